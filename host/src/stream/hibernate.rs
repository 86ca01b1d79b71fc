//! Hibernation: a deployment with nothing to do gives back its clients and
//! threads, and wakes when input arrives.
//!
//! A host of hundreds of deployments pays, for each idle one, two
//! librdkafka clients (a consumer in the group and a transactional
//! producer: about 10 OS threads, 4 broker connections, and a fetch every
//! few milliseconds), its worker and standby threads and its open stores.
//! So when none of a deployment's input partitions (all of them, not only
//! this host's: inputs and tables) got a committed record for
//! [`Hibernation::after`], and this host's workers have processed
//! everything and restore nothing, the workers stop as at a shutdown
//! (commit, leave the group) and the deployment's thread waits on the
//! process's [`EndWatch`] until the end of one of those partitions moves.
//! Then the workers start again, as after a restart: a clean one, whose
//! stores are current (their positions say so), so waking costs the
//! group's join and the producer's `InitProducerId`, not a restore.
//!
//! The quiet window is at least a group session long ([`shortest_window`]):
//! a member that died holding a backlog is out of the group by then, and
//! its partitions are this instance's, before this instance may sleep.
//!
//! Exactly-once is unchanged: hibernating is a clean stop and waking a
//! start, the paths every restart takes. What is checked before stopping
//! is only about cost: a deployment that still has input would wake at
//! once. Every instance of a deployment decides alike (the ends are the
//! same for all), so instances hibernate together when the whole input is
//! quiet, and none hibernates while any partition is busy: there is no
//! back and forth of partitions between a sleeping and a working
//! instance.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Deployment;
use crate::kafka::{EndWatch, Ends};

/// A deployment's hibernation settings (`--hibernate-after-secs`).
#[derive(Clone)]
pub struct Hibernation {
    /// How long the inputs stay unchanged, with nothing left to do here,
    /// before the deployment hibernates.
    pub after: Duration,
    /// The process's watch of partition ends (shared by its deployments).
    pub ends: Arc<EndWatch>,
}

impl std::fmt::Debug for Hibernation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hibernation")
            .field("after", &self.after)
            .finish_non_exhaustive()
    }
}

/// Watches a running deployment for the moment it may hibernate.
pub(super) struct Idle {
    after: Duration,
    partitions: Vec<(String, i32)>,
    /// The records count when last seen changing.
    records: u64,
    /// Since when nothing changed, and the inputs' ends then (`None` until
    /// they were read: the quiet window starts with them).
    quiet: Option<(Instant, Ends)>,
}

/// The shortest quiet window: longer than a group session, so that a
/// member that died (or hibernated and then died: a static member stays in
/// the group for its session) has been removed and its partitions given to
/// this instance, which then sees their backlog, before it may hibernate.
/// Without that, the backlog of a dead member's partitions would wait for
/// the next record. Under KIP-848 the brokers' session (45 s by default).
pub(super) fn shortest_window(d: &Deployment) -> Duration {
    let session = match d.options.group_protocol {
        super::GroupProtocol::Classic => d.options.session_timeout,
        super::GroupProtocol::Consumer => Duration::from_secs(45),
    };
    session + Duration::from_secs(2)
}

impl Idle {
    pub(super) fn new(d: &Deployment, after: Duration, partitions: i32) -> Idle {
        let after = after.max(shortest_window(d));
        let partitions = d
            .manifest
            .sources()
            .into_iter()
            .flat_map(|t| (0..partitions).map(move |p| (t.to_owned(), p)))
            .collect();
        Idle {
            after,
            partitions,
            records: d.metrics.snapshot().records,
            quiet: None,
        }
    }

    /// The inputs' ends to wait on if the deployment may hibernate now;
    /// called every second or so while it runs.
    pub(super) fn check(&mut self, d: &Deployment, watch: &EndWatch) -> Option<Ends> {
        let records = d.metrics.snapshot().records;
        // (Not the lag figure: librdkafka counts it from the offsets it
        // knows committed, and the workers commit theirs in transactions,
        // so it may be stale.)
        let load = d.metrics.load();
        // (`unsettled`: a worker with work not committed yet, or one whose
        // loop has not reported lately. Without it, a worker re-creating
        // its producer after an abort, its batch rewound and not processed
        // again yet, looked idle: 500 deployments woken at once after a
        // restart left three with 20 payments each, unprocessed, asleep.)
        let busy = records != self.records
            || load.unfetched != 0
            || load.unsettled != 0
            || d.metrics.restoring.load(Ordering::Relaxed) != 0
            || d.metrics.failing().is_some();
        if busy {
            tracing::trace!(
                records,
                unfetched = load.unfetched,
                unsettled = load.unsettled,
                restoring = d.metrics.restoring.load(Ordering::Relaxed),
                "not idle"
            );
            self.records = records;
            self.quiet = None;
            return None;
        }
        let Some((since, ends)) = &self.quiet else {
            // The window starts once the ends are known; a failure to read
            // them (a broker away) only delays hibernating.
            self.quiet = match watch.ends(&self.partitions) {
                Ok(ends) => Some((Instant::now(), ends)),
                Err(e) => {
                    tracing::debug!(
                        "cannot read the inputs' ends: {}",
                        crate::types::error_chain(&e)
                    );
                    None
                }
            };
            return None;
        };
        if since.elapsed() < self.after {
            return None;
        }
        let now = watch.ends(&self.partitions).ok()?;
        if now != *ends || now.len() != self.partitions.len() {
            tracing::trace!(?now, before = ?ends, "the inputs' ends moved");
            // Input came and went (another instance processed it), or a
            // partition did not answer: a new window.
            self.quiet = Some((Instant::now(), now));
            return None;
        }
        Some(now)
    }
}

/// Waits, with the workers stopped, until one of `ends`' partitions moves
/// (true: start the workers again) or the deployment is asked to stop
/// (false).
pub(super) fn hibernate(d: &Deployment, h: &Hibernation, ends: Ends) -> bool {
    let app = d.manifest.application_id();
    d.metrics.hibernating.store(true, Ordering::Relaxed);
    d.metrics.hibernations.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        %app,
        "hibernating: no input for {} s; the workers left the group and closed their \
         clients; waking when a record arrives",
        h.after.max(shortest_window(d)).as_secs()
    );
    let since = Instant::now();
    // A query of its stores wakes it too (`queries.rs`).
    let asked = d.queries().map(|q| q.hibernating(&app, true));
    let asked_to_wake = || asked.as_ref().is_some_and(|a| a.load(Ordering::Relaxed));
    let moved = h.ends.wait_moved(ends, &|| {
        d.shutdown.load(Ordering::Relaxed) || asked_to_wake()
    });
    let queried = !moved && asked_to_wake() && !d.shutdown.load(Ordering::Relaxed);
    if let Some(q) = d.queries() {
        q.hibernating(&app, false).store(false, Ordering::Relaxed);
    }
    d.metrics.hibernating.store(false, Ordering::Relaxed);
    if moved {
        tracing::info!(
            %app,
            "waking: input arrived after {:.1} s of hibernation",
            since.elapsed().as_secs_f64()
        );
    } else if queried {
        tracing::info!(
            %app,
            "waking: a query of its stores after {:.1} s of hibernation",
            since.elapsed().as_secs_f64()
        );
    }
    moved || queried
}
