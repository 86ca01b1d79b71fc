//! What a guest's calls do to the host, as one task collects it: state
//! writes through the task's layers (tables read-only, window stores only
//! through the window calls), outputs by alias, each call's bytes counted
//! against [`MAX_CALL_BYTES`]. The window stores' semantics are
//! [`WindowStore`]'s.

use std::sync::Arc;

use super::{MAX_CALL_BYTES, MAX_OUTPUT_BYTES};
use crate::sandbox::CallFailure;
use crate::schema::Codecs;
use crate::state::TaskState;
use crate::state::window::{self, WindowStore};
use crate::types::{
    AccessError, Effects, EmitError, Entry, Header, OutputRecord, StoreAccessError, WindowEntry,
    WindowKey,
};

/// The effects of a task's calls, and the state they go to.
pub(super) struct TaskEffects {
    pub(super) state: TaskState,
    /// Window stores and their retention, ms.
    pub(super) windows: Vec<(String, u64)>,
    /// Table stores (read-only to the guest).
    pub(super) tables: Vec<String>,
    pub(super) outputs: Vec<(String, Arc<str>)>,
    pub(super) call_outputs: Vec<OutputRecord>,
    /// Bytes of outputs and state writes in the call in progress.
    pub(super) call_bytes: u64,
    /// Whether the call went past [`MAX_CALL_BYTES`].
    pub(super) over_budget: bool,
    /// Whether a write of the call was refused for `limits.state-mb`.
    pub(super) state_full: bool,
    /// `call_outputs.len()` and `call_bytes` when the current record of
    /// the call began (`begin-record`).
    pub(super) record_mark: (usize, u64),
    /// How output values are encoded (`None`: bytes as they are).
    pub(super) codecs: Option<Arc<Codecs>>,
    /// Why an output of the call could not be encoded in its topic's
    /// format: the call fails, and its record goes to the error policy.
    pub(super) unencodable: Option<String>,
}

impl TaskEffects {
    /// Counts `size` more bytes for the call; false (and every later
    /// request of the call refused) past [`MAX_CALL_BYTES`].
    fn spend(&mut self, size: u64) -> bool {
        if self.over_budget || self.call_bytes + size > MAX_CALL_BYTES {
            self.over_budget = true;
            return false;
        }
        self.call_bytes += size;
        true
    }

    /// Refuses writes to a table, and the key-value calls on a window store.
    fn writable(&self, store: &str) -> Result<(), AccessError> {
        if self.tables.iter().any(|t| t == store) {
            return Err(StoreAccessError::ReadOnly(store.to_owned()).into());
        }
        self.key_value(store)
    }

    /// Refuses the key-value calls on a window store.
    fn key_value(&self, store: &str) -> Result<(), AccessError> {
        if self.windows.iter().any(|(name, _)| name == store) {
            return Err(StoreAccessError::WrongKind {
                store: store.to_owned(),
                window: true,
            }
            .into());
        }
        Ok(())
    }

    /// A window store's retention; refuses the window calls on any other.
    fn retention(&self, store: &str) -> Result<u64, AccessError> {
        if let Some((_, retention)) = self.windows.iter().find(|(name, _)| name == store) {
            return Ok(*retention);
        }
        if self.tables.iter().any(|t| t == store) {
            return Err(StoreAccessError::WrongKind {
                store: store.to_owned(),
                window: false,
            }
            .into());
        }
        if !self.state.has_store(store) {
            return Err(StoreAccessError::UnknownStore(store.to_owned()).into());
        }
        Err(StoreAccessError::WrongKind {
            store: store.to_owned(),
            window: false,
        }
        .into())
    }

    fn write(&mut self, store: &str, key: Vec<u8>, value: Vec<u8>) -> Result<(), AccessError> {
        if !self.spend((key.len() + value.len()) as u64) {
            return Err(AccessError::Refused(StoreAccessError::TooLarge(
                MAX_CALL_BYTES,
            )));
        }
        let put = self.state.put(store, key, value);
        if matches!(
            put,
            Err(AccessError::Refused(StoreAccessError::StateFull(_)))
        ) {
            self.state_full = true;
        }
        put
    }

    /// A delete, counted against the call's [`MAX_CALL_BYTES`] as a put is:
    /// the host holds each deleted key until the commit, whether or not
    /// the key existed (before: one record deleting 1,500 absent 1 MB keys
    /// took the host to 2.9 GB).
    fn forget(&mut self, store: &str, key: Vec<u8>) -> Result<(), AccessError> {
        if !self.spend(key.len() as u64) {
            return Err(AccessError::Refused(StoreAccessError::TooLarge(
                MAX_CALL_BYTES,
            )));
        }
        self.state.delete(store, key)
    }

    /// Window store `store` (refused unless it is one).
    fn window_store<'a>(&'a self, store: &'a str) -> Result<WindowStore<'a>, AccessError> {
        Ok(WindowStore {
            retention: self.retention(store)?,
            state: &self.state,
            store,
        })
    }
}

impl Effects for TaskEffects {
    fn record_begun(&mut self) {
        self.state.mark_record();
        self.record_mark = (self.call_outputs.len(), self.call_bytes);
    }

    fn get(&mut self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, AccessError> {
        self.key_value(store)?;
        self.state.get(store, key)
    }
    fn put(&mut self, store: &str, key: Vec<u8>, value: Vec<u8>) -> Result<(), AccessError> {
        self.writable(store)?;
        self.write(store, key, value)
    }
    fn delete(&mut self, store: &str, key: Vec<u8>) -> Result<(), AccessError> {
        self.writable(store)?;
        self.forget(store, key)
    }
    fn scan_prefix(
        &mut self,
        store: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, AccessError> {
        self.key_value(store)?;
        self.state.scan_prefix(store, prefix, after, limit)
    }
    fn scan_range(
        &mut self,
        store: &str,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, AccessError> {
        self.key_value(store)?;
        self.state.scan_range(store, start, end, limit)
    }
    fn window_put(
        &mut self,
        store: &str,
        w: WindowKey,
        value: Vec<u8>,
        now: Option<i64>,
    ) -> Result<(), AccessError> {
        if window::expired(w.start, now, self.retention(store)?) {
            // Kafka Streams drops a write to an expired window too.
            return Ok(());
        }
        self.write(store, window::encode(&w.key, w.start), value)
    }
    fn window_get(
        &mut self,
        store: &str,
        w: WindowKey,
        now: Option<i64>,
    ) -> Result<Option<Vec<u8>>, AccessError> {
        if window::expired(w.start, now, self.retention(store)?) {
            return Ok(None);
        }
        self.state.get(store, &window::encode(&w.key, w.start))
    }
    fn window_delete(&mut self, store: &str, w: WindowKey) -> Result<(), AccessError> {
        self.retention(store)?;
        self.forget(store, window::encode(&w.key, w.start))
    }
    fn window_fetch(
        &mut self,
        store: &str,
        key: &[u8],
        from: i64,
        to: i64,
        now: Option<i64>,
    ) -> Result<Vec<WindowEntry>, AccessError> {
        self.window_store(store)?.fetch(key, from, to, now)
    }
    fn window_fetch_all(
        &mut self,
        store: &str,
        from: i64,
        to: i64,
        after: Option<WindowKey>,
        limit: usize,
        now: Option<i64>,
    ) -> Result<Vec<WindowEntry>, AccessError> {
        self.window_store(store)?
            .fetch_all(from, to, after, limit, now)
    }
    fn emit(
        &mut self,
        alias: &str,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<Header>,
        timestamp: i64,
    ) -> Result<(), EmitError> {
        let topic = self
            .outputs
            .iter()
            .find(|(a, _)| a == alias)
            .map(|(_, t)| t.clone())
            .ok_or_else(|| EmitError::UnknownAlias(alias.to_owned()))?;
        let value = match (&self.codecs, value) {
            (Some(codecs), Some(v)) => match codecs.encode(alias, &v) {
                None => Some(v),
                Some(Ok(encoded)) => Some(encoded),
                Some(Err(why)) => {
                    // Not the guest's to ignore: the call fails (`Task::refusal`).
                    if self.unencodable.is_none() {
                        self.unencodable = Some(format!(
                            "an output to `{alias}` ({topic}) does not fit its format: {why}"
                        ));
                    }
                    return Ok(());
                }
            },
            (_, v) => v,
        };
        let record = OutputRecord {
            topic,
            key,
            value,
            headers,
            timestamp: Some(timestamp),
        };
        if record.size() as u64 > MAX_OUTPUT_BYTES {
            return Err(EmitError::TooLarge(MAX_OUTPUT_BYTES));
        }
        if !self.spend(record.size() as u64) {
            return Err(EmitError::TooLarge(MAX_CALL_BYTES));
        }
        self.call_outputs.push(record);
        Ok(())
    }
}

impl super::Task {
    /// A call's result, failed if the host refused one of its writes (past
    /// the call's byte budget or `limits.state-mb`), whatever the guest made
    /// of the refusal.
    pub(super) fn refusal(&self, result: Result<(), CallFailure>) -> Result<(), CallFailure> {
        let fx = self.fx_ref();
        let refused = if let Some(why) = &fx.unencodable {
            Some(why.clone())
        } else if fx.over_budget {
            Some(format!(
                "the outputs and state writes of one call exceeded the host's limit of {} MiB: \
                 the record emits or writes too much at once",
                MAX_CALL_BYTES >> 20
            ))
        } else if fx.state_full {
            Some(format!(
                "{} (partition {} holds {} bytes)",
                StoreAccessError::StateFull(self.config.state_limit_bytes),
                self.partition,
                fx.state.visible_bytes()
            ))
        } else {
            None
        };
        if let Some(message) = refused {
            // Whatever the guest made of the refusals, the call failed.
            return Err(match result {
                Err(CallFailure::Rejected { index, .. }) => {
                    CallFailure::Rejected { index, message }
                }
                // The refusal is why: a guest that unwraps it traps.
                Err(CallFailure::Trapped { index, reason }) => CallFailure::Trapped {
                    index,
                    reason: format!("{message}; then the guest trapped: {reason}"),
                },
                Err(host @ CallFailure::Host(_)) => host,
                Ok(()) => CallFailure::Rejected {
                    index: None,
                    message,
                },
            });
        }
        result
    }
}
