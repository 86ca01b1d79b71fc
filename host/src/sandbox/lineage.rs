//! What outlives one instance of a task's processor.
//!
//! A trap throws its instance away and the next call gets a fresh one
//! (`init` runs again). What must not start over with it lives here, in a
//! [`Lineage`] the task owns for as long as it lives:
//!
//! - the guest log, with its rate limit: a limit that restarted with each
//!   instance let a guest that logs and then traps write ~90 times its limit
//!   (issue 45: 3,500 lines/s of 8 KiB at a limit of 40);
//! - the fuel burned by instantiation and `init`, for the task to bill with
//!   its records' fuel: unbilled, each trap bought a free re-run of `init`
//!   (issue 45: 10 trapping records cost 50.5 s of CPU, billed 133,651 fuel).

use super::log::GuestLog;

/// The succession of instances of one task's processor: their shared log
/// (and its rate limit) and the fuel their `init`s burned.
/// [`super::Processor::lineage`] makes one; [`super::Processor::instantiate_in`]
/// starts each instance in it.
pub struct Lineage {
    pub(super) log: GuestLog,
    /// Fuel burned by instantiation and `init` (those that failed too) since
    /// [`Lineage::take_init_fuel`] last asked.
    pub(super) init_fuel: u64,
}

impl Lineage {
    pub(super) fn new(log: GuestLog) -> Self {
        Self { log, init_fuel: 0 }
    }

    /// Fuel that instantiation and `init` burned since the last time this was
    /// asked, failed attempts included (0 with metering off): to be billed
    /// like the fuel of the records.
    pub fn take_init_fuel(&mut self) -> u64 {
        std::mem::take(&mut self.init_fuel)
    }
}
