//! Counters and latency samples of a running deployment, shared by its
//! worker threads. Cheap to update (atomics; one short lock per commit) and
//! read by the periodic log line, the final report, the host's status
//! records and the Prometheus endpoint ([`Exposition`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// A deployment's figures.
#[derive(Debug)]
pub struct Metrics {
    /// Input records processed (counted when their transaction commits).
    pub records: AtomicU64,
    /// Output records produced (committed).
    pub outputs: AtomicU64,
    /// Transactions (or at-least-once offset commits) completed.
    pub commits: AtomicU64,
    /// Transactions aborted.
    pub aborts: AtomicU64,
    /// Times a producer was fenced or a commit refused as a zombie's.
    pub fenced: AtomicU64,
    /// Worker sessions restarted (producer re-created, group rejoined).
    pub restarts: AtomicU64,
    /// Records dead-lettered.
    pub dead_lettered: AtomicU64,
    /// Records skipped.
    pub skipped: AtomicU64,
    /// Late records dropped (`time.late-records = "drop"`; committed).
    pub late_dropped: AtomicU64,
    /// `punctuate` calls (committed).
    pub punctuations: AtomicU64,
    /// Changelog records replayed into stores while restoring.
    pub restored: AtomicU64,
    /// Store partitions restored.
    pub restores: AtomicU64,
    /// Changelog records written into standby stores (warm copies of
    /// other instances' tasks).
    pub standby_records: AtomicU64,
    /// Store partitions being restored right now.
    pub restoring: AtomicU64,
    /// Fuel the guests burned (0 with metering off).
    pub fuel: AtomicU64,
    /// Bytes (keys, values, headers) of the input records processed
    /// (committed).
    pub bytes_in: AtomicU64,
    /// Bytes of the output records produced (committed).
    pub bytes_out: AtomicU64,
    /// Bytes of state written: the changelog records committed.
    pub state_bytes: AtomicU64,
    /// Guest log lines written (after the rate limit).
    pub log_lines: AtomicU64,
    /// Time (µs) its workers waited because the tenant was over its CPU
    /// share.
    pub throttled_us: AtomicU64,
    /// Commits made early because the deployment or its tenant reached its
    /// memory budget (`held-mb`, `host-held-mb`): a batch committed in
    /// parts.
    pub memory_commits: AtomicU64,
    /// Time (µs) its guest calls ran, less the time they were parked for
    /// the CPU share: the tenant's CPU as the host accounts it.
    pub call_us: AtomicU64,
    /// Log lines not yet counted in a usage record (see [`Usage`]): the
    /// next committed transaction of any worker takes them.
    pub unbilled_log_lines: AtomicU64,
    /// Fuel burned and not yet counted in a usage record: the deployment's
    /// ledger, as for log lines. A transaction takes it into its usage
    /// record; if the transaction does not commit, it is given back
    /// (`stream/worker/abort.rs`).
    pub unbilled_fuel: AtomicU64,
    /// Whether the deployment hibernates now (`stream::Hibernation`): no
    /// workers, no clients, waiting for input.
    pub hibernating: std::sync::atomic::AtomicBool,
    /// How many times it hibernated.
    pub hibernations: AtomicU64,
    /// Per worker: its input partitions and their lag.
    workers: Mutex<BTreeMap<u32, WorkerLoad>>,
    /// When the latest worker restarts happened, and the last one's error.
    restart_log: Mutex<(std::collections::VecDeque<std::time::Instant>, String)>,
    commit_latency_us: Mutex<Vec<u64>>,
    status_latency_us: Mutex<Vec<u64>>,
    all_commit_latency_us: Mutex<Vec<u64>>,
    commit_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            records: AtomicU64::default(),
            outputs: AtomicU64::default(),
            commits: AtomicU64::default(),
            aborts: AtomicU64::default(),
            fenced: AtomicU64::default(),
            restarts: AtomicU64::default(),
            dead_lettered: AtomicU64::default(),
            late_dropped: AtomicU64::default(),
            punctuations: AtomicU64::default(),
            skipped: AtomicU64::default(),
            restored: AtomicU64::default(),
            restores: AtomicU64::default(),
            standby_records: AtomicU64::default(),
            restoring: AtomicU64::default(),
            fuel: AtomicU64::default(),
            bytes_in: AtomicU64::default(),
            bytes_out: AtomicU64::default(),
            state_bytes: AtomicU64::default(),
            log_lines: AtomicU64::default(),
            unbilled_log_lines: AtomicU64::default(),
            unbilled_fuel: AtomicU64::default(),
            throttled_us: AtomicU64::default(),
            memory_commits: AtomicU64::default(),
            call_us: AtomicU64::default(),
            hibernating: Default::default(),
            hibernations: AtomicU64::default(),
            workers: Mutex::default(),
            restart_log: Mutex::default(),
            commit_latency_us: Mutex::default(),
            status_latency_us: Mutex::default(),
            all_commit_latency_us: Mutex::default(),
            // 1 ms .. ~18 s in steps of 25%, fine enough for a p99 from
            // two scrapes.
            commit_seconds: Histogram::new(exponential_buckets(0.001, 1.25, 45)),
        }
    }
}

/// One worker's share of the input.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WorkerLoad {
    /// Input partitions it owns.
    pub partitions: BTreeSet<i32>,
    /// Records between its positions and the partitions' last stable offsets.
    pub lag: i64,
    /// Its partitions whose records did not all reach it yet (see
    /// `stream::hibernate`): 0 when it has seen everything there is.
    pub unfetched: i64,
    /// 1 while it holds work not committed yet: records polled and not
    /// processed, an open or committing transaction, partitions restoring
    /// or to be rewound after an abort. Summed by [`Metrics::load`], which
    /// also counts a worker whose last report is older than
    /// [`LOAD_REPORT_STALE`] (one blocked in a long call, such as
    /// re-creating its producer after an abort).
    pub unsettled: i64,
    /// When the worker reported this (`None` in a sum).
    pub reported: Option<std::time::Instant>,
}

/// A worker reports its load about every second from its loop: a report
/// older than this means the loop is blocked.
pub const LOAD_REPORT_STALE: Duration = Duration::from_secs(3);

/// A deployment whose workers restarted this many times within
/// [`FAILING_WINDOW`] is failing (a restart loop), whatever else it says.
pub const FAILING_RESTARTS: usize = 3;
/// See [`FAILING_RESTARTS`].
pub const FAILING_WINDOW: Duration = Duration::from_secs(60);

/// Most commit latencies kept between two reports.
const MAX_SAMPLES: usize = 100_000;

/// A point-in-time copy of the counters.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Snapshot {
    /// See [`Metrics::records`].
    pub records: u64,
    /// See [`Metrics::outputs`].
    pub outputs: u64,
    /// See [`Metrics::commits`].
    pub commits: u64,
    /// See [`Metrics::aborts`].
    pub aborts: u64,
    /// See [`Metrics::fenced`].
    pub fenced: u64,
    /// See [`Metrics::restarts`].
    pub restarts: u64,
    /// See [`Metrics::dead_lettered`].
    pub dead_lettered: u64,
    /// See [`Metrics::skipped`].
    pub skipped: u64,
    /// See [`Metrics::restored`].
    pub restored: u64,
    /// See [`Metrics::restores`].
    pub restores: u64,
    /// See [`Metrics::standby_records`].
    pub standby_records: u64,
}

/// Commit latency percentiles over a window.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Latency {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Largest.
    pub max: Duration,
}

impl Metrics {
    /// Adds to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a worker session restart and remembers why.
    pub fn restarted(&self, error: String) {
        Self::add(&self.restarts, 1);
        let mut log = self.restart_log.lock().unwrap_or_else(|e| e.into_inner());
        log.0.push_back(std::time::Instant::now());
        while log.0.len() > FAILING_RESTARTS {
            log.0.pop_front();
        }
        log.1 = error;
    }

    /// `Some(last error)` while the workers are in a restart loop: at least
    /// [`FAILING_RESTARTS`] restarts within the last [`FAILING_WINDOW`].
    pub fn failing(&self) -> Option<String> {
        let log = self.restart_log.lock().unwrap_or_else(|e| e.into_inner());
        let recent = log
            .0
            .iter()
            .filter(|t| t.elapsed() < FAILING_WINDOW)
            .count();
        (recent >= FAILING_RESTARTS).then(|| log.1.clone())
    }

    /// Records what worker `n` owns and how far behind it is.
    pub fn worker_load(&self, n: u32, load: WorkerLoad) {
        self.workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(n, load);
    }

    /// The partitions of every worker together, and their summed lag.
    pub fn load(&self) -> WorkerLoad {
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let mut all = WorkerLoad::default();
        for w in workers.values() {
            all.partitions.extend(&w.partitions);
            all.lag += w.lag;
            all.unfetched += w.unfetched;
            all.unsettled += w.unsettled;
            if w.reported
                .is_some_and(|at| at.elapsed() > LOAD_REPORT_STALE)
            {
                all.unsettled += 1;
            }
        }
        all
    }

    /// Records one commit's latency.
    pub fn commit_latency(&self, d: Duration) {
        self.commit_seconds.observe(d.as_secs_f64());
        let mut v = self
            .commit_latency_us
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if v.len() < MAX_SAMPLES {
            v.push(d.as_micros() as u64);
        }
        drop(v);
        let mut v = self
            .status_latency_us
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if v.len() < MAX_SAMPLES {
            v.push(d.as_micros() as u64);
        }
        drop(v);
        let mut all = self
            .all_commit_latency_us
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if all.len() < 10 * MAX_SAMPLES {
            all.push(d.as_micros() as u64);
        }
    }

    /// Commit latency percentiles over the whole run.
    pub fn overall_latency(&self) -> Latency {
        let mut v = self
            .all_commit_latency_us
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        latency_of(&mut v)
    }

    /// Takes the commit latencies recorded since the last call.
    pub fn take_latency(&self) -> Latency {
        let mut v = std::mem::take(
            &mut *self
                .commit_latency_us
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        latency_of(&mut v)
    }

    /// Takes the commit latencies recorded since the last call, for the
    /// host's status records (a window separate from the log line's).
    pub fn take_status_latency(&self) -> Latency {
        let mut v = std::mem::take(
            &mut *self
                .status_latency_us
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        latency_of(&mut v)
    }

    /// Copies the counters.
    pub fn snapshot(&self) -> Snapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            records: g(&self.records),
            outputs: g(&self.outputs),
            commits: g(&self.commits),
            aborts: g(&self.aborts),
            fenced: g(&self.fenced),
            restarts: g(&self.restarts),
            dead_lettered: g(&self.dead_lettered),
            skipped: g(&self.skipped),
            restored: g(&self.restored),
            restores: g(&self.restores),
            standby_records: g(&self.standby_records),
        }
    }
}

/// The Prometheus view of a set of deployments (one scrape): counters,
/// gauges and the commit latency histogram, labelled by tenant, deployment
/// and version.
#[derive(Debug, Default)]
pub struct Exposition {
    /// (tenant, deployment, version, metrics).
    pub deployments: Vec<(String, String, u64, Arc<Metrics>)>,
}

impl Exposition {
    /// The OpenMetrics content type of [`Exposition::encode_text`].
    pub const CONTENT_TYPE: &'static str =
        "application/openmetrics-text; version=1.0.0; charset=utf-8";

    /// The series as OpenMetrics text.
    pub fn encode_text(self) -> Result<String, std::fmt::Error> {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(self));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)?;
        Ok(text)
    }
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        type Get = fn(&Metrics) -> u64;
        let counters: [(&str, &str, Get); 21] = [
            (
                "onceflow_records",
                "Input records processed (committed)",
                |m| m.records.load(Ordering::Relaxed),
            ),
            (
                "onceflow_outputs",
                "Output records produced (committed)",
                |m| m.outputs.load(Ordering::Relaxed),
            ),
            ("onceflow_commits", "Transactions committed", |m| {
                m.commits.load(Ordering::Relaxed)
            }),
            ("onceflow_aborts", "Transactions aborted", |m| {
                m.aborts.load(Ordering::Relaxed)
            }),
            (
                "onceflow_fenced",
                "Producers fenced by a newer incarnation",
                |m| m.fenced.load(Ordering::Relaxed),
            ),
            (
                "onceflow_worker_restarts",
                "Worker sessions restarted after an error",
                |m| m.restarts.load(Ordering::Relaxed),
            ),
            (
                "onceflow_dead_lettered",
                "Records sent to the dead-letter topic",
                |m| m.dead_lettered.load(Ordering::Relaxed),
            ),
            (
                "onceflow_late_records_dropped",
                "Late records dropped (time.late-records = \"drop\")",
                |m| m.late_dropped.load(Ordering::Relaxed),
            ),
            (
                "onceflow_punctuations",
                "Stream-time punctuations called",
                |m| m.punctuations.load(Ordering::Relaxed),
            ),
            (
                "onceflow_skipped",
                "Records skipped by the error policy",
                |m| m.skipped.load(Ordering::Relaxed),
            ),
            (
                "onceflow_restored_records",
                "Changelog records replayed into stores",
                |m| m.restored.load(Ordering::Relaxed),
            ),
            (
                "onceflow_standby_records",
                "Changelog records written into standby stores (warm copies of other hosts' tasks)",
                |m| m.standby_records.load(Ordering::Relaxed),
            ),
            ("onceflow_fuel", "Fuel burned by the guests", |m| {
                m.fuel.load(Ordering::Relaxed)
            }),
            (
                "onceflow_input_bytes",
                "Bytes of input records processed (committed)",
                |m| m.bytes_in.load(Ordering::Relaxed),
            ),
            (
                "onceflow_output_bytes",
                "Bytes of output records produced (committed)",
                |m| m.bytes_out.load(Ordering::Relaxed),
            ),
            (
                "onceflow_state_bytes_written",
                "Bytes of changelog records committed",
                |m| m.state_bytes.load(Ordering::Relaxed),
            ),
            ("onceflow_log_lines", "Guest log lines written", |m| {
                m.log_lines.load(Ordering::Relaxed)
            }),
            (
                "onceflow_cpu_throttled_microseconds",
                "Time its workers waited because the tenant was over its cpu-share",
                |m| m.throttled_us.load(Ordering::Relaxed),
            ),
            (
                "onceflow_hibernations",
                "Times the deployment hibernated on this host (--hibernate-after-secs)",
                |m| m.hibernations.load(Ordering::Relaxed),
            ),
            (
                "onceflow_memory_commits",
                "Commits made early because the deployment or its tenant reached its memory budget",
                |m| m.memory_commits.load(Ordering::Relaxed),
            ),
            (
                "onceflow_guest_call_microseconds",
                "Time its guest calls ran, less the time they were parked for the tenant's cpu-share",
                |m| m.call_us.load(Ordering::Relaxed),
            ),
        ];
        let labels = |(t, d, v, _): &(String, String, u64, Arc<Metrics>)| {
            vec![
                ("tenant", t.clone()),
                ("deployment", d.clone()),
                ("version", v.to_string()),
            ]
        };
        for (name, help, get) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for d in &self.deployments {
                ConstCounter::new(get(&d.3)).encode(family.encode_family(&labels(d))?)?;
            }
        }
        type Level = fn(&Metrics) -> i64;
        let gauges: [(&str, &str, Level); 5] = [
            (
                "onceflow_hibernating",
                "1 while the deployment hibernates on this host: no input lately, no workers or clients",
                |m| i64::from(m.hibernating.load(Ordering::Relaxed)),
            ),
            (
                "onceflow_failing",
                "1 while the deployment's workers are in a restart loop (see describe's last errors)",
                |m| i64::from(m.failing().is_some()),
            ),
            (
                "onceflow_lag_records",
                "Records between the workers' positions and the last stable offsets",
                |m| m.load().lag,
            ),
            (
                "onceflow_partitions",
                "Input partitions owned by this host",
                |m| m.load().partitions.len() as i64,
            ),
            (
                "onceflow_restoring_partitions",
                "Store partitions being restored from their changelogs",
                |m| m.restoring.load(Ordering::Relaxed) as i64,
            ),
        ];
        for (name, help, get) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for d in &self.deployments {
                ConstGauge::new(get(&d.3)).encode(family.encode_family(&labels(d))?)?;
            }
        }
        let mut latency = encoder.encode_descriptor(
            "onceflow_commit_latency_seconds",
            "Time to commit a transaction",
            None,
            MetricType::Histogram,
        )?;
        for d in &self.deployments {
            d.3.commit_seconds
                .encode(latency.encode_family(&labels(d))?)?;
        }
        Ok(())
    }
}

/// Percentiles of microsecond samples (sorts them).
pub fn latency_of(samples: &mut [u64]) -> Latency {
    if samples.is_empty() {
        return Latency::default();
    }
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        Duration::from_micros(samples[i])
    };
    Latency {
        count: samples.len(),
        p50: at(0.50),
        p99: at(0.99),
        max: at(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn percentiles() {
        let mut v: Vec<u64> = (1..=100).collect();
        let l = latency_of(&mut v);
        assert_eq!(l.count, 100);
        assert_eq!(l.p50, Duration::from_micros(51));
        assert_eq!(l.p99, Duration::from_micros(99));
        assert_eq!(l.max, Duration::from_micros(100));
        assert_eq!(latency_of(&mut []), Latency::default());
    }

    /// A worker with work in hand, or one that has not reported lately,
    /// keeps its deployment from hibernating (`stream::hibernate`).
    #[test]
    fn a_worker_holding_work_or_silent_is_unsettled() {
        let m = Metrics::default();
        let now = Instant::now();
        let settled = WorkerLoad {
            reported: Some(now),
            ..Default::default()
        };
        m.worker_load(0, settled.clone());
        assert_eq!(m.load().unsettled, 0);
        m.worker_load(
            1,
            WorkerLoad {
                unsettled: 1,
                ..settled.clone()
            },
        );
        assert_eq!(m.load().unsettled, 1);
        m.worker_load(
            1,
            WorkerLoad {
                reported: Some(now - LOAD_REPORT_STALE - Duration::from_secs(1)),
                ..settled
            },
        );
        assert_eq!(m.load().unsettled, 1, "a silent worker counts as busy");
    }

    #[test]
    fn exposition_labels_every_series() {
        let m = Arc::new(Metrics::default());
        Metrics::add(&m.records, 42);
        m.commit_latency(Duration::from_millis(3));
        m.worker_load(
            0,
            WorkerLoad {
                partitions: [1, 2].into(),
                lag: 7,
                unfetched: 0,
                ..Default::default()
            },
        );
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Exposition {
            deployments: vec![("acme".into(), "wallet".into(), 2, m)],
        }));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        let want = "onceflow_records_total{tenant=\"acme\",deployment=\"wallet\",version=\"2\"} 42";
        assert!(text.contains(want), "{text}");
        assert!(
            text.contains(
                "onceflow_lag_records{tenant=\"acme\",deployment=\"wallet\",version=\"2\"} 7"
            ),
            "{text}"
        );
        assert!(text.contains("onceflow_commit_latency_seconds_count{tenant=\"acme\",deployment=\"wallet\",version=\"2\"} 1"), "{text}");
    }
}
