//! A call's clock: its deadline, and its tenant's CPU share charged while
//! it runs.
//!
//! The epoch ticker interrupts every running call each epoch tick (10 ms);
//! at each tick `CallClock::tick` charges the time the call ran since the
//! last tick (its wall time, less the time it was parked: a guest call does
//! no I/O, so that is its CPU time on an idle host, and more on a busy one,
//! where a tenant is held back hardest when others want the CPU) to the
//! tenant's [`CpuMeter`] and, when the tenant is over its share, parks the
//! call right there until the share has refilled. Charged only between calls, a deployment whose calls took
//! 64 records each used 1.20 cores at `cpu-share = 10` on 2 cores (issue
//! 45): one long call overran the share six-fold before the first wait.
//! Then the deadline: a call's `limits.timeout-ms` counts its own running
//! time, not the time it was parked.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a call's CPU time is charged to: a tenant's share of the host
/// (`stream::cpu::CpuBudget`).
pub trait CpuMeter: Send + Sync {
    /// Takes `used` CPU time out of the share; returns how long the caller
    /// should wait before it goes on (zero while within the share).
    fn charge(&self, used: Duration) -> Duration;
}

/// One instance's clock, restarted for each call.
pub(crate) struct CallClock {
    meter: Option<Arc<dyn CpuMeter>>,
    started: Instant,
    timeout: Duration,
    /// Time parked for the share in this call.
    parked: Duration,
    /// Parked time not yet taken by [`CallClock::take_parked`].
    parked_total: Duration,
    /// When the call was last charged (or last woke from parking).
    mark: Instant,
}

impl CallClock {
    pub(crate) fn new(meter: Option<Arc<dyn CpuMeter>>) -> Self {
        Self {
            meter,
            started: Instant::now(),
            timeout: Duration::MAX,
            parked: Duration::ZERO,
            parked_total: Duration::ZERO,
            mark: Instant::now(),
        }
    }

    /// A call begins, on this thread, with `timeout` of running time. The
    /// charge runs on from the last one (or [`CallClock::charge_from_now`]):
    /// the host's work for the batch between two calls is the tenant's too.
    pub(crate) fn start(&mut self, timeout: Duration) {
        self.started = Instant::now();
        self.timeout = timeout;
        self.parked = Duration::ZERO;
    }

    /// Charges from now on, not for the time since the last charge (a new
    /// batch: what the worker did since the last one was not the
    /// tenant's).
    pub(crate) fn charge_from_now(&mut self) {
        self.mark = Instant::now();
    }

    /// An epoch tick during the call: charge the share (and park while it
    /// is spent); `false` once the call has run past its deadline.
    pub(crate) fn tick(&mut self) -> bool {
        self.charge();
        self.started.elapsed().saturating_sub(self.parked) < self.timeout
    }

    /// The call returned: charge what it used since the last tick (a call
    /// shorter than a tick is charged here only), parking before the next
    /// call if the share is spent.
    pub(crate) fn finish(&mut self) {
        self.charge();
    }

    /// Time parked for the share since the last time this was asked.
    pub(crate) fn take_parked(&mut self) -> Duration {
        std::mem::take(&mut self.parked_total)
    }

    fn charge(&mut self) {
        let Some(meter) = &self.meter else {
            return;
        };
        let now = Instant::now();
        let wait = meter.charge(now.duration_since(self.mark));
        self.mark = now;
        if !wait.is_zero() {
            std::thread::sleep(wait);
            // As long as it actually took (a loaded machine oversleeps),
            // and not charged.
            self.mark = Instant::now();
            let parked = self.mark.duration_since(now);
            self.parked += parked;
            self.parked_total += parked;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records what it was charged; asks for `wait` each time.
    struct Recorder {
        charged: Mutex<Duration>,
        wait: Duration,
    }

    impl CpuMeter for Recorder {
        fn charge(&self, used: Duration) -> Duration {
            *self.charged.lock().unwrap_or_else(|e| e.into_inner()) += used;
            self.wait
        }
    }

    fn spin(d: Duration) {
        let started = Instant::now();
        while started.elapsed() < d {
            std::hint::black_box(0u64);
        }
    }

    #[test]
    fn a_call_is_charged_as_it_runs_and_parks_when_asked() {
        let meter = Arc::new(Recorder {
            charged: Mutex::new(Duration::ZERO),
            wait: Duration::from_millis(500),
        });
        let mut clock = CallClock::new(Some(meter.clone()));
        clock.start(Duration::from_secs(60));
        spin(Duration::from_millis(30));
        assert!(clock.tick(), "within its deadline");
        let charged = *meter.charged.lock().unwrap();
        // At least the time it spun (a little more: the test's own work).
        assert!(
            charged >= Duration::from_millis(30) && charged < Duration::from_secs(5),
            "{charged:?}"
        );
        clock.finish();
        // Parked twice (the tick, the finish), 500 ms each at least; the
        // parking itself is not charged (the finish charges only what ran
        // since the tick woke up: far less than the 500 ms parked, on a
        // busy machine too).
        assert!(clock.take_parked() >= Duration::from_millis(1000));
        assert_eq!(clock.take_parked(), Duration::ZERO);
        let after = *meter.charged.lock().unwrap();
        assert!(after - charged < Duration::from_millis(500), "{after:?}");
    }

    #[test]
    fn parked_time_does_not_count_against_the_deadline() {
        let meter = Arc::new(Recorder {
            charged: Mutex::new(Duration::ZERO),
            wait: Duration::from_millis(600),
        });
        let mut clock = CallClock::new(Some(meter));
        clock.start(Duration::from_millis(500));
        // Parked 600 ms at each tick, past the 500 ms deadline in wall
        // time, but the call itself has hardly run.
        assert!(clock.tick());
        assert!(clock.tick());
        // Without a meter, the deadline is the wall time.
        let mut clock = CallClock::new(None);
        clock.start(Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(15));
        assert!(!clock.tick(), "past its deadline");
    }
}
