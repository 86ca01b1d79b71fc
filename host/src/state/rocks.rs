//! RocksDB-backed committed stores: one database per task (input
//! partition), one column family per store, and a metadata column family
//! with each store's changelog position. Changes and positions land in one
//! atomic write batch, so the database never claims a position its data
//! does not reflect.

use std::ops::Bound;
use std::path::{Path, PathBuf};

use rocksdb::{ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, ReadOptions};

use super::{PartitionStore, StateError, WriteBatch, bounds_empty};
use crate::types::Entry;

const META_CF: &str = "onceflow.meta";
const POSITION_PREFIX: &str = "changelog-position/";

/// One task's stores in RocksDB.
pub struct RocksPartition {
    db: DB,
    path: PathBuf,
}

fn backend(store: &str, e: impl std::fmt::Display) -> StateError {
    StateError::Backend {
        store: store.to_owned(),
        message: e.to_string(),
    }
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
        std::fs::create_dir_all(path).map_err(|e| backend(&path.display().to_string(), e))?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        // Small by default: a host runs many tasks.
        opts.set_write_buffer_size(8 << 20);
        opts.set_max_open_files(64);
        opts.set_keep_log_file_num(2);
        let existing = DB::list_cf(&opts, path).unwrap_or_default();
        let declared = |name: &str| name == META_CF || stores.iter().any(|s| s == name);
        let stale: Vec<String> = existing
            .into_iter()
            .filter(|name| name != rocksdb::DEFAULT_COLUMN_FAMILY_NAME && !declared(name))
            .collect();
        let cfs = stores
            .iter()
            .map(String::as_str)
            .chain([META_CF])
            .chain(stale.iter().map(String::as_str))
            .map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
        let mut db = DB::open_cf_descriptors(&opts, path, cfs).map_err(|e| {
            backend(
                &path.display().to_string(),
                format!("cannot open RocksDB: {e} (is another onceflow using this --state-dir?)"),
            )
        })?;
        for name in &stale {
            let meta = db
                .cf_handle(META_CF)
                .ok_or_else(|| backend(META_CF, "no such column family"))?;
            db.delete_cf(meta, format!("{POSITION_PREFIX}{name}"))
                .map_err(|e| backend(name, e))?;
            db.drop_cf(name).map_err(|e| backend(name, e))?;
            tracing::info!(
                path = %path.display(),
                store = %name,
                "dropped the local copy of store {name}: the manifest no longer declares it"
            );
        }
        Ok(Self {
            db,
            path: path.to_path_buf(),
        })
    }

    /// Where the database lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn cf(&self, store: &str) -> Result<&rocksdb::ColumnFamily, StateError> {
        self.db
            .cf_handle(store)
            .ok_or_else(|| backend(store, "no such column family"))
    }
}

impl PartitionStore for RocksPartition {
    fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.db
            .get_cf(self.cf(store)?, key)
            .map_err(|e| backend(store, e))
    }

    fn range<'a>(
        &'a self,
        store: &str,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> Box<dyn Iterator<Item = Result<Entry, StateError>> + 'a> {
        if bounds_empty(start, end) {
            return Box::new(std::iter::empty());
        }
        let cf = match self.cf(store) {
            Ok(cf) => cf,
            Err(e) => return Box::new(std::iter::once(Err(e))),
        };
        let mut read = ReadOptions::default();
        let (end_key, end_inclusive) = match end {
            Bound::Included(e) => (Some(e.to_vec()), true),
            Bound::Excluded(e) => (Some(e.to_vec()), false),
            Bound::Unbounded => (None, false),
        };
        if let (Some(e), false) = (&end_key, end_inclusive) {
            read.set_iterate_upper_bound(e.clone());
        }
        let (mode, skip_equal) = match start {
            Bound::Included(s) => (IteratorMode::From(s, Direction::Forward), None),
            Bound::Excluded(s) => (IteratorMode::From(s, Direction::Forward), Some(s.to_vec())),
            Bound::Unbounded => (IteratorMode::Start, None),
        };
        let store = store.to_owned();
        let iter = self
            .db
            .iterator_cf_opt(cf, read, mode)
            .map(move |item| {
                item.map(|(k, v)| (k.into_vec(), v.into_vec()))
                    .map_err(|e| backend(&store, e))
            })
            .filter(move |item| match (item, &skip_equal) {
                (Ok((k, _)), Some(s)) => k != s,
                _ => true,
            })
            .take_while(move |item| match (item, &end_key, end_inclusive) {
                (Ok((k, _)), Some(e), true) => k <= e,
                _ => true,
            });
        Box::new(iter)
    }

    fn write(&mut self, batch: &WriteBatch) -> Result<(), StateError> {
        let mut wb = rocksdb::WriteBatch::default();
        for c in &batch.changes {
            let cf = self.cf(&c.store)?;
            for (key, value) in &c.changes {
                match value {
                    Some(v) => wb.put_cf(cf, key, v),
                    None => wb.delete_cf(cf, key),
                }
            }
        }
        let meta = self.cf(META_CF)?;
        for (store, position) in &batch.positions {
            wb.put_cf(
                meta,
                format!("{POSITION_PREFIX}{store}"),
                position.to_be_bytes(),
            );
        }
        self.db
            .write(wb)
            .map_err(|e| backend(&self.path.display().to_string(), e))
    }

    fn changelog_position(&self, store: &str) -> Result<Option<i64>, StateError> {
        let raw = self
            .db
            .get_cf(self.cf(META_CF)?, format!("{POSITION_PREFIX}{store}"))
            .map_err(|e| backend(store, e))?;
        match raw {
            None => Ok(None),
            Some(bytes) => {
                let arr: [u8; 8] = bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| backend(store, "corrupt changelog position"))?;
                Ok(Some(i64::from_be_bytes(arr)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StoreChanges;

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
            })
            .unwrap();
            p.write(&WriteBatch {
                changes: vec![StoreChanges {
                    store: "a".into(),
                    changes: vec![(b"k2".to_vec(), None)],
                }],
                positions: vec![("a".into(), 18)],
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
}
