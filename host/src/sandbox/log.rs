//! Guest logging: the `log` import and captured stdout/stderr, labelled and
//! rate-limited per task: the instances of one task share one [`GuestLog`]
//! (their [`super::Lineage`]), so a trap, which replaces the instance, does
//! not restart the limit. Logging is not transactional: a line written
//! during a batch that is retried appears twice.
//!
//! Lines are cut at [`MAX_LINE`] bytes, and so are the messages of
//! `late-record` ([`cut`]): the host keeps no guest text longer than that.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::types::LogLevel;

/// Where a guest log line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSource {
    /// The `onceflow:processor/log` import.
    Log,
    /// WASI stdout.
    Stdout,
    /// WASI stderr.
    Stderr,
}

/// One guest log line, as delivered to a [`LogSink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestLogLine {
    /// Severity (stdout is info, stderr is warn).
    pub level: LogLevel,
    /// Origin.
    pub source: LogSource,
    /// The text, without the trailing newline.
    pub message: String,
}

/// Receives an instance's log lines after rate limiting.
pub trait LogSink: Send + Sync {
    /// Delivers a line. `labels` identifies the instance (tenant, processor,
    /// partition).
    fn line(&self, labels: &LogLabels, line: &GuestLogLine);
    /// Reports lines dropped by the rate limit since the last report.
    fn dropped(&self, labels: &LogLabels, count: u64);
}

/// Who is logging.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogLabels {
    /// Tenant.
    pub tenant: String,
    /// Processor name.
    pub processor: String,
    /// Input partition of the task.
    pub partition: i32,
}

/// The default sink: `tracing` events under the `guest` target.
#[derive(Debug, Default)]
pub struct TracingSink;

impl LogSink for TracingSink {
    fn line(&self, l: &LogLabels, line: &GuestLogLine) {
        let (tenant, processor, partition, msg) =
            (&l.tenant, &l.processor, l.partition, &line.message);
        match line.level {
            LogLevel::Trace => {
                tracing::trace!(target: "guest", %tenant, %processor, partition, "{msg}")
            }
            LogLevel::Debug => {
                tracing::debug!(target: "guest", %tenant, %processor, partition, "{msg}")
            }
            LogLevel::Info => {
                tracing::info!(target: "guest", %tenant, %processor, partition, "{msg}")
            }
            LogLevel::Warn => {
                tracing::warn!(target: "guest", %tenant, %processor, partition, "{msg}")
            }
            LogLevel::Error => {
                tracing::error!(target: "guest", %tenant, %processor, partition, "{msg}")
            }
        }
    }

    fn dropped(&self, l: &LogLabels, count: u64) {
        tracing::warn!(
            target: "guest",
            tenant = %l.tenant,
            processor = %l.processor,
            partition = l.partition,
            "dropped {count} guest log lines over the rate limit"
        );
    }
}

/// Longest line kept, in bytes; longer lines are cut (a guest must not make
/// the host buffer without bound). `late-record` messages too.
pub const MAX_LINE: usize = 8 * 1024;

struct Inner {
    labels: LogLabels,
    sink: Arc<dyn LogSink>,
    per_second: u32,
    window_start: Instant,
    in_window: u32,
    dropped: u64,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    last_error: Option<String>,
}

/// A task's log: clone it freely, all clones share the limiter.
#[derive(Clone)]
pub struct GuestLog {
    inner: Arc<Mutex<Inner>>,
}

impl GuestLog {
    /// A log for one task's instances, allowing `per_second` lines a second.
    pub fn new(labels: LogLabels, sink: Arc<dyn LogSink>, per_second: u32) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                labels,
                sink,
                per_second,
                window_start: Instant::now(),
                in_window: 0,
                dropped: 0,
                stdout: Vec::new(),
                stderr: Vec::new(),
                last_error: None,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new instance starts logging: the previous one's last error does not
    /// explain this one's traps (the rate limit goes on).
    pub fn start_instance(&self) {
        self.lock().last_error = None;
    }

    /// A line from the `log` import.
    pub fn write(&self, level: LogLevel, message: &str) {
        let mut inner = self.lock();
        let message = cut(message);
        if level == LogLevel::Error {
            inner.last_error = Some(message.clone());
        }
        inner.emit(GuestLogLine {
            level,
            source: LogSource::Log,
            message,
        });
    }

    /// Bytes written to stdout or stderr; complete lines are logged.
    pub fn write_stream(&self, source: LogSource, bytes: &[u8]) {
        let mut inner = self.lock();
        let level = if source == LogSource::Stderr {
            LogLevel::Warn
        } else {
            LogLevel::Info
        };
        let mut buf = std::mem::take(match source {
            LogSource::Stderr => &mut inner.stderr,
            _ => &mut inner.stdout,
        });
        buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(nl) = buf[start..].iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&buf[start..start + nl]);
            let message = cut(line.trim_end_matches('\r'));
            if source == LogSource::Stderr {
                inner.last_error = Some(message.clone());
            }
            inner.emit(GuestLogLine {
                level,
                source,
                message,
            });
            start += nl + 1;
        }
        buf.drain(..start);
        buf.truncate(MAX_LINE);
        *match source {
            LogSource::Stderr => &mut inner.stderr,
            _ => &mut inner.stdout,
        } = buf;
    }

    /// Logs what is left in the stdout/stderr buffers (a last line without
    /// a newline) and reports dropped lines.
    pub fn flush(&self) {
        let mut inner = self.lock();
        for source in [LogSource::Stdout, LogSource::Stderr] {
            let buf = std::mem::take(match source {
                LogSource::Stderr => &mut inner.stderr,
                _ => &mut inner.stdout,
            });
            if !buf.is_empty() {
                let level = if source == LogSource::Stderr {
                    LogLevel::Warn
                } else {
                    LogLevel::Info
                };
                let message = cut(&String::from_utf8_lossy(&buf));
                inner.emit(GuestLogLine {
                    level,
                    source,
                    message,
                });
            }
        }
        if inner.dropped > 0 {
            let dropped = std::mem::take(&mut inner.dropped);
            inner.sink.dropped(&inner.labels, dropped);
        }
    }

    /// Takes the last error-level line (or stderr line) written since the
    /// previous call: the likely explanation of a trap, such as a Rust
    /// panic message.
    pub fn take_last_error(&self) -> Option<String> {
        self.lock().last_error.take()
    }
}

impl Inner {
    fn emit(&mut self, line: GuestLogLine) {
        let now = Instant::now();
        if now.duration_since(self.window_start).as_secs() >= 1 {
            self.window_start = now;
            self.in_window = 0;
            if self.dropped > 0 {
                let dropped = std::mem::take(&mut self.dropped);
                self.sink.dropped(&self.labels, dropped);
            }
        }
        if self.in_window >= self.per_second {
            self.dropped += 1;
            return;
        }
        self.in_window += 1;
        self.sink.line(&self.labels, &line);
    }
}

/// `s`, cut at [`MAX_LINE`] bytes (on a character boundary) with a note
/// that says so.
pub fn cut(s: &str) -> String {
    if s.len() <= MAX_LINE {
        return s.to_owned();
    }
    let mut end = MAX_LINE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… (cut at {MAX_LINE} bytes)", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collect(Mutex<(Vec<String>, u64)>);
    impl LogSink for Collect {
        fn line(&self, _: &LogLabels, line: &GuestLogLine) {
            self.0.lock().unwrap().0.push(line.message.clone());
        }
        fn dropped(&self, _: &LogLabels, count: u64) {
            self.0.lock().unwrap().1 += count;
        }
    }

    #[test]
    fn stdout_is_split_into_lines_and_rate_limited() {
        let sink = Arc::new(Collect::default());
        let log = GuestLog::new(LogLabels::default(), sink.clone(), 3);
        log.write_stream(LogSource::Stdout, b"one\ntw");
        log.write_stream(LogSource::Stdout, b"o\nthree\nfour\nfive\n");
        log.write(LogLevel::Error, "six");
        log.flush();
        let (lines, dropped) = &*sink.0.lock().unwrap();
        assert_eq!(lines, &["one", "two", "three"]);
        assert_eq!(*dropped, 3);
        assert_eq!(log.take_last_error().as_deref(), Some("six"));
        assert_eq!(log.take_last_error(), None);
    }

    /// The instances of a task share its log: a new one (after a trap) gets
    /// no fresh allowance, and no stale last error.
    #[test]
    fn the_limit_goes_on_across_instances() {
        let sink = Arc::new(Collect::default());
        let log = GuestLog::new(LogLabels::default(), sink.clone(), 2);
        log.write(LogLevel::Error, "one");
        log.start_instance();
        assert_eq!(log.take_last_error(), None, "the last instance's error");
        log.write(LogLevel::Info, "two");
        log.start_instance();
        log.write(LogLevel::Info, "three");
        log.flush();
        let (lines, dropped) = &*sink.0.lock().unwrap();
        assert_eq!(lines, &["one", "two"]);
        assert_eq!(*dropped, 1);
    }

    #[test]
    fn a_cut_line_says_so_and_keeps_whole_characters() {
        let long = "é".repeat(MAX_LINE);
        let c = cut(&long);
        let note = format!("… (cut at {MAX_LINE} bytes)");
        assert!(c.ends_with(&note), "{}", &c[c.len() - 40..]);
        assert!(c.len() <= MAX_LINE + note.len());
        assert_eq!(cut("short"), "short");
    }
}
