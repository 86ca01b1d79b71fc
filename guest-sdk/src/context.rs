//! What a processor can do while it processes a record: state, outputs,
//! configuration, logging and deterministic randomness.

use std::fmt;

use crate::bindings::onceflow::processor::types::Entry;
use crate::error::{Error, ErrorKind};
use crate::host::Host;
use crate::log::Level;
use crate::record::{Config, Record};
use crate::windows::WindowStore;

/// How many entries a scan asks the host for at a time.
pub const DEFAULT_SCAN_PAGE: u32 = 256;

/// The processor's handle on the outside world while it processes one
/// record.
///
/// A new `Context` is made for every record, so [`Context::random_u64`]
/// starts from the same seed whenever the same record is processed again.
pub struct Context<'a> {
    host: &'a dyn Host,
    config: &'a Config,
    seed: u64,
    draws: u64,
    /// The record's index in its batch (`None` in `punctuate`).
    index: Option<u32>,
}

impl<'a> Context<'a> {
    pub(crate) fn new(host: &'a dyn Host, config: &'a Config, record: &Record) -> Self {
        Self {
            host,
            config,
            seed: record_seed(record),
            draws: 0,
            index: Some(0),
        }
    }

    /// The context of record `index` of the batch.
    pub(crate) fn at(mut self, index: u32) -> Self {
        self.index = Some(index);
        self
    }

    /// The context of a punctuation at `stream_time`: random numbers are
    /// seeded from it.
    pub(crate) fn for_punctuation(
        host: &'a dyn Host,
        config: &'a Config,
        stream_time: i64,
    ) -> Self {
        Self {
            host,
            config,
            seed: splitmix64(stream_time as u64),
            draws: 0,
            index: None,
        }
    }

    /// The window store called `name`, which must be declared under
    /// `[window-stores]` in `onceflow.toml`. See [`WindowStore`].
    pub fn window_store<'s>(&self, name: &'s str) -> WindowStore<'s>
    where
        'a: 's,
    {
        WindowStore::new(self.host, name)
    }

    /// The task's stream time: the largest record timestamp the task has
    /// seen, counting this record (in [`crate::Processor::punctuate`], the
    /// time it was called for). `None` before the task's first record with
    /// a timestamp.
    pub fn stream_time(&self) -> Option<i64> {
        self.host.stream_time()
    }

    /// Reports this record as late: its window had closed. Leave no other
    /// mark for it (write nothing, emit nothing) and return `Ok`; the host
    /// then counts and drops it, or hands it to the error policy with
    /// `message` as the reason, as the manifest's `[time] late-records`
    /// says. Outside `process` it does nothing.
    pub fn report_late(&self, message: impl AsRef<str>) {
        if let Some(index) = self.index {
            self.host.late_record(index, message.as_ref());
        }
    }

    /// The state store called `name`, which must be declared under `stores`
    /// in `onceflow.toml`.
    ///
    /// This only names the store; nothing is read until you call a method of
    /// [`Store`]. The store does not borrow the context, so you may hold it
    /// while you emit.
    pub fn store<'s>(&self, name: &'s str) -> Store<'s>
    where
        'a: 's,
    {
        Store {
            host: self.host,
            name,
        }
    }

    /// Emits a record with `key` and `value` to the topic that `alias` maps to
    /// under `[outputs]` in `onceflow.toml`.
    ///
    /// The record is written inside the current transaction: it becomes
    /// visible to `read_committed` consumers only if the batch commits.
    pub fn emit(
        &self,
        alias: &str,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<(), Error> {
        self.emit_with(alias, Some(key.as_ref()), Some(value.as_ref()), &[])
    }

    /// Emits a record with an optional key (`None` for a null key), an
    /// optional value (`None` for a tombstone) and headers.
    pub fn emit_with(
        &self,
        alias: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&str, &[u8])],
    ) -> Result<(), Error> {
        Ok(self.host.emit(alias, key, value, headers)?)
    }

    /// The value of `key` in the manifest's `[config]` table.
    pub fn config(&self, key: &str) -> Option<&'a str> {
        self.config.get(key)
    }

    /// The whole configuration.
    pub fn config_all(&self) -> &'a Config {
        self.config
    }

    /// Writes a log line at `level`. See [`crate::log`].
    pub fn log(&self, level: Level, message: impl AsRef<str>) {
        self.host.log(level, message.as_ref());
    }

    /// A pseudo-random number, deterministic per record.
    ///
    /// The sequence is seeded from the record's topic, partition and offset,
    /// so processing the same record again (after an abort, say) draws the
    /// same numbers in the same order and leaves the same mark. Computed in
    /// the guest with SplitMix64; not for cryptography.
    pub fn random_u64(&mut self) -> u64 {
        self.draws += 1;
        splitmix64(
            self.seed
                .wrapping_add(self.draws.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        )
    }
}

impl fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("seed", &self.seed)
            .field("draws", &self.draws)
            .finish_non_exhaustive()
    }
}

/// A keyed state store.
///
/// Each input partition has its own partition of every store: key your input
/// the way you key your state. Reads see this processor's own uncommitted
/// writes; writes become visible to others when the host commits the batch.
/// Keys and values are bytes; the typed helpers store text so that state
/// dumps stay readable.
#[derive(Clone, Copy)]
pub struct Store<'s> {
    host: &'s dyn Host,
    name: &'s str,
}

impl<'s> Store<'s> {
    /// The store's name.
    pub fn name(&self) -> &'s str {
        self.name
    }

    /// The value of `key`, or `None` if the key is absent.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.host.get(self.name, key.as_ref())?)
    }

    /// The value of `key` as UTF-8 text, or `None` if the key is absent.
    pub fn get_string(&self, key: impl AsRef<[u8]>) -> Result<Option<String>, Error> {
        let key = key.as_ref();
        match self.get(key)? {
            None => Ok(None),
            Some(bytes) => String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| self.bad_value(key, "is not UTF-8 text")),
        }
    }

    /// The value of `key` as an integer stored in decimal text (as
    /// [`Store::put_i64`] writes it), or `None` if the key is absent.
    pub fn get_i64(&self, key: impl AsRef<[u8]>) -> Result<Option<i64>, Error> {
        let key = key.as_ref();
        match self.get(key)? {
            None => Ok(None),
            Some(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|text| text.parse::<i64>().ok())
                .map(Some)
                .ok_or_else(|| self.bad_value(key, "is not a decimal integer")),
        }
    }

    /// Sets `key` to `value`.
    pub fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), Error> {
        Ok(self.host.put(self.name, key.as_ref(), value.as_ref())?)
    }

    /// Sets `key` to `value` written as decimal text.
    pub fn put_i64(&self, key: impl AsRef<[u8]>, value: i64) -> Result<(), Error> {
        self.put(key, value.to_string())
    }

    /// Removes `key` (a tombstone in the changelog). Removing an absent key
    /// is not an error.
    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<(), Error> {
        Ok(self.host.delete(self.name, key.as_ref())?)
    }

    /// The entries whose key starts with `prefix`, in ascending key order.
    /// An empty prefix scans the whole store.
    ///
    /// The iterator fetches [`DEFAULT_SCAN_PAGE`] entries at a time (see
    /// [`Scan::page_size`]); a failed fetch is yielded as an error and ends
    /// the scan.
    pub fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Scan<'s> {
        self.scan(Bounds::Prefix {
            prefix: prefix.as_ref().to_vec(),
            after: None,
        })
    }

    /// The entries with `start <= key < end`, in ascending key order.
    pub fn scan_range(&self, start: impl AsRef<[u8]>, end: impl AsRef<[u8]>) -> Scan<'s> {
        self.scan(Bounds::Range {
            start: Some(start.as_ref().to_vec()),
            end: Some(end.as_ref().to_vec()),
        })
    }

    /// The entries with `start <= key`, in ascending key order.
    pub fn scan_from(&self, start: impl AsRef<[u8]>) -> Scan<'s> {
        self.scan(Bounds::Range {
            start: Some(start.as_ref().to_vec()),
            end: None,
        })
    }

    fn scan(&self, bounds: Bounds) -> Scan<'s> {
        Scan {
            store: *self,
            bounds,
            page: Vec::new().into_iter(),
            page_size: DEFAULT_SCAN_PAGE,
            done: false,
        }
    }

    fn bad_value(&self, key: &[u8], problem: &str) -> Error {
        Error::with_kind(
            ErrorKind::InvalidData,
            format!(
                "state store \"{}\": the value of key \"{}\" {problem}",
                self.name,
                key.escape_ascii()
            ),
        )
    }
}

impl fmt::Debug for Store<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("name", &self.name).finish()
    }
}

enum Bounds {
    /// Keys starting with `prefix`, after `after` (the last key seen).
    Prefix {
        prefix: Vec<u8>,
        after: Option<Vec<u8>>,
    },
    /// Keys in `start..end`; `start` moves past each page.
    Range {
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
    },
}

/// An iterator over the entries of a [`Store`] scan, fetched from the host a
/// page at a time. Yields `(key, value)` pairs.
pub struct Scan<'s> {
    store: Store<'s>,
    bounds: Bounds,
    page: std::vec::IntoIter<Entry>,
    page_size: u32,
    done: bool,
}

impl Scan<'_> {
    /// Sets how many entries to fetch from the host at a time (at least 1).
    pub fn page_size(mut self, entries: u32) -> Self {
        self.page_size = entries.max(1);
        self
    }

    fn fetch(&mut self) -> Result<Vec<Entry>, Error> {
        let Store { host, name } = self.store;
        let page = match &self.bounds {
            Bounds::Prefix { prefix, after } => {
                host.scan_prefix(name, prefix, after.as_deref(), self.page_size)?
            }
            Bounds::Range { start, end } => {
                host.scan_range(name, start.as_deref(), end.as_deref(), self.page_size)?
            }
        };
        if page.len() < self.page_size as usize {
            self.done = true;
        }
        if let Some(last) = page.last() {
            match &mut self.bounds {
                Bounds::Prefix { after, .. } => *after = Some(last.key.clone()),
                // The smallest key greater than `last` is `last` followed by 0.
                Bounds::Range { start, .. } => {
                    let mut next = last.key.clone();
                    next.push(0);
                    *start = Some(next);
                }
            }
        }
        Ok(page)
    }
}

impl Iterator for Scan<'_> {
    type Item = Result<(Vec<u8>, Vec<u8>), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(entry) = self.page.next() {
                return Some(Ok((entry.key, entry.value)));
            }
            if self.done {
                return None;
            }
            match self.fetch() {
                Ok(page) => self.page = page.into_iter(),
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            }
        }
    }
}

impl fmt::Debug for Scan<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scan")
            .field("store", &self.store.name)
            .field("page_size", &self.page_size)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// FNV-1a over the record's topic, a 0xff separator, its partition and its
/// offset (little-endian): stable across platforms and compiler versions,
/// unlike `std`'s hashers. Computed for every record, so in plain loops: a
/// chain of iterators cost ~1% of the Rust wallet's time in Wasm.
fn record_seed(record: &Record) -> u64 {
    #[inline(always)]
    fn fnv(mut hash: u64, bytes: &[u8]) -> u64 {
        for &byte in bytes {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        hash
    }
    let hash = fnv(0xcbf2_9ce4_8422_2325, record.topic.as_bytes());
    let hash = fnv(hash, &[0xff]);
    let hash = fnv(hash, &record.partition.to_le_bytes());
    fnv(hash, &record.offset.to_le_bytes())
}

fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed as the SDK computed it up to 2026-12-03, with a chain of
    /// iterators: a processor built with a newer SDK draws the same random
    /// numbers for the same record.
    fn record_seed_before(record: &Record) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let partition = record.partition.to_le_bytes();
        let offset = record.offset.to_le_bytes();
        let bytes = record.topic.as_bytes().iter().chain(&[0xff]);
        for &byte in bytes.chain(&partition).chain(&offset) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        hash
    }

    #[test]
    fn the_seed_of_a_record_has_not_changed() {
        for topic in ["", "t", "payments", "a-rather-long.topic_name-with.dots"] {
            for (partition, offset) in [(0, 0), (3, 17), (-1, -1), (i32::MAX, i64::MAX)] {
                let record = Record {
                    topic: topic.into(),
                    partition,
                    offset,
                    ..Record::default()
                };
                assert_eq!(
                    record_seed(&record),
                    record_seed_before(&record),
                    "{topic} {partition} {offset}"
                );
            }
        }
        // A fixed value, so that both functions cannot drift together.
        let record = Record {
            topic: "payments".into(),
            partition: 3,
            offset: 17,
            ..Record::default()
        };
        assert_eq!(record_seed(&record), 0x8b05_6b28_50dd_a849);
    }
}
