//! Logging through the host.
//!
//! Lines go to the host's log, labelled with the tenant, the processor and the
//! partition, and are rate-limited per instance. Logging is not
//! transactional: a line written while processing a batch that is later
//! retried appears again. Keep the per-record path at [`trace`] or
//! [`debug`].
//!
//! ```
//! onceflow_sdk::log::info("starting");
//! onceflow_sdk::log::write(onceflow_sdk::Level::Warn, format!("{} late records", 3));
//! ```
//!
//! Outside WebAssembly (native tests and doctests) lines go to standard
//! error.

use crate::host::write_log;

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Fine-grained detail, such as one line per record.
    Trace,
    /// Detail useful when debugging a processor.
    Debug,
    /// Normal but noteworthy events.
    Info,
    /// Something unexpected that the processor handled.
    Warn,
    /// Something failed.
    Error,
}

impl Level {
    /// The level's name in lower case, as the WIT spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// Writes `message` at `level`.
pub fn write(level: Level, message: impl AsRef<str>) {
    write_log(level, message.as_ref());
}

/// Writes `message` at [`Level::Trace`].
pub fn trace(message: impl AsRef<str>) {
    write(Level::Trace, message);
}

/// Writes `message` at [`Level::Debug`].
pub fn debug(message: impl AsRef<str>) {
    write(Level::Debug, message);
}

/// Writes `message` at [`Level::Info`].
pub fn info(message: impl AsRef<str>) {
    write(Level::Info, message);
}

/// Writes `message` at [`Level::Warn`].
pub fn warn(message: impl AsRef<str>) {
    write(Level::Warn, message);
}

/// Writes `message` at [`Level::Error`].
pub fn error(message: impl AsRef<str>) {
    write(Level::Error, message);
}
