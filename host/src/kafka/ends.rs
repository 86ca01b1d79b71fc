//! The end offsets of many partitions, and waits for them to move: how a
//! hibernating deployment (`stream`, docs/operations.md "Capacity") learns
//! that input arrived without a client of its own. One client and one
//! thread per process whatever the number of deployments waiting: each
//! round asks for every partition anyone waits on at once (librdkafka's
//! `offsets_for_times`: one ListOffsets request per partition leader).

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use super::{ADMIN_TIMEOUT, Connection, KafkaError, OncePerMinute, SharedClient};

/// Per (topic, partition), its end: the last stable offset (a record of a
/// transaction still open does not move it; its commit does).
pub type Ends = BTreeMap<(String, i32), i64>;

/// How long a waiter sleeps between looks at its stop condition.
const STOP_CHECK: Duration = Duration::from_secs(1);

/// A process's watch over partition ends ([`EndWatch::ends`],
/// [`EndWatch::wait_moved`]). Cheap to create: the client and the thread
/// start at the first use.
pub struct EndWatch {
    /// Time between two rounds of the watching thread.
    interval: Duration,
    state: Mutex<State>,
    /// Signalled when a round found a waiter's ends moved, and when a
    /// waiter arrives (the thread sleeps while nobody waits).
    changed: Condvar,
    client: SharedClient,
}

#[derive(Default)]
struct State {
    waiters: BTreeMap<u64, Waiter>,
    next_id: u64,
    thread_started: bool,
    /// When the last failed round was logged.
    failures: OncePerMinute,
}

struct Waiter {
    since: Ends,
    moved: bool,
}

impl EndWatch {
    /// A watch whose thread asks every `interval`.
    pub fn new(connection: Connection, interval: Duration) -> Arc<EndWatch> {
        Arc::new(EndWatch {
            interval,
            state: Mutex::default(),
            changed: Condvar::new(),
            client: SharedClient::new(
                connection,
                &[("isolation.level", "read_committed")],
                "the end-offset watch's client",
            ),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ends of `partitions` now, in one round trip per leader. A
    /// partition the broker does not answer for is left out.
    pub fn ends(&self, partitions: &[(String, i32)]) -> Result<Ends, KafkaError> {
        let mut list = TopicPartitionList::new();
        for (topic, p) in partitions {
            // The offset field carries a timestamp here: `End` is -1,
            // ListOffsets' "latest".
            list.add_partition_offset(topic, *p, Offset::End)
                .map_err(|e| KafkaError::client("listing partitions to watch", e))?;
        }
        let answer = self
            .client
            .get()?
            .offsets_for_times(list, ADMIN_TIMEOUT)
            .map_err(|e| KafkaError::client("reading the ends of the inputs", e))?;
        Ok(answer
            .elements()
            .iter()
            .filter(|e| e.error().is_ok())
            .filter_map(|e| {
                let at = e.offset().to_raw().filter(|o| *o >= 0)?;
                Some(((e.topic().to_owned(), e.partition()), at))
            })
            .collect())
    }

    /// Blocks until the end of one of `since`'s partitions is not the one
    /// given (true), or `stop()` (checked every second) says to give up
    /// (false). The watch asks for all its waiters' partitions together.
    pub fn wait_moved(self: &Arc<Self>, since: Ends, stop: &dyn Fn() -> bool) -> bool {
        let id = {
            let mut state = self.lock();
            if !state.thread_started {
                let me = self.clone();
                match std::thread::Builder::new()
                    .name("onceflow-end-watch".to_owned())
                    .spawn(move || me.watch())
                {
                    Ok(_) => state.thread_started = true,
                    Err(e) => {
                        // Nobody would wake the waiter: it does not sleep.
                        tracing::warn!(
                            "cannot start the end-offset watch's thread ({e}): not hibernating"
                        );
                        return true;
                    }
                }
            }
            let id = state.next_id;
            state.next_id += 1;
            state.waiters.insert(
                id,
                Waiter {
                    since,
                    moved: false,
                },
            );
            self.changed.notify_all();
            id
        };
        let mut state = self.lock();
        loop {
            let moved = state.waiters.get(&id).is_none_or(|w| w.moved);
            if moved || stop() {
                state.waiters.remove(&id);
                return moved;
            }
            state = self
                .changed
                .wait_timeout(state, STOP_CHECK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The thread: while anyone waits, asks for every waiter's partitions
    /// each interval and wakes the waiters whose ends moved.
    fn watch(self: Arc<Self>) {
        loop {
            let partitions: Vec<(String, i32)> = {
                let state = self
                    .changed
                    .wait_while(self.lock(), |s| s.waiters.is_empty())
                    .unwrap_or_else(|e| e.into_inner());
                let mut all: Vec<(String, i32)> = state
                    .waiters
                    .values()
                    .flat_map(|w| w.since.keys().cloned())
                    .collect();
                all.sort_unstable();
                all.dedup();
                all
            };
            match self.ends(&partitions) {
                Ok(now) => {
                    let mut state = self.lock();
                    let mut any = false;
                    for w in state.waiters.values_mut() {
                        if !w.moved && moved_from(&w.since, &now) {
                            w.moved = true;
                            any = true;
                        }
                    }
                    if any {
                        self.changed.notify_all();
                    }
                }
                Err(e) => {
                    if self.lock().failures.due() {
                        tracing::warn!(
                            "hibernating deployments cannot see their inputs' ends (tried again \
                             every {} ms; they wake when it works): {}",
                            self.interval.as_millis(),
                            crate::types::error_chain(&e)
                        );
                    }
                }
            }
            std::thread::sleep(self.interval);
        }
    }
}

/// Whether any partition of `since` has another end in `now` (a partition
/// `now` does not have is not known to have moved).
fn moved_from(since: &Ends, now: &Ends) -> bool {
    since
        .iter()
        .any(|(k, at)| now.get(k).is_some_and(|end| end != at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends(list: &[(&str, i32, i64)]) -> Ends {
        list.iter()
            .map(|(t, p, o)| (((*t).to_owned(), *p), *o))
            .collect()
    }

    #[test]
    fn an_end_that_moved_either_way_wakes_and_an_unknown_one_does_not() {
        let since = ends(&[("in", 0, 10), ("in", 1, 5)]);
        assert!(!moved_from(&since, &ends(&[("in", 0, 10), ("in", 1, 5)])));
        assert!(moved_from(&since, &ends(&[("in", 0, 11), ("in", 1, 5)])));
        // A recreated or truncated topic: the workers sort it out.
        assert!(moved_from(&since, &ends(&[("in", 0, 10), ("in", 1, 0)])));
        assert!(!moved_from(&since, &ends(&[("in", 0, 10)])));
        assert!(!moved_from(&since, &Ends::new()));
    }
}
