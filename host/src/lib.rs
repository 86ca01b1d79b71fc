//! # Onceflow
//!
//! Onceflow runs stream processors compiled to WebAssembly components over
//! Apache Kafka, with Kafka Streams' exactly-once (EOS v2) guarantee, inside
//! a sandbox that gives a processor keyed state and output topics and
//! nothing else.
//!
//! ## A tour
//!
//! - [`deploy`]: the manifest (`onceflow.toml`) and `onceflow build`.
//! - [`sandbox`]: the wasmtime engine; the import policy that refuses a
//!   component before it runs; memory, fuel and deadline limits; the
//!   deterministic clocks and randomness; a [`sandbox::Guest`] per task.
//! - [`state`]: a task's state stores in layers (call, transaction,
//!   committed), so a failed call or an aborted transaction leaves nothing.
//! - [`task`]: one input partition: feeds batches to its guest, isolates a
//!   failing record, applies the error policy (fail, skip, dead-letter).
//! - [`stream`]: `onceflow run`, the exactly-once loop on Kafka (the commit
//!   protocol is in `stream/worker.rs`, top to bottom), and `onceflow verify`.
//! - [`fleet`]: `onceflow host`, reconciling the deployment registry (kept
//!   in Kafka by `stream::control`) into running deployments.
//! - [`admin`]: the host's HTTP admin API and Prometheus endpoint.
//! - [`tenancy`]: tenants, their tokens, namespaces and quotas.
//! - [`metrics`]: a deployment's counters and commit latencies.
//! - [`offline`]: `onceflow test`, the TopologyTestDriver for components.
//! - [`guestbench`]: `onceflow bench-guest`.
//! - [`types`]: plain records and errors every module shares.
//! - [`cli`]: the command line.
//!
//! ## Running a processor offline
//!
//! ```no_run
//! use onceflow::deploy::Manifest;
//! use onceflow::offline::{OfflineRunner, RunOptions, read_input};
//! use onceflow::sandbox::{ProcessorPolicy, Sandbox, SandboxConfig};
//!
//! # fn main() -> anyhow::Result<()> {
//! let manifest = Manifest::load("examples/wallet/onceflow.toml")?;
//! let bytes = std::fs::read(manifest.component_path())?;
//! let sandbox = Sandbox::new(SandboxConfig::default())?;
//! let processor = sandbox.load(&bytes, ProcessorPolicy::from_manifest(&manifest))?;
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
pub mod cli;
pub mod deploy;
pub mod fleet;
pub mod guestbench;
pub mod metrics;
pub mod offline;
pub mod sandbox;
pub mod state;
pub mod stream;
pub mod task;
pub mod tenancy;
pub mod types;
