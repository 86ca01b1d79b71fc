//! One id, one host process. A host's id is the instance id of every
//! deployment it runs: part of its transactional ids and static group
//! memberships. Two live processes with one id fence each other's
//! producers and members forever (each restart fences the other), so:
//!
//! - each host process has a random *incarnation*, published with its
//!   statuses and with a heartbeat (`_host/<id>` in the status topic) every
//!   [`STATUS_INTERVAL`], and removed when it stops cleanly;
//! - at start ([`Fleet::check_unique_host_id`]) a host that finds a recent
//!   status with its id and another incarnation watches it for a few
//!   intervals: if it is refreshed, another process is alive with this id
//!   and this host refuses to start; if not, it was this host's own
//!   previous run (a crash) and the host carries on;
//! - while running ([`Fleet::watch_for_duplicates`]) a host that sees its
//!   id refreshed by another incarnation (two started at once) logs an
//!   error every 30 s naming the id and what to do. It does not stop
//!   itself: which of the two should yield is the operator's call, and a
//!   misconfigured newcomer must not take a healthy host down.
//!
//! Refreshes are compared with the other process's own earlier stamps, not
//! with this host's clock, so clock skew does not matter except for which
//! statuses count as recent (a minute).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::registry::{HostStatus, now_ms};
use super::{Fleet, FleetError};

/// How often a host publishes its heartbeat and statuses.
pub(super) const STATUS_INTERVAL: Duration = Duration::from_secs(2);
/// How long a starting host watches a recent status of another
/// incarnation for a refresh: three intervals and a margin.
const WATCH: Duration = Duration::from_secs(7);
/// A status older than this (by this host's clock) is not looked at.
const RECENT_MS: i64 = 60_000;
/// How often the duplicate error is logged while it lasts.
const DUPLICATE_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// A new random incarnation id.
pub(super) fn new_incarnation() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// What a host tracks of other processes using its id.
#[derive(Default)]
pub(super) struct DuplicateWatch {
    /// Per status key: the latest stamp seen from another incarnation.
    seen: BTreeMap<(String, String), i64>,
    last_log: Option<Instant>,
}

impl Fleet {
    /// Statuses (heartbeats included) that another process published
    /// under this host's id, keyed by (tenant, name), with their stamps.
    fn foreign_statuses(&self) -> BTreeMap<(String, String), HostStatus> {
        self.control
            .statuses
            .all()
            .into_iter()
            .filter(|s| s.host == self.host_id && s.incarnation != self.incarnation)
            // A process that drained has stopped: no rival.
            .filter(|s| s.state != super::DRAINED)
            .map(|s| ((s.tenant.clone(), s.name.clone()), s))
            .collect()
    }

    /// Refuses to start if another live process uses this host's id: see
    /// the module's docs. Waits up to `watch` only when a recent status of
    /// another incarnation is there (after a crash, or a duplicate).
    pub fn check_unique_host_id(&self) -> Result<(), FleetError> {
        let watch = WATCH;
        let now = now_ms();
        let before: BTreeMap<(String, String), i64> = self
            .foreign_statuses()
            .into_iter()
            .map(|(k, s)| (k, s.updated_ms))
            .collect();
        let Some(latest) = before
            .values()
            .max()
            .copied()
            .filter(|t| now - t <= RECENT_MS)
        else {
            return Ok(());
        };
        tracing::warn!(
            host = %self.host_id,
            "another process published a status as host {:?} {:.1} s ago; watching for {} s whether it is still alive",
            self.host_id,
            (now - latest) as f64 / 1e3,
            watch.as_secs()
        );
        let deadline = Instant::now() + watch;
        let mut position = self.control.statuses.position();
        while Instant::now() < deadline {
            position = self
                .control
                .statuses
                .wait_change(position, Duration::from_millis(250));
            let refreshed = self
                .foreign_statuses()
                .into_iter()
                .find(|(k, s)| before.get(k).is_none_or(|stamp| s.updated_ms > *stamp));
            if let Some((_, s)) = refreshed {
                return Err(FleetError::DuplicateHost {
                    host: self.host_id.clone(),
                    age_s: ((now_ms() - s.updated_ms).max(0) + 500) / 1000,
                });
            }
        }
        tracing::info!(
            host = %self.host_id,
            "no other process refreshed it: it was an earlier run of this host that did not stop cleanly"
        );
        Ok(())
    }

    /// Publishes this host's heartbeat: `alive`, or `draining`.
    pub(super) fn heartbeat(&self) {
        self.heartbeat_saying(if self.draining() {
            super::DRAINING
        } else {
            "alive"
        });
    }

    /// The heartbeat a drained host leaves behind: `drained`. The hosts that
    /// take its partitions after it exited read it to know that its workers
    /// committed before they left (a cleared heartbeat read as a crash and
    /// they fenced the workers of the host back under the same id); its
    /// next incarnation does not watch it as a rival's ([`Self::check_unique_host_id`]).
    pub(super) fn heartbeat_drained(&self) {
        self.heartbeat_saying(super::DRAINED);
    }

    fn heartbeat_saying(&self, state: &str) {
        self.control.put_heartbeat(&HostStatus {
            host: self.host_id.clone(),
            tenant: String::new(),
            name: String::new(),
            version: 0,
            state: state.to_owned(),
            partitions: Vec::new(),
            lag: 0,
            records_per_s: 0.0,
            commits_per_s: 0.0,
            commit_p99_ms: 0.0,
            records: 0,
            aborts: 0,
            fenced: 0,
            dead_lettered: 0,
            last_errors: Vec::new(),
            updated_ms: now_ms(),
            incarnation: self.incarnation.clone(),
            hibernating: false,
            api: self.api_url(),
        });
    }

    /// Logs an error (every 30 s while it lasts) if another process keeps
    /// refreshing statuses under this host's id.
    pub(super) fn watch_for_duplicates(&self) {
        let mut watch = self.duplicates.lock().unwrap_or_else(|e| e.into_inner());
        let mut refreshed = None;
        for (key, s) in self.foreign_statuses() {
            let previous = watch.seen.insert(key, s.updated_ms);
            if previous.is_some_and(|p| s.updated_ms > p) {
                refreshed = Some(s);
            }
        }
        if let Some(s) = refreshed
            && watch
                .last_log
                .is_none_or(|t| t.elapsed() >= DUPLICATE_LOG_INTERVAL)
        {
            watch.last_log = Some(Instant::now());
            tracing::error!(
                host = %self.host_id,
                other_incarnation = %s.incarnation,
                "another live process uses host id {:?}: the two fence each other's transactions and group memberships. Stop one of them and give it its own --host-id (or its own --state-dir)",
                self.host_id
            );
        }
    }

    /// The ids of the hosts that published a status lately (this one
    /// included): the instance ids deployments run with.
    pub(super) fn live_host_ids(&self) -> Vec<String> {
        let now = now_ms();
        let mut ids: Vec<String> = self
            .control
            .statuses
            .all()
            .into_iter()
            .filter(|s| now - s.updated_ms <= RECENT_MS && s.state != super::DRAINED)
            .map(|s| s.host)
            .chain(std::iter::once(self.host_id.clone()))
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }
}
