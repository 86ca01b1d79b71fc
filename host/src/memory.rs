//! What the host holds in memory on a guest's behalf, bounded per
//! deployment and per tenant: outputs and state changes not yet committed,
//! the outputs of a commit in flight, a sink's batches.
//!
//! Every per-call cap (64 MiB of outputs and writes, `task/effects.rs`) bounds one
//! call; this bounds what calls add up to. Each holder (a worker thread, a
//! sink) keeps a [`Held`] account that counts its bytes against its
//! deployment's [`MemoryBudget`] and its tenant's on this host. A worker's
//! task stops a batch after the call that fills the room left
//! ([`Held::room`], `task::BatchOutcome::room`); when a holder finds either
//! budget over its limit, it commits what it holds (a worker commits its
//! transaction, a sink hands over its batch) and goes on with the rest: a
//! polled batch is split and committed in parts. A holder
//! never waits for another to give memory back, so budgets cannot
//! deadlock; the price is that each holder may overshoot by one call's
//! effects (at most [`crate::task::MAX_CALL_BYTES`]) before it commits.
//!
//! The limits come from `tenants.toml` (`held-mb` per deployment,
//! `host-held-mb` per tenant and host); `onceflow run` takes
//! `--held-mb`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of a deployment's (or a sink's) holdings when nothing says
/// otherwise (`held-mb`).
pub const DEFAULT_HELD_MB: u64 = 256;

/// One budget: a limit in bytes and what its holders hold together.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: AtomicU64,
    held: AtomicU64,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            limit: AtomicU64::new(limit),
            held: AtomicU64::new(0),
        }
    }

    /// Changes the limit (the tenant's quota changed).
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// The limit, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// What all its holders hold now, in bytes.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.held() > self.limit()
    }
}

/// One holder's bytes, counted against its budgets (the deployment's,
/// and the tenant's when it has one). Given back when dropped.
#[derive(Debug)]
pub struct Held {
    budgets: Vec<Arc<MemoryBudget>>,
    bytes: u64,
}

impl Held {
    /// An account holding nothing, against `budgets`.
    pub fn new(budgets: Vec<Arc<MemoryBudget>>) -> Self {
        Self { budgets, bytes: 0 }
    }

    /// Sets what this holder holds to `bytes` and says whether all its
    /// budgets are still within their limits (false: commit, then go on).
    pub fn set(&mut self, bytes: u64) -> bool {
        if bytes >= self.bytes {
            let more = bytes - self.bytes;
            for b in &self.budgets {
                b.held.fetch_add(more, Ordering::Relaxed);
            }
        } else {
            let less = self.bytes - bytes;
            for b in &self.budgets {
                b.held.fetch_sub(less, Ordering::Relaxed);
            }
        }
        self.bytes = bytes;
        self.within()
    }

    /// Whether every budget is within its limit.
    pub fn within(&self) -> bool {
        !self.budgets.iter().any(|b| b.over())
    }

    /// How many more bytes it may hold before a budget is over its limit
    /// (zero when one already is).
    pub fn room(&self) -> u64 {
        self.budgets
            .iter()
            .map(|b| b.limit().saturating_sub(b.held()))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// What this holder holds, in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.set(0);
    }
}

/// A deployment's budgets: its own, and its tenant's on this host.
#[derive(Debug, Clone)]
pub struct MemoryLimits {
    /// The deployment's (shared by its worker threads).
    pub deployment: Arc<MemoryBudget>,
    /// The tenant's on this host (shared by its deployments and sinks);
    /// `None` outside a fleet.
    pub tenant: Option<Arc<MemoryBudget>>,
}

impl MemoryLimits {
    /// A deployment's own budget of `mb` MiB, under `tenant`'s.
    pub fn new(mb: u64, tenant: Option<Arc<MemoryBudget>>) -> Self {
        Self {
            deployment: Arc::new(MemoryBudget::new(mb.saturating_mul(1 << 20))),
            tenant,
        }
    }

    /// A new holder's account (a worker thread, a sink).
    pub fn holder(&self) -> Held {
        let mut budgets = vec![self.deployment.clone()];
        budgets.extend(self.tenant.clone());
        Held::new(budgets)
    }
}

impl Default for MemoryLimits {
    fn default() -> Self {
        Self::new(DEFAULT_HELD_MB, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_share_their_budgets_and_give_back_when_dropped() {
        let tenant = Arc::new(MemoryBudget::new(100));
        let a = MemoryLimits {
            deployment: Arc::new(MemoryBudget::new(60)),
            tenant: Some(tenant.clone()),
        };
        let b = MemoryLimits {
            deployment: Arc::new(MemoryBudget::new(60)),
            tenant: Some(tenant.clone()),
        };
        let mut a1 = a.holder();
        let mut a2 = a.holder();
        assert!(a1.set(30));
        assert!(a2.set(30), "60 of the deployment's 60");
        assert!(!a2.set(31), "61 of 60: over the deployment's budget");
        assert!(a2.set(10));
        let mut b1 = b.holder();
        assert!(b1.set(50), "the tenant holds 90 of 100");
        assert!(!b1.set(61), "101 of the tenant's 100, 61 of b's 60");
        assert!(b1.set(59), "59 of b's 60, 99 of the tenant's 100");
        drop(a1);
        assert_eq!(tenant.held(), 69);
        assert!(b1.within());
        // A lowered limit applies to what is held.
        tenant.set_limit(50);
        assert!(!b1.within());
        drop(a2);
        drop(b1);
        assert_eq!(tenant.held(), 0);
        assert_eq!(a.deployment.held(), 0);
    }
}
