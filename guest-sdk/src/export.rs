//! The glue that `export_processor!` expands to: an implementation of the
//! generated `Guest` trait for any [`Processor`].

use std::marker::PhantomData;
use std::sync::{Once, OnceLock};

use crate::Processor;
use crate::bindings::Guest;
use crate::bindings::onceflow::processor::context;
use crate::bindings::onceflow::processor::types as wit;
use crate::context::Context;
use crate::host::{WasmHost, write_log};
use crate::log::Level;
use crate::record::{Config, Record};

/// The configuration `init` received. An instance runs one processor on one
/// thread, and `init` runs once per instance, so a write-once cell is enough.
static CONFIG: OnceLock<Config> = OnceLock::new();

/// The configuration seen by a `process` that was not preceded by `init`.
static NO_CONFIG: Config = Config::new();

/// Exports `P` as the component's `init`, `process` and `punctuate`.
pub struct Export<P>(PhantomData<P>);

/// Fails to compile unless `P` implements [`Processor`]; lets
/// `export_processor!` check its argument on every target.
pub fn assert_processor<P: Processor>() {}

impl<P: Processor> Guest for Export<P> {
    fn init(config: Vec<(String, String)>) -> Result<(), String> {
        install_panic_hook();
        let config = Config::from(config);
        let config = match CONFIG.get() {
            Some(stored) if *stored != config => {
                return Err("init was called again with a different configuration".into());
            }
            Some(stored) => stored,
            None => CONFIG.get_or_init(|| config),
        };
        P::init(config).map_err(|error| error.to_string())
    }

    fn process(batch: Vec<wit::Record>) -> Result<(), wit::ProcessError> {
        install_panic_hook();
        let config = CONFIG.get().unwrap_or(&NO_CONFIG);
        for (index, record) in batch.into_iter().enumerate() {
            // A batch is a WIT list, whose length fits in a u32.
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            context::begin_record(index);
            let record = Record::from(record);
            let mut ctx = Context::new(&WasmHost, config, &record).at(index);
            if let Err(error) = P::process(&mut ctx, &record) {
                return Err(wit::ProcessError {
                    record_index: Some(index),
                    message: error.to_string(),
                });
            }
        }
        Ok(())
    }

    fn punctuate(stream_time: i64) -> Result<(), wit::ProcessError> {
        install_panic_hook();
        let config = CONFIG.get().unwrap_or(&NO_CONFIG);
        let mut ctx = Context::for_punctuation(&WasmHost, config, stream_time);
        P::punctuate(&mut ctx, stream_time).map_err(|error| wit::ProcessError {
            record_index: None,
            message: error.to_string(),
        })
    }
}

/// Makes a panic write its message to the host's log at level error before
/// the instance traps, so the host's logs show why a guest trapped. The
/// previous hook still runs (under WASI it prints to standard error).
fn install_panic_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info.payload_as_str().unwrap_or("(no message)");
            let line = match info.location() {
                Some(at) => format!(
                    "processor panicked at {}:{}:{}: {message}",
                    at.file(),
                    at.line(),
                    at.column()
                ),
                None => format!("processor panicked: {message}"),
            };
            write_log(Level::Error, &line);
            previous(info);
        }));
    });
}
