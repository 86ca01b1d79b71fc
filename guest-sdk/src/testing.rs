//! Run processors natively, in unit tests, against an in-memory host.
//!
//! [`TestHost`] keeps state stores in memory, records what the processor
//! emits and logs, and, like the real host, discards everything a record did
//! when processing it fails.
//!
//! ```
//! use onceflow_sdk::testing::TestHost;
//! use onceflow_sdk::{Context, Error, Processor, Record};
//!
//! struct Echo;
//!
//! impl Processor for Echo {
//!     fn process(ctx: &mut Context, record: &Record) -> Result<(), Error> {
//!         let text = record.value_str()?;
//!         ctx.store("seen").put(text, "1")?;
//!         ctx.emit("out", text, text.to_uppercase())
//!     }
//! }
//!
//! let mut host = TestHost::new().with_store("seen").with_output("out");
//! host.process::<Echo>(&Record { value: Some(b"hi".to_vec()), ..Record::default() })
//!     .unwrap();
//! assert_eq!(host.get("seen", "hi"), Some(b"1".to_vec()));
//! assert_eq!(host.emitted()[0].value.as_deref(), Some(&b"HI"[..]));
//!
//! // A failing record leaves no mark.
//! let error = host.process::<Echo>(&Record::default()).unwrap_err();
//! assert_eq!(error.to_string(), "record has no value");
//! assert_eq!(host.emitted().len(), 1);
//! ```

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};

use crate::Processor;
use crate::bindings::onceflow::processor::types::{
    Entry, OutputError, StateError, WindowEntry, WindowKey,
};
use crate::context::Context;
use crate::error::Error;
use crate::host::Host;
use crate::log::Level;
use crate::record::{Config, Record};

type Stores = BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>;
type WindowStores = BTreeMap<String, BTreeMap<(Vec<u8>, i64), Vec<u8>>>;

thread_local! {
    /// What `schedule_punctuation` asked for natively, for `TestHost::init`.
    static SCHEDULED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// `schedule_punctuation` outside WebAssembly.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn scheduled(ms: u64) {
    SCHEDULED.with(|s| s.set((ms > 0).then_some(ms)));
}

/// A record emitted by a processor under test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// The output alias it was emitted to.
    pub alias: String,
    /// The key, or `None` for a null key.
    pub key: Option<Vec<u8>>,
    /// The value, or `None` for a tombstone.
    pub value: Option<Vec<u8>>,
    /// The headers, in order.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// An in-memory stand-in for the Onceflow host.
///
/// By default any store name and output alias is accepted; once one is
/// declared with [`TestHost::with_store`] or [`TestHost::with_output`], the
/// others are rejected as the real host rejects names missing from the
/// manifest.
#[derive(Debug, Default)]
pub struct TestHost {
    stores: RefCell<Stores>,
    emitted: RefCell<Vec<Emitted>>,
    logs: RefCell<Vec<(Level, String)>>,
    declared_stores: BTreeSet<String>,
    declared_outputs: BTreeSet<String>,
    config: Config,
    windows: RefCell<WindowStores>,
    stream_time: Cell<Option<i64>>,
    punctuate_every: Cell<Option<u64>>,
    late: RefCell<Vec<String>>,
}

impl TestHost {
    /// An empty host that accepts every store and alias.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares the store `name`, as `stores` in the manifest does.
    pub fn with_store(mut self, name: impl Into<String>) -> Self {
        self.declared_stores.insert(name.into());
        self
    }

    /// Declares the output alias `alias`, as `[outputs]` in the manifest
    /// does.
    pub fn with_output(mut self, alias: impl Into<String>) -> Self {
        self.declared_outputs.insert(alias.into());
        self
    }

    /// Sets `key` in the processor's configuration (the manifest's
    /// `[config]` table).
    pub fn with_config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        let mut entries: Vec<(String, String)> = self
            .config
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        entries.push((key.into(), value.into()));
        self.config = Config::from(entries);
        self
    }

    /// Sets `key` to `value` in `store` before the test runs.
    pub fn with_state(
        self,
        store: impl Into<String>,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Self {
        self.stores
            .borrow_mut()
            .entry(store.into())
            .or_default()
            .insert(key.as_ref().to_vec(), value.as_ref().to_vec());
        self
    }

    /// Calls `P::init` with the configuration, and keeps the punctuation
    /// schedule it asks for.
    pub fn init<P: Processor>(&self) -> Result<(), Error> {
        SCHEDULED.with(|s| s.set(None));
        let result = P::init(&self.config);
        self.punctuate_every.set(SCHEDULED.with(Cell::take));
        result
    }

    /// Calls `P::process` on `record`, after counting its timestamp in the
    /// stream time; then, if `init` scheduled punctuation and stream time
    /// reached a scheduled point, `P::punctuate`, as the host does. When
    /// processing fails, the state writes and emitted records of this call
    /// are discarded, as the real host does; log lines are kept. (Windows
    /// never expire here: the host's retention is not modelled.)
    pub fn process<P: Processor>(&mut self, record: &Record) -> Result<(), Error> {
        let stores = self.stores.borrow().clone();
        let windows = self.windows.borrow().clone();
        let emitted = self.emitted.borrow().len();
        let before = self.stream_time.get();
        if record.timestamp >= 0 && before.is_none_or(|t| record.timestamp > t) {
            self.stream_time.set(Some(record.timestamp));
        }
        let result = {
            let mut ctx = Context::new(&*self, &self.config, record);
            P::process(&mut ctx, record)
        };
        if result.is_err() {
            *self.stores.get_mut() = stores;
            *self.windows.get_mut() = windows;
            self.emitted.get_mut().truncate(emitted);
            return result;
        }
        let (Some(every), Some(now)) = (self.punctuate_every.get(), self.stream_time.get()) else {
            return result;
        };
        let every = every.min(i64::MAX as u64) as i64;
        let due = before.is_none_or(|b| now >= (b.div_euclid(every) + 1).saturating_mul(every));
        if due {
            self.punctuate::<P>(now)
        } else {
            result
        }
    }

    /// Calls `P::punctuate` for stream time `now`, with the same rollback
    /// on failure as [`TestHost::process`].
    pub fn punctuate<P: Processor>(&mut self, now: i64) -> Result<(), Error> {
        let stores = self.stores.borrow().clone();
        let windows = self.windows.borrow().clone();
        let emitted = self.emitted.borrow().len();
        let result = {
            let mut ctx = Context::for_punctuation(&*self, &self.config, now);
            P::punctuate(&mut ctx, now)
        };
        if result.is_err() {
            *self.stores.get_mut() = stores;
            *self.windows.get_mut() = windows;
            self.emitted.get_mut().truncate(emitted);
        }
        result
    }

    /// The stream time: the largest record timestamp processed so far.
    pub fn stream_time(&self) -> Option<i64> {
        self.stream_time.get()
    }

    /// The messages of the records reported late, in order.
    pub fn late_records(&self) -> Vec<String> {
        self.late.borrow().clone()
    }

    /// The windows of window store `store`, in (key, start) order.
    pub fn windows(&self, store: &str) -> Vec<crate::Window> {
        self.windows
            .borrow()
            .get(store)
            .map(|ws| {
                ws.iter()
                    .map(|((key, start), value)| crate::Window {
                        key: key.clone(),
                        start: *start,
                        value: value.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Makes a [`Context`] for `record`, to test helper functions that take
    /// one.
    pub fn context(&self, record: &Record) -> Context<'_> {
        Context::new(self, &self.config, record)
    }

    /// The value of `key` in `store`.
    pub fn get(&self, store: &str, key: impl AsRef<[u8]>) -> Option<Vec<u8>> {
        self.stores
            .borrow()
            .get(store)
            .and_then(|entries| entries.get(key.as_ref()))
            .cloned()
    }

    /// All entries of `store`, in key order.
    pub fn entries(&self, store: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.stores
            .borrow()
            .get(store)
            .map(|entries| {
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Everything emitted so far, in order.
    pub fn emitted(&self) -> Vec<Emitted> {
        self.emitted.borrow().clone()
    }

    /// Removes and returns everything emitted so far.
    pub fn take_emitted(&mut self) -> Vec<Emitted> {
        std::mem::take(self.emitted.get_mut())
    }

    /// Every line logged through [`Context::log`], in order.
    pub fn logs(&self) -> Vec<(Level, String)> {
        self.logs.borrow().clone()
    }

    fn check_store(&self, store: &str) -> Result<(), StateError> {
        if self.declared_stores.is_empty() || self.declared_stores.contains(store) {
            Ok(())
        } else {
            Err(StateError::UnknownStore(store.to_owned()))
        }
    }
}

impl Host for TestHost {
    fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.check_store(store)?;
        Ok(TestHost::get(self, store, key))
    }

    fn put(&self, store: &str, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.check_store(store)?;
        self.stores
            .borrow_mut()
            .entry(store.to_owned())
            .or_default()
            .insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn delete(&self, store: &str, key: &[u8]) -> Result<(), StateError> {
        self.check_store(store)?;
        if let Some(entries) = self.stores.borrow_mut().get_mut(store) {
            entries.remove(key);
        }
        Ok(())
    }

    fn scan_prefix(
        &self,
        store: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<Entry>, StateError> {
        self.check_store(store)?;
        Ok(self
            .entries(store)
            .into_iter()
            .filter(|(key, _)| key.starts_with(prefix))
            .filter(|(key, _)| after.is_none_or(|after| key.as_slice() > after))
            .take(limit as usize)
            .map(|(key, value)| Entry { key, value })
            .collect())
    }

    fn scan_range(
        &self,
        store: &str,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<Entry>, StateError> {
        self.check_store(store)?;
        Ok(self
            .entries(store)
            .into_iter()
            .filter(|(key, _)| start.is_none_or(|start| key.as_slice() >= start))
            .filter(|(key, _)| end.is_none_or(|end| key.as_slice() < end))
            .take(limit as usize)
            .map(|(key, value)| Entry { key, value })
            .collect())
    }

    fn emit(
        &self,
        alias: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&str, &[u8])],
    ) -> Result<(), OutputError> {
        if !self.declared_outputs.is_empty() && !self.declared_outputs.contains(alias) {
            return Err(OutputError::UnknownAlias(alias.to_owned()));
        }
        self.emitted.borrow_mut().push(Emitted {
            alias: alias.to_owned(),
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
                .collect(),
        });
        Ok(())
    }

    fn log(&self, level: Level, message: &str) {
        self.logs.borrow_mut().push((level, message.to_owned()));
    }

    fn window_put(
        &self,
        store: &str,
        key: &[u8],
        start: i64,
        value: &[u8],
    ) -> Result<(), StateError> {
        self.windows
            .borrow_mut()
            .entry(store.to_owned())
            .or_default()
            .insert((key.to_vec(), start), value.to_vec());
        Ok(())
    }

    fn window_get(
        &self,
        store: &str,
        key: &[u8],
        start: i64,
    ) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self
            .windows
            .borrow()
            .get(store)
            .and_then(|ws| ws.get(&(key.to_vec(), start)))
            .cloned())
    }

    fn window_delete(&self, store: &str, key: &[u8], start: i64) -> Result<(), StateError> {
        if let Some(ws) = self.windows.borrow_mut().get_mut(store) {
            ws.remove(&(key.to_vec(), start));
        }
        Ok(())
    }

    fn window_fetch(
        &self,
        store: &str,
        key: &[u8],
        earliest: i64,
        latest: i64,
    ) -> Result<Vec<WindowEntry>, StateError> {
        Ok(self
            .windows(store)
            .into_iter()
            .filter(|w| w.key == key && (earliest..=latest).contains(&w.start))
            .map(|w| WindowEntry {
                key: w.key,
                start: w.start,
                value: w.value,
            })
            .collect())
    }

    fn window_fetch_all(
        &self,
        store: &str,
        earliest: i64,
        latest: i64,
        after: Option<&WindowKey>,
        limit: u32,
    ) -> Result<Vec<WindowEntry>, StateError> {
        Ok(self
            .windows(store)
            .into_iter()
            .filter(|w| (earliest..=latest).contains(&w.start))
            .filter(|w| after.is_none_or(|a| (&w.key, w.start) > (&a.key, a.start)))
            .take(limit as usize)
            .map(|w| WindowEntry {
                key: w.key,
                start: w.start,
                value: w.value,
            })
            .collect())
    }

    fn stream_time(&self) -> Option<i64> {
        self.stream_time.get()
    }

    fn late_record(&self, _index: u32, message: &str) {
        self.late.borrow_mut().push(message.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn record(offset: i64) -> Record {
        Record {
            topic: "t".into(),
            offset,
            ..Record::default()
        }
    }

    #[test]
    fn scans_page_through_every_entry() {
        let mut host = TestHost::new();
        for i in 0..10u8 {
            host = host.with_state("s", [b'k', i], [i]);
        }
        host = host.with_state("s", b"other", b"x");
        let ctx = host.context(&record(0));
        let store = ctx.store("s");
        let keys: Vec<Vec<u8>> = store
            .scan_prefix(b"k")
            .page_size(3)
            .map(|entry| entry.unwrap().0)
            .collect();
        assert_eq!(keys, (0..10u8).map(|i| vec![b'k', i]).collect::<Vec<_>>());
        let keys: Vec<Vec<u8>> = store
            .scan_range([b'k', 2], [b'k', 7])
            .page_size(2)
            .map(|entry| entry.unwrap().0)
            .collect();
        assert_eq!(keys, (2..7u8).map(|i| vec![b'k', i]).collect::<Vec<_>>());
        assert_eq!(store.scan_from(b"o").count(), 1);
        assert_eq!(store.scan_prefix(b"").count(), 11);
    }

    #[test]
    fn integers_are_stored_as_decimal_text() {
        let host = TestHost::new();
        let ctx = host.context(&record(0));
        let store = ctx.store("s");
        assert_eq!(store.get_i64("n").unwrap(), None);
        store.put_i64("n", -42).unwrap();
        assert_eq!(host.get("s", "n"), Some(b"-42".to_vec()));
        assert_eq!(store.get_i64("n").unwrap(), Some(-42));
        store.put("n", "x").unwrap();
        let error = store.get_i64("n").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidData);
        assert_eq!(
            error.to_string(),
            "state store \"s\": the value of key \"n\" is not a decimal integer"
        );
        store.delete("n").unwrap();
        assert_eq!(store.get_string("n").unwrap(), None);
    }

    #[test]
    fn undeclared_names_are_rejected() {
        let host = TestHost::new().with_store("a").with_output("out");
        let ctx = host.context(&record(0));
        let error = ctx.store("b").get("k").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::UnknownStore);
        let error = ctx.emit("other", "k", "v").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::UnknownAlias);
        ctx.emit_with("out", None, Some(b"v"), &[("h", b"1")])
            .unwrap();
        assert_eq!(host.emitted()[0].headers, vec![("h".into(), b"1".to_vec())]);
    }

    #[test]
    fn randomness_is_deterministic_per_record() {
        let host = TestHost::new();
        let draw = |offset| {
            let mut ctx = host.context(&record(offset));
            [ctx.random_u64(), ctx.random_u64()]
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        let [a, b] = draw(1);
        assert_ne!(a, b);
    }

    struct Failing;

    impl Processor for Failing {
        fn init(config: &Config) -> Result<(), Error> {
            match config.get("mode") {
                Some("ok") => Ok(()),
                _ => Err(Error::new("mode must be ok")),
            }
        }

        fn process(ctx: &mut Context, _record: &Record) -> Result<(), Error> {
            ctx.store("s").put("k", "v")?;
            ctx.emit("out", "k", "v")?;
            ctx.log(Level::Warn, "about to fail");
            Err(Error::new("failed on purpose"))
        }
    }

    #[test]
    fn a_failed_record_leaves_no_mark() {
        let mut host = TestHost::new().with_config("mode", "ok");
        host.init::<Failing>().unwrap();
        let error = host.process::<Failing>(&record(0)).unwrap_err();
        assert_eq!(error.to_string(), "failed on purpose");
        assert_eq!(host.get("s", "k"), None);
        assert!(host.emitted().is_empty());
        assert_eq!(host.logs(), vec![(Level::Warn, "about to fail".into())]);
        assert!(TestHost::new().init::<Failing>().is_err());
    }
}
