//! Counters and latency samples of a running deployment, shared by its
//! worker threads. Cheap to update (atomics; one short lock per commit) and
//! read by the periodic log line and the final report.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A deployment's figures.
#[derive(Debug, Default)]
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
    /// Changelog records replayed into stores while restoring.
    pub restored: AtomicU64,
    /// Store partitions restored.
    pub restores: AtomicU64,
    commit_latency_us: Mutex<Vec<u64>>,
    all_commit_latency_us: Mutex<Vec<u64>>,
}

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

    /// Records one commit's latency.
    pub fn commit_latency(&self, d: Duration) {
        let mut v = self
            .commit_latency_us
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
        }
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
}
