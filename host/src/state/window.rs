//! How a window store keeps its windows in a key-value store partition: one
//! entry per (key, window start), under a byte key that sorts like the pair.
//!
//! The key is escaped (each 0x00 becomes 0x00 0xFF) and closed with 0x00
//! 0x01, so that no key's encoding is a prefix of another's and bytewise
//! order of the encodings is bytewise order of the keys; the start follows
//! as 8 big-endian bytes with the sign bit flipped, so negative starts sort
//! first. A window store is therefore an ordinary store to the layers, the
//! changelog and RocksDB: only this encoding knows it holds windows.

use crate::types::WindowKey;

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
