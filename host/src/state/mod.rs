//! Keyed state stores.
//!
//! Each task (one input partition) owns one partition of every store the
//! manifest declares. A store partition has three layers, read top-down:
//!
//! 1. the *call* layer: writes of the `process` call in progress. A failed
//!    call (error or trap) drops it, so a poison record leaves no trace;
//! 2. the *transaction* layer: writes of calls that succeeded since the last
//!    commit. These become changelog records in the commit's transaction, and
//!    are dropped if the transaction aborts;
//! 3. the *committed* store, which only ever holds data whose transaction
//!    committed (the EOS loop applies layer 2 to it after the commit
//!    succeeds). A crash can therefore never leave uncommitted data behind.
//!
//! This module knows nothing of Wasm or Kafka: `task` drives it.

pub mod rocks;
pub mod window;

use std::collections::{BTreeMap, btree_map};
use std::ops::Bound;
use std::time::SystemTime;

use crate::types::{AccessError, Entry, StoreAccessError};

/// Largest key and value together the host accepts, in bytes: a state
/// change is one changelog record ([`crate::types::MAX_RECORD_BYTES`]).
pub const MAX_ENTRY_BYTES: u64 = crate::types::MAX_RECORD_BYTES;

/// A failure of the store backend itself (not of the processor).
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The backend failed to read or write.
    #[error("state store {store:?}: {message}")]
    Backend {
        /// The store name.
        store: String,
        /// What failed.
        message: String,
    },
}

/// The committed data of one task: one partition of every store, and how
/// far each store's changelog has been applied.
pub trait PartitionStore: Send {
    /// Reads a committed key.
    fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError>;
    /// Committed entries with keys in the bounds, ascending.
    fn range<'a>(
        &'a self,
        store: &str,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> Box<dyn Iterator<Item = Result<Entry, StateError>> + 'a>;
    /// Applies committed changes and changelog positions atomically.
    fn write(&mut self, batch: &WriteBatch) -> Result<(), StateError>;
    /// The next changelog offset to read for `store`: every changelog
    /// record before it is reflected in the store. `None`: never written.
    fn changelog_position(&self, store: &str) -> Result<Option<i64>, StateError>;
    /// When `store` was last known in sync with its log
    /// ([`WriteBatch::synced`]); `None`: never recorded.
    fn synced_at(&self, store: &str) -> Result<Option<SystemTime>, StateError>;
    /// Deletes every entry of `store` and sets its position to 0, in sync
    /// as of now (it is then restored in full). Returns the entries
    /// deleted.
    fn wipe(&mut self, store: &str) -> Result<u64, StateError> {
        let keys: Vec<Vec<u8>> = self
            .range(store, Bound::Unbounded, Bound::Unbounded)
            .map(|e| e.map(|(k, _)| k))
            .collect::<Result<_, StateError>>()?;
        let wiped = keys.len() as u64;
        self.write(&WriteBatch {
            changes: vec![StoreChanges {
                store: store.to_owned(),
                changes: keys.into_iter().map(|k| (k, None)).collect(),
            }],
            positions: vec![(store.to_owned(), 0)],
            synced: vec![(store.to_owned(), SystemTime::now())],
        })?;
        Ok(wiped)
    }
    /// Bytes of keys and values committed in all stores together, counted
    /// exactly by [`PartitionStore::write`] (what `limits.state-mb`
    /// bounds).
    fn live_bytes(&self) -> u64;
}

/// Bytes one entry takes against `limits.state-mb`.
pub(crate) fn entry_bytes(key: &[u8], value: Option<&[u8]>) -> u64 {
    value.map_or(0, |v| (key.len() + v.len()) as u64)
}

/// Committed changes to apply in one atomic write.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WriteBatch {
    /// Per store, the latest value (`None`: delete) of each key written.
    pub changes: Vec<StoreChanges>,
    /// Per store, the next changelog offset to read after this write.
    pub positions: Vec<(String, i64)>,
    /// Per store, a wall time as of which it is in sync with its log up to
    /// its position: every record at or past the position was appended to
    /// the log after it. A store whose sync is older than its topic's
    /// `delete.retention.ms` may have missed a tombstone that compaction
    /// removed since, and is restored in full (`changelog::restore`).
    pub synced: Vec<(String, SystemTime)>,
}

/// A task's stores held in memory: the offline runner's backend.
#[derive(Debug, Default, Clone)]
pub struct MemoryPartition {
    stores: BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>,
    positions: BTreeMap<String, i64>,
    synced: BTreeMap<String, SystemTime>,
    live_bytes: u64,
}

impl PartitionStore for MemoryPartition {
    fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.stores.get(store).and_then(|s| s.get(key)).cloned())
    }

    fn range<'a>(
        &'a self,
        store: &str,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> Box<dyn Iterator<Item = Result<Entry, StateError>> + 'a> {
        match self.stores.get(store) {
            Some(data) if !bounds_empty(start, end) => Box::new(
                data.range::<[u8], _>((start, end))
                    .map(|(k, v)| Ok((k.clone(), v.clone()))),
            ),
            _ => Box::new(std::iter::empty()),
        }
    }

    fn write(&mut self, batch: &WriteBatch) -> Result<(), StateError> {
        for c in &batch.changes {
            let data = self.stores.entry(c.store.clone()).or_default();
            for (key, value) in &c.changes {
                let old = match value {
                    Some(v) => data.insert(key.clone(), v.clone()),
                    None => data.remove(key),
                };
                self.live_bytes = (self.live_bytes + entry_bytes(key, value.as_deref()))
                    .saturating_sub(entry_bytes(key, old.as_deref()));
            }
        }
        for (store, position) in &batch.positions {
            self.positions.insert(store.clone(), *position);
        }
        for (store, at) in &batch.synced {
            self.synced.insert(store.clone(), *at);
        }
        Ok(())
    }

    fn changelog_position(&self, store: &str) -> Result<Option<i64>, StateError> {
        Ok(self.positions.get(store).copied())
    }

    fn synced_at(&self, store: &str) -> Result<Option<SystemTime>, StateError> {
        Ok(self.synced.get(store).copied())
    }

    fn live_bytes(&self) -> u64 {
        self.live_bytes
    }
}

/// `BTreeMap::range` panics on inverted or empty-exclusive bounds; a guest
/// asking for `[b, a)` must get an empty scan instead.
pub(crate) fn bounds_empty(start: Bound<&[u8]>, end: Bound<&[u8]>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e))
        | (Bound::Excluded(s), Bound::Excluded(e)) => s >= e,
        _ => false,
    }
}

type Layer = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// A write of the current record in a call layer: the store's index, the
/// key, and the layer's entry before it (`None`: the layer had no entry).
type Undo = (usize, Vec<u8>, Option<Option<Vec<u8>>>);

/// One store's layers over the committed store, oldest first: the
/// transaction being committed (frozen; empty unless a commit is in flight),
/// the open transaction's, and the call's.
struct LayeredStore {
    name: String,
    committing: Layer,
    txn: Layer,
    call: Layer,
}

impl LayeredStore {
    fn get(
        &self,
        committed: &dyn PartitionStore,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StateError> {
        if let Some(v) = self.call.get(key) {
            return Ok(v.clone());
        }
        if let Some(v) = self.txn.get(key) {
            return Ok(v.clone());
        }
        if let Some(v) = self.committing.get(key) {
            return Ok(v.clone());
        }
        committed.get(&self.name, key)
    }

    /// Entries in the bounds, newest layer winning, tombstones hidden.
    fn scan(
        &self,
        committed: &dyn PartitionStore,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        accept: impl Fn(&[u8]) -> bool,
        limit: usize,
    ) -> Result<Vec<Entry>, StateError> {
        let mut out = Vec::new();
        if bounds_empty(start, end) || limit == 0 {
            return Ok(out);
        }
        let upper = MergeUpper {
            layers: [&self.committing, &self.txn, &self.call]
                .into_iter()
                .filter(|l| !l.is_empty())
                .map(|l| l.range::<[u8], _>((start, end)).peekable())
                .collect(),
        };
        let mut upper = upper.peekable();
        let mut lower = committed.range(&self.name, start, end).peekable();
        enum Pick {
            Upper,
            UpperOverLower,
            Lower,
        }
        loop {
            // Take the smaller key; on a tie the upper layers win.
            let pick = match (upper.peek(), lower.peek()) {
                (None, None) => break,
                (Some(_), None) => Pick::Upper,
                (None, Some(_)) | (Some(_), Some(Err(_))) => Pick::Lower,
                (Some((uk, _)), Some(Ok((lk, _)))) => match uk.as_slice().cmp(lk.as_slice()) {
                    std::cmp::Ordering::Less => Pick::Upper,
                    std::cmp::Ordering::Equal => Pick::UpperOverLower,
                    std::cmp::Ordering::Greater => Pick::Lower,
                },
            };
            let (key, value) = match pick {
                Pick::Lower => lower.next().expect("peeked")?,
                Pick::Upper | Pick::UpperOverLower => {
                    if matches!(pick, Pick::UpperOverLower) {
                        lower.next();
                    }
                    match upper.next().expect("peeked") {
                        (k, Some(v)) => (k.clone(), v.clone()),
                        (_, None) => continue,
                    }
                }
            };
            if !accept(&key) {
                // Keys are ascending, and callers only reject keys past the
                // end of what they want.
                break;
            }
            out.push((key, value));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }
}

/// Merges the layers over the committed store, the newest winning on a key.
struct MergeUpper<'a> {
    /// Oldest first.
    layers: Vec<LayerRange<'a>>,
}

type LayerRange<'a> = std::iter::Peekable<btree_map::Range<'a, Vec<u8>, Option<Vec<u8>>>>;

impl<'a> Iterator for MergeUpper<'a> {
    type Item = (&'a Vec<u8>, &'a Option<Vec<u8>>);

    fn next(&mut self) -> Option<Self::Item> {
        let smallest = self
            .layers
            .iter_mut()
            .filter_map(|l| l.peek().map(|(k, _)| *k))
            .min()?;
        let mut newest = None;
        for l in &mut self.layers {
            if l.peek().is_some_and(|(k, _)| *k == smallest) {
                newest = l.next();
            }
        }
        newest
    }
}

/// The changes of one store since the last commit: what goes to its
/// changelog and, after the commit, to the committed store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreChanges {
    /// The store name.
    pub store: String,
    /// Latest value (or `None`: deleted) of every key written, ascending.
    pub changes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// The state of one task: one partition of every declared store.
pub struct TaskState {
    committed: Box<dyn PartitionStore>,
    stores: Vec<LayeredStore>,
    /// Most bytes of keys and values all stores may hold together
    /// (`limits.state-mb`): a write that would go past it is refused.
    limit: u64,
    /// What the transaction's writes change the committed bytes by, exactly
    /// (each write looks up the value it replaces).
    txn_delta: i64,
    /// The same for the call in progress.
    call_delta: i64,
    /// The same for the transaction being committed (frozen).
    committing_delta: i64,
    /// Whether a transaction's changes are frozen for its commit.
    frozen: bool,
    /// The call layer's writes since the current record began (store,
    /// key, the call layer's entry before), so that the record's writes
    /// can be taken back alone ([`TaskState::undo_record`]). Kept only
    /// after [`TaskState::mark_record`], until the call ends.
    record_undo: Vec<Undo>,
    /// Whether the call marks its records.
    marking: bool,
    /// `call_delta` when the current record began.
    record_delta_mark: i64,
    /// Bytes of keys and values the transaction's writes put in memory
    /// (each write counted, a key written twice twice: an upper bound),
    /// and the same for the transaction being committed.
    txn_written: u64,
    committing_written: u64,
}

impl TaskState {
    /// Opens the task's state over its committed stores, with no limit on
    /// its size ([`TaskState::limit_bytes`]).
    pub fn new(stores: &[String], committed: Box<dyn PartitionStore>) -> Self {
        Self {
            committed,
            stores: stores
                .iter()
                .map(|name| LayeredStore {
                    name: name.clone(),
                    committing: Layer::new(),
                    txn: Layer::new(),
                    call: Layer::new(),
                })
                .collect(),
            limit: u64::MAX,
            txn_delta: 0,
            call_delta: 0,
            committing_delta: 0,
            frozen: false,
            record_undo: Vec::new(),
            marking: false,
            record_delta_mark: 0,
            txn_written: 0,
            committing_written: 0,
        }
    }

    /// Bytes of keys and values held in memory until their commit: the
    /// open transaction's writes and those of the one being committed
    /// (`memory.rs`).
    pub fn held_bytes(&self) -> u64 {
        self.txn_written + self.committing_written
    }

    /// Refuses writes that would take the stores past `limit` bytes of
    /// keys and values together (deletes and shrinking writes always go
    /// through, so a full processor can make room).
    pub fn limit_bytes(mut self, limit: u64) -> Self {
        self.limit = limit;
        self
    }

    /// Bytes of keys and values the stores hold, as the processor sees
    /// them: committed, plus the transaction's and the call's writes.
    pub fn visible_bytes(&self) -> u64 {
        let pending = self.committing_delta + self.txn_delta + self.call_delta;
        self.committed.live_bytes().saturating_add_signed(pending)
    }

    /// Counts a write of `key` (`value`; `None`: a delete) in the call
    /// layer, refusing it when it grows the stores past the limit.
    fn account(
        &mut self,
        store: &str,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), AccessError> {
        let old = self.store(store)?.get(self.committed.as_ref(), key)?;
        let delta = entry_bytes(key, value) as i64 - entry_bytes(key, old.as_deref()) as i64;
        if delta > 0 && self.visible_bytes().saturating_add(delta as u64) > self.limit {
            return Err(StoreAccessError::StateFull(self.limit).into());
        }
        self.call_delta += delta;
        Ok(())
    }

    /// The committed stores (for restore and positions).
    pub fn committed(&self) -> &dyn PartitionStore {
        self.committed.as_ref()
    }

    /// Applies a write to the committed stores directly (restore).
    pub fn write_committed(&mut self, batch: &WriteBatch) -> Result<(), StateError> {
        self.committed.write(batch)
    }

    /// Records that every committed store is in sync with its log as of
    /// `at` ([`WriteBatch::synced`]).
    pub fn mark_synced(&mut self, at: SystemTime) -> Result<(), StateError> {
        let synced = self.stores.iter().map(|s| (s.name.clone(), at)).collect();
        self.committed.write(&WriteBatch {
            synced,
            ..WriteBatch::default()
        })
    }

    /// Empties a committed store for a restore in full
    /// ([`PartitionStore::wipe`]).
    pub fn wipe_committed(&mut self, store: &str) -> Result<u64, StateError> {
        self.committed.wipe(store)
    }

    /// Whether `name` is one of the task's stores.
    pub fn has_store(&self, name: &str) -> bool {
        self.store(name).is_ok()
    }

    /// Stores are few (a handful per processor): a linear search beats
    /// hashing the name.
    fn store(&self, name: &str) -> Result<&LayeredStore, StoreAccessError> {
        self.stores
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| StoreAccessError::UnknownStore(name.to_owned()))
    }

    fn store_index(&self, name: &str) -> Result<usize, StoreAccessError> {
        self.stores
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| StoreAccessError::UnknownStore(name.to_owned()))
    }

    /// Writes `value` (`None`: a tombstone) in the call layer, noting what
    /// it replaced while the call marks its records.
    fn write_call(
        &mut self,
        store: &str,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
    ) -> Result<(), AccessError> {
        let index = self.store_index(store)?;
        let call = &mut self.stores[index].call;
        if self.marking {
            let before = call.insert(key.clone(), value);
            self.record_undo.push((index, key, before));
        } else {
            call.insert(key, value);
        }
        Ok(())
    }

    /// Reads a key as the processor sees it (its own writes included).
    pub fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, AccessError> {
        Ok(self.store(store)?.get(self.committed.as_ref(), key)?)
    }

    /// Writes a key in the call layer.
    pub fn put(&mut self, store: &str, key: Vec<u8>, value: Vec<u8>) -> Result<(), AccessError> {
        if (key.len() + value.len()) as u64 > MAX_ENTRY_BYTES {
            return Err(StoreAccessError::TooLarge(MAX_ENTRY_BYTES).into());
        }
        self.account(store, &key, Some(&value))?;
        self.write_call(store, key, Some(value))
    }

    /// Deletes a key in the call layer.
    pub fn delete(&mut self, store: &str, key: Vec<u8>) -> Result<(), AccessError> {
        if key.len() as u64 > MAX_ENTRY_BYTES {
            return Err(StoreAccessError::TooLarge(MAX_ENTRY_BYTES).into());
        }
        self.account(store, &key, None)?;
        self.write_call(store, key, None)
    }

    /// Entries whose key starts with `prefix`, strictly after `after`.
    pub fn scan_prefix(
        &self,
        store: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, AccessError> {
        let s = self.store(store)?;
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        let end_key = prefix_successor(prefix);
        let end = match &end_key {
            Some(e) => Bound::Excluded(e.as_slice()),
            None => Bound::Unbounded,
        };
        Ok(s.scan(
            self.committed.as_ref(),
            start,
            end,
            |k| k.starts_with(prefix),
            limit,
        )?)
    }

    /// Entries with `start <= key < end`.
    pub fn scan_range(
        &self,
        store: &str,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, AccessError> {
        let s = self.store(store)?;
        let start = start.map_or(Bound::Unbounded, Bound::Included);
        let end = end.map_or(Bound::Unbounded, Bound::Excluded);
        Ok(s.scan(self.committed.as_ref(), start, end, |_| true, limit)?)
    }

    /// A record of the call begins: its writes can be taken back alone
    /// ([`TaskState::undo_record`]), those of the records before it stay.
    pub fn mark_record(&mut self) {
        self.marking = true;
        self.record_undo.clear();
        self.record_delta_mark = self.call_delta;
    }

    /// Takes back the writes of the record begun last
    /// ([`TaskState::mark_record`]); the call's earlier writes stay.
    pub fn undo_record(&mut self) {
        for (index, key, before) in self.record_undo.drain(..).rev() {
            let call = &mut self.stores[index].call;
            match before {
                Some(value) => call.insert(key, value),
                None => call.remove(&key),
            };
        }
        self.call_delta = self.record_delta_mark;
    }

    /// The call succeeded: its writes join the transaction.
    pub fn end_call(&mut self) {
        for s in &mut self.stores {
            let call = std::mem::take(&mut s.call);
            self.txn_written += call
                .iter()
                .map(|(k, v)| (k.len() + v.as_ref().map_or(0, Vec::len)) as u64)
                .sum::<u64>();
            s.txn.extend(call);
        }
        self.txn_delta += std::mem::take(&mut self.call_delta);
        self.end_marking();
    }

    /// The call failed: forget its writes.
    pub fn discard_call(&mut self) {
        for s in &mut self.stores {
            s.call.clear();
        }
        self.call_delta = 0;
        self.end_marking();
    }

    fn end_marking(&mut self) {
        self.marking = false;
        self.record_undo.clear();
        self.record_delta_mark = 0;
    }

    /// Whether any store has changes waiting for a commit.
    pub fn is_dirty(&self) -> bool {
        self.stores.iter().any(|s| !s.txn.is_empty())
    }

    /// The transaction's changes, per store (stores without changes left
    /// out), without clearing them: the EOS loop writes them to the
    /// changelogs, commits, then calls [`TaskState::apply_committed`].
    pub fn pending_changes(&self) -> Vec<StoreChanges> {
        self.stores
            .iter()
            .filter(|s| !s.txn.is_empty())
            .map(|s| StoreChanges {
                store: s.name.clone(),
                changes: s.txn.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            })
            .collect()
    }

    /// Freezes the open transaction's changes for its commit: they stay
    /// visible, and what comes next is a new transaction over them, which
    /// can go on while the commit is in flight (see
    /// [`TaskState::apply_committed`] and [`TaskState::abort`]).
    pub fn freeze(&mut self) {
        debug_assert!(!self.frozen, "one commit in flight at a time");
        for s in &mut self.stores {
            s.committing = std::mem::take(&mut s.txn);
        }
        self.committing_delta = std::mem::take(&mut self.txn_delta);
        self.committing_written = std::mem::take(&mut self.txn_written);
        self.frozen = true;
    }

    /// The transaction committed: move its changes (frozen, or the open
    /// transaction's if none are) into the committed stores in one atomic
    /// write, with the changelog positions its changelog records reached
    /// and, when given, every store in sync with its log as of `synced`.
    /// Changes made after the freeze stay pending.
    pub fn apply_committed(
        &mut self,
        positions: Vec<(String, i64)>,
        synced: Option<SystemTime>,
    ) -> Result<(), StateError> {
        if !self.frozen {
            self.freeze();
        }
        self.frozen = false;
        let changes: Vec<StoreChanges> = self
            .stores
            .iter_mut()
            .filter(|s| !s.committing.is_empty())
            .map(|s| StoreChanges {
                store: s.name.clone(),
                changes: std::mem::take(&mut s.committing).into_iter().collect(),
            })
            .collect();
        self.committing_delta = 0;
        self.committing_written = 0;
        let synced: Vec<(String, SystemTime)> = synced
            .map(|at| self.stores.iter().map(|s| (s.name.clone(), at)).collect())
            .unwrap_or_default();
        if changes.is_empty() && positions.is_empty() && synced.is_empty() {
            return Ok(());
        }
        self.committed.write(&WriteBatch {
            changes,
            positions,
            synced,
        })
    }

    /// The transaction aborted: forget everything since the last commit,
    /// a frozen transaction's changes included (its commit failed).
    pub fn abort(&mut self) {
        for s in &mut self.stores {
            s.committing.clear();
            s.txn.clear();
            s.call.clear();
        }
        self.committing_delta = 0;
        self.txn_delta = 0;
        self.call_delta = 0;
        self.txn_written = 0;
        self.committing_written = 0;
        self.frozen = false;
    }

    /// Every store's visible entries (committed plus pending), for dumps.
    pub fn dump(&self) -> Result<Vec<(String, Vec<Entry>)>, StateError> {
        self.stores
            .iter()
            .map(|s| {
                Ok((
                    s.name.clone(),
                    s.scan(
                        self.committed.as_ref(),
                        Bound::Unbounded,
                        Bound::Unbounded,
                        |_| true,
                        usize::MAX,
                    )?,
                ))
            })
            .collect()
    }
}

impl From<StateError> for AccessError {
    fn from(e: StateError) -> Self {
        AccessError::Failed(e.to_string())
    }
}

/// The smallest key greater than every key starting with `prefix`, or `None`
/// if there is none (the prefix is empty or all 0xff).
pub(crate) fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task_with(committed: &[(&str, &str)]) -> TaskState {
        let mut store = MemoryPartition::default();
        let changes: Vec<_> = committed
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), Some(v.as_bytes().to_vec())))
            .collect();
        store
            .write(&WriteBatch {
                changes: vec![StoreChanges {
                    store: "s".to_owned(),
                    changes,
                }],
                positions: vec![],
                synced: vec![],
            })
            .unwrap();
        TaskState::new(&["s".to_owned()], Box::new(store))
    }

    fn keys(entries: &[Entry]) -> Vec<String> {
        entries
            .iter()
            .map(|(k, v)| {
                format!(
                    "{}={}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v)
                )
            })
            .collect()
    }

    #[test]
    fn held_bytes_count_what_waits_for_a_commit_deletes_included() {
        let mut t = task_with(&[]);
        t.put("s", b"k1".to_vec(), vec![0; 100]).expect("put");
        // A delete of an absent key is held too (a tombstone to write).
        t.delete("s", vec![7; 50]).expect("delete");
        assert_eq!(t.held_bytes(), 0, "the call's writes count once it ends");
        t.end_call();
        assert_eq!(t.held_bytes(), 2 + 100 + 50);
        t.freeze();
        t.put("s", b"k2".to_vec(), vec![0; 10]).expect("put");
        t.end_call();
        assert_eq!(t.held_bytes(), 152 + 12, "the frozen and the open one");
        t.apply_committed(vec![], None).expect("commit");
        assert_eq!(t.held_bytes(), 12, "the committed ones are given back");
        t.abort();
        assert_eq!(t.held_bytes(), 0);
    }

    #[test]
    fn state_limit_counts_replaced_values_and_lets_deletes_through() {
        // Committed: a=1 (2 bytes); at most 10 bytes.
        let mut t = task_with(&[("a", "1")]).limit_bytes(10);
        let full = Err(AccessError::Refused(StoreAccessError::StateFull(10)));
        assert_eq!(t.put("s", b"b".to_vec(), b"12345678".to_vec()), full);
        t.put("s", b"b".to_vec(), b"1234567".to_vec()).unwrap();
        assert_eq!(t.visible_bytes(), 10);
        // Growing a is refused; deleting it makes room; shrinking and
        // same-size writes go through at the limit.
        assert_eq!(t.put("s", b"a".to_vec(), b"12".to_vec()), full);
        t.delete("s", b"a".to_vec()).unwrap();
        assert_eq!(t.visible_bytes(), 8);
        assert_eq!(t.put("s", b"a".to_vec(), b"12".to_vec()), full);
        t.put("s", b"a".to_vec(), b"9".to_vec()).unwrap();
        assert_eq!(t.visible_bytes(), 10);
        // A failed call's writes no longer count.
        t.discard_call();
        assert_eq!(t.visible_bytes(), 2);
        t.put("s", b"b".to_vec(), b"1234567".to_vec()).unwrap();
        t.end_call();
        t.apply_committed(vec![], None).unwrap();
        assert_eq!(t.committed().live_bytes(), 10);
        assert_eq!(t.visible_bytes(), 10);
        t.put("s", b"b".to_vec(), b"7654321".to_vec()).unwrap();
        t.end_call();
        t.abort();
        assert_eq!(t.visible_bytes(), 10);
    }

    #[test]
    fn reads_see_call_then_txn_then_committed() {
        let mut t = task_with(&[("a", "1"), ("b", "1")]);
        t.put("s", b"a".to_vec(), b"2".to_vec()).unwrap();
        t.end_call();
        t.put("s", b"a".to_vec(), b"3".to_vec()).unwrap();
        assert_eq!(t.get("s", b"a").unwrap(), Some(b"3".to_vec()));
        t.discard_call();
        assert_eq!(t.get("s", b"a").unwrap(), Some(b"2".to_vec()));
        t.abort();
        assert_eq!(t.get("s", b"a").unwrap(), Some(b"1".to_vec()));
        assert!(!t.is_dirty());
    }

    #[test]
    fn scans_merge_layers_and_hide_tombstones() {
        let mut t = task_with(&[("p1", "c"), ("p2", "c"), ("p4", "c"), ("q", "c")]);
        t.delete("s", b"p2".to_vec()).unwrap();
        t.put("s", b"p3".to_vec(), b"t".to_vec()).unwrap();
        t.end_call();
        t.put("s", b"p4".to_vec(), b"call".to_vec()).unwrap();
        t.put("s", b"p0".to_vec(), b"call".to_vec()).unwrap();
        let all = t.scan_prefix("s", b"p", None, 100).unwrap();
        assert_eq!(keys(&all), ["p0=call", "p1=c", "p3=t", "p4=call"]);
        let page = t.scan_prefix("s", b"p", Some(b"p1"), 2).unwrap();
        assert_eq!(keys(&page), ["p3=t", "p4=call"]);
        let range = t.scan_range("s", Some(b"p1"), Some(b"p4"), 100).unwrap();
        assert_eq!(keys(&range), ["p1=c", "p3=t"]);
        assert!(
            t.scan_range("s", Some(b"z"), Some(b"a"), 10)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn undo_record_takes_back_the_last_records_writes_only() {
        let mut t = task_with(&[("a", "committed"), ("b", "committed")]);
        // Record 0 of the call.
        t.mark_record();
        t.put("s", b"a".to_vec(), b"r0".to_vec()).unwrap();
        t.put("s", b"new".to_vec(), b"r0".to_vec()).unwrap();
        let after_r0 = t.visible_bytes();
        // Record 1 overwrites, deletes and adds; then fails.
        t.mark_record();
        t.put("s", b"a".to_vec(), b"r1-longer".to_vec()).unwrap();
        t.delete("s", b"b".to_vec()).unwrap();
        t.put("s", b"c".to_vec(), b"r1".to_vec()).unwrap();
        t.put("s", b"c".to_vec(), b"r1-again".to_vec()).unwrap();
        t.undo_record();
        assert_eq!(t.visible_bytes(), after_r0);
        t.end_call();
        let all = t.scan_prefix("s", b"", None, 100).unwrap();
        assert_eq!(keys(&all), ["a=r0", "b=committed", "new=r0"]);
        let pending = t.pending_changes();
        assert_eq!(pending[0].changes.len(), 2, "{pending:?}");
    }

    #[test]
    fn commit_moves_only_successful_calls() {
        let mut t = task_with(&[]);
        t.put("s", b"k".to_vec(), b"v".to_vec()).unwrap();
        t.end_call();
        t.put("s", b"bad".to_vec(), b"v".to_vec()).unwrap();
        t.discard_call();
        t.delete("s", b"gone".to_vec()).unwrap();
        t.end_call();
        let pending = t.pending_changes();
        assert_eq!(
            pending,
            vec![StoreChanges {
                store: "s".to_owned(),
                changes: vec![
                    (b"gone".to_vec(), None),
                    (b"k".to_vec(), Some(b"v".to_vec()))
                ],
            }]
        );
        t.apply_committed(vec![("s".to_owned(), 42)], None).unwrap();
        assert!(!t.is_dirty());
        assert_eq!(t.committed().changelog_position("s").unwrap(), Some(42));
        assert_eq!(t.get("s", b"k").unwrap(), Some(b"v".to_vec()));
    }

    #[test]
    fn a_frozen_transaction_stays_visible_under_the_next_one() {
        let mut t = task_with(&[("a", "1"), ("b", "1"), ("c", "1")]);
        t.put("s", b"a".to_vec(), b"2".to_vec()).unwrap();
        t.delete("s", b"b".to_vec()).unwrap();
        t.end_call();
        t.freeze();
        assert!(
            !t.is_dirty(),
            "frozen changes are not the open transaction's"
        );
        // The next transaction reads through the frozen one.
        assert_eq!(t.get("s", b"a").unwrap(), Some(b"2".to_vec()));
        assert_eq!(t.get("s", b"b").unwrap(), None);
        t.put("s", b"c".to_vec(), b"3".to_vec()).unwrap();
        t.put("s", b"d".to_vec(), b"3".to_vec()).unwrap();
        t.end_call();
        let all = t.scan_prefix("s", b"", None, 100).unwrap();
        assert_eq!(keys(&all), ["a=2", "c=3", "d=3"]);
        // Only the next transaction's changes go to the next changelog.
        let pending = t.pending_changes();
        assert_eq!(pending[0].changes.len(), 2);
        // The frozen one commits; the next stays pending over it.
        t.apply_committed(vec![("s".to_owned(), 7)], None).unwrap();
        assert_eq!(t.committed().get("s", b"a").unwrap(), Some(b"2".to_vec()));
        assert_eq!(t.committed().get("s", b"c").unwrap(), Some(b"1".to_vec()));
        assert!(t.is_dirty());
        assert_eq!(t.visible_bytes(), 6);
        // An abort with a commit in flight forgets both.
        t.freeze();
        t.put("s", b"a".to_vec(), b"9".to_vec()).unwrap();
        t.end_call();
        t.abort();
        assert_eq!(
            keys(&t.scan_prefix("s", b"", None, 100).unwrap()),
            ["a=2", "c=1"]
        );
        assert_eq!(t.visible_bytes(), 4);
    }

    #[test]
    fn unknown_store_is_refused() {
        let t = task_with(&[]);
        let err = t.get("nope", b"k").unwrap_err().to_string();
        assert!(err.contains("\"nope\""), "{err}");
    }

    #[test]
    fn prefix_successor_handles_ff() {
        assert_eq!(prefix_successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_successor(&[0x61, 0xff]), Some(vec![0x62]));
        assert_eq!(prefix_successor(&[0xff, 0xff]), None);
        assert_eq!(prefix_successor(b""), None);
    }
}
