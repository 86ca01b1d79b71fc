//! RocksDB-backed committed stores: one database per task (input
//! partition), one column family per store, and a metadata column family
//! with each store's changelog position. Changes and positions land in one
//! atomic write batch, so the database never claims a position its data
//! does not reflect.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rocksdb::{ColumnFamilyDescriptor, DB, IteratorMode, Options};

use super::{PartitionStore, StateError, WriteBatch, bounds_empty, entry_bytes};

mod reader;
use crate::types::Entry;
pub use reader::StoreReader;
use reader::range_in;

const META_CF: &str = "onceflow.meta";
const POSITION_PREFIX: &str = "changelog-position/";
/// Per store, when it was last known in sync with its log (milliseconds
/// since the Unix epoch, u64 big-endian; [`WriteBatch::synced`]).
const SYNCED_PREFIX: &str = "synced-at/";
/// A write that only moves sync times is skipped unless one moves by this
/// much: a worker commits many times a second, and the trust horizon it
/// serves is hours (a topic's `delete.retention.ms`).
const SYNC_GRAIN: Duration = Duration::from_secs(60);
/// Per store, the bytes of its keys and values (u64, big-endian), kept in
/// the same write as the data ([`PartitionStore::live_bytes`]).
const BYTES_PREFIX: &str = "live-bytes/";

/// The memtable of each column family. Small: a host runs many tasks, and
/// after a crash RocksDB replays the write-ahead log not yet flushed and
/// flushes it when it opens the database, partition by partition, before a
/// reassigned task can restore its changelog's tail (with RocksDB's 64 MB
/// default, a wallet partition holding 17 MB of recent writes took 200 ms to
/// open; bench/README.md, "Recovery").
const WRITE_BUFFER_BYTES: usize = 8 << 20;

fn cf_options() -> Options {
    let mut opts = Options::default();
    opts.set_write_buffer_size(WRITE_BUFFER_BYTES);
    opts
}

/// One task's stores in RocksDB.
pub struct RocksPartition {
    db: Arc<DB>,
    /// Reads of the committed stores from other threads (queries).
    reader: StoreReader,
    path: PathBuf,
    /// Each store's bytes of keys and values, as in the metadata.
    live: BTreeMap<String, u64>,
    /// Each store's sync time, as in the metadata.
    synced: BTreeMap<String, SystemTime>,
}

fn backend(store: &str, e: impl std::fmt::Display) -> StateError {
    StateError::Backend {
        store: store.to_owned(),
        message: e.to_string(),
    }
}

/// A file in a database's directory that marks it damaged (a checksum
/// failed, a file is missing or cut short): the next open removes the
/// database, and the task restores its stores from their logs. It holds
/// what was found.
const DAMAGED_FILE: &str = "DAMAGED";

/// Whether a RocksDB error says the database's files are damaged: a
/// checksum or a size that does not match, a file the MANIFEST lists that
/// is gone; not a lock another process holds, nor a full disk.
fn is_damage(e: &rocksdb::Error) -> bool {
    match e.kind() {
        rocksdb::ErrorKind::Corruption => true,
        rocksdb::ErrorKind::IOError => {
            let m = e.to_string();
            m.contains("No such file or directory") && !m.contains("/LOCK")
        }
        _ => false,
    }
}

/// Marks the database at `path` damaged (best effort: failing, the error
/// itself still ends the session, and the next open meets the damage).
fn mark_damaged(path: &Path, what: &str) {
    if let Err(e) = std::fs::write(path.join(DAMAGED_FILE), what) {
        tracing::warn!(path = %path.display(), "cannot mark the database damaged: {e}");
    }
}

/// A RocksDB failure of `store` in the database at `path`: one that says
/// its files are damaged marks it so.
fn failed(path: &Path, store: &str, e: rocksdb::Error) -> StateError {
    if is_damage(&e) {
        mark_damaged(path, e.as_ref());
    }
    backend(store, e)
}

/// A metadata value of `store` that is not what the host writes: the
/// database is marked damaged.
fn damaged(path: &Path, store: &str, what: &str) -> StateError {
    mark_damaged(path, &format!("{what} of store {store}"));
    backend(store, what)
}

/// Removes the damaged database at `path` (its stores are then restored in
/// full from their logs), saying so.
fn remove_damaged(path: &Path, what: &str) -> Result<(), StateError> {
    tracing::warn!(
        path = %path.display(),
        "the local stores in {} are damaged ({what}): removed; they are restored from their \
         changelogs (and tables from their topics) before the partition is processed",
        path.display()
    );
    let place = path.display().to_string();
    std::fs::remove_dir_all(path)
        .map_err(|e| backend(&place, format!("cannot remove the damaged database: {e}")))?;
    std::fs::create_dir_all(path).map_err(|e| backend(&place, e))
}

/// The message for a database that did not open, with what to do.
fn open_failure(path: &Path, e: &rocksdb::Error) -> StateError {
    let m = e.to_string();
    let hint = if m.contains("/LOCK") {
        " (is another onceflow using this --state-dir?)"
    } else if m.contains("No space left") {
        " (the state directory's disk is full: free space; the partition is opened again every \
         few seconds)"
    } else {
        ""
    };
    backend(
        &path.display().to_string(),
        format!("cannot open RocksDB: {m}{hint}"),
    )
}

impl RocksPartition {
    /// Opens (or creates) the database at `path` with a column family per
    /// store. Column families of stores no longer declared (an upgrade
    /// removed or renamed a store) are dropped, with their changelog
    /// positions: RocksDB refuses to open a database without all of its
    /// column families, and a renamed store starts empty and restores from
    /// its own changelog.
    pub fn open(path: &Path, stores: &[String]) -> Result<Self, StateError> {
        // The manifest refuses this name; a store must never share the
        // metadata's column family, whatever built the list.
        if let Some(s) = stores.iter().find(|s| s.as_str() == META_CF) {
            return Err(backend(
                s,
                "this store name is reserved for the host's metadata",
            ));
        }
        // Read before RocksDB touches the directory (it writes a log and
        // options files on every open): when a database from before sync
        // times was last written.
        let mut last_written = last_written(path);
        std::fs::create_dir_all(path).map_err(|e| backend(&path.display().to_string(), e))?;
        if let Ok(what) = std::fs::read_to_string(path.join(DAMAGED_FILE)) {
            remove_damaged(path, what.trim())?;
            last_written = None;
        }
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        // Small by default: a host runs many tasks.
        opts.set_write_buffer_size(WRITE_BUFFER_BYTES);
        // The metadata column family (the changelog positions, a few bytes
        // per commit) never fills its memtable, and a log file stays while
        // any column family has unflushed data in it: without a bound every
        // log since the last flush of the metadata stayed and was replayed
        // at the next open (RocksDB's own bound is four times the sum of the
        // memtables). Past this, RocksDB flushes the column families holding
        // the oldest log.
        opts.set_max_total_wal_size(2 * WRITE_BUFFER_BYTES as u64);
        opts.set_max_open_files(64);
        opts.set_keep_log_file_num(2);
        let declared = |name: &str| name == META_CF || stores.iter().any(|s| s == name);
        // A damaged database (found by the open, or while listing its
        // column families) is removed once and opened again, empty.
        let mut removed = false;
        let (mut db, stale) = loop {
            let existing = match DB::list_cf(&opts, path) {
                Ok(names) => names,
                // (A new database has no CURRENT to list from: not damage.)
                Err(e) if e.kind() == rocksdb::ErrorKind::Corruption && !removed => {
                    remove_damaged(path, e.as_ref())?;
                    (removed, last_written) = (true, None);
                    continue;
                }
                // A new database.
                Err(_) => Vec::new(),
            };
            let stale: Vec<String> = existing
                .into_iter()
                .filter(|name| name != rocksdb::DEFAULT_COLUMN_FAMILY_NAME && !declared(name))
                .collect();
            let cfs = stores
                .iter()
                .map(String::as_str)
                .chain([META_CF])
                .chain(stale.iter().map(String::as_str))
                .map(|name| ColumnFamilyDescriptor::new(name, cf_options()));
            match DB::open_cf_descriptors(&opts, path, cfs) {
                Ok(db) => break (db, stale),
                Err(e) if is_damage(&e) && !removed => {
                    remove_damaged(path, e.as_ref())?;
                    (removed, last_written) = (true, None);
                }
                Err(e) => return Err(open_failure(path, &e)),
            }
        };
        for name in &stale {
            let meta = db
                .cf_handle(META_CF)
                .ok_or_else(|| backend(META_CF, "no such column family"))?;
            db.delete_cf(meta, format!("{POSITION_PREFIX}{name}"))
                .map_err(|e| failed(path, name, e))?;
            db.delete_cf(meta, format!("{BYTES_PREFIX}{name}"))
                .map_err(|e| failed(path, name, e))?;
            db.delete_cf(meta, format!("{SYNCED_PREFIX}{name}"))
                .map_err(|e| failed(path, name, e))?;
            db.drop_cf(name).map_err(|e| failed(path, name, e))?;
            tracing::info!(
                path = %path.display(),
                store = %name,
                "dropped the local copy of store {name}: the manifest no longer declares it"
            );
        }
        let db = Arc::new(db);
        let mut me = Self {
            reader: StoreReader {
                db: Arc::new(RwLock::new(Some(db.clone()))),
                path: Arc::new(path.to_path_buf()),
            },
            db,
            path: path.to_path_buf(),
            live: BTreeMap::new(),
            synced: BTreeMap::new(),
        };
        for store in stores {
            let bytes = me.load_live_bytes(store)?;
            me.live.insert(store.clone(), bytes);
            if let Some(at) = me.load_synced(store, last_written)? {
                me.synced.insert(store.clone(), at);
            }
        }
        Ok(me)
    }

    /// `store`'s sync time from the metadata. A store with a position and
    /// no sync time was written by a host from before sync times: it is
    /// taken as in sync when its directory was last written (what that host
    /// judged by), recorded once.
    fn load_synced(
        &self,
        store: &str,
        last_written: Option<SystemTime>,
    ) -> Result<Option<SystemTime>, StateError> {
        let meta = self.cf(META_CF)?;
        let key = format!("{SYNCED_PREFIX}{store}");
        if let Some(raw) = self
            .db
            .get_cf(meta, &key)
            .map_err(|e| failed(&self.path, store, e))?
        {
            let arr: [u8; 8] = raw
                .as_slice()
                .try_into()
                .map_err(|_| damaged(&self.path, store, "corrupt sync time"))?;
            return Ok(Some(
                UNIX_EPOCH + Duration::from_millis(u64::from_be_bytes(arr)),
            ));
        }
        if self.changelog_position(store)?.is_none() {
            return Ok(None);
        }
        let Some(at) = last_written else {
            return Ok(None);
        };
        let ms = unix_millis(at);
        self.db
            .put_cf(meta, &key, ms.to_be_bytes())
            .map_err(|e| failed(&self.path, store, e))?;
        Ok(Some(UNIX_EPOCH + Duration::from_millis(ms)))
    }

    /// `store`'s byte count from the metadata; counted once by reading the
    /// store when a host that kept no count wrote it.
    fn load_live_bytes(&self, store: &str) -> Result<u64, StateError> {
        let meta = self.cf(META_CF)?;
        let key = format!("{BYTES_PREFIX}{store}");
        if let Some(raw) = self
            .db
            .get_cf(meta, &key)
            .map_err(|e| failed(&self.path, store, e))?
        {
            let arr: [u8; 8] = raw
                .as_slice()
                .try_into()
                .map_err(|_| damaged(&self.path, store, "corrupt byte count"))?;
            return Ok(u64::from_be_bytes(arr));
        }
        let mut bytes = 0;
        for item in self.db.iterator_cf(self.cf(store)?, IteratorMode::Start) {
            let (k, v) = item.map_err(|e| failed(&self.path, store, e))?;
            bytes += entry_bytes(&k, Some(&v));
        }
        self.db
            .put_cf(meta, &key, bytes.to_be_bytes())
            .map_err(|e| failed(&self.path, store, e))?;
        Ok(bytes)
    }

    /// Where the database lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A handle that reads the committed stores from another thread while
    /// this task holds the database ([`StoreReader`]).
    pub fn reader(&self) -> StoreReader {
        self.reader.clone()
    }

    fn cf(&self, store: &str) -> Result<&rocksdb::ColumnFamily, StateError> {
        cf_of(&self.db, store)
    }
}

impl Drop for RocksPartition {
    /// The readers first (waiting for a read in progress, a few
    /// milliseconds), so that the database closes with its task and a task
    /// that opens it next on this host finds it free.
    fn drop(&mut self) {
        *self.reader.db.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

fn cf_of<'a>(db: &'a DB, store: &str) -> Result<&'a rocksdb::ColumnFamily, StateError> {
    db.cf_handle(store)
        .ok_or_else(|| backend(store, "no such column family"))
}

impl PartitionStore for RocksPartition {
    fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.db
            .get_cf(self.cf(store)?, key)
            .map_err(|e| failed(&self.path, store, e))
    }

    fn range<'a>(
        &'a self,
        store: &str,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> Box<dyn Iterator<Item = Result<Entry, StateError>> + 'a> {
        range_in(&self.db, &self.path, store, start, end)
    }

    fn write(&mut self, batch: &WriteBatch) -> Result<(), StateError> {
        let moved = |store: &String, at: &SystemTime| {
            self.synced.get(store).is_none_or(|last| {
                at.duration_since(*last)
                    .map_or(true, |ahead| ahead >= SYNC_GRAIN)
            })
        };
        if batch.changes.is_empty()
            && batch.positions.is_empty()
            && !batch.synced.iter().any(|(s, at)| moved(s, at))
        {
            return Ok(());
        }
        let mut wb = rocksdb::WriteBatch::default();
        let mut live = self.live.clone();
        let meta = self.cf(META_CF)?;
        for c in &batch.changes {
            let cf = self.cf(&c.store)?;
            // Each key's size as this batch leaves it, for keys written
            // more than once in it (a restore's batch may).
            let mut written: BTreeMap<&[u8], u64> = BTreeMap::new();
            let mut bytes = live.get(&c.store).copied().unwrap_or(0);
            for (key, value) in &c.changes {
                let old = match written.get(key.as_slice()) {
                    Some(&size) => size,
                    None => {
                        let found = self
                            .db
                            .get_pinned_cf(cf, key)
                            .map_err(|e| failed(&self.path, &c.store, e))?;
                        entry_bytes(key, found.as_deref())
                    }
                };
                let new = entry_bytes(key, value.as_deref());
                bytes = (bytes + new).saturating_sub(old);
                written.insert(key, new);
                match value {
                    Some(v) => wb.put_cf(cf, key, v),
                    None => wb.delete_cf(cf, key),
                }
            }
            wb.put_cf(
                meta,
                format!("{BYTES_PREFIX}{}", c.store),
                bytes.to_be_bytes(),
            );
            live.insert(c.store.clone(), bytes);
        }
        for (store, position) in &batch.positions {
            wb.put_cf(
                meta,
                format!("{POSITION_PREFIX}{store}"),
                position.to_be_bytes(),
            );
        }
        for (store, at) in &batch.synced {
            wb.put_cf(
                meta,
                format!("{SYNCED_PREFIX}{store}"),
                unix_millis(*at).to_be_bytes(),
            );
        }
        self.db
            .write(wb)
            .map_err(|e| failed(&self.path, &self.path.display().to_string(), e))?;
        self.live = live;
        for (store, at) in &batch.synced {
            self.synced.insert(
                store.clone(),
                UNIX_EPOCH + Duration::from_millis(unix_millis(*at)),
            );
        }
        Ok(())
    }

    fn synced_at(&self, store: &str) -> Result<Option<SystemTime>, StateError> {
        Ok(self.synced.get(store).copied())
    }

    fn live_bytes(&self) -> u64 {
        self.live.values().sum()
    }

    fn changelog_position(&self, store: &str) -> Result<Option<i64>, StateError> {
        let raw = self
            .db
            .get_cf(self.cf(META_CF)?, format!("{POSITION_PREFIX}{store}"))
            .map_err(|e| failed(&self.path, store, e))?;
        match raw {
            None => Ok(None),
            Some(bytes) => {
                let arr: [u8; 8] = bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| damaged(&self.path, store, "corrupt changelog position"))?;
                Ok(Some(i64::from_be_bytes(arr)))
            }
        }
    }
}

fn unix_millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis().try_into().unwrap_or(u64::MAX))
}

/// When anything in a directory was last modified.
fn last_written(dir: &Path) -> Option<SystemTime> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StoreChanges;

    #[test]
    fn a_reopen_after_a_crash_replays_little_whatever_was_written_before() {
        let dir = tempfile::tempdir().unwrap();
        let stores = vec!["a".to_owned()];
        let mut p = RocksPartition::open(dir.path(), &stores).unwrap();
        // 48 MB of writes, 100-byte keys like the recovery benchmark's, each
        // batch with its position (the metadata column family).
        for chunk in 0..48u64 {
            let changes = (0..8_000u64)
                .map(|i| {
                    let key = format!("{:0100}", chunk * 8_000 + i).into_bytes();
                    (key, Some(vec![b'7'; 31]))
                })
                .collect();
            p.write(&WriteBatch {
                changes: vec![StoreChanges {
                    store: "a".into(),
                    changes,
                }],
                positions: vec![("a".into(), chunk as i64)],
                synced: vec![],
            })
            .unwrap();
        }
        let cf = p.db.cf_handle("a").unwrap();
        // What is in memory, and what a crash now would leave to replay at
        // the next open: the logs. Flushes and the deletion of old logs run
        // on RocksDB's background threads, which a busy machine may leave
        // behind the writes: the bounds must hold once they catch up (a
        // generous wait; without the bounds they never would).
        let measure = || {
            let unflushed =
                p.db.property_int_value_cf(&cf, "rocksdb.cur-size-all-mem-tables")
                    .unwrap()
                    .unwrap();
            let logs: u64 = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap())
                .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
                .map(|e| e.metadata().unwrap().len())
                .sum();
            (unflushed, logs)
        };
        let within = |(unflushed, logs): (u64, u64)| {
            unflushed <= 2 * WRITE_BUFFER_BYTES as u64 && logs <= 3 * WRITE_BUFFER_BYTES as u64
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let mut seen = measure();
        while !within(seen) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
            seen = measure();
        }
        let (unflushed, logs) = seen;
        // RocksDB's default memtable (64 MB) kept all of it in memory.
        assert!(
            unflushed <= 2 * WRITE_BUFFER_BYTES as u64,
            "{unflushed} bytes in memtables"
        );
        // Without a bound on the logs every log stayed, the metadata's
        // memtable holding each one.
        assert!(
            logs <= 3 * WRITE_BUFFER_BYTES as u64,
            "{logs} bytes of write-ahead log"
        );
    }

    #[test]
    fn writes_are_atomic_with_positions_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let stores = vec!["a".to_owned(), "b".to_owned()];
        {
            let mut p = RocksPartition::open(dir.path(), &stores).unwrap();
            p.write(&WriteBatch {
                changes: vec![
                    StoreChanges {
                        store: "a".into(),
                        changes: vec![
                            (b"k1".to_vec(), Some(b"v1".to_vec())),
                            (b"k2".to_vec(), Some(b"v2".to_vec())),
                            (b"k3".to_vec(), Some(b"v3".to_vec())),
                        ],
                    },
                    StoreChanges {
                        store: "b".into(),
                        changes: vec![(b"x".to_vec(), Some(b"y".to_vec()))],
                    },
                ],
                positions: vec![("a".into(), 17), ("b".into(), 3)],
                synced: vec![],
            })
            .unwrap();
            p.write(&WriteBatch {
                changes: vec![StoreChanges {
                    store: "a".into(),
                    changes: vec![(b"k2".to_vec(), None)],
                }],
                positions: vec![("a".into(), 18)],
                synced: vec![],
            })
            .unwrap();
        }
        let p = RocksPartition::open(dir.path(), &stores).unwrap();
        assert_eq!(p.get("a", b"k1").unwrap(), Some(b"v1".to_vec()));
        assert_eq!(p.get("a", b"k2").unwrap(), None);
        assert_eq!(p.changelog_position("a").unwrap(), Some(18));
        assert_eq!(p.changelog_position("b").unwrap(), Some(3));
        let keys = |s: Bound<&[u8]>, e: Bound<&[u8]>| -> Vec<Vec<u8>> {
            p.range("a", s, e).map(|r| r.unwrap().0).collect()
        };
        assert_eq!(
            keys(Bound::Unbounded, Bound::Unbounded),
            vec![b"k1".to_vec(), b"k3".to_vec()]
        );
        assert_eq!(
            keys(Bound::Excluded(b"k1"), Bound::Unbounded),
            vec![b"k3".to_vec()]
        );
        assert_eq!(
            keys(Bound::Included(b"k1"), Bound::Excluded(b"k3")),
            vec![b"k1".to_vec()]
        );
        assert_eq!(
            keys(Bound::Included(b"k1"), Bound::Included(b"k3")),
            vec![b"k1".to_vec(), b"k3".to_vec()]
        );
        assert!(keys(Bound::Included(b"z"), Bound::Included(b"a")).is_empty());
        // k1=v1, k3=v3 and x=y: 10 bytes, kept across the reopen.
        assert_eq!(p.live_bytes(), 10);
    }

    #[test]
    fn the_byte_count_is_exact_and_made_for_a_database_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let stores = vec!["a".to_owned()];
        let batch = |changes: Vec<(&str, Option<&str>)>| WriteBatch {
            changes: vec![StoreChanges {
                store: "a".into(),
                changes: changes
                    .into_iter()
                    .map(|(k, v)| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec())))
                    .collect(),
            }],
            positions: vec![],
            synced: vec![],
        };
        {
            let mut p = RocksPartition::open(dir.path(), &stores).unwrap();
            p.write(&batch(vec![("k1", Some("v1")), ("k2", Some("v2"))]))
                .unwrap();
            assert_eq!(p.live_bytes(), 8);
            // A restore's batch may write one key twice: the second
            // replaces the first, not the committed value.
            p.write(&batch(vec![
                ("k1", Some("vvvv")),
                ("k1", Some("v")),
                ("k2", None),
            ]))
            .unwrap();
            assert_eq!(p.live_bytes(), 3);
            // As a host before the count left it: data, no count.
            let meta = p.cf(META_CF).unwrap();
            p.db.delete_cf(meta, format!("{BYTES_PREFIX}a")).unwrap();
        }
        let p = RocksPartition::open(dir.path(), &stores).unwrap();
        assert_eq!(p.live_bytes(), 3);
    }

    #[test]
    fn a_store_no_longer_declared_is_dropped_with_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let both = vec!["a".to_owned(), "b".to_owned()];
        {
            let mut p = RocksPartition::open(dir.path(), &both).unwrap();
            p.write(&WriteBatch {
                changes: vec![StoreChanges {
                    store: "b".into(),
                    changes: vec![(b"x".to_vec(), Some(b"y".to_vec()))],
                }],
                positions: vec![("a".into(), 5), ("b".into(), 7)],
                synced: vec![],
            })
            .unwrap();
        }
        // An upgrade removed store b: the database still opens.
        {
            let p = RocksPartition::open(dir.path(), &["a".to_owned()]).unwrap();
            assert_eq!(p.changelog_position("a").unwrap(), Some(5));
            assert!(p.get("b", b"x").is_err(), "b is gone");
        }
        // Declared again later: empty, restored from the start.
        let p = RocksPartition::open(dir.path(), &both).unwrap();
        assert_eq!(p.get("b", b"x").unwrap(), None);
        assert_eq!(p.changelog_position("b").unwrap(), None);
        assert_eq!(p.changelog_position("a").unwrap(), Some(5));
    }

    /// Sync times (eos-audit-3 findings 2 and 10) are kept per store with
    /// the data, survive a reopen, and are not moved by opening the
    /// database (RocksDB rewrites its log and options files on every open,
    /// which refreshed the directory's age the trust horizon used to read).
    #[test]
    fn sync_times_are_per_store_durable_and_not_refreshed_by_an_open() {
        let dir = tempfile::tempdir().unwrap();
        let stores = vec!["a".to_owned(), "t".to_owned()];
        let old = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let newer = old + Duration::from_secs(3600);
        {
            let mut p = RocksPartition::open(dir.path(), &stores).unwrap();
            assert_eq!(p.synced_at("a").unwrap(), None);
            p.write(&WriteBatch {
                changes: vec![],
                positions: vec![("a".into(), 5), ("t".into(), 9)],
                synced: vec![("a".into(), old), ("t".into(), old)],
            })
            .unwrap();
            p.write(&WriteBatch {
                synced: vec![("a".into(), newer)],
                ..WriteBatch::default()
            })
            .unwrap();
        }
        for _ in 0..3 {
            let p = RocksPartition::open(dir.path(), &stores).unwrap();
            assert_eq!(p.synced_at("a").unwrap(), Some(newer));
            assert_eq!(p.synced_at("t").unwrap(), Some(old), "an open moved it");
        }
    }

    /// A write that only moves sync times by less than [`SYNC_GRAIN`] is
    /// skipped (a worker commits many times a second); a wipe leaves the
    /// store empty at position 0, in sync as of now.
    #[test]
    fn small_sync_moves_are_skipped_and_a_wipe_resets_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let stores = vec!["a".to_owned()];
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut p = RocksPartition::open(dir.path(), &stores).unwrap();
        p.write(&WriteBatch {
            changes: vec![StoreChanges {
                store: "a".into(),
                changes: vec![(b"k".to_vec(), Some(b"v".to_vec()))],
            }],
            positions: vec![("a".into(), 3)],
            synced: vec![("a".into(), at)],
        })
        .unwrap();
        let only_sync = |d: u64| WriteBatch {
            synced: vec![("a".into(), at + Duration::from_secs(d))],
            ..WriteBatch::default()
        };
        p.write(&only_sync(59)).unwrap();
        assert_eq!(p.synced_at("a").unwrap(), Some(at));
        p.write(&only_sync(60)).unwrap();
        assert_eq!(
            p.synced_at("a").unwrap(),
            Some(at + Duration::from_secs(60))
        );
        let before = SystemTime::now();
        assert_eq!(p.wipe("a").unwrap(), 1);
        assert_eq!(p.get("a", b"k").unwrap(), None);
        assert_eq!(p.changelog_position("a").unwrap(), Some(0));
        assert_eq!(p.live_bytes(), 0);
        // (Kept in milliseconds.)
        assert!(
            p.synced_at("a")
                .unwrap()
                .is_some_and(|t| t + Duration::from_millis(1) > before)
        );
    }

    /// A database written by a host from before sync times: its stores
    /// with a position are taken as in sync when the directory was last
    /// written, read before the open rewrites it.
    #[test]
    fn a_database_without_sync_times_takes_its_directory_age() {
        let dir = tempfile::tempdir().unwrap();
        let stores = vec!["a".to_owned(), "b".to_owned()];
        {
            let mut p = RocksPartition::open(dir.path(), &stores).unwrap();
            p.write(&WriteBatch {
                changes: vec![],
                positions: vec![("a".into(), 5)],
                synced: vec![],
            })
            .unwrap();
        }
        let written = last_written(dir.path()).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        let p = RocksPartition::open(dir.path(), &stores).unwrap();
        let synced = p.synced_at("a").unwrap().expect("a store with a position");
        assert_eq!(
            synced,
            UNIX_EPOCH + Duration::from_millis(unix_millis(written)),
            "not the directory's age"
        );
        assert_eq!(p.synced_at("b").unwrap(), None, "b has no position");
        drop(p);
        let p = RocksPartition::open(dir.path(), &stores).unwrap();
        assert_eq!(p.synced_at("a").unwrap(), Some(synced), "recorded once");
    }

    /// A database of store "a" with `batches` batches of 1,000 keys (batch
    /// b: keys b*1000.., position b+1), flushed into SST files when
    /// `flush`, else left in the write-ahead log.
    fn written(dir: &Path, batches: u64, flush: bool) {
        let stores = vec!["a".to_owned()];
        let mut p = RocksPartition::open(dir, &stores).unwrap();
        for b in 0..batches {
            let changes = (0..1_000u64)
                .map(|i| {
                    (
                        format!("{:08}", b * 1_000 + i).into_bytes(),
                        Some(vec![b'v'; 200]),
                    )
                })
                .collect();
            p.write(&WriteBatch {
                changes: vec![StoreChanges {
                    store: "a".into(),
                    changes,
                }],
                positions: vec![("a".into(), b as i64 + 1)],
                synced: vec![],
            })
            .unwrap();
        }
        if flush {
            for cf in ["a", META_CF] {
                p.db.flush_cf(p.db.cf_handle(cf).unwrap()).unwrap();
            }
        }
    }

    /// The files of `dir` whose names end or start with `name`, sorted.
    fn files(dir: &Path, name: &str) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let f = p.file_name().unwrap().to_string_lossy().into_owned();
                f.ends_with(name) || f.starts_with(name)
            })
            .collect();
        out.sort();
        out
    }

    /// Cuts `f` to `keep`/`of` of its length.
    fn cut(f: &Path, keep: u64, of: u64) {
        let len = std::fs::metadata(f).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(f)
            .unwrap()
            .set_len(len * keep / of)
            .unwrap();
    }

    /// Opens the database after `damage`, reading every key of "a" the
    /// way a task would; a read that fails ends that open (the session
    /// restarts) and the next one is tried: what the third open holds.
    fn open_after(dir: &Path, damage: impl FnOnce(&Path)) -> (Option<i64>, usize) {
        damage(dir);
        let stores = vec!["a".to_owned()];
        for _ in 0..3 {
            let Ok(p) = RocksPartition::open(dir, &stores) else {
                continue;
            };
            let Ok(position) = p.changelog_position("a") else {
                continue;
            };
            let keys: Result<Vec<_>, _> =
                p.range("a", Bound::Unbounded, Bound::Unbounded).collect();
            if let Ok(keys) = keys {
                return (position, keys.len());
            }
        }
        panic!("the damaged database did not open within three tries");
    }

    #[test]
    fn a_damaged_database_is_removed_and_opens_empty() {
        type Damage = fn(&Path);
        let cases: [(&str, Damage); 5] = [
            ("an SST file cut short", |d| cut(&files(d, ".sst")[0], 1, 2)),
            ("bytes of an SST file's data blocks overwritten", |d| {
                use std::os::unix::fs::FileExt;
                for f in files(d, ".sst") {
                    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
                    file.write_all_at(&[0xA5; 4096], 64).unwrap();
                }
            }),
            ("an SST file gone", |d| {
                std::fs::remove_file(&files(d, ".sst")[0]).unwrap();
            }),
            ("the MANIFEST cut short", |d| {
                cut(&files(d, "MANIFEST-")[0], 1, 3)
            }),
            ("CURRENT names no MANIFEST", |d| {
                std::fs::write(d.join("CURRENT"), "MANIFEST-999999\n").unwrap();
            }),
        ];
        for (what, damage) in cases {
            let dir = tempfile::tempdir().unwrap();
            written(dir.path(), 20, true);
            let (position, keys) = open_after(dir.path(), damage);
            assert_eq!(
                (position, keys),
                (None, 0),
                "{what}: the damaged database must be removed (restored in full from the log)"
            );
            assert!(!dir.path().join(DAMAGED_FILE).exists(), "{what}");
        }
    }

    /// A write-ahead log cut short or overwritten loses its last writes
    /// with their positions (each write is one batch with its position):
    /// what stays is consistent, and the restore reads the rest again.
    #[test]
    fn a_damaged_write_ahead_log_goes_back_to_a_consistent_write() {
        for of in [2, 3, 5] {
            let dir = tempfile::tempdir().unwrap();
            written(dir.path(), 20, false);
            let (position, keys) = open_after(dir.path(), |d| {
                cut(&files(d, ".log").into_iter().last().unwrap(), of - 1, of)
            });
            let position = position.unwrap_or(0);
            assert!(
                position < 20,
                "the log was cut, and nothing lost: {position}"
            );
            assert_eq!(
                keys as i64,
                position * 1_000,
                "the keys of exactly the batches before position {position}"
            );
        }
    }

    /// A database another process holds open is not damaged: its error
    /// says what to check, and it is kept.
    #[test]
    fn a_locked_database_is_not_taken_for_damaged() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 3, false);
        let stores = vec!["a".to_owned()];
        let held = RocksPartition::open(dir.path(), &stores).unwrap();
        let Err(e) = RocksPartition::open(dir.path(), &stores) else {
            panic!("a second open of a held database succeeded");
        };
        assert!(e.to_string().contains("another onceflow"), "{e}");
        drop(held);
        let p = RocksPartition::open(dir.path(), &stores).unwrap();
        assert_eq!(p.changelog_position("a").unwrap(), Some(3));
    }
}
