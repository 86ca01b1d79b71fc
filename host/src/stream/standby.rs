//! Standby replicas (`processing.standby-replicas`, Kafka Streams'
//! `num.standby.replicas`): warm copies of the stores of tasks that other
//! instances run, so that a task moving here after its instance died
//! restores only a short tail instead of its whole changelog.
//!
//! The process's group watch (`kafka::GroupWatch`, one client for every
//! deployment) learns from the group coordinator which instance runs which
//! partition (the group's description: a worker's client id names its
//! instance, [`super::names::transactional_id`]). Under exactly-once that is
//! remembered even with no standbys ([`saw_group`], on the deployment's
//! thread), so that a host that takes over from a dead one fences its
//! transactions (`worker::producer`, `Core::start_fencing`). With standbys,
//! one thread per deployment ([`run`]) follows the changelogs. For
//! each partition it ranks the other instances by a hash of (application,
//! partition, instance) and the first `standby-replicas` of them keep a
//! standby: the partition's local stores (the same RocksDB directory a task
//! here would open), following its changelogs with read_committed, so they
//! only ever hold committed state, each store with its changelog position.
//!
//! When the group gives this instance the partition, the worker's
//! `open_store` takes the stores from the standby ([`Standbys::release`],
//! under the `open_tasks` lock, so the two never write the same database)
//! and restores from their positions as after any restart: the changelog's
//! tail, up to the stable end. A standby's stores are never read by a guest
//! (they may be behind); only a task opens them, after the standby let go.
//!
//! Not covered: table stores (restored from their own topic up to the
//! group's committed offset; a standby leaves them, and their sync time,
//! as the last task here did, so one older than its topic's
//! `delete.retention.ms` is restored in full when a task opens it); and
//! the assignor does not know about
//! standbys: with more instances than `standby-replicas` + 1, a dead
//! instance's partition can go to an instance without a warm copy, which
//! restores it in full (docs/manifest.md says so).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{Deployment, StreamError};
use crate::kafka;
use crate::state::rocks::RocksPartition;
use crate::state::{PartitionStore, StoreChanges, WriteBatch};

/// How often the group's assignment is read again: with standbys, and
/// without (then only to know whose transactions to fence after a host
/// died, `worker::producer`, `Core::start_fencing`).
const PLAN_INTERVAL: Duration = Duration::from_secs(1);
const WATCH_INTERVAL: Duration = Duration::from_secs(5);
/// How often followed changelog records are written to the stores.
const FLUSH_INTERVAL: Duration = Duration::from_millis(200);
/// Changelog records buffered before a write regardless of the interval.
const CHUNK: usize = 10_000;
/// How often the followed stores that reached their changelog's end are
/// marked in sync ([`Follower::mark_caught_up`]).
const SYNC_INTERVAL: Duration = Duration::from_secs(60);

/// The standby stores of a deployment on this instance, shared between
/// the standby thread (which writes them) and the workers (which take them
/// over).
#[derive(Default)]
pub(crate) struct Standbys {
    stores: Mutex<BTreeMap<i32, RocksPartition>>,
    /// Per partition, the client id of the worker the group last gave it
    /// to, and of the one before (as the standby thread saw the group).
    owners: Mutex<BTreeMap<i32, (String, Option<String>)>>,
}

impl Standbys {
    /// Takes `partition`'s stores away from the standby, closing its
    /// database (a task is about to open it; the caller holds the
    /// deployment's `open_tasks` lock, so the standby cannot take it back).
    /// Returns whether there was a standby.
    pub(crate) fn release(&self, partition: i32) -> bool {
        self.lock().remove(&partition).is_some()
    }

    /// Whether `partition` has a standby here (its directory is in use).
    pub(crate) fn holds(&self, partition: i32) -> bool {
        self.lock().contains_key(&partition)
    }

    /// The worker of another instance that last ran `partition` (its
    /// client id, also its transactional id), as the standby thread last
    /// saw the group; `None` when not known (no standbys, or never seen).
    pub(crate) fn previous_owner(&self, app: &str, me: &str, partition: i32) -> Option<String> {
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        let (current, before) = owners.get(&partition)?;
        [Some(current), before.as_ref()]
            .into_iter()
            .flatten()
            .find(|c| instance_of(app, c).is_some_and(|i| i != me))
            .cloned()
    }

    fn saw_owners(&self, app: &str, sources: &[String], members: &[kafka::GroupMember]) {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        for m in members {
            if instance_of(app, &m.client_id).is_none() {
                continue;
            }
            for (topic, p) in &m.partitions {
                if !sources.iter().any(|s| s == topic) {
                    continue;
                }
                match owners.get_mut(p) {
                    // Seen again: the owner before is history (it is kept
                    // for the moment between this thread seeing a new
                    // assignment and the worker opening the partition).
                    Some((current, before)) if *current == m.client_id => *before = None,
                    Some((current, before)) => {
                        *before = Some(std::mem::replace(current, m.client_id.clone()));
                    }
                    None => {
                        owners.insert(*p, (m.client_id.clone(), None));
                    }
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, RocksPartition>> {
        self.stores.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How often the deployment's group is described: every second with
/// standbys, every 5 s without.
pub(super) fn watch_interval(d: &Deployment) -> Duration {
    if d.manifest.processing.standby_replicas > 0 {
        PLAN_INTERVAL
    } else {
        WATCH_INTERVAL
    }
}

/// Records who owns which partition from the process's group watch, when
/// it has a newer description than `seen`: the deployment thread's part
/// when no standby thread runs (exactly-once with no standbys).
pub(super) fn saw_group(d: &Deployment, owners: &kafka::GroupRegistration, seen: &mut u64) {
    if let Some((n, members)) = owners.newer_than(*seen) {
        *seen = n;
        let sources: Vec<String> = d.manifest.sources().iter().map(|s| s.to_string()).collect();
        d.standbys
            .saw_owners(&d.manifest.application_id(), &sources, &members);
    }
}

/// Keeps this instance's standbys until the deployment shuts down. Errors
/// are logged and retried: a standby is an optimisation, never a reason to
/// stop processing. The group is read from the process's watch (`owners`)
/// or, without one, described by the thread's own client.
pub(crate) fn run(d: &Deployment, owners: Option<kafka::GroupRegistration>) {
    let mut follower = match Follower::new(d, owners) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(
                "cannot watch the consumer group (standby replicas, and fencing a dead host's \
                 transactions at once, are off on this instance): {}",
                crate::types::error_chain(&e)
            );
            return;
        }
    };
    let mut last_error: Option<(String, Instant)> = None;
    while !d.stopping() {
        if let Err(e) = follower.step() {
            let message = crate::types::error_chain(&e);
            // The same error once a minute at most (a broker down for a
            // while fails every step).
            let repeat = last_error
                .as_ref()
                .is_some_and(|(m, at)| *m == message && at.elapsed() < Duration::from_secs(60));
            if !repeat {
                if d.manifest.processing.standby_replicas > 0 {
                    tracing::warn!("standby replicas: {message}; trying again");
                } else {
                    // Only watching the group (whose workers to fence after
                    // a host died): the workers say what is wrong with Kafka.
                    tracing::info!("watching the consumer group: {message}; trying again");
                }
                last_error = Some((message, Instant::now()));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    if let Err(e) = follower.flush() {
        tracing::debug!(
            "standby replicas at shutdown: {}",
            crate::types::error_chain(&e)
        );
    }
    d.standbys.lock().clear();
}

/// The partitions this instance keeps standbys of, given the group's
/// members: for each partition some other instance runs, the
/// `replicas` other instances ranked first by [`rank`].
fn plan(
    app: &str,
    me: &str,
    sources: &[String],
    members: &[kafka::GroupMember],
    replicas: usize,
) -> BTreeSet<i32> {
    let mut owner: BTreeMap<i32, &str> = BTreeMap::new();
    let mut instances: BTreeSet<&str> = BTreeSet::new();
    for m in members {
        let Some(instance) = instance_of(app, &m.client_id) else {
            continue;
        };
        instances.insert(instance);
        for (topic, p) in &m.partitions {
            if sources.iter().any(|s| s == topic) {
                owner.insert(*p, instance);
            }
        }
    }
    let mut wanted = BTreeSet::new();
    for (p, o) in owner {
        if o == me {
            continue;
        }
        let mut ranked: Vec<(u64, &str)> = instances
            .iter()
            .filter(|i| **i != o)
            .map(|i| (rank(app, p, i), *i))
            .collect();
        ranked.sort_unstable_by(|a, b| b.cmp(a));
        if ranked.iter().take(replicas).any(|(_, i)| *i == me) {
            wanted.insert(p);
        }
    }
    wanted
}

/// The instance in a worker's client id (`<application>-<instance>-<n>`).
pub(crate) fn instance_of<'a>(app: &str, client_id: &'a str) -> Option<&'a str> {
    let rest = client_id.strip_prefix(app)?.strip_prefix('-')?;
    let (instance, n) = rest.rsplit_once('-')?;
    n.parse::<u32>().ok()?;
    Some(instance)
}

/// A hash every instance computes alike (FNV-1a, whatever the Rust
/// version): which instances keep a partition's standbys.
fn rank(app: &str, partition: i32, instance: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let partition = partition.to_be_bytes();
    let bytes = app
        .as_bytes()
        .iter()
        .chain(&[0])
        .chain(&partition)
        .chain(&[0])
        .chain(instance.as_bytes());
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Changelog records read for one store: each key's latest value
/// (`None`: a tombstone).
type Chunk = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// The standby thread's state.
struct Follower<'a> {
    d: &'a Deployment,
    consumer: BaseConsumer<kafka::QuietContext>,
    /// The partitions followed, and the next offset of each of their
    /// changelog partitions.
    followed: BTreeSet<i32>,
    next: BTreeMap<(String, i32), i64>,
    /// Records read and not yet written, per (partition, store).
    pending: BTreeMap<(i32, String), Chunk>,
    pending_records: usize,
    last_plan: Option<Instant>,
    last_flush: Instant,
    last_sync: Instant,
    /// The process's watch of the group, and the last description used.
    owners: Option<kafka::GroupRegistration>,
    seen: u64,
}

impl<'a> Follower<'a> {
    fn new(
        d: &'a Deployment,
        owners: Option<kafka::GroupRegistration>,
    ) -> Result<Self, StreamError> {
        let group = format!("{}-standby", d.manifest.application_id());
        let consumer = d.options.kafka.reader(
            &group,
            "read_committed",
            100,
            kafka::QuietContext::default(),
        )?;
        Ok(Self {
            d,
            consumer,
            followed: BTreeSet::new(),
            next: BTreeMap::new(),
            pending: BTreeMap::new(),
            pending_records: 0,
            last_plan: None,
            last_flush: Instant::now(),
            last_sync: Instant::now(),
            owners,
            seen: 0,
        })
    }

    fn store_of(&self, topic: &str) -> Option<&'a str> {
        self.d
            .changelogs
            .iter()
            .find(|(_, t)| t == topic)
            .map(|(s, _)| s.as_str())
    }

    fn step(&mut self) -> Result<(), StreamError> {
        let interval = watch_interval(self.d);
        if self.last_plan.is_none_or(|t| t.elapsed() >= interval) {
            self.last_plan = Some(Instant::now());
            self.replan()?;
        }
        if self.followed.is_empty() {
            std::thread::sleep(Duration::from_millis(100));
            return Ok(());
        }
        let mut wait = Duration::from_millis(100);
        while self.pending_records < CHUNK {
            let Some(polled) = self.consumer.poll(wait) else {
                break;
            };
            wait = Duration::ZERO;
            let m = match polled {
                Ok(m) => m,
                Err(rdkafka::error::KafkaError::PartitionEOF(_)) => continue,
                Err(e) => return Err(StreamError::kafka("following changelogs", e)),
            };
            let (topic, p) = (m.topic(), m.partition());
            let Some(store) = self.store_of(topic) else {
                continue;
            };
            if !self.followed.contains(&p) {
                continue;
            }
            self.next.insert((topic.to_owned(), p), m.offset() + 1);
            if let Some(key) = m.key() {
                self.pending
                    .entry((p, store.to_owned()))
                    .or_default()
                    .insert(key.to_vec(), m.payload().map(<[u8]>::to_vec));
                self.pending_records += 1;
            }
        }
        if self.pending_records >= CHUNK || self.last_flush.elapsed() >= FLUSH_INTERVAL {
            self.flush()?;
        }
        if self.last_sync.elapsed() >= SYNC_INTERVAL {
            self.mark_caught_up()?;
        }
        Ok(())
    }

    /// Marks each followed store whose changelog it has read to the end in
    /// sync ([`WriteBatch::synced`]), as of before the end was sampled, less
    /// the transaction timeout (records of a transaction still open then
    /// were appended before it). A standby follows changelogs only: a
    /// task's table stores keep the sync of its last run here, and
    /// `changelog::restore` judges them by that.
    fn mark_caught_up(&mut self) -> Result<(), StreamError> {
        self.last_sync = Instant::now();
        self.flush()?;
        let positions = self
            .consumer
            .position()
            .map_err(|e| StreamError::kafka("reading the standby's positions", e))?;
        let margin = self.d.options.transaction_timeout;
        let mut caught_up = Vec::new();
        for (topic, p) in self.next.keys() {
            let Some(store) = self.store_of(topic) else {
                continue;
            };
            // Past the transaction markers, unlike `next`.
            let Some(at) = positions
                .find_partition(topic, *p)
                .and_then(|e| e.offset().to_raw())
            else {
                continue;
            };
            let sampled = std::time::SystemTime::now();
            match kafka::watermarks(&self.consumer, topic, *p) {
                Ok((_, high)) if at >= high => {
                    if let Some(synced) = sampled.checked_sub(margin) {
                        caught_up.push((*p, store.to_owned(), synced));
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    // Tried again at the next interval.
                    tracing::debug!(%topic, partition = p, error = %e, "standby: no end offset");
                    break;
                }
            }
        }
        let mut stores = self.d.standbys.lock();
        for (p, store, synced) in caught_up {
            if let Some(db) = stores.get_mut(&p) {
                db.write(&WriteBatch {
                    synced: vec![(store, synced)],
                    ..WriteBatch::default()
                })
                .map_err(StreamError::State)?;
            }
        }
        Ok(())
    }

    /// Writes the records read into the standby stores, each store with
    /// its new position. A partition whose stores a task took meanwhile is
    /// no longer followed.
    fn flush(&mut self) -> Result<(), StreamError> {
        self.last_flush = Instant::now();
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let records = std::mem::take(&mut self.pending_records);
        let mut released = BTreeSet::new();
        {
            let mut stores = self.d.standbys.lock();
            for ((p, store), changes) in pending {
                let Some(db) = stores.get_mut(&p) else {
                    released.insert(p);
                    continue;
                };
                let Some(topic) = self
                    .d
                    .changelogs
                    .iter()
                    .find(|(s, _)| *s == store)
                    .map(|(_, t)| t)
                else {
                    continue;
                };
                let Some(position) = self.next.get(&(topic.clone(), p)).copied() else {
                    continue;
                };
                db.write(&WriteBatch {
                    changes: vec![StoreChanges {
                        store: store.clone(),
                        changes: changes.into_iter().collect(),
                    }],
                    positions: vec![(store, position)],
                    synced: Vec::new(),
                })
                .map_err(StreamError::State)?;
            }
        }
        self.d
            .metrics
            .standby_records
            .fetch_add(records as u64, Ordering::Relaxed);
        if !released.is_empty() {
            for p in released {
                self.forget(p);
            }
            self.reassign()?;
        }
        Ok(())
    }

    /// Reads the group's assignment and starts or stops following
    /// partitions to match it. Keeps the current standbys while the group
    /// is rebalancing.
    fn replan(&mut self) -> Result<(), StreamError> {
        let app = self.d.manifest.application_id();
        let members = match &self.owners {
            Some(owners) => match owners.newer_than(self.seen) {
                Some((n, members)) => {
                    self.seen = n;
                    members
                }
                None => return Ok(()),
            },
            None => match kafka::group_members(&self.consumer, &app)? {
                Some(members) => std::sync::Arc::new(members),
                None => return Ok(()),
            },
        };
        let sources: Vec<String> = self
            .d
            .manifest
            .sources()
            .iter()
            .map(|s| s.to_string())
            .collect();
        self.d.standbys.saw_owners(&app, &sources, &members);
        let wanted = plan(
            &app,
            &self.d.options.instance_id,
            &sources,
            &members,
            self.d.manifest.processing.standby_replicas as usize,
        );
        let stop: Vec<i32> = self.followed.difference(&wanted).copied().collect();
        let start: Vec<i32> = wanted.difference(&self.followed).copied().collect();
        if stop.is_empty() && start.is_empty() {
            return Ok(());
        }
        self.flush()?;
        let me = &self.d.options.instance_id;
        let mine: BTreeSet<i32> = members
            .iter()
            .filter(|m| instance_of(&app, &m.client_id) == Some(me.as_str()))
            .flat_map(|m| &m.partitions)
            .filter(|(topic, _)| sources.contains(topic))
            .map(|(_, p)| *p)
            .collect();
        for p in stop {
            self.d.standbys.release(p);
            self.forget(p);
            if mine.contains(&p) {
                // The worker's task opens the same stores, at the positions
                // the standby reached.
                tracing::info!(
                    partition = p,
                    "standby ended: this instance runs the partition now"
                );
            } else {
                tracing::info!(
                    partition = p,
                    "standby stopped: another instance keeps it now"
                );
            }
        }
        for p in start {
            if let Some(positions) = self.open(p)? {
                for (topic, at) in positions {
                    self.next.insert((topic, p), at);
                }
                self.followed.insert(p);
                tracing::info!(
                    partition = p,
                    "standby started: following the partition's changelogs"
                );
            }
        }
        self.reassign()
    }

    fn forget(&mut self, p: i32) {
        self.followed.remove(&p);
        self.next.retain(|(_, q), _| *q != p);
        self.pending.retain(|(q, _), _| *q != p);
    }

    fn reassign(&self) -> Result<(), StreamError> {
        let list: Vec<(&str, i32, Option<i64>)> = self
            .next
            .iter()
            .map(|((t, p), at)| (t.as_str(), *p, Some(*at)))
            .collect();
        if list.is_empty() {
            self.consumer
                .unassign()
                .map_err(|e| StreamError::kafka("unassigning changelogs", e))
        } else {
            Ok(kafka::assign(&self.consumer, &list)?)
        }
    }

    /// Opens `p`'s local stores as a standby and returns where to follow
    /// each changelog from; `None` when a task of this instance has them
    /// open. Stores whose positions this changelog cannot continue (see
    /// `changelog::restore`), or last in sync with it longer ago than its
    /// `delete.retention.ms`, are wiped first.
    fn open(&mut self, p: i32) -> Result<Option<Vec<(String, i64)>>, StreamError> {
        let d = self.d;
        let path = d.store_dir(p);
        let stores = d.manifest.local_stores();
        let positions = {
            let open = d.open_tasks.lock().unwrap_or_else(|e| e.into_inner());
            if open.contains(&p) {
                return Ok(None);
            }
            let mut db = RocksPartition::open(&path, &stores).map_err(StreamError::State)?;
            let mut positions = Vec::new();
            for (store, topic) in &d.changelogs {
                let mut at = db
                    .changelog_position(store)
                    .map_err(StreamError::State)?
                    .unwrap_or(0);
                // As `changelog::restore` judges it: a store last in sync
                // longer ago than its changelog's delete.retention.ms is
                // followed from the start.
                let horizon = d.trust_horizon(store);
                if at > 0
                    && db
                        .synced_at(store)
                        .map_err(StreamError::State)?
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > horizon)
                {
                    let wiped = db.wipe(store).map_err(StreamError::State)?;
                    tracing::warn!(
                        %topic,
                        partition = p,
                        position = at,
                        wiped,
                        "the standby's store {store} was last in sync with its changelog longer \
                         ago than the topic's delete.retention.ms: wiped it and following the \
                         changelog from its start"
                    );
                    at = 0;
                }
                positions.push((topic.clone(), at));
            }
            d.standbys.lock().insert(p, db);
            positions
        };
        // The bounds, outside the locks (a broker may be slow to answer).
        let mut valid = true;
        for (topic, at) in &positions {
            let (low, high) = kafka::watermarks(&self.consumer, topic, p)?;
            if *at > high || (*at < low && *at > 0) {
                tracing::warn!(
                    %topic,
                    partition = p,
                    position = at,
                    low,
                    high,
                    "the local stores do not match the changelog (the topic was recreated or \
                     truncated): wiping them and following the changelog from its start"
                );
                valid = false;
            }
        }
        if valid {
            return Ok(Some(positions));
        }
        let open = d.open_tasks.lock().unwrap_or_else(|e| e.into_inner());
        if open.contains(&p) || !d.standbys.release(p) {
            return Ok(None);
        }
        remove_dir(&path)?;
        let db = RocksPartition::open(&path, &stores).map_err(StreamError::State)?;
        d.standbys.lock().insert(p, db);
        drop(open);
        Ok(Some(
            positions.into_iter().map(|(topic, _)| (topic, 0)).collect(),
        ))
    }
}

fn remove_dir(path: &std::path::Path) -> Result<(), StreamError> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StreamError::State(crate::state::StateError::Backend {
            store: path.display().to_string(),
            message: format!("cannot remove stale local stores: {e}"),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(client_id: &str, partitions: &[i32]) -> kafka::GroupMember {
        kafka::GroupMember {
            client_id: client_id.to_owned(),
            partitions: partitions.iter().map(|p| ("in".to_owned(), *p)).collect(),
        }
    }

    #[test]
    fn the_instance_is_read_from_a_workers_client_id() {
        assert_eq!(
            instance_of("acme.wallet", "acme.wallet-host-a-0"),
            Some("host-a")
        );
        assert_eq!(instance_of("acme.wallet", "acme.wallet-b-12"), Some("b"));
        assert_eq!(instance_of("acme.wallet", "other-b-1"), None);
        assert_eq!(instance_of("acme.wallet", "acme.wallet-b-x"), None);
    }

    /// With two instances and one standby, each keeps a standby of every
    /// partition the other runs, and none of its own.
    #[test]
    fn two_instances_keep_each_others_partitions() {
        let members = [
            member("app-a-0", &[0, 1]),
            member("app-a-1", &[2]),
            member("app-b-0", &[3, 4, 5]),
        ];
        let sources = ["in".to_owned()];
        assert_eq!(
            plan("app", "a", &sources, &members, 1),
            BTreeSet::from([3, 4, 5])
        );
        assert_eq!(
            plan("app", "b", &sources, &members, 1),
            BTreeSet::from([0, 1, 2])
        );
        assert!(plan("app", "b", &sources, &members, 0).is_empty());
    }

    /// With more instances, each partition has exactly `replicas` standbys,
    /// never on its owner, and every instance agrees.
    #[test]
    fn each_partition_has_the_asked_number_of_standbys() {
        let members = [
            member("app-a-0", &[0, 1, 2]),
            member("app-b-0", &[3, 4, 5]),
            member("app-c-0", &[6, 7, 8]),
            member("app-d-0", &[9, 10, 11]),
        ];
        let sources = ["in".to_owned()];
        for replicas in 1..=3 {
            let plans: Vec<BTreeSet<i32>> = ["a", "b", "c", "d"]
                .iter()
                .map(|me| plan("app", me, &sources, &members, replicas))
                .collect();
            for p in 0..12 {
                let keepers: Vec<usize> = (0..4).filter(|i| plans[*i].contains(&p)).collect();
                assert_eq!(keepers.len(), replicas, "partition {p}");
                assert!(
                    !keepers.contains(&(p as usize / 3)),
                    "partition {p} on its owner"
                );
            }
        }
    }
}
