//! Guest logs: written by each host to its tenant's log topic (not
//! transactional), read back by the admin API. One topic per tenant
//! ([`logs_topic`]), each with its own byte retention: a tenant that floods
//! its logs evicts its own lines, never another tenant's.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::FleetError;
use super::control::ControlPlane;
use super::registry::{LOG_RETENTION_BYTES, LogEntry, logs_topic, now_ms};
use crate::kafka::{self, KafkaError, TopicSpec};
use crate::metrics::Metrics;
use crate::sandbox::log::{GuestLogLine, LogLabels, LogSink};

/// Most lines one read returns.
const MAX_LINES: usize = 1000;
/// How long guest log lines are kept (at most [`LOG_RETENTION_BYTES`]).
const LOG_RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;

impl ControlPlane {
    /// Creates `tenant`'s log topic unless this host already made sure of
    /// it (a host starting a deployment of the tenant calls this first).
    pub fn ensure_log_topic(&self, tenant: &str) -> Result<(), FleetError> {
        let mut known = self.log_topics.lock().unwrap_or_else(|e| e.into_inner());
        if known.contains(tenant) {
            return Ok(());
        }
        let topic = logs_topic(tenant);
        let (ms, bytes, segment) = (
            LOG_RETENTION_MS.to_string(),
            LOG_RETENTION_BYTES.to_string(),
            (LOG_RETENTION_BYTES / 8).to_string(),
        );
        kafka::create_topics(
            self.connection(),
            &[TopicSpec {
                name: &topic,
                partitions: 1,
                config: &[
                    ("cleanup.policy", "delete"),
                    ("retention.ms", &ms),
                    ("retention.bytes", &bytes),
                    // Retention drops whole segments: several per topic.
                    ("segment.bytes", &segment),
                ],
            }],
        )?;
        kafka::wait_for_topics(
            self.connection(),
            &[&topic],
            Instant::now() + Duration::from_secs(30),
        )?;
        known.insert(tenant.to_owned());
        Ok(())
    }

    /// Appends a guest log line to `topic` (not transactional: logs of
    /// aborted work are kept too, which is what one wants when debugging).
    pub fn append_log(&self, topic: &str, key: &str, entry: &LogEntry) {
        if let Ok(json) = serde_json::to_vec(entry)
            && let Err(e) = self.producer.send(topic, key, Some(&json))
        {
            tracing::debug!("cannot write a guest log line: {e}");
        }
    }

    /// Log lines of deployment `<tenant>/<name>` from offset `from` of its
    /// tenant's log topic (default: the last `tail` records of the topic):
    /// everything up to the topic's end, and when that is nothing, waits up
    /// to `wait` for more. Returns the lines and the offset to continue
    /// from. A tenant that never logged has no topic yet: no lines.
    pub fn read_logs(
        &self,
        tenant: &str,
        key: &str,
        from: Option<i64>,
        tail: i64,
        wait: Duration,
    ) -> Result<(Vec<LogEntry>, i64), KafkaError> {
        let started = Instant::now();
        let topic = logs_topic(tenant);
        let consumer = self.reader()?;
        if kafka::partitions(&consumer, &topic)?.is_none() {
            if !wait.is_zero() {
                std::thread::sleep(wait.min(Duration::from_secs(1)));
            }
            return Ok((Vec::new(), from.unwrap_or(0).max(0)));
        }
        let (low, end) = kafka::watermarks(&consumer, &topic, 0)?;
        let start = from.unwrap_or(end - tail).clamp(low, end.max(low));
        kafka::assign(&consumer, &[(&topic, 0, Some(start))])?;
        let mut lines = Vec::new();
        let mut next = start;
        // Up to the end as of now, then (with nothing to show) a long poll.
        let at_end = started + Duration::from_secs(30);
        kafka::read_to_end(&consumer, 1, &topic, at_end, |m| {
            collect(key, m, &mut lines, &mut next)
        })?;
        if lines.is_empty() && !wait.is_zero() {
            let waited = kafka::read_to_end(&consumer, 1, &topic, started + wait, |m| {
                collect(key, m, &mut lines, &mut next)
            });
            match waited {
                Ok(()) | Err(KafkaError::Timeout { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((lines, next))
    }
}

/// Keeps `m` if it is a line of `key`; stops at [`MAX_LINES`].
fn collect(
    key: &str,
    m: &kafka::Record<'_>,
    lines: &mut Vec<LogEntry>,
    next: &mut i64,
) -> ControlFlow<()> {
    *next = m.offset() + 1;
    if m.key() == Some(key.as_bytes())
        && let Some(entry) = m.payload().and_then(|p| serde_json::from_slice(p).ok())
    {
        lines.push(entry);
    }
    if lines.len() >= MAX_LINES {
        ControlFlow::Break(())
    } else {
        ControlFlow::Continue(())
    }
}

/// Guest logs of one deployment on this host: to the log topic, to the
/// host's own log, and the latest warnings kept for `describe`.
pub struct DeploymentLogSink {
    control: Arc<ControlPlane>,
    /// The tenant's log topic.
    topic: String,
    key: String,
    host: String,
    recent_errors: Arc<Mutex<VecDeque<String>>>,
    /// Counts the lines written (usage).
    metrics: Arc<Metrics>,
}

impl DeploymentLogSink {
    /// A sink for `<tenant>/<name>` on `host`, keeping warnings in `recent`
    /// and counting lines in `metrics`.
    pub fn new(
        control: Arc<ControlPlane>,
        tenant: &str,
        key: String,
        host: String,
        recent_errors: Arc<Mutex<VecDeque<String>>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            control,
            topic: logs_topic(tenant),
            key,
            host,
            recent_errors,
            metrics,
        }
    }
}

impl DeploymentLogSink {
    fn append(&self, labels: &LogLabels, level: String, message: String) {
        self.control.append_log(
            &self.topic,
            &self.key,
            &LogEntry {
                ts_ms: now_ms(),
                host: self.host.clone(),
                partition: labels.partition,
                level,
                message,
            },
        );
    }
}

/// Keeps the last few errors for `describe`.
pub fn remember_error(recent: &Mutex<VecDeque<String>>, message: String) {
    let mut r = recent.lock().unwrap_or_else(|e| e.into_inner());
    if r.len() >= 5 {
        r.pop_front();
    }
    r.push_back(message);
}

impl LogSink for DeploymentLogSink {
    fn line(&self, labels: &LogLabels, line: &GuestLogLine) {
        let level = format!("{:?}", line.level).to_lowercase();
        if matches!(level.as_str(), "error" | "warn") {
            remember_error(
                &self.recent_errors,
                format!("partition {}: {}", labels.partition, line.message),
            );
        }
        self.append(labels, level, line.message.clone());
        Metrics::add(&self.metrics.log_lines, 1);
        Metrics::add(&self.metrics.unbilled_log_lines, 1);
    }

    fn dropped(&self, labels: &LogLabels, count: u64) {
        self.append(
            labels,
            "warn".to_owned(),
            format!("{count} log lines dropped by the rate limit"),
        );
    }
}
