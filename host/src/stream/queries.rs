//! Interactive queries from the local stores: which of this host's tasks
//! answer for which partition of which deployment ([`LocalStores`]), and
//! their reads of the committed layer (a key, a range of keys, a key's
//! windows).
//!
//! A task registers its database when it opens it (restoring: not yet an
//! answer) and is ready once its restore finished; it leaves when the task
//! closes (a revocation, a session's end, hibernation). What it answers is
//! what RocksDB holds: only data whose transaction committed, as the
//! changelog scan that queries read before (`changelog::query`) saw it.
//! The fleet's admin API routes each partition's read to the host that
//! owns it (`admin/queries.rs`).

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::state::rocks::StoreReader;
use crate::state::window;
pub use crate::state::window::decode as decode_window;
use crate::state::{StateError, prefix_successor};
use crate::types::Entry;

/// Most entries one range or window read returns per partition (and, the
/// partitions merged, in all).
pub const MAX_ENTRIES: usize = 10_000;

/// What a query reads of one store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// One key.
    Key(Vec<u8>),
    /// Keys in `[from, to)` (unbounded where `None`).
    Range {
        /// First key (inclusive).
        from: Option<Vec<u8>>,
        /// Last key (exclusive).
        to: Option<Vec<u8>>,
        /// Most entries.
        limit: usize,
    },
    /// Keys starting with `prefix`.
    Prefix {
        /// The prefix.
        prefix: Vec<u8>,
        /// Most entries.
        limit: usize,
    },
    /// The windows of a window store's `key` that start in `[from_ms,
    /// to_ms]`.
    Windows {
        /// The key.
        key: Vec<u8>,
        /// Earliest start (ms since the epoch).
        from_ms: i64,
        /// Latest start.
        to_ms: i64,
        /// Most entries.
        limit: usize,
    },
}

/// One partition's answer.
#[derive(Debug)]
pub enum PartitionRead {
    /// Its committed entries (for a window read, each key is the window's
    /// store key: [`window::decode`] gives the key and start).
    Entries(Vec<Entry>),
    /// This host does not hold the partition's task now.
    NotHere,
    /// This host's task is restoring the partition's stores.
    Restoring,
    /// The deployment hibernates on this host: a wake was asked for.
    Waking,
}

/// This host's tasks that answer queries, per deployment (application id).
#[derive(Default)]
pub struct LocalStores {
    apps: Mutex<HashMap<String, App>>,
}

#[derive(Default)]
struct App {
    partitions: BTreeMap<i32, Task>,
    /// Set while the deployment hibernates; a query sets `wake`.
    hibernating: bool,
    wake: Arc<AtomicBool>,
}

struct Task {
    reader: StoreReader,
    ready: bool,
}

impl std::fmt::Debug for LocalStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let apps = self.lock();
        f.debug_map()
            .entries(
                apps.iter()
                    .map(|(app, a)| (app, a.partitions.keys().collect::<Vec<_>>())),
            )
            .finish()
    }
}

impl LocalStores {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, App>> {
        self.apps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A task of `app` opened `partition`'s database (restoring).
    pub(crate) fn opened(&self, app: &str, partition: i32, reader: StoreReader) {
        self.lock()
            .entry(app.to_owned())
            .or_default()
            .partitions
            .insert(
                partition,
                Task {
                    reader,
                    ready: false,
                },
            );
    }

    /// The task of `partition` finished its restore: it answers.
    pub(crate) fn ready(&self, app: &str, partition: i32) {
        if let Some(t) = self
            .lock()
            .get_mut(app)
            .and_then(|a| a.partitions.get_mut(&partition))
        {
            t.ready = true;
        }
    }

    /// The task of `partition` restores again (after a rebalance it may have
    /// missed commits of another member): no answer until it is ready.
    pub(crate) fn restoring(&self, app: &str, partition: i32) {
        if let Some(t) = self
            .lock()
            .get_mut(app)
            .and_then(|a| a.partitions.get_mut(&partition))
        {
            t.ready = false;
        }
    }

    /// The task of `partition` closed.
    pub(crate) fn closed(&self, app: &str, partition: i32) {
        if let Some(a) = self.lock().get_mut(app) {
            a.partitions.remove(&partition);
        }
    }

    /// The deployment's flag a query sets to wake it, and whether it
    /// hibernates now.
    pub(crate) fn hibernating(&self, app: &str, asleep: bool) -> Arc<AtomicBool> {
        let mut apps = self.lock();
        let a = apps.entry(app.to_owned()).or_default();
        a.hibernating = asleep;
        if asleep {
            a.partitions.clear();
        }
        a.wake.clone()
    }

    /// The deployment stopped on this host.
    pub(crate) fn stopped(&self, app: &str) {
        self.lock().remove(app);
    }

    /// Reads `store` of `app` in each of `partitions` from this host's
    /// tasks. A deployment hibernating here is woken (its partitions
    /// answer [`PartitionRead::Waking`] meanwhile).
    pub fn read(
        &self,
        app: &str,
        store: &str,
        partitions: &[i32],
        read: &Read,
    ) -> Result<Vec<(i32, PartitionRead)>, StateError> {
        let readers: Vec<(i32, Option<StoreReader>, PartitionRead)> = {
            let apps = self.lock();
            let Some(a) = apps.get(app) else {
                return Ok(partitions
                    .iter()
                    .map(|&p| (p, PartitionRead::NotHere))
                    .collect());
            };
            if a.hibernating {
                a.wake.store(true, Ordering::Relaxed);
            }
            partitions
                .iter()
                .map(|&p| match a.partitions.get(&p) {
                    Some(t) if t.ready => (p, Some(t.reader.clone()), PartitionRead::NotHere),
                    Some(_) => (p, None, PartitionRead::Restoring),
                    None if a.hibernating => (p, None, PartitionRead::Waking),
                    None => (p, None, PartitionRead::NotHere),
                })
                .collect()
        };
        // Read outside the lock: tasks open and close meanwhile.
        let mut out = Vec::with_capacity(readers.len());
        for (p, reader, otherwise) in readers {
            let answer = match reader {
                Some(r) => match read_one(&r, store, read) {
                    Some(entries) => PartitionRead::Entries(entries?),
                    None => PartitionRead::NotHere,
                },
                None => otherwise,
            };
            out.push((p, answer));
        }
        Ok(out)
    }
}

/// One task's read (`None`: it closed its database meanwhile).
fn read_one(r: &StoreReader, store: &str, read: &Read) -> Option<Result<Vec<Entry>, StateError>> {
    match read {
        Read::Key(key) => r
            .get(store, key)
            .map(|found| found.map(|v| v.map(|v| (key.clone(), v)).into_iter().collect())),
        Read::Range { from, to, limit } => r.range(
            store,
            from.as_deref().map_or(Bound::Unbounded, Bound::Included),
            to.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
            (*limit).min(MAX_ENTRIES),
        ),
        Read::Prefix { prefix, limit } => {
            let end = prefix_successor(prefix);
            r.range(
                store,
                Bound::Included(prefix),
                end.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
                (*limit).min(MAX_ENTRIES),
            )
        }
        Read::Windows {
            key,
            from_ms,
            to_ms,
            limit,
        } => {
            if from_ms > to_ms {
                return Some(Ok(Vec::new()));
            }
            let (from, to) = (window::encode(key, *from_ms), window::encode(key, *to_ms));
            r.range(
                store,
                Bound::Included(&from),
                Bound::Included(&to),
                (*limit).min(MAX_ENTRIES),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::rocks::RocksPartition;
    use crate::state::{PartitionStore, StoreChanges, WriteBatch};

    fn store_with(dir: &std::path::Path, entries: &[(&[u8], &[u8])]) -> RocksPartition {
        let mut db = RocksPartition::open(dir, &["s".to_owned()]).expect("open");
        db.write(&WriteBatch {
            changes: vec![StoreChanges {
                store: "s".to_owned(),
                changes: entries
                    .iter()
                    .map(|(k, v)| (k.to_vec(), Some(v.to_vec())))
                    .collect(),
            }],
            positions: vec![("s".to_owned(), 1)],
            synced: Vec::new(),
        })
        .expect("write");
        db
    }

    fn keys(read: &PartitionRead) -> Vec<Vec<u8>> {
        match read {
            PartitionRead::Entries(e) => e.iter().map(|(k, _)| k.clone()).collect(),
            other => panic!("expected entries, got {other:?}"),
        }
    }

    #[test]
    fn a_task_answers_once_restored_and_not_after_it_closed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = store_with(dir.path(), &[(b"a", b"1"), (b"ab", b"2"), (b"b", b"3")]);
        let stores = LocalStores::default();
        stores.opened("t.app", 0, db.reader());
        let key = Read::Key(b"ab".to_vec());
        let r = stores.read("t.app", "s", &[0, 1], &key).expect("read");
        assert!(matches!(r[0].1, PartitionRead::Restoring), "{r:?}");
        assert!(matches!(r[1].1, PartitionRead::NotHere), "{r:?}");
        stores.ready("t.app", 0);
        let r = stores.read("t.app", "s", &[0], &key).expect("read");
        assert_eq!(keys(&r[0].1), vec![b"ab".to_vec()]);
        let prefix = Read::Prefix {
            prefix: b"a".to_vec(),
            limit: 10,
        };
        let r = stores.read("t.app", "s", &[0], &prefix).expect("read");
        assert_eq!(keys(&r[0].1), vec![b"a".to_vec(), b"ab".to_vec()]);
        let range = Read::Range {
            from: Some(b"ab".to_vec()),
            to: None,
            limit: 1,
        };
        let r = stores.read("t.app", "s", &[0], &range).expect("read");
        assert_eq!(keys(&r[0].1), vec![b"ab".to_vec()]);
        // The task closes its database: a reader still registered (the
        // close not yet reported) answers as not here, never a stale store.
        drop(db);
        let r = stores.read("t.app", "s", &[0], &key).expect("read");
        assert!(matches!(r[0].1, PartitionRead::NotHere), "{r:?}");
    }

    #[test]
    fn window_reads_take_the_key_s_windows_in_the_time_range() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (k1, k2, k3) = (
            window::encode(b"k", 1_000),
            window::encode(b"k", 2_000),
            window::encode(b"k", 3_000),
        );
        let other = window::encode(b"k2", 2_000);
        let db = store_with(
            dir.path(),
            &[(&k1, b"1"), (&k2, b"2"), (&k3, b"3"), (&other, b"x")],
        );
        let stores = LocalStores::default();
        stores.opened("t.app", 0, db.reader());
        stores.ready("t.app", 0);
        let read = Read::Windows {
            key: b"k".to_vec(),
            from_ms: 2_000,
            to_ms: 3_000,
            limit: 10,
        };
        let r = stores.read("t.app", "s", &[0], &read).expect("read");
        assert_eq!(keys(&r[0].1), vec![k2, k3]);
    }

    #[test]
    fn a_hibernating_deployment_is_woken_by_a_read() {
        let stores = LocalStores::default();
        let wake = stores.hibernating("t.app", true);
        let r = stores
            .read("t.app", "s", &[0], &Read::Key(b"a".to_vec()))
            .expect("read");
        assert!(matches!(r[0].1, PartitionRead::Waking), "{r:?}");
        assert!(wake.load(Ordering::Relaxed));
    }
}
