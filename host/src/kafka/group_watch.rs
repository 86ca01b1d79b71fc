//! One watch over the consumer groups of a process's deployments: which
//! worker owns which partition, as the group coordinators describe their
//! groups. A deployment under exactly-once needs it to fence a dead
//! host's transactions at once (`stream::worker::producer`), and its
//! standbys to know what to follow (`stream::standby`).
//!
//! Each deployment used to describe its own group from a client of its own
//! (a thread and 4 librdkafka threads, 2 connections, per deployment; and a
//! ListGroups to every broker per description, which is how librdkafka
//! describes one group). Here one client and one thread serve the process:
//! a round describes one group when one is due, and every group at once
//! when several are (one ListGroups and one DescribeGroups per broker).

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;

use super::{
    ADMIN_TIMEOUT, Connection, GroupMember, KafkaError, OncePerMinute, SharedClient, stable_members,
};

/// How often the thread looks for groups due.
const ROUND: Duration = Duration::from_millis(250);

/// The process's group watch. The client and the thread start at the
/// first registration.
pub struct GroupWatch {
    state: Mutex<State>,
    /// Signalled when a group is registered (the thread sleeps while none
    /// is).
    registered: Condvar,
    client: SharedClient,
}

#[derive(Default)]
struct State {
    groups: BTreeMap<String, Watched>,
    thread_started: bool,
    /// When a failed round was last logged.
    failures: OncePerMinute,
}

struct Watched {
    /// The shortest interval its registrations asked for, and how many
    /// registrations there are.
    intervals: Vec<Duration>,
    last: Option<Instant>,
    /// The latest stable description, numbered from 1.
    view: Option<(u64, Arc<Vec<GroupMember>>)>,
}

/// A deployment's interest in its group; dropping it ends the interest.
pub(crate) struct GroupRegistration {
    watch: Arc<GroupWatch>,
    group: String,
    interval: Duration,
}

impl GroupRegistration {
    /// The group's latest stable description, if newer than `seen` (a
    /// number this returned before, or 0); with its number.
    pub(crate) fn newer_than(&self, seen: u64) -> Option<(u64, Arc<Vec<GroupMember>>)> {
        let state = self.watch.lock();
        let (n, members) = state.groups.get(&self.group)?.view.as_ref()?;
        (*n > seen).then(|| (*n, members.clone()))
    }
}

impl Drop for GroupRegistration {
    fn drop(&mut self) {
        let mut state = self.watch.lock();
        if let Some(w) = state.groups.get_mut(&self.group) {
            if let Some(i) = w.intervals.iter().position(|i| *i == self.interval) {
                w.intervals.swap_remove(i);
            }
            if w.intervals.is_empty() {
                state.groups.remove(&self.group);
            }
        }
    }
}

impl std::fmt::Debug for GroupWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let groups = self.lock().groups.len();
        f.debug_struct("GroupWatch")
            .field("groups", &groups)
            .finish_non_exhaustive()
    }
}

impl GroupWatch {
    /// A watch that describes groups through `connection`.
    pub fn new(connection: Connection) -> Arc<GroupWatch> {
        Arc::new(GroupWatch {
            state: Mutex::default(),
            registered: Condvar::new(),
            client: SharedClient::new(connection, &[], "the group watch's client"),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Describes `group` every `interval` (or more often, for another
    /// registration's sake) until the registration is dropped. `None` if
    /// the watch's thread cannot start (the caller goes without).
    pub(crate) fn register(
        self: &Arc<Self>,
        group: &str,
        interval: Duration,
    ) -> Option<GroupRegistration> {
        let mut state = self.lock();
        if !state.thread_started {
            let me = self.clone();
            match std::thread::Builder::new()
                .name("onceflow-groups".to_owned())
                .spawn(move || me.watch())
            {
                Ok(_) => state.thread_started = true,
                Err(e) => {
                    tracing::warn!(
                        "cannot start the group watch's thread ({e}): a dead host's transactions \
                         are not fenced at once, and standby replicas are not placed"
                    );
                    return None;
                }
            }
        }
        state
            .groups
            .entry(group.to_owned())
            .or_insert_with(|| Watched {
                intervals: Vec::new(),
                last: None,
                view: None,
            })
            .intervals
            .push(interval);
        self.registered.notify_all();
        Some(GroupRegistration {
            watch: self.clone(),
            group: group.to_owned(),
            interval,
        })
    }

    /// Describes `group` (or every group the brokers list, `None`): each
    /// described group's stable members, `None` for one that is not stable.
    fn describe(
        &self,
        group: Option<&str>,
    ) -> Result<BTreeMap<String, Option<Vec<GroupMember>>>, KafkaError> {
        let list = self
            .client
            .get()?
            .fetch_group_list(group, ADMIN_TIMEOUT)
            .map_err(|e| {
                KafkaError::client(
                    format!("describing consumer group {}", group.unwrap_or("(all)")),
                    e,
                )
            })?;
        Ok(list
            .groups()
            .iter()
            .map(|info| (info.name().to_owned(), stable_members(info)))
            .collect())
    }

    fn watch(self: Arc<Self>) {
        loop {
            let due: Vec<String> = {
                let state = self
                    .registered
                    .wait_while(self.lock(), |s| s.groups.is_empty())
                    .unwrap_or_else(|e| e.into_inner());
                state
                    .groups
                    .iter()
                    .filter(|(_, w)| {
                        let every = w.intervals.iter().min().copied().unwrap_or(ROUND);
                        w.last.is_none_or(|t| t.elapsed() >= every)
                    })
                    .map(|(g, _)| g.clone())
                    .collect()
            };
            if !due.is_empty() {
                let one = (due.len() == 1).then(|| due[0].as_str());
                let described = self.describe(one);
                let mut state = self.lock();
                match described {
                    Ok(found) => {
                        let now = Instant::now();
                        for (group, w) in state.groups.iter_mut() {
                            let asked = one.is_none_or(|g| g == group);
                            if !asked {
                                continue;
                            }
                            w.last = Some(now);
                            if let Some(Some(members)) = found.get(group) {
                                let n = w.view.as_ref().map_or(0, |(n, _)| *n) + 1;
                                w.view = Some((n, Arc::new(members.clone())));
                            }
                        }
                    }
                    Err(e) => {
                        let now = Instant::now();
                        for g in &due {
                            if let Some(w) = state.groups.get_mut(g) {
                                w.last = Some(now);
                            }
                        }
                        if state.failures.due() {
                            // The workers say what is wrong with Kafka.
                            tracing::info!(
                                "watching the consumer groups: {}; trying again",
                                crate::types::error_chain(&e)
                            );
                        }
                    }
                }
            }
            std::thread::sleep(ROUND);
        }
    }
}
