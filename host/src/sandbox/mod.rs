//! The Wasm sandbox: wasmtime engine, import policy, limits, and guest
//! instances.
//!
//! A component goes through three steps:
//!
//! 1. [`policy::inspect`] reads its imports and exports from the bytes, and
//!    [`policy::ComponentInterface::check`] refuses anything outside the
//!    allowlist, before anything is compiled;
//! 2. [`Sandbox::load`] compiles it (or loads the compiled form from the
//!    on-disk cache, keyed by content hash and engine settings) and links it
//!    against the Onceflow imports and the sandboxed WASI;
//! 3. [`Processor::instantiate`] makes a [`Guest`]: one instance in its own
//!    store, with its own memory cap, fuel and deadline, for one task.
//!
//! The sandbox knows nothing of Kafka or RocksDB: a guest's state and output
//! go to an [`Effects`] the caller supplies for each call.

mod clock;
mod host;
mod lineage;
pub mod log;
pub mod policy;
mod wasi;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{
    Component, ComponentType, Func, InstancePre, Linker, Lower, ResourceTable,
};
use wasmtime::{Config, Engine, Store, Trap};

pub use self::clock::CpuMeter;
pub use self::host::HostFailure;
use self::host::{HostState, MemoryLimiter, RecordCoords, WitProcessError};
pub use self::lineage::Lineage;
use self::log::{GuestLog, LogLabels, LogSink};
pub use self::policy::{ComponentInterface, Grant, PolicyError};
pub use self::wasi::record_seed;
use crate::types::{Effects, InputRecord, NoEffects};

/// `punctuate` gets the fuel of this many records: it emits what many
/// records accumulated (closing 300 windows at once took 150 M fuel in
/// JavaScript, 1.4 M in Rust).
pub const PUNCTUATE_RECORDS: u64 = 100;

/// Fuel for instantiating a processor and running its `init`, per instance
/// ([`ProcessorPolicy::init_fuel`]'s default): init runs again on every new
/// instance, after each trap, so it gets its own limit rather than a share of
/// the records' (it had 1000 records' fuel: 50 G at the default, seconds of
/// CPU per trap, up to the call's deadline; a spinning init burns 1 G in
/// about 0.1 s). The language runtimes' inits measured 74 (C) to
/// 2.7 M (Go) fuel, JavaScript 0.34 M, Python 0.16 M; this is 20 records at
/// the default `fuel-per-record`. What init burns is billed like the
/// records' fuel ([`Lineage::take_init_fuel`]).
pub const INIT_FUEL: u64 = 1_000_000_000;

/// How often the epoch ticks: the granularity of call deadlines.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Why the sandbox could not load or start a processor.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The component breaks the import policy or lacks an export.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The component could not be compiled.
    #[error("cannot compile the component: {0}")]
    Compile(String),
    /// The component's imports do not match what the host provides.
    #[error("cannot link the component: {0}")]
    Link(String),
    /// An export has the wrong type.
    #[error(
        "export `{export}` has the wrong type ({message}): build against onceflow:processor@0.2.0 (or 0.1.0)"
    )]
    ExportType {
        /// The export.
        export: &'static str,
        /// The type-check message.
        message: String,
    },
    /// Instantiation failed (for example the initial memory exceeds the cap).
    #[error("cannot instantiate the processor: {0}")]
    Instantiate(String),
    /// `init` returned an error or trapped.
    #[error("the processor's init failed: {0}")]
    Init(String),
    /// Instantiation and `init` burned their whole fuel limit.
    #[error(
        "the processor's init ran out of fuel: instantiation and init may burn {limit} fuel per \
         instance, and they run again on every new instance (after each trap); do less in init, \
         or do it in process, where each record has its own fuel"
    )]
    InitFuel {
        /// The limit ([`ProcessorPolicy::init_fuel`]).
        limit: u64,
    },
    /// The engine could not be configured.
    #[error("cannot configure the Wasm engine: {0}")]
    Engine(String),
}

/// Engine-wide settings.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Meter fuel. Costs some speed; without it only the deadline stops a
    /// runaway guest. A processor's `fuel-per-record = 0` also turns fuel
    /// off for that processor, but the engine still meters.
    pub fuel: bool,
    /// Where compiled components are cached (`None`: no cache).
    pub cache_dir: Option<PathBuf>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            fuel: true,
            cache_dir: default_cache_dir(),
        }
    }
}

/// `$ONCEFLOW_CACHE_DIR`, else `$XDG_CACHE_HOME/onceflow`, else
/// `~/.cache/onceflow`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("ONCEFLOW_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("onceflow"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("onceflow"))
}

/// Per-processor limits and labels (`task::processor_policy` makes one from
/// a manifest).
#[derive(Debug, Clone)]
pub struct ProcessorPolicy {
    /// Linear memory cap per instance, bytes.
    pub memory_bytes: usize,
    /// Fuel per input record (0: unmetered, `init` included).
    pub fuel_per_record: u64,
    /// Fuel for instantiation and `init`, per instance (see [`INIT_FUEL`];
    /// 0: unmetered); unmetered too when `fuel_per_record` is 0.
    pub init_fuel: u64,
    /// Wall-clock deadline per call.
    pub timeout: Duration,
    /// Guest log lines per second per task: the limit holds across the
    /// instances a trap replaces ([`Lineage`]).
    pub log_lines_per_second: u32,
    /// `[config]` handed to `init`.
    pub config: Vec<(String, String)>,
    /// Tenant, for log labels.
    pub tenant: String,
    /// Processor name, for log labels.
    pub processor: String,
}

impl Default for ProcessorPolicy {
    /// The manifest's defaults (`types::default_limits`): 128 MiB, 50 M fuel
    /// per record, 10 s per call, 100 log lines per second; [`INIT_FUEL`].
    fn default() -> Self {
        use crate::types::default_limits as d;
        Self {
            memory_bytes: (d::MEMORY_MB as usize) << 20,
            fuel_per_record: d::FUEL_PER_RECORD,
            init_fuel: INIT_FUEL,
            timeout: Duration::from_millis(d::TIMEOUT_MS),
            log_lines_per_second: d::LOG_LINES_PER_SECOND,
            config: Vec::new(),
            tenant: String::new(),
            processor: String::new(),
        }
    }
}

/// The wasmtime engine, the linker with the sandboxed imports, and the
/// compile cache. One per host process (per fuel setting); cheap to clone.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<SandboxInner>,
}

struct SandboxInner {
    engine: Engine,
    linker: Linker<HostState>,
    config: SandboxConfig,
    ticker_stop: Arc<AtomicBool>,
}

impl Drop for SandboxInner {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

impl Sandbox {
    /// Creates the engine and starts its epoch ticker thread.
    pub fn new(config: SandboxConfig) -> Result<Self, SandboxError> {
        let mut wc = Config::new();
        wc.wasm_component_model(true)
            .consume_fuel(config.fuel)
            .epoch_interruption(true)
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            .max_wasm_stack(1 << 20);
        if std::env::var_os("ONCEFLOW_PERFMAP").is_some() {
            wc.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&wc).map_err(|e| SandboxError::Engine(e.to_string()))?;
        let mut linker = Linker::new(&engine);
        host::add_to_linker(&mut linker).map_err(|e| SandboxError::Engine(e.to_string()))?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        {
            let engine = engine.weak();
            let stop = ticker_stop.clone();
            std::thread::Builder::new()
                .name("onceflow-epoch".to_owned())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        match engine.upgrade() {
                            Some(e) => e.increment_epoch(),
                            None => break,
                        }
                    }
                })
                .map_err(|e| SandboxError::Engine(format!("cannot start the epoch ticker: {e}")))?;
        }
        Ok(Self {
            inner: Arc::new(SandboxInner {
                engine,
                linker,
                config,
                ticker_stop,
            }),
        })
    }

    /// Checks the policy, compiles (or loads from the cache) and links a
    /// component.
    pub fn load(&self, bytes: &[u8], policy: ProcessorPolicy) -> Result<Processor, SandboxError> {
        let interface = policy::inspect(bytes)?;
        let grants = interface.check()?;
        let component = self.compile_cached(bytes)?;
        let pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(|e| SandboxError::Link(format!("{e:#}")))?;
        Ok(Processor {
            inner: Arc::new(ProcessorInner {
                sandbox: self.clone(),
                pre,
                policy,
                interface,
                grants,
                sink: Arc::new(log::TracingSink),
                digest: hex::encode(Sha256::digest(bytes)),
            }),
            meter: None,
        })
    }

    /// Whether loading `bytes` would find its compiled form in the cache
    /// (a load that compiles takes seconds for an interpreter's component).
    pub fn is_compiled(&self, bytes: &[u8]) -> bool {
        self.cache_path(bytes).is_some_and(|path| path.exists())
    }

    /// Where the compiled form of `bytes` is cached (`None`: no cache).
    fn cache_path(&self, bytes: &[u8]) -> Option<PathBuf> {
        let dir = self.inner.config.cache_dir.as_ref()?;
        Some(
            dir.join("compiled")
                .join(format!("{}.cwasm", self.cache_key(bytes))),
        )
    }

    fn compile_cached(&self, bytes: &[u8]) -> Result<Component, SandboxError> {
        let engine = &self.inner.engine;
        let Some(path) = self.cache_path(bytes) else {
            return Component::new(engine, bytes)
                .map_err(|e| SandboxError::Compile(format!("{e:#}")));
        };
        if path.exists() {
            // SAFETY: the file was written by `Component::serialize` of an
            // engine with the same compatibility hash (it is in the file
            // name), and the cache directory belongs to this user.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(c) => {
                    tracing::debug!(path = %path.display(), "loaded compiled component from cache");
                    return Ok(c);
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), "ignoring unusable cache entry: {e:#}");
                }
            }
        }
        let started = std::time::Instant::now();
        let component =
            Component::new(engine, bytes).map_err(|e| SandboxError::Compile(format!("{e:#}")))?;
        tracing::info!(
            bytes = bytes.len(),
            ms = started.elapsed().as_millis() as u64,
            "compiled component"
        );
        // The cache is an optimisation: failing to write it costs a
        // recompile next time, never the load.
        if let Err(e) = write_cache_entry(&path, &component) {
            tracing::warn!(path = %path.display(), "cannot cache the compiled component: {e}");
        }
        Ok(component)
    }

    /// Content hash of the component plus the engine's compatibility hash
    /// (wasmtime version and every setting that changes compiled code).
    fn cache_key(&self, bytes: &[u8]) -> String {
        use std::hash::Hash;
        struct ShaHasher(Sha256);
        impl std::hash::Hasher for ShaHasher {
            fn finish(&self) -> u64 {
                0
            }
            fn write(&mut self, bytes: &[u8]) {
                self.0.update(bytes);
            }
        }
        let mut engine_hash = ShaHasher(Sha256::new());
        self.inner
            .engine
            .precompile_compatibility_hash()
            .hash(&mut engine_hash);
        let engine_hash = engine_hash.0.finalize();
        let content = Sha256::digest(bytes);
        format!(
            "{}-{}",
            hex::encode(content),
            hex::encode(&engine_hash[..8])
        )
    }
}

/// Writes a compiled component to the cache: to a file unique to this
/// writer, then renamed into place, so concurrent writers (threads or
/// processes) never expose half a file.
fn write_cache_entry(path: &std::path::Path, component: &Component) -> Result<(), String> {
    static UNIQUE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = path.parent().ok_or("the cache path has no directory")?;
    let serialized = component.serialize().map_err(|e| format!("{e:#}"))?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&tmp, serialized).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        e.to_string()
    })
}

/// A loaded processor: compiled, linked, ready to instantiate per task.
#[derive(Clone)]
pub struct Processor {
    inner: Arc<ProcessorInner>,
    /// The tenant's CPU share, charged as its calls run (`clock.rs`).
    meter: Option<Arc<dyn CpuMeter>>,
}

struct ProcessorInner {
    sandbox: Sandbox,
    pre: InstancePre<HostState>,
    policy: ProcessorPolicy,
    interface: ComponentInterface,
    grants: Vec<(String, Grant)>,
    sink: Arc<dyn LogSink>,
    /// The component's SHA-256, in hex.
    digest: String,
}

impl Processor {
    /// Charges every call's CPU time to `meter` while the call runs, and
    /// parks the call whenever the tenant is over its share.
    pub fn with_cpu_meter(mut self, meter: Arc<dyn CpuMeter>) -> Self {
        self.meter = Some(meter);
        self
    }

    /// The component's imports and exports.
    pub fn interface(&self) -> &ComponentInterface {
        &self.inner.interface
    }

    /// The component's SHA-256, in hex (what the fleet's artifacts are
    /// named by, and what a replay checks it runs).
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }

    /// The version of `onceflow:processor` the component was built
    /// against, from its imports (`0.1.0`, `0.2.0`; `None` if it imports
    /// none of its interfaces).
    pub fn wit_version(&self) -> Option<&str> {
        self.inner
            .interface
            .imports
            .iter()
            .find_map(|i| i.strip_prefix("onceflow:processor/")?.split_once('@'))
            .map(|(_, version)| version)
    }

    /// How each import is granted.
    pub fn grants(&self) -> &[(String, Grant)] {
        &self.inner.grants
    }

    /// The limits in force.
    pub fn policy(&self) -> &ProcessorPolicy {
        &self.inner.policy
    }

    /// The same processor with guest logs sent to `sink`.
    pub fn with_log_sink(&self, sink: Arc<dyn LogSink>) -> Self {
        let i = &self.inner;
        Self {
            inner: Arc::new(ProcessorInner {
                sandbox: i.sandbox.clone(),
                pre: i.pre.clone(),
                policy: i.policy.clone(),
                interface: i.interface.clone(),
                grants: i.grants.clone(),
                sink,
                digest: i.digest.clone(),
            }),
            meter: self.meter.clone(),
        }
    }

    /// The lineage of the instances of the task of `partition`: their log,
    /// with its rate limit, and the fuel their inits burn. A task keeps one
    /// for as long as it lives.
    pub fn lineage(&self, partition: i32) -> Lineage {
        let p = &self.inner.policy;
        Lineage::new(GuestLog::new(
            LogLabels {
                tenant: p.tenant.clone(),
                processor: p.processor.clone(),
                partition,
            },
            self.inner.sink.clone(),
            p.log_lines_per_second,
        ))
    }

    /// Creates an instance for the task of `partition` in a lineage of its
    /// own and runs its `init` (what init burns is not billed: a task uses
    /// [`Processor::instantiate_in`]).
    pub fn instantiate(&self, partition: i32) -> Result<Guest, SandboxError> {
        self.instantiate_in(&mut self.lineage(partition))
    }

    /// Creates an instance in `lineage` and runs its `init`, with
    /// [`ProcessorPolicy::init_fuel`] for both. The fuel they burn is added
    /// to the lineage, whether they succeed or not.
    pub fn instantiate_in(&self, lineage: &mut Lineage) -> Result<Guest, SandboxError> {
        let p = &self.inner.policy;
        let engine = &self.inner.sandbox.inner.engine;
        let log = lineage.log.clone();
        log.start_instance();
        let determinism = wasi::Determinism::default();
        let state = HostState {
            wasi: wasi::build_ctx(&determinism, &log),
            table: ResourceTable::new(),
            limiter: MemoryLimiter {
                max_bytes: p.memory_bytes,
                refused: false,
            },
            effects: Box::new(NoEffects),
            determinism,
            log,
            batch: Vec::new(),
            cursor: None,
            fuel: host::FuelMeter::default(),
            in_init: false,
            punctuate_every: None,
            late: Vec::new(),
            in_punctuate: false,
            clock: clock::CallClock::new(self.meter.clone()),
        };
        let mut store = Store::new(engine, state);
        store.limiter(|s| &mut s.limiter);
        // Every epoch tick of a call: the tenant's share charged (the call
        // parked while it is spent), then the call's deadline.
        store.epoch_deadline_callback(|mut ctx| {
            if ctx.data_mut().clock.tick() {
                Ok(wasmtime::UpdateDeadline::Continue(1))
            } else {
                Err(Trap::Interrupt.into())
            }
        });
        let fuel = self.inner.sandbox.inner.config.fuel;
        if fuel && p.fuel_per_record > 0 {
            store.data_mut().fuel.per_record = Some(p.fuel_per_record);
            // `begin-record` refills the fuel to one record's budget
            // (host::begin_record).
        }
        // Instantiation and init get init's own budget (0: unmetered, as the
        // records are).
        let init_fuel = if p.fuel_per_record == 0 {
            0
        } else {
            p.init_fuel
        };
        set_budget(&mut store, fuel, init_fuel, p.timeout);
        let started = self.start(&mut store, init_fuel);
        store.data_mut().clock.finish();
        if fuel {
            let level = if init_fuel == 0 { u64::MAX } else { init_fuel };
            let left = store.get_fuel().unwrap_or(0);
            lineage.init_fuel = lineage.init_fuel.saturating_add(level.saturating_sub(left));
        }
        if started.is_err() {
            // No `Guest` will flush what the failed instance left unlogged.
            store.data().log.flush();
        }
        let (process, punctuate) = started?;
        let punctuate_every = store.data().punctuate_every;
        Ok(Guest {
            processor: self.inner.clone(),
            store,
            process,
            punctuate,
            punctuate_every,
            fuel,
            poisoned: false,
            fuel_used: 0,
        })
    }

    /// Instantiates the component in `store` and runs its `init`; returns
    /// its `process` and `punctuate` exports. `init_fuel` is the budget set
    /// (0: unmetered), for the error that says it ran out.
    fn start(
        &self,
        store: &mut Store<HostState>,
        init_fuel: u64,
    ) -> Result<(Func, Option<Func>), SandboxError> {
        let p = &self.inner.policy;
        let out_of_fuel = |e: &wasmtime::Error| {
            init_fuel > 0 && matches!(e.downcast_ref::<Trap>(), Some(Trap::OutOfFuel))
        };
        let instance = self.inner.pre.instantiate(&mut *store).map_err(|e| {
            let limiter = &store.data().limiter;
            if limiter.refused {
                SandboxError::Instantiate(format!(
                    "the component needs more memory than its limit of {} MiB; raise limits.memory-mb",
                    p.memory_bytes >> 20
                ))
            } else if out_of_fuel(&e) {
                SandboxError::InitFuel { limit: init_fuel }
            } else {
                SandboxError::Instantiate(format!("{e:#}"))
            }
        })?;
        let process = instance
            .get_func(&mut *store, "process")
            .ok_or_else(|| SandboxError::Policy(PolicyError::MissingExport("process".into())))?;
        process
            .typed::<ProcessParams<'_>, ProcessResult>(&*store)
            .map_err(|e| SandboxError::ExportType {
                export: "process",
                message: format!("{e:#}"),
            })?;
        if let Some(init) = instance.get_func(&mut *store, "init") {
            let init = init
                .typed::<(&[(String, String)],), (Result<(), String>,)>(&*store)
                .map_err(|e| SandboxError::ExportType {
                    export: "init",
                    message: format!("{e:#}"),
                })?;
            store.data_mut().in_init = true;
            let called = init.call(&mut *store, (&p.config,));
            store.data_mut().in_init = false;
            match called {
                Ok((Ok(()),)) => {}
                Ok((Err(message),)) => return Err(SandboxError::Init(message)),
                Err(e) if out_of_fuel(&e) => {
                    return Err(SandboxError::InitFuel { limit: init_fuel });
                }
                Err(e) => {
                    let failure = classify_trap(store, e, p);
                    return Err(SandboxError::Init(failure.to_string()));
                }
            }
        }
        let punctuate = instance.get_func(&mut *store, "punctuate");
        if store.data().punctuate_every.is_some() && punctuate.is_none() {
            return Err(SandboxError::Init(
                "init scheduled punctuation, but the component does not export `punctuate`"
                    .to_owned(),
            ));
        }
        Ok((process, punctuate))
    }
}

fn set_budget(store: &mut Store<HostState>, fuel_on: bool, fuel: u64, timeout: Duration) {
    if fuel_on {
        // 0 means unmetered for this processor.
        let fuel = if fuel == 0 { u64::MAX } else { fuel };
        // Cannot fail: fuel is enabled on the engine.
        let _ = store.set_fuel(fuel);
    }
    // The call's clock: its deadline, its tenant's share, checked at every
    // tick (the store's epoch deadline callback).
    store.data_mut().clock.start(timeout);
    store.set_epoch_deadline(1);
}

/// Why a call to the guest did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallFailure {
    /// The processor returned an error; the instance is still usable.
    Rejected {
        /// The failing record's index in the batch, if the processor named it.
        index: Option<u32>,
        /// The processor's message.
        message: String,
    },
    /// The guest trapped or hit a limit; the instance is unusable.
    Trapped {
        /// The record the processor was working on, if it said so.
        index: Option<u32>,
        /// What happened, for people.
        reason: String,
    },
    /// The host failed during the call (for example a state backend error):
    /// not the record's fault. The instance is unusable.
    Host(String),
}

impl std::fmt::Display for CallFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallFailure::Rejected { message, .. } => f.write_str(message),
            CallFailure::Trapped { reason, .. } => f.write_str(reason),
            CallFailure::Host(m) => write!(f, "host failure: {m}"),
        }
    }
}

fn classify_trap(
    store: &Store<HostState>,
    err: wasmtime::Error,
    p: &ProcessorPolicy,
) -> CallFailure {
    if let Some(h) = err.downcast_ref::<HostFailure>() {
        return CallFailure::Host(h.0.clone());
    }
    let data = store.data();
    let index = data.cursor;
    let mut reason = match err.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => format!(
            "ran out of fuel ({} per record): the processor is looping or doing too much work \
             for one record; raise limits.fuel-per-record if the work is legitimate",
            p.fuel_per_record
        ),
        Some(Trap::Interrupt) => format!(
            "exceeded the deadline of {} ms for one call; raise limits.timeout-ms if the work \
             is legitimate",
            p.timeout.as_millis()
        ),
        Some(Trap::StackOverflow) => "stack overflow (unbounded recursion?)".to_owned(),
        _ if data.limiter.refused => format!(
            "memory limit of {} MiB exceeded; raise limits.memory-mb if the processor needs more",
            p.memory_bytes >> 20
        ),
        Some(trap) => format!("trapped: {trap}"),
        None => format!("failed: {err:#}"),
    };
    if let Some(last) = data.log.take_last_error() {
        reason.push_str(&format!(" (last error logged: {last})"));
    }
    CallFailure::Trapped { index, reason }
}

/// One live instance of a processor, for one task.
pub struct Guest {
    processor: Arc<ProcessorInner>,
    store: Store<HostState>,
    process: Func,
    punctuate: Option<Func>,
    punctuate_every: Option<u64>,
    fuel: bool,
    poisoned: bool,
    fuel_used: u64,
}

impl Guest {
    /// Fuel burned by calls since the last time this was asked (0 with
    /// metering off).
    pub fn take_fuel_used(&mut self) -> u64 {
        std::mem::take(&mut self.fuel_used)
    }

    /// The record the last call began last (`begin-record`), if it said.
    pub fn cursor(&self) -> Option<u32> {
        self.store.data().cursor
    }

    /// A batch of calls begins: its time, calls and the host's work between
    /// them, is charged to the tenant's share from now
    /// (`Processor::with_cpu_meter`).
    pub fn begin_batch(&mut self) {
        self.store.data_mut().clock.charge_from_now();
    }

    /// A batch ends: the time since its last call is charged (parked for
    /// if the tenant is over its share).
    pub fn end_batch(&mut self) {
        self.store.data_mut().clock.finish();
    }

    /// How long calls (and `init`) were parked for the tenant's CPU share
    /// since the last time this was asked.
    pub fn take_parked(&mut self) -> Duration {
        self.store.data_mut().clock.take_parked()
    }

    /// Whether the instance trapped and must be replaced.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Calls `process` with `batch`, sending state and output to
    /// `effects`; `stream_times[i]` is the task's stream time once record
    /// `i` is counted. The caller owns rolling back `effects` on failure.
    pub fn process(
        &mut self,
        batch: &[InputRecord],
        stream_times: &[Option<i64>],
        effects: &mut Box<dyn Effects>,
    ) -> Result<(), CallFailure> {
        if batch.is_empty() {
            return Ok(());
        }
        let coords = batch.iter().zip(stream_times).map(|(r, t)| RecordCoords {
            seed: record_seed(&r.topic, r.partition, r.offset),
            timestamp_ms: r.timestamp,
            stream_time: *t,
        });
        let budget = self.enter(coords, batch.len() as u64, effects)?;
        let records: Vec<RecordView<'_>> = batch.iter().map(RecordView::of).collect();
        let result = self
            .process
            .typed::<ProcessParams<'_>, ProcessResult>(&self.store)
            .and_then(|f| f.call(&mut self.store, (records.as_slice(),)));
        self.leave(result, budget, effects)
    }

    /// Calls `punctuate` for stream time `now` of the task of `partition`
    /// (a no-op without the export). Outputs are stamped with `now`.
    pub fn punctuate(
        &mut self,
        partition: i32,
        now: i64,
        effects: &mut Box<dyn Effects>,
    ) -> Result<(), CallFailure> {
        let Some(punctuate) = self.punctuate else {
            return Ok(());
        };
        let coords = std::iter::once(RecordCoords {
            seed: record_seed("", partition, now),
            timestamp_ms: now,
            stream_time: Some(now),
        });
        let budget = self.enter(coords, PUNCTUATE_RECORDS, effects)?;
        self.store.data_mut().in_punctuate = true;
        let result = punctuate
            .typed::<(i64,), ProcessResult>(&self.store)
            .and_then(|f| f.call(&mut self.store, (now,)));
        self.store.data_mut().in_punctuate = false;
        let outcome = self.leave(result, budget, effects);
        // A punctuation has no records to report late.
        self.store.data_mut().late.clear();
        outcome
    }

    /// The stream-time punctuation interval `init` scheduled, ms.
    pub fn punctuation_interval(&self) -> Option<u64> {
        self.punctuate_every
    }

    /// The records (index in the batch, message) the last `process` call
    /// reported late.
    pub fn take_late(&mut self) -> Vec<(u32, String)> {
        std::mem::take(&mut self.store.data_mut().late)
    }

    /// Prepares a call over the records `coords`: their coordinates, the
    /// caller's effects swapped in, the budget of `records` records set.
    fn enter(
        &mut self,
        coords: impl Iterator<Item = RecordCoords>,
        records: u64,
        effects: &mut Box<dyn Effects>,
    ) -> Result<u64, CallFailure> {
        if self.poisoned {
            return Err(CallFailure::Host(
                "instance used after a trap (host bug)".to_owned(),
            ));
        }
        {
            let data = self.store.data_mut();
            data.batch.clear();
            data.batch.extend(coords);
            if let Some(first) = data.batch.first() {
                data.determinism.set_record(first.seed, first.timestamp_ms);
            }
            data.cursor = None;
            data.late.clear();
            data.limiter.refused = false;
            std::mem::swap(&mut data.effects, effects);
        }
        let p = &self.processor.policy;
        let budget = p.fuel_per_record.saturating_mul(records);
        set_budget(&mut self.store, self.fuel, budget, p.timeout);
        {
            let meter = &mut self.store.data_mut().fuel;
            meter.mark = budget;
            meter.burned = 0;
        }
        Ok(budget)
    }

    /// Ends a call: the effects swapped back, the fuel counted, the result
    /// classified.
    fn leave(
        &mut self,
        result: wasmtime::Result<ProcessResult>,
        budget: u64,
        effects: &mut Box<dyn Effects>,
    ) -> Result<(), CallFailure> {
        std::mem::swap(&mut self.store.data_mut().effects, effects);
        self.store.data_mut().clock.finish();
        if self.fuel && budget > 0 {
            let left = self.store.get_fuel().unwrap_or(0);
            let meter = &self.store.data().fuel;
            self.fuel_used += meter.burned + meter.mark.saturating_sub(left);
        }
        match result {
            Ok((Ok(()),)) => Ok(()),
            Ok((Err(e),)) => Err(CallFailure::Rejected {
                index: e.record_index,
                message: e.message,
            }),
            Err(e) => {
                self.poisoned = true;
                self.store.data().log.flush();
                Err(classify_trap(&self.store, e, &self.processor.policy))
            }
        }
    }

    /// Whether the processor exports `punctuate`.
    pub fn has_punctuate(&self) -> bool {
        self.punctuate.is_some()
    }

    /// Fuel left after the last call (`None` without fuel metering).
    pub fn fuel_left(&self) -> Option<u64> {
        self.store.get_fuel().ok()
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.store.data().log.flush();
    }
}

/// The WIT `record` as the host lowers it: borrowed from the polled batch,
/// so each record is copied once, straight into guest memory (the
/// bindgen-generated `Record` owns its strings and bytes, which cost a
/// second copy of every topic, key and value per call). Field names and
/// order are the WIT record's; `typed` checks them when the guest is
/// instantiated.
#[derive(ComponentType, Lower)]
#[component(record)]
struct RecordView<'a> {
    topic: &'a str,
    partition: i32,
    offset: i64,
    timestamp: i64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    headers: Vec<HeaderView<'a>>,
}

/// The WIT `header`, borrowed.
#[derive(ComponentType, Lower)]
#[component(record)]
struct HeaderView<'a> {
    key: &'a str,
    value: &'a [u8],
}

impl<'a> RecordView<'a> {
    fn of(r: &'a InputRecord) -> Self {
        RecordView {
            topic: &r.topic,
            partition: r.partition,
            offset: r.offset,
            timestamp: r.timestamp,
            key: r.key.as_deref(),
            value: r.value.as_deref(),
            // No allocation for the usual record without headers.
            headers: r
                .headers
                .iter()
                .map(|h| HeaderView {
                    key: &h.key,
                    value: &h.value,
                })
                .collect(),
        }
    }
}

/// `process`'s parameters and result.
type ProcessParams<'a> = (&'a [RecordView<'a>],);
type ProcessResult = (Result<(), WitProcessError>,);
