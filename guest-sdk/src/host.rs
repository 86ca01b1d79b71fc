//! The seam between the SDK and whatever runs it: the Onceflow host (through
//! the component's imports) or, in native tests, [`TestHost`].
//!
//! [`TestHost`]: crate::testing::TestHost

use crate::bindings::onceflow::processor::types::{
    Entry, Header, OutputError, StateError, WindowEntry, WindowKey,
};
use crate::bindings::onceflow::processor::{context, log as wit_log, output, state, windows};
use crate::log::Level;

/// What a [`Context`](crate::Context) needs from its host: one method per
/// import of the `processor` world.
pub(crate) trait Host {
    fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError>;
    fn put(&self, store: &str, key: &[u8], value: &[u8]) -> Result<(), StateError>;
    fn delete(&self, store: &str, key: &[u8]) -> Result<(), StateError>;
    fn scan_prefix(
        &self,
        store: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<Entry>, StateError>;
    fn scan_range(
        &self,
        store: &str,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<Entry>, StateError>;
    fn emit(
        &self,
        alias: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&str, &[u8])],
    ) -> Result<(), OutputError>;
    fn log(&self, level: Level, message: &str);
    fn window_put(
        &self,
        store: &str,
        key: &[u8],
        start: i64,
        value: &[u8],
    ) -> Result<(), StateError>;
    fn window_get(
        &self,
        store: &str,
        key: &[u8],
        start: i64,
    ) -> Result<Option<Vec<u8>>, StateError>;
    fn window_delete(&self, store: &str, key: &[u8], start: i64) -> Result<(), StateError>;
    fn window_fetch(
        &self,
        store: &str,
        key: &[u8],
        earliest: i64,
        latest: i64,
    ) -> Result<Vec<WindowEntry>, StateError>;
    fn window_fetch_all(
        &self,
        store: &str,
        earliest: i64,
        latest: i64,
        after: Option<&WindowKey>,
        limit: u32,
    ) -> Result<Vec<WindowEntry>, StateError>;
    fn stream_time(&self) -> Option<i64>;
    fn late_record(&self, index: u32, message: &str);
}

/// The Onceflow host, reached through the component's imports.
pub(crate) struct WasmHost;

impl Host for WasmHost {
    fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        state::get(store, key)
    }

    fn put(&self, store: &str, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        state::put(store, key, value)
    }

    fn delete(&self, store: &str, key: &[u8]) -> Result<(), StateError> {
        state::delete(store, key)
    }

    fn scan_prefix(
        &self,
        store: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<Entry>, StateError> {
        state::scan_prefix(store, prefix, after, limit)
    }

    fn scan_range(
        &self,
        store: &str,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<Entry>, StateError> {
        state::scan_range(store, start, end, limit)
    }

    fn emit(
        &self,
        alias: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&str, &[u8])],
    ) -> Result<(), OutputError> {
        if headers.is_empty() {
            return output::emit(alias, key, value, &[]);
        }
        let headers: Vec<Header> = headers
            .iter()
            .map(|(key, value)| Header {
                key: (*key).to_owned(),
                value: value.to_vec(),
            })
            .collect();
        output::emit(alias, key, value, &headers)
    }

    fn log(&self, level: Level, message: &str) {
        write_log(level, message);
    }

    fn window_put(
        &self,
        store: &str,
        key: &[u8],
        start: i64,
        value: &[u8],
    ) -> Result<(), StateError> {
        windows::put(store, key, start, value)
    }

    fn window_get(
        &self,
        store: &str,
        key: &[u8],
        start: i64,
    ) -> Result<Option<Vec<u8>>, StateError> {
        windows::get(store, key, start)
    }

    fn window_delete(&self, store: &str, key: &[u8], start: i64) -> Result<(), StateError> {
        windows::delete(store, key, start)
    }

    fn window_fetch(
        &self,
        store: &str,
        key: &[u8],
        earliest: i64,
        latest: i64,
    ) -> Result<Vec<WindowEntry>, StateError> {
        windows::fetch(store, key, earliest, latest)
    }

    fn window_fetch_all(
        &self,
        store: &str,
        earliest: i64,
        latest: i64,
        after: Option<&WindowKey>,
        limit: u32,
    ) -> Result<Vec<WindowEntry>, StateError> {
        windows::fetch_all(store, earliest, latest, after, limit)
    }

    fn stream_time(&self) -> Option<i64> {
        context::stream_time()
    }

    fn late_record(&self, index: u32, message: &str) {
        context::late_record(index, message);
    }
}

/// Writes a log line through the `log` import; outside WebAssembly (native
/// tests, docs), to standard error.
pub(crate) fn write_log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        let level = match level {
            Level::Trace => wit_log::Level::Trace,
            Level::Debug => wit_log::Level::Debug,
            Level::Info => wit_log::Level::Info,
            Level::Warn => wit_log::Level::Warn,
            Level::Error => wit_log::Level::Error,
        };
        wit_log::write(level, message);
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let _ = wit_log::write;
        eprintln!("[{}] {message}", level.as_str());
    }
}
