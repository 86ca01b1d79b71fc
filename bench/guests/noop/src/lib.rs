//! A processor that does nothing: it measures the host's own cost per record
//! (reading, calling the guest, committing).

use onceflow_sdk::{Context, Error, Processor, Record};

/// The no-op processor.
pub struct Noop;

impl Processor for Noop {
    fn process(_ctx: &mut Context, _record: &Record) -> Result<(), Error> {
        Ok(())
    }
}

onceflow_sdk::export_processor!(Noop);
