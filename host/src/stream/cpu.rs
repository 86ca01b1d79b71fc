//! A tenant's share of the host's CPU: a budget of guest-call time that
//! every call of the tenant's deployments on this host charges as it runs
//! (at each 10 ms epoch tick, `sandbox/clock.rs`, wired in `stream::run`),
//! and that parks the call right there while the tenant is over its
//! share.
//!
//! Fuel bounds one record; this bounds a tenant: a neighbour looping to its
//! fuel limit on every record, or simply sending 10x the load, gets its
//! share of the cores and no more, and the other tenants' workers the rest.
//! The charge is the call's wall time, which is its CPU time when the host
//! is idle (a guest call does no I/O) and more when the host is contended:
//! a tenant is held back hardest exactly when others want the CPU.
//!
//! A token bucket: the budget refills at `share x cores` seconds per second
//! up to [`BURST`] of it, a call's time is taken out as it runs, and while
//! the balance is negative the call is parked for it to refill (at most
//! [`MAX_WAIT`] at a time; parked time does not count against the call's
//! `limits.timeout-ms`). Charged only after each call, one call of 64
//! records overran a 10% share six-fold before its first wait (issue 45).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest a budget may save up: a tenant idle for a while may then
/// run this long at full speed.
pub const BURST: Duration = Duration::from_millis(250);
/// The longest one wait: a worker over budget still serves its consumer
/// and commits between waits.
pub const MAX_WAIT: Duration = Duration::from_secs(1);
/// A wait lasts until the budget holds this much of the share again, not
/// just until the debt is paid: a tenant of short calls then parks once
/// per several calls instead of after each (a park costs CPU of its own:
/// with one-record batches at a share of 0.25, 0.30 of a core went by when
/// each call parked).
pub const PARK_QUANTUM: Duration = Duration::from_millis(10);

/// One tenant's CPU budget on one host, shared by its workers.
#[derive(Debug)]
pub struct CpuBudget {
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    /// CPU seconds per second of wall time; `None`: no limit (the tenant's
    /// `cpu-share` is 100), nothing charged.
    rate: Option<f64>,
    /// Seconds of guest-call time available (negative: owed).
    balance: f64,
    at: Instant,
}

impl CpuBudget {
    /// A budget of `rate` CPU seconds per second (`share x cores`); `None`:
    /// no limit, until [`set_rate`](Self::set_rate) sets one. A tenant's
    /// workers hold its budget whether or not it is limited, so that a
    /// `cpu-share` lowered in tenants.toml applies to what already runs.
    pub fn new(rate: Option<f64>) -> Self {
        Self {
            state: Mutex::new(Bucket {
                rate: rate.map(|r| r.max(0.01)),
                balance: 0.0,
                at: Instant::now(),
            }),
        }
    }

    /// Changes the rate (the tenant's quota changed); `None` lifts the
    /// limit.
    pub fn set_rate(&self, rate: Option<f64>) {
        let mut b = self.state.lock().unwrap_or_else(|e| e.into_inner());
        b.refill();
        b.rate = rate.map(|r| r.max(0.01));
    }

    /// The rate, in CPU seconds per second (`None`: no limit).
    pub fn rate(&self) -> Option<f64> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).rate
    }

    /// Takes `used` out of the budget; returns how long the caller should
    /// wait before its next call (zero while within the share, or with no
    /// limit).
    pub fn charge(&self, used: Duration) -> Duration {
        let mut b = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Unlimited: nothing to refill or charge (set_rate starts a limit
        // from an empty budget).
        let Some(rate) = b.rate else {
            return Duration::ZERO;
        };
        b.refill();
        b.balance -= used.as_secs_f64();
        if b.balance >= 0.0 {
            return Duration::ZERO;
        }
        (Duration::from_secs_f64(-b.balance / rate) + PARK_QUANTUM).min(MAX_WAIT)
    }
}

impl crate::sandbox::CpuMeter for CpuBudget {
    fn charge(&self, used: Duration) -> Duration {
        CpuBudget::charge(self, used)
    }
}

impl Bucket {
    fn refill(&mut self) {
        let now = Instant::now();
        match self.rate {
            Some(rate) => {
                let burst = BURST.as_secs_f64() * rate;
                self.balance =
                    (self.balance + now.duration_since(self.at).as_secs_f64() * rate).min(burst);
            }
            // Lifting or setting a limit (set_rate): a limit set later
            // starts from an empty budget.
            None => self.balance = 0.0,
        }
        self.at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_over_its_share_waits_for_it() {
        // Half a core: 100 ms of calls owe 200 ms of waiting, less what
        // refilled meanwhile (measured: a busy machine may deschedule this
        // thread between the two calls).
        let started = std::time::Instant::now();
        let b = CpuBudget::new(Some(0.5));
        let wait = b.charge(Duration::from_millis(100));
        let between = started.elapsed();
        assert!(
            wait <= Duration::from_millis(200) + PARK_QUANTUM
                && wait + between >= Duration::from_millis(199) + PARK_QUANTUM,
            "{wait:?} after {between:?}"
        );
        // A huge call waits at most MAX_WAIT at a time.
        assert_eq!(b.charge(Duration::from_secs(10)), MAX_WAIT);
        // Within the share: no wait once the budget has refilled.
        let b = CpuBudget::new(Some(4.0));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(b.charge(Duration::from_millis(100)), Duration::ZERO);
        // The rate can change.
        b.set_rate(Some(1.0));
        assert_eq!(b.rate(), Some(1.0));
    }

    #[test]
    fn an_unlimited_budget_charges_nothing_until_a_limit_is_set() {
        let b = CpuBudget::new(None);
        assert_eq!(b.charge(Duration::from_secs(10)), Duration::ZERO);
        // The share lowered while the workers run: the next calls wait.
        b.set_rate(Some(0.1));
        assert!(b.charge(Duration::from_millis(100)) > Duration::from_millis(500));
        b.set_rate(None);
        assert_eq!(b.charge(Duration::from_secs(10)), Duration::ZERO);
    }
}
