//! The error type of processors and of the SDK.

use std::fmt;

use crate::bindings::onceflow::processor::types::{OutputError, StateError};

/// Why processing a record failed.
///
/// Returning an `Error` from [`Processor::process`](crate::Processor::process)
/// discards everything the call did (state writes and emitted records); the
/// host then applies the deployment's error policy (`fail`, `skip` or
/// `dead-letter`) to the record, with [`Error::message`] as the reason. Return
/// errors for bad data; never panic on it, because a panic traps the instance
/// and the host cannot tell bad data from a bug.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// What kind of failure an [`Error`] reports.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The processor rejected the record (made with [`Error::new`]).
    Processor,
    /// The record's key or value could not be decoded as asked (not UTF-8,
    /// not JSON, absent), or a stored value could not be decoded.
    InvalidData,
    /// A state store is not declared under `stores` in `onceflow.toml`.
    UnknownStore,
    /// An output alias is not declared under `[outputs]` in `onceflow.toml`.
    UnknownAlias,
    /// A key, value or record is larger than the host accepts.
    TooLarge,
    /// A table was written (tables are read-only), or a store was used as
    /// the other kind (a window store through [`crate::Store`], a key-value
    /// store through [`crate::WindowStore`]).
    WrongStore,
}

impl Error {
    /// An error with `message`, of kind [`ErrorKind::Processor`].
    ///
    /// The message is what people read in the dead-letter topic and in the
    /// host's logs: say what was wrong with the record.
    pub fn new(message: impl Into<String>) -> Self {
        Self::with_kind(ErrorKind::Processor, message)
    }

    /// An error of `kind` with `message`.
    pub fn with_kind(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message for people.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<StateError> for Error {
    fn from(error: StateError) -> Self {
        match error {
            StateError::UnknownStore(store) => Self::with_kind(
                ErrorKind::UnknownStore,
                format!(
                    "unknown state store \"{store}\": declare it under stores in onceflow.toml"
                ),
            ),
            StateError::TooLarge(limit) => Self::with_kind(
                ErrorKind::TooLarge,
                format!("state key or value too large: the host accepts at most {limit} bytes"),
            ),
            StateError::ReadOnly(store) => Self::with_kind(
                ErrorKind::WrongStore,
                format!(
                    "\"{store}\" is a table: the host writes it from its topic, a processor only reads it"
                ),
            ),
            StateError::WrongKind(store) => Self::with_kind(
                ErrorKind::WrongStore,
                format!(
                    "\"{store}\" is of the other kind: use ctx.window_store for a store under \
                     window-stores in onceflow.toml, ctx.store for one under stores"
                ),
            ),
        }
    }
}

impl From<OutputError> for Error {
    fn from(error: OutputError) -> Self {
        match error {
            OutputError::UnknownAlias(alias) => Self::with_kind(
                ErrorKind::UnknownAlias,
                format!(
                    "unknown output alias \"{alias}\": declare it under [outputs] in onceflow.toml"
                ),
            ),
            OutputError::TooLarge(limit) => Self::with_kind(
                ErrorKind::TooLarge,
                format!("output record too large: the host accepts at most {limit} bytes"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_errors_say_what_to_fix() {
        let error = Error::from(StateError::UnknownStore("x".into()));
        assert_eq!(error.kind(), ErrorKind::UnknownStore);
        assert_eq!(
            error.to_string(),
            "unknown state store \"x\": declare it under stores in onceflow.toml"
        );
        let error = Error::from(StateError::TooLarge(1024));
        assert_eq!(error.kind(), ErrorKind::TooLarge);
        assert!(error.message().contains("at most 1024 bytes"));
    }

    #[test]
    fn output_errors_say_what_to_fix() {
        let error = Error::from(OutputError::UnknownAlias("out".into()));
        assert_eq!(error.kind(), ErrorKind::UnknownAlias);
        assert_eq!(
            error.to_string(),
            "unknown output alias \"out\": declare it under [outputs] in onceflow.toml"
        );
    }

    #[test]
    fn new_is_a_processor_error() {
        let error = Error::new("bad record");
        assert_eq!(error.kind(), ErrorKind::Processor);
        assert_eq!(error.to_string(), "bad record");
    }
}
