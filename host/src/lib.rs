//! # Onceflow
//!
//! Onceflow runs stream processors compiled to WebAssembly components over
//! Apache Kafka, with Kafka Streams' exactly-once (EOS v2) guarantee, inside
//! a sandbox that gives a processor keyed state and output topics and
//! nothing else.
//!
//! ## A tour
//!
//! The layers, bottom up (each uses only those below it; see
//! `docs/architecture.md` for the path of a record and the rules that
//! `scripts/test` checks):
//!
//! - [`types`]: plain records and errors every module shares;
//!   [`manifest`]: `onceflow.toml`, the configuration schema.
//! - [`sandbox`]: the wasmtime engine, the import policy that refuses a
//!   component before it runs, memory, fuel and deadline limits, the
//!   deterministic clocks and randomness, a [`sandbox::Guest`] per task.
//!   [`state`]: a task's stores in layers (call, transaction, committed) on
//!   RocksDB. Neither knows the other, Kafka or the manifest.
//! - [`task`]: one input partition: feeds batches to its guest, isolates a
//!   failing record, applies the error policy.
//! - [`kafka`]: the shared Kafka plumbing. [`stream`]: `onceflow run`, the
//!   exactly-once loop (the commit protocol is in `stream/worker/commit.rs`, top
//!   to bottom), changelog restore, and `onceflow verify`.
//! - [`fleet`]: the control plane (reconciler, the tenants' operations,
//!   control topics, tenancy). [`api`]: the admin API's types.
//!   [`admin`]: the admin API over the fleet. [`host`]: starting a host.
//! - [`metrics`]: counters, commit latencies, Prometheus.
//!   [`offline`]: `onceflow test`. [`guestbench`]: `onceflow bench-guest`.
//!   [`build`]: `onceflow build`, per language.
//! - [`sink`]: `onceflow sink postgres`, topics into PostgreSQL exactly
//!   once (the database's transaction holds the effect, a marker and the
//!   position).
//!
//! The command line is the `onceflow` binary's (`src/main.rs`, `src/cli/`):
//! nothing in the library depends on it.
//!
//! ## Running a processor offline
//!
//! ```no_run
//! use onceflow::manifest::Manifest;
//! use onceflow::offline::{OfflineRunner, RunOptions, read_input};
//! use onceflow::sandbox::{Sandbox, SandboxConfig};
//! use onceflow::task::processor_policy;
//!
//! # fn main() -> anyhow::Result<()> {
//! let manifest = Manifest::load("examples/wallet/onceflow.toml")?;
//! let bytes = std::fs::read(manifest.component_path())?;
//! let sandbox = Sandbox::new(SandboxConfig::default())?;
//! let processor = sandbox.load(&bytes, processor_policy(&manifest))?;
//! let input = r#"{"topic":"payments","key":"a","value":"{\"payment_id\":\"p1\",\"account\":\"a\",\"amount\":5}"}"#;
//! let records = read_input(input.as_bytes(), "inline", &manifest, 1)?;
//! let mut runner = OfflineRunner::new(processor, &manifest);
//! runner.run(&records, &RunOptions { batch_size: 100 }, |out| {
//!     println!("{out:?}");
//!     Ok(())
//! })?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

pub mod admin;
pub mod api;
pub mod build;
pub mod fleet;
pub mod guestbench;
pub mod host;
pub mod kafka;
pub mod manifest;
pub mod memory;
pub mod metrics;
pub mod offline;
pub mod sandbox;
pub mod schema;
pub mod sink;
pub mod state;
pub mod stream;
pub mod task;
pub mod types;
