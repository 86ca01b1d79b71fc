//! Reads of a task's committed stores from other threads (interactive
//! queries), and the range iterator the task's own reads share.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rocksdb::{DB, Direction, IteratorMode, ReadOptions};

use super::{StateError, bounds_empty, cf_of, failed};
use crate::types::Entry;

/// Reads a task's committed stores from another thread than the task's (an
/// interactive query): the RocksDB database holds only data whose
/// transaction committed (the layers above it hold the rest,
/// `state/mod.rs`). Valid while the task keeps its database open: once the
/// task closed it, every read answers `None`.
#[derive(Clone)]
pub struct StoreReader {
    pub(super) db: Arc<RwLock<Option<Arc<DB>>>>,
    pub(super) path: Arc<PathBuf>,
}

impl StoreReader {
    /// The committed value of `key` in `store` (`None`: the task closed its
    /// database).
    pub fn get(&self, store: &str, key: &[u8]) -> Option<Result<Option<Vec<u8>>, StateError>> {
        let db = self.db.read().unwrap_or_else(|e| e.into_inner());
        let db = db.as_ref()?;
        Some(
            cf_of(db, store)
                .and_then(|cf| db.get_cf(cf, key).map_err(|e| failed(&self.path, store, e))),
        )
    }

    /// Up to `limit` committed entries of `store` with keys in the bounds,
    /// ascending (`None`: the task closed its database).
    pub fn range(
        &self,
        store: &str,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Option<Result<Vec<Entry>, StateError>> {
        let db = self.db.read().unwrap_or_else(|e| e.into_inner());
        let db = db.as_ref()?;
        Some(
            range_in(db, &self.path, store, start, end)
                .take(limit)
                .collect(),
        )
    }
}

/// The entries of `store` in `db` with keys in the bounds, ascending.
pub(super) fn range_in<'a>(
    db: &'a DB,
    path: &'a Path,
    store: &str,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
) -> Box<dyn Iterator<Item = Result<Entry, StateError>> + 'a> {
    if bounds_empty(start, end) {
        return Box::new(std::iter::empty());
    }
    let cf = match cf_of(db, store) {
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
    let iter = db
        .iterator_cf_opt(cf, read, mode)
        .map(move |item| {
            item.map(|(k, v)| (k.into_vec(), v.into_vec()))
                .map_err(|e| failed(path, &store, e))
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
