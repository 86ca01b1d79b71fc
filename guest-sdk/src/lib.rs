//! Write Onceflow stream processors in Rust.
//!
//! Onceflow runs stream processors, compiled to WebAssembly components, over
//! Kafka with exactly-once semantics: every input record leaves exactly one
//! mark in the state stores and output topics, however often the host has to
//! retry it. This crate is the guest side: it hides the component's WIT
//! interface (`onceflow:processor`, world `processor`) behind one trait,
//! [`Processor`], and one macro, [`export_processor!`].
//!
//! # A complete processor
//!
//! A wallet that keeps a balance per account and reports every change:
//!
//! ```
//! use onceflow_sdk::{Context, Error, Processor, Record};
//!
//! struct Wallet;
//!
//! impl Processor for Wallet {
//!     fn process(ctx: &mut Context, record: &Record) -> Result<(), Error> {
//!         // Input: key = account, value = amount in decimal text.
//!         let account = record.key_str()?;
//!         let amount: i64 = record
//!             .value_str()?
//!             .parse()
//!             .map_err(|_| Error::new("amount must be an integer"))?;
//!
//!         // State lives in a store declared in onceflow.toml, never in
//!         // the processor's memory.
//!         let balances = ctx.store("balances");
//!         let balance = balances.get_i64(account)?.unwrap_or(0) + amount;
//!         balances.put_i64(account, balance)?;
//!
//!         // Outputs go to an alias that onceflow.toml maps to a topic.
//!         ctx.emit("balances", account, balance.to_string())
//!     }
//! }
//!
//! onceflow_sdk::export_processor!(Wallet);
//! # // Run it natively against the in-memory host.
//! # let mut host = onceflow_sdk::testing::TestHost::new();
//! # let record = Record { key: Some(b"alice".to_vec()), value: Some(b"5".to_vec()), ..Record::default() };
//! # host.process::<Wallet>(&record).unwrap();
//! # host.process::<Wallet>(&record).unwrap();
//! # assert_eq!(host.get("balances", "alice"), Some(b"10".to_vec()));
//! ```
//!
//! with its manifest, `onceflow.toml`, beside `Cargo.toml` (the crate is a
//! `cdylib`):
//!
//! ```toml
//! name = "wallet"
//! tenant = "demo"
//! inputs = ["payments"]
//! stores = ["balances"]
//!
//! [build]
//! language = "rust"
//! source = "."
//! component = "target/onceflow/wallet.wasm"
//!
//! [outputs]
//! balances = "balances"
//! ```
//!
//! `onceflow build` compiles it for `wasm32-unknown-unknown` and turns the
//! module into a component; by hand that is
//!
//! ```text
//! cargo build --release --target wasm32-unknown-unknown
//! wasm-tools component new target/wasm32-unknown-unknown/release/wallet.wasm -o wallet.wasm
//! ```
//!
//! The component imports nothing but the `onceflow:processor` interfaces: no
//! WASI, so it can only touch the world through the host.
//!
//! # Core concepts
//!
//! - **[`Processor`]** has no `self`. The host may replace an instance at any
//!   batch boundary (after an aborted transaction, a trap or a rebalance) and
//!   may process a batch more than once, so anything kept in the processor's
//!   own memory would be lost or counted twice. Keep everything you need to
//!   remember in state stores: their writes commit in the same Kafka
//!   transaction as your outputs and the input offsets.
//! - **[`Record`]** is one input record: topic, partition, offset,
//!   timestamp, optional key and value, headers. Helpers decode the key and
//!   value ([`Record::key_str`], [`Record::value_str`],
//!   [`Record::value_json`]).
//! - **[`Context`]** is made afresh for every record. It reaches state
//!   stores ([`Context::store`] → [`Store`]), emits output records
//!   ([`Context::emit`], [`Context::emit_with`]), reads the manifest's
//!   `[config]` ([`Context::config`]), logs ([`Context::log`], or the
//!   functions in [`log`]) and draws random numbers that are the same
//!   whenever the same record is processed again ([`Context::random_u64`]).
//! - **[`Error`]** is how a processor rejects a record. The host discards
//!   what the failed call did and applies the manifest's error policy
//!   (`fail`, `skip` or `dead-letter`) to that record, with the error's
//!   message as the reason. Return errors for bad data; do not panic. A panic
//!   traps the instance (the SDK first writes the panic message to the host's
//!   log at level error), and the host cannot tell bad data from a bug.
//! - **Batches.** The host calls the component with a batch of records from
//!   one input partition, in offset order; the SDK calls
//!   [`Processor::process`] for each in turn, tells the host which record it
//!   is on, and stops at the first error, pinning it on that record.
//! - **Initialisation.** [`Processor::init`] runs once per instance, before
//!   the first batch, with the manifest's `[config]` table. An error stops
//!   the deployment.
//! - **Time and windows.** Stream time ([`Context::stream_time`]) is the
//!   largest record timestamp the task has seen. Window stores
//!   ([`Context::window_store`] → [`WindowStore`]) keep a value per key and
//!   window; [`TimeWindows`] assigns records to tumbling or hopping windows
//!   with a grace period; [`schedule_punctuation`] in `init` makes the host
//!   call [`Processor::punctuate`] as stream time passes, where closed
//!   windows are emitted. See [`windows`].
//!
//! # Testing natively
//!
//! [`testing::TestHost`] runs a processor in a plain `cargo test`, with
//! in-memory stores, and records what it emits and logs. Like the real host,
//! it discards the writes and outputs of a record that fails.
//!
//! # Cargo features
//!
//! - `json` (default): [`Record::value_json`], with serde_json.
#![deny(missing_docs)]

mod context;
mod error;
mod export;
mod host;
pub mod log;
mod record;
pub mod testing;
pub mod windows;

pub use context::{Context, DEFAULT_SCAN_PAGE, Scan, Store};
pub use error::{Error, ErrorKind};
pub use log::Level;
pub use record::{Config, Record};
pub use windows::{
    Session, SessionWindows, TimeWindows, Window, WindowScan, WindowStore, schedule_punctuation,
};

/// The bindings wit-bindgen generates for the `processor` world. Used by
/// [`export_processor!`]; not part of the SDK's stable API.
#[doc(hidden)]
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "processor",
        pub_export_macro: true,
        export_macro_name: "__export_processor_world",
        default_bindings_module: "onceflow_sdk::bindings",
    });
}

/// Items used by [`export_processor!`]; not part of the SDK's stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::export::{Export, assert_processor};
}

/// A stream processor.
///
/// Implement it on a unit struct and export that with
/// [`export_processor!`]. Both functions are associated functions (no
/// `self`): the host replaces instances after aborts and traps, so a
/// processor keeps what it remembers in state stores (see [`Context::store`]).
pub trait Processor {
    /// Called once per instance, before the first batch, with the manifest's
    /// `[config]` table. An error stops the deployment with its message.
    ///
    /// Instances are created again after an aborted transaction or a trap, so
    /// this may run many times over a deployment's life. The default does
    /// nothing.
    fn init(config: &Config) -> Result<(), Error> {
        let _ = config;
        Ok(())
    }

    /// Processes one input record.
    ///
    /// Returning an error discards the record's state writes and outputs and
    /// hands the record to the deployment's error policy.
    fn process(ctx: &mut Context, record: &Record) -> Result<(), Error>;

    /// Called when the task's stream time reaches a point scheduled with
    /// [`schedule_punctuation`] (from `init`), right after the record that
    /// carried it there and in the same transaction. Emit closed windows
    /// here (see [`TimeWindows::take_closed`]). An error stops the
    /// deployment: no record is to blame. The default does nothing.
    fn punctuate(ctx: &mut Context, stream_time: i64) -> Result<(), Error> {
        let _ = (ctx, stream_time);
        Ok(())
    }
}

/// Exports a [`Processor`] as the component's `init`, `process` and
/// `punctuate` functions.
///
/// Invoke it once, at the top level of a `cdylib` crate:
///
/// ```
/// # use onceflow_sdk::{Context, Error, Processor, Record};
/// struct Noop;
///
/// impl Processor for Noop {
///     fn process(_ctx: &mut Context, _record: &Record) -> Result<(), Error> {
///         Ok(())
///     }
/// }
///
/// onceflow_sdk::export_processor!(Noop);
/// ```
///
/// The exports exist only when compiling for WebAssembly; natively the macro
/// only checks that the type implements [`Processor`], so the crate's unit
/// tests build.
#[macro_export]
macro_rules! export_processor {
    ($processor:ty) => {
        const _: () = {
            const _: fn() = $crate::__private::assert_processor::<$processor>;
            #[allow(dead_code)]
            type __OnceflowProcessor = $crate::__private::Export<$processor>;
            #[cfg(target_arch = "wasm32")]
            $crate::bindings::__export_processor_world!(
                __OnceflowProcessor with_types_in $crate::bindings
            );
        };
    };
}
