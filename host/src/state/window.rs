//! How a window store keeps its windows in a key-value store partition: one
//! entry per (key, window start), under a byte key that sorts like the pair.
//!
//! The key is escaped (each 0x00 becomes 0x00 0xFF) and closed with 0x00
//! 0x01, so that no key's encoding is a prefix of another's and bytewise
//! order of the encodings is bytewise order of the keys; the start follows
//! as 8 big-endian bytes with the sign bit flipped, so negative starts sort
//! first. A window store is therefore an ordinary store to the layers, the
//! changelog and RocksDB: only this encoding knows it holds windows.
//!
//! [`WindowStore`] reads a task's window store through its layers: the
//! fetches the guest asks for (expired windows left out) and the expired
//! windows a sweep deletes.

use super::TaskState;
use crate::types::{AccessError, WindowEntry, WindowKey};

const ESCAPE: u8 = 0x00;
const ESCAPED_ZERO: u8 = 0xFF;
const TERMINATOR: u8 = 0x01;

/// The encoded form of `key`'s part: every window of `key` starts with it.
pub fn key_prefix(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 10);
    for &b in key {
        out.push(b);
        if b == ESCAPE {
            out.push(ESCAPED_ZERO);
        }
    }
    out.extend_from_slice(&[ESCAPE, TERMINATOR]);
    out
}

/// The store key of the window of `key` starting at `start`.
pub fn encode(key: &[u8], start: i64) -> Vec<u8> {
    let mut out = key_prefix(key);
    out.extend_from_slice(&((start as u64) ^ (1 << 63)).to_be_bytes());
    out
}

/// The window a store key holds; `None` for bytes [`encode`] did not make.
pub fn decode(stored: &[u8]) -> Option<WindowKey> {
    let (key_part, start) = stored.split_at_checked(stored.len().checked_sub(8)?)?;
    let start = (u64::from_be_bytes(start.try_into().ok()?) ^ (1 << 63)) as i64;
    let (body, end) = key_part.split_at_checked(key_part.len().checked_sub(2)?)?;
    if end != [ESCAPE, TERMINATOR] {
        return None;
    }
    let mut key = Vec::with_capacity(body.len());
    let mut bytes = body.iter();
    while let Some(&b) = bytes.next() {
        key.push(b);
        if b == ESCAPE && bytes.next() != Some(&ESCAPED_ZERO) {
            return None;
        }
    }
    Some(WindowKey { key, start })
}

/// Whether a window starting at `start` has expired at stream time `now`
/// under `retention_ms`: Kafka Streams' rule, a window is kept while its
/// start is after `now - retention`.
pub fn expired(start: i64, now: Option<i64>, retention_ms: u64) -> bool {
    now.is_some_and(|now| start <= now.saturating_sub(retention_ms.min(i64::MAX as u64) as i64))
}

/// One window store of a task, read through the task's layers (what the
/// call wrote, then what committed).
pub struct WindowStore<'a> {
    /// The task's state, read through its layers.
    pub state: &'a TaskState,
    /// The window store's name.
    pub store: &'a str,
    /// How long a window is kept behind stream time, ms.
    pub retention: u64,
}

impl WindowStore<'_> {
    /// The windows of `key` starting in `[from, to]`, not expired at `now`,
    /// by start.
    pub fn fetch(
        &self,
        key: &[u8],
        from: i64,
        to: i64,
        now: Option<i64>,
    ) -> Result<Vec<WindowEntry>, AccessError> {
        if from > to {
            return Ok(Vec::new());
        }
        let start = encode(key, from);
        let end = (to < i64::MAX).then(|| encode(key, to.saturating_add(1)));
        let end = end.unwrap_or_else(|| {
            // Past every window of the key: the terminator's last byte + 1.
            let mut prefix_end = key_prefix(key);
            if let Some(last) = prefix_end.last_mut() {
                *last += 1;
            }
            prefix_end
        });
        self.windows_in(Some(start), Some(&end), (from, to), usize::MAX, now)
    }

    /// Up to `limit` windows of any key starting in `[from, to]`, not
    /// expired at `now`, by key then start, after window `after`.
    pub fn fetch_all(
        &self,
        from: i64,
        to: i64,
        after: Option<WindowKey>,
        limit: usize,
        now: Option<i64>,
    ) -> Result<Vec<WindowEntry>, AccessError> {
        if from > to || limit == 0 {
            return Ok(Vec::new());
        }
        let start = after.map(|w| {
            let mut k = encode(&w.key, w.start);
            k.push(0);
            k
        });
        self.windows_in(start, None, (from, to), limit, now)
    }

    /// The stored keys of the windows expired at stream time `now`.
    pub fn expired_keys(&self, now: i64) -> Result<Vec<Vec<u8>>, AccessError> {
        const PAGE: usize = 1024;
        let mut expired_keys = Vec::new();
        let mut cursor: Option<Vec<u8>> = None;
        loop {
            let page = self
                .state
                .scan_range(self.store, cursor.as_deref(), None, PAGE)?;
            let full = page.len() == PAGE;
            if let Some((last, _)) = page.last() {
                let mut next = last.clone();
                next.push(0);
                cursor = Some(next);
            }
            for (raw, _) in page {
                if decode(&raw).is_some_and(|w| expired(w.start, Some(now), self.retention)) {
                    expired_keys.push(raw);
                }
            }
            if !full {
                return Ok(expired_keys);
            }
        }
    }

    /// Windows decoded from the raw entries in `[start, end)`, starting in
    /// `[from, to]` and not expired at `now`, until `limit` are found.
    fn windows_in(
        &self,
        start: Option<Vec<u8>>,
        end: Option<&[u8]>,
        (from, to): (i64, i64),
        limit: usize,
        now: Option<i64>,
    ) -> Result<Vec<WindowEntry>, AccessError> {
        const PAGE: usize = 256;
        let mut found = Vec::new();
        let mut cursor = start;
        while found.len() < limit {
            let page = self
                .state
                .scan_range(self.store, cursor.as_deref(), end, PAGE)?;
            let Some((last, _)) = page.last() else {
                break;
            };
            // The smallest key after the last one seen.
            let mut next = last.clone();
            next.push(0);
            let full = page.len() == PAGE;
            for (raw, value) in page {
                let Some(w) = decode(&raw) else {
                    continue;
                };
                if (from..=to).contains(&w.start) && !expired(w.start, now, self.retention) {
                    found.push((w, value));
                    if found.len() == limit {
                        break;
                    }
                }
            }
            if !full {
                break;
            }
            cursor = Some(next);
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_sort_like_key_then_start_and_decode_back() {
        let keys: [&[u8]; 6] = [b"", b"\x00", b"\x00\x00", b"\x00\x01", b"a", b"a\x00b"];
        let starts = [i64::MIN, -60_000, -1, 0, 1, 60_000, i64::MAX];
        let mut pairs = Vec::new();
        for k in keys {
            for s in starts {
                pairs.push((k.to_vec(), s));
            }
        }
        let mut encoded: Vec<_> = pairs
            .iter()
            .map(|(k, s): &(Vec<u8>, i64)| (encode(k, *s), (k.clone(), *s)))
            .collect();
        encoded.sort();
        let by_encoding: Vec<_> = encoded.iter().map(|(_, p)| p.clone()).collect();
        let mut by_pair = pairs.clone();
        by_pair.sort();
        assert_eq!(by_encoding, by_pair);
        for (bytes, (k, s)) in &encoded {
            assert_eq!(
                decode(bytes),
                Some(WindowKey {
                    key: k.clone(),
                    start: *s
                })
            );
            assert!(bytes.starts_with(&key_prefix(k)));
        }
        // No key's windows fall under another key's prefix.
        assert!(!encode(b"a\x00b", 0).starts_with(&key_prefix(b"a")));
    }

    #[test]
    fn foreign_bytes_are_not_windows() {
        assert_eq!(decode(b""), None);
        assert_eq!(decode(b"balance"), None);
        assert_eq!(decode(b"\x00\x02\x80\x00\x00\x00\x00\x00\x00\x00"), None);
    }

    #[test]
    fn a_window_expires_when_its_start_is_retention_behind_stream_time() {
        assert!(!expired(0, None, 1000));
        assert!(!expired(1, Some(1000), 1000));
        assert!(expired(0, Some(1000), 1000));
        assert!(
            !expired(-5, Some(100), u64::MAX),
            "retention past the epoch"
        );
    }
}
