//! The host side of the `onceflow:processor` imports, on the per-instance
//! store data. Errors the processor is meant to see (unknown store, unknown
//! alias, too large) are returned to it; failures of the host itself (a
//! store backend error) trap, so the batch is retried rather than blamed on
//! a record.

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{ResourceLimiter, Result, StoreContextMut};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::log::GuestLog;
use super::wasi::Determinism;
use crate::types::{self, AccessError, Effects, EmitError, LogLevel, StoreAccessError};

wasmtime::component::bindgen!({
    path: "../wit/processor.wit",
    world: "processor",
    imports: { default: trappable },
});

/// The contract of components built against `onceflow:processor@0.1.0`,
/// frozen: the host links its imports beside 0.2.0's, so such a component
/// runs unchanged (its exports have the same types in both versions).
pub(crate) mod v0_1 {
    wasmtime::component::bindgen!({
        path: "../wit/compat/processor-0.1.0.wit",
        world: "processor",
        imports: { default: trappable },
    });
}

pub use self::onceflow::processor::types::ProcessError as WitProcessError;

use self::onceflow::processor::{context, log, output, state, types as wit, windows};

/// A host-side failure inside an import: the call traps with it, and the
/// sandbox reports it as the host's fault, not the record's.
#[derive(Debug)]
pub struct HostFailure(pub String);

impl std::fmt::Display for HostFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HostFailure {}

/// Caps linear memory and table growth, and remembers whether it refused, so
/// that the trap that follows can be reported as "memory limit exceeded".
pub struct MemoryLimiter {
    pub(crate) max_bytes: usize,
    pub(crate) refused: bool,
}

/// Table elements allowed per table: generous for real programs, a wall for
/// a guest that grows tables to exhaust host memory.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> Result<bool> {
        if desired > self.max_bytes {
            self.refused = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            self.refused = true;
            return Ok(false);
        }
        Ok(true)
    }
}

/// Coordinates of one record of the current batch, for `begin-record`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordCoords {
    pub seed: u64,
    pub timestamp_ms: i64,
    /// The task's stream time once this record is counted.
    pub stream_time: Option<i64>,
}

/// Everything an instance's imports can reach. One per wasmtime `Store`.
pub struct HostState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    /// Where state and output go; swapped in for the duration of a call.
    pub(crate) effects: Box<dyn Effects>,
    pub(crate) determinism: Determinism,
    pub(crate) log: GuestLog,
    pub(crate) batch: Vec<RecordCoords>,
    /// The record the processor said it is working on.
    pub(crate) cursor: Option<u32>,
    /// Per-record fuel, when metered: `begin-record` asks the call hook to
    /// refill the fuel to this, so one looping record burns one record's
    /// budget, not the whole batch's.
    pub(crate) fuel: FuelMeter,
    /// Whether `init` is running (only it may schedule punctuation).
    pub(crate) in_init: bool,
    /// The stream-time punctuation interval `init` asked for, ms.
    pub(crate) punctuate_every: Option<u64>,
    /// Records of the call in progress the processor reported late.
    pub(crate) late: Vec<(u32, String)>,
    /// Whether the call is `punctuate`: its window reads see the windows
    /// that expired at this stream time too, so that a window closing and
    /// expiring at once (stream time jumped) is still emitted once; the
    /// task sweeps expired windows only after its punctuations.
    pub(crate) in_punctuate: bool,
    /// The call's deadline and its tenant's CPU share (`clock.rs`).
    pub(crate) clock: super::clock::CallClock,
}

impl HostState {
    /// The coordinates of the record the processor works on, else the
    /// batch's first (in `punctuate`: the punctuation's).
    fn current(&self) -> Option<&RecordCoords> {
        self.cursor
            .and_then(|i| self.batch.get(i as usize))
            .or(self.batch.first())
    }

    fn stream_time(&self) -> Option<i64> {
        self.current().and_then(|c| c.stream_time)
    }

    /// The stream time windows expire by (none in `punctuate`).
    fn expiry_time(&self) -> Option<i64> {
        if self.in_punctuate {
            None
        } else {
            self.stream_time()
        }
    }

    fn emit_record(
        &mut self,
        alias: String,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<types::Header>,
    ) -> Result<(), EmitError> {
        let timestamp = self.current().map_or(0, |c| c.timestamp_ms);
        self.effects.emit(&alias, key, value, headers, timestamp)
    }

    /// Moves the cursor to record `index`; whether it moved.
    fn begin_record(&mut self, index: u32) -> bool {
        // An index past the batch is a guest bug; ignore it rather than
        // trap, so the cursor keeps pointing at the last valid record.
        // Indices must also move forward: each record of the batch refills
        // the fuel once, so a guest calling `begin-record` in a loop cannot
        // refuel itself (it ran 200 M iterations on a 5 M budget before).
        if self.cursor.is_some_and(|c| index <= c) {
            return false;
        }
        let Some(c) = self.batch.get(index as usize) else {
            return false;
        };
        self.cursor = Some(index);
        self.determinism.set_record(c.seed, c.timestamp_ms);
        self.effects.record_begun();
        true
    }
}

/// Fuel accounting across the per-record refills of one call.
#[derive(Debug, Default)]
pub(crate) struct FuelMeter {
    /// Fuel per record (`None`: unmetered, no refills).
    pub per_record: Option<u64>,
    /// The fuel level at the last (re)fill.
    pub mark: u64,
    /// Fuel burned before the refills of this call.
    pub burned: u64,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Adds the Onceflow imports and the sandboxed WASI 0.2 to a linker.
/// `wasi:http` is never added.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    Processor::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    v0_1::Processor::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    // `begin-record` refills the fuel, which the generated bindings cannot
    // reach (they see the host state, not the store): it is linked again
    // here, over the generated one, with the store. A call hook could do
    // the refill too, but wasmtime runs a hook on every crossing between
    // guest and host (2.7% of the enrich benchmark's worker CPU).
    linker.allow_shadowing(true);
    for interface in [
        "onceflow:processor/context@0.2.0",
        "onceflow:processor/context@0.1.0",
    ] {
        linker.instance(interface)?.func_wrap(
            "begin-record",
            |store: StoreContextMut<'_, HostState>, (index,): (u32,)| begin_record(store, index),
        )?;
    }
    linker.allow_shadowing(false);
    Ok(())
}

/// `begin-record`: moves the cursor to record `index` and gives it one
/// record's fuel, counting what the previous record burned.
fn begin_record(mut store: StoreContextMut<'_, HostState>, index: u32) -> Result<()> {
    if !HostState::begin_record(store.data_mut(), index) {
        return Ok(());
    }
    let Some(refill) = store.data().fuel.per_record else {
        return Ok(());
    };
    let left = store.get_fuel()?;
    let meter = &mut store.data_mut().fuel;
    meter.burned += meter.mark.saturating_sub(left);
    meter.mark = refill;
    store.set_fuel(refill)
}

fn state_result<T>(r: Result<T, AccessError>) -> Result<Result<T, wit::StateError>> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(AccessError::Refused(StoreAccessError::UnknownStore(s))) => {
            Ok(Err(wit::StateError::UnknownStore(s)))
        }
        Err(AccessError::Refused(
            StoreAccessError::TooLarge(n) | StoreAccessError::StateFull(n),
        )) => Ok(Err(wit::StateError::TooLarge(n))),
        Err(AccessError::Refused(StoreAccessError::WrongKind { store, .. })) => {
            Ok(Err(wit::StateError::WrongKind(store)))
        }
        Err(AccessError::Refused(StoreAccessError::ReadOnly(store))) => {
            Ok(Err(wit::StateError::ReadOnly(store)))
        }
        Err(AccessError::Failed(m)) => Err(wasmtime::Error::new(HostFailure(m))),
    }
}

fn window_entries(entries: Vec<types::WindowEntry>) -> Vec<wit::WindowEntry> {
    entries
        .into_iter()
        .map(|(w, value)| wit::WindowEntry {
            key: w.key,
            start: w.start,
            value,
        })
        .collect()
}

/// The imports 0.1.0 and 0.2.0 have in common (`types`, `state`, `output`,
/// `log`), for the version whose bindings are in scope as `wit`, `state`,
/// `output` and `log`, with that version's `state_result`.
macro_rules! common_imports {
    () => {
        fn to_entries(entries: Vec<types::Entry>) -> Vec<wit::Entry> {
            entries
                .into_iter()
                .map(|(key, value)| wit::Entry { key, value })
                .collect()
        }

        impl wit::Host for HostState {}

        impl state::Host for HostState {
            fn get(
                &mut self,
                store: String,
                key: Vec<u8>,
            ) -> Result<Result<Option<Vec<u8>>, wit::StateError>> {
                state_result(self.effects.get(&store, &key))
            }

            fn put(
                &mut self,
                store: String,
                key: Vec<u8>,
                value: Vec<u8>,
            ) -> Result<Result<(), wit::StateError>> {
                state_result(self.effects.put(&store, key, value))
            }

            fn delete(
                &mut self,
                store: String,
                key: Vec<u8>,
            ) -> Result<Result<(), wit::StateError>> {
                state_result(self.effects.delete(&store, key))
            }

            fn scan_prefix(
                &mut self,
                store: String,
                prefix: Vec<u8>,
                after: Option<Vec<u8>>,
                limit: u32,
            ) -> Result<Result<Vec<wit::Entry>, wit::StateError>> {
                let r = self
                    .effects
                    .scan_prefix(&store, &prefix, after.as_deref(), limit as usize);
                state_result(r.map(to_entries))
            }

            fn scan_range(
                &mut self,
                store: String,
                start: Option<Vec<u8>>,
                end: Option<Vec<u8>>,
                limit: u32,
            ) -> Result<Result<Vec<wit::Entry>, wit::StateError>> {
                let r = self.effects.scan_range(
                    &store,
                    start.as_deref(),
                    end.as_deref(),
                    limit as usize,
                );
                state_result(r.map(to_entries))
            }
        }

        impl output::Host for HostState {
            fn emit(
                &mut self,
                alias: String,
                key: Option<Vec<u8>>,
                value: Option<Vec<u8>>,
                headers: Vec<wit::Header>,
            ) -> Result<Result<(), wit::OutputError>> {
                let headers = headers
                    .into_iter()
                    .map(|h| types::Header {
                        key: h.key,
                        value: h.value,
                    })
                    .collect();
                Ok(match self.emit_record(alias, key, value, headers) {
                    Ok(()) => Ok(()),
                    Err(EmitError::UnknownAlias(a)) => Err(wit::OutputError::UnknownAlias(a)),
                    Err(EmitError::TooLarge(n)) => Err(wit::OutputError::TooLarge(n)),
                })
            }
        }

        impl log::Host for HostState {
            fn write(&mut self, level: log::Level, message: String) -> Result<()> {
                let level = match level {
                    log::Level::Trace => LogLevel::Trace,
                    log::Level::Debug => LogLevel::Debug,
                    log::Level::Info => LogLevel::Info,
                    log::Level::Warn => LogLevel::Warn,
                    log::Level::Error => LogLevel::Error,
                };
                self.log.write(level, &message);
                Ok(())
            }
        }
    };
}

common_imports!();

impl context::Host for HostState {
    // Not called: `add_to_linker` links `begin_record` (with the store, for
    // the fuel) over the generated import, for both versions.
    fn begin_record(&mut self, index: u32) -> Result<()> {
        HostState::begin_record(self, index);
        Ok(())
    }

    fn stream_time(&mut self) -> Result<Option<i64>> {
        Ok(HostState::stream_time(self))
    }

    fn schedule_punctuation(&mut self, interval_ms: u64) -> Result<Result<(), String>> {
        if !self.in_init {
            return Ok(Err(
                "schedule-punctuation may only be called from init: a schedule must not depend on \
                 which records an instance happened to see"
                    .to_owned(),
            ));
        }
        self.punctuate_every = (interval_ms > 0).then_some(interval_ms);
        Ok(Ok(()))
    }

    fn late_record(&mut self, index: u32, message: String) -> Result<()> {
        // Only records of the batch, once each (the task ignores reports
        // made in `punctuate`), and the message cut like a log line: the
        // host keeps at most a call's records x 8 KiB of them (a guest of
        // 64 MiB made it hold 64 x 20 MB before).
        if (index as usize) < self.batch.len() && !self.late.iter().any(|(i, _)| *i == index) {
            self.late.push((index, super::log::cut(&message)));
        }
        Ok(())
    }
}

impl windows::Host for HostState {
    fn put(
        &mut self,
        store: String,
        key: Vec<u8>,
        start: i64,
        value: Vec<u8>,
    ) -> Result<Result<(), wit::StateError>> {
        let now = self.expiry_time();
        let window = types::WindowKey { key, start };
        state_result(self.effects.window_put(&store, window, value, now))
    }

    fn get(
        &mut self,
        store: String,
        key: Vec<u8>,
        start: i64,
    ) -> Result<Result<Option<Vec<u8>>, wit::StateError>> {
        let now = self.expiry_time();
        let window = types::WindowKey { key, start };
        state_result(self.effects.window_get(&store, window, now))
    }

    fn delete(
        &mut self,
        store: String,
        key: Vec<u8>,
        start: i64,
    ) -> Result<Result<(), wit::StateError>> {
        let window = types::WindowKey { key, start };
        state_result(self.effects.window_delete(&store, window))
    }

    fn fetch(
        &mut self,
        store: String,
        key: Vec<u8>,
        from: i64,
        to: i64,
    ) -> Result<Result<Vec<wit::WindowEntry>, wit::StateError>> {
        let now = self.expiry_time();
        let r = self.effects.window_fetch(&store, &key, from, to, now);
        state_result(r.map(window_entries))
    }

    fn fetch_all(
        &mut self,
        store: String,
        from: i64,
        to: i64,
        after: Option<wit::WindowKey>,
        limit: u32,
    ) -> Result<Result<Vec<wit::WindowEntry>, wit::StateError>> {
        let now = self.expiry_time();
        let after = after.map(|w| types::WindowKey {
            key: w.key,
            start: w.start,
        });
        let r = self
            .effects
            .window_fetch_all(&store, from, to, after, limit as usize, now);
        state_result(r.map(window_entries))
    }
}

/// The 0.1.0 imports: the same host, with 0.1.0's types (its state errors
/// have no `read-only` or `wrong-kind`: a 0.1.0 processor calling the
/// key-value functions on a window store sees `unknown-store`).
mod compat {
    use super::v0_1::onceflow::processor::{context, log, output, state, types as wit};
    use super::*;

    fn state_result<T>(r: Result<T, AccessError>) -> Result<Result<T, wit::StateError>> {
        match r {
            Ok(v) => Ok(Ok(v)),
            Err(AccessError::Refused(
                StoreAccessError::UnknownStore(s)
                | StoreAccessError::WrongKind { store: s, .. }
                | StoreAccessError::ReadOnly(s),
            )) => Ok(Err(wit::StateError::UnknownStore(s))),
            Err(AccessError::Refused(
                StoreAccessError::TooLarge(n) | StoreAccessError::StateFull(n),
            )) => Ok(Err(wit::StateError::TooLarge(n))),
            Err(AccessError::Failed(m)) => Err(wasmtime::Error::new(HostFailure(m))),
        }
    }

    common_imports!();

    impl context::Host for HostState {
        fn begin_record(&mut self, index: u32) -> Result<()> {
            HostState::begin_record(self, index);
            Ok(())
        }
    }
}
