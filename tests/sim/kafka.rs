//! The simulated Kafka: partition logs with idempotent-producer state, a
//! transaction coordinator and a group coordinator, as Kafka 4.4 answers a
//! transaction-version-1 client (librdkafka 2.12):
//!
//! - a produce request is refused with an older epoch than the partition
//!   has seen (fenced), refused unless the partition is in the producer's
//!   ongoing transaction (KIP-890 part 1: the leader asks the coordinator),
//!   and taken only with the next sequence number (an earlier one is a
//!   duplicate, acknowledged without appending; a later one is out of
//!   order);
//! - `EndTxn` writes its commit or abort marker to every partition of the
//!   transaction at once (inter-broker traffic is not simulated) and, on a
//!   commit, applies the transaction's offsets to the group;
//! - `InitProducerId` aborts the ongoing transaction and bumps the epoch;
//!   a transaction open past the transaction timeout is aborted by the
//!   coordinator with an epoch bump too;
//! - `TxnOffsetCommit` is refused unless its generation is the group's
//!   current one and its member is in the group.
//!
//! Reading `read_committed` folds a partition's log: a producer's records
//! since its last marker commit or vanish with the next one.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::Time;

/// A topic partition: `(topic, partition)`.
pub type Tp = (Topic, u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Topic {
    Output,
    Changelog,
}

/// What a record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// The output of input record `input`.
    Output { input: u64 },
    /// A store's new value for `key`.
    Change { key: u32, value: i64 },
}

#[derive(Debug, Clone)]
enum Entry {
    Data {
        pid: u32,
        value: Value,
    },
    /// A commit or abort marker: `pid`'s records since its previous one
    /// are decided.
    Marker {
        pid: u32,
    },
}

#[derive(Debug, Clone, Copy)]
struct ProducerState {
    epoch: u16,
    last_seq: Option<u32>,
}

#[derive(Debug, Default)]
struct Partition {
    log: Vec<Entry>,
    producers: HashMap<u32, ProducerState>,
}

/// Why the brokers refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// An older producer epoch than the coordinator or partition knows.
    Fenced,
    /// KIP-890 part 1: the partition is not in an ongoing transaction of
    /// this producer (or the transaction is not in a state for this).
    InvalidTxnState,
    /// A sequence number past the next one expected.
    OutOfOrder,
    /// Offsets sent with a generation that is not the group's.
    IllegalGeneration,
}

#[derive(Debug)]
struct Ongoing {
    started: Time,
    partitions: BTreeSet<Tp>,
    /// The offsets sent with the transaction: (generation, input partition
    /// -> next offset), and the generations its records were read under
    /// (what the checker needs, not what a broker knows).
    offsets: Option<(u32, BTreeMap<u32, u64>, BTreeSet<u32>)>,
}

#[derive(Debug)]
struct TxnMeta {
    pid: u32,
    epoch: u16,
    ongoing: Option<Ongoing>,
}

/// A violation the brokers' view proves at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broken {
    /// An input record's output committed a second time.
    Duplicate { input: u64, tp: Tp },
    /// A transaction committed offsets under a generation other than the
    /// one its records were read under.
    SpansGenerations { sent: u32, read: BTreeSet<u32> },
    /// A worker's store took a value the committed changelog never held.
    Uncommitted { worker: usize, key: u32, value: i64 },
}

/// The brokers.
pub struct Kafka {
    partitions: BTreeMap<Tp, Partition>,
    txns: BTreeMap<String, TxnMeta>,
    next_pid: u32,
    pub generation: u32,
    /// Members of the group and their assignments, by worker.
    pub members: BTreeMap<usize, BTreeSet<u32>>,
    /// Every generation's members and assignments (generation 0: none).
    history: Vec<BTreeMap<usize, BTreeSet<u32>>>,
    /// Committed input offsets, by input partition.
    pub committed: BTreeMap<u32, u64>,
    pub txn_timeout: Time,
    /// Committed outputs, by input id (the read_committed view, kept as
    /// markers land).
    pub outputs: BTreeMap<u64, u32>,
    /// The committed changelog, folded: the latest value per key.
    pub state: BTreeMap<u32, i64>,
    /// Every value the committed changelog held, per key.
    pub ever: BTreeMap<u32, BTreeSet<i64>>,
    pub broken: Vec<Broken>,
    /// Aborted transactions, for the figures.
    pub aborts: u64,
    pub commits: u64,
}

impl Kafka {
    pub fn new(txn_timeout: Time) -> Kafka {
        Kafka {
            partitions: BTreeMap::new(),
            txns: BTreeMap::new(),
            next_pid: 1,
            generation: 0,
            members: BTreeMap::new(),
            history: vec![BTreeMap::new()],
            committed: BTreeMap::new(),
            txn_timeout,
            outputs: BTreeMap::new(),
            state: BTreeMap::new(),
            ever: BTreeMap::new(),
            broken: Vec::new(),
            aborts: 0,
            commits: 0,
        }
    }

    /// `InitProducerId`: aborts the ongoing transaction, bumps the epoch.
    pub fn init_pid(&mut self, txnid: &str) -> (u32, u16) {
        if !self.txns.contains_key(txnid) {
            let pid = self.next_pid;
            self.next_pid += 1;
            self.txns.insert(
                txnid.to_owned(),
                TxnMeta {
                    pid,
                    epoch: 0,
                    ongoing: None,
                },
            );
            return (pid, 0);
        }
        self.end(txnid, false);
        let meta = self.txns.get_mut(txnid).expect("checked");
        meta.epoch += 1;
        (meta.pid, meta.epoch)
    }

    fn meta(&mut self, txnid: &str, pid: u32, epoch: u16) -> Result<&mut TxnMeta, Refusal> {
        match self.txns.get_mut(txnid) {
            Some(m) if m.pid == pid && m.epoch == epoch => Ok(m),
            Some(m) if m.pid == pid && m.epoch > epoch => Err(Refusal::Fenced),
            _ => Err(Refusal::InvalidTxnState),
        }
    }

    /// `AddPartitionsToTxn`.
    pub fn add_partitions(
        &mut self,
        now: Time,
        txnid: &str,
        pid: u32,
        epoch: u16,
        tps: &[Tp],
    ) -> Result<(), Refusal> {
        let meta = self.meta(txnid, pid, epoch)?;
        let ongoing = meta.ongoing.get_or_insert_with(|| Ongoing {
            started: now,
            partitions: BTreeSet::new(),
            offsets: None,
        });
        ongoing.partitions.extend(tps.iter().copied());
        Ok(())
    }

    /// A transactional produce request of one record.
    pub fn produce(
        &mut self,
        txnid: &str,
        tp: Tp,
        pid: u32,
        epoch: u16,
        seq: u32,
        value: Value,
    ) -> Result<(), Refusal> {
        let part = self.partitions.entry(tp).or_default();
        let state = part.producers.get(&pid).copied();
        if state.is_some_and(|s| epoch < s.epoch) {
            return Err(Refusal::Fenced);
        }
        // KIP-890 part 1: the leader verifies with the coordinator.
        let verified = self
            .txns
            .get(txnid)
            .filter(|m| m.pid == pid && m.epoch == epoch)
            .and_then(|m| m.ongoing.as_ref())
            .is_some_and(|o| o.partitions.contains(&tp));
        if !verified {
            return Err(Refusal::InvalidTxnState);
        }
        let part = self.partitions.get_mut(&tp).expect("inserted above");
        let expected = match state {
            Some(s) if s.epoch == epoch => s.last_seq.map_or(0, |l| l + 1),
            // A new epoch starts its sequences again.
            _ => 0,
        };
        if seq < expected {
            return Ok(()); // a duplicate: acknowledged, not appended
        }
        if seq > expected {
            return Err(Refusal::OutOfOrder);
        }
        part.producers.insert(
            pid,
            ProducerState {
                epoch,
                last_seq: Some(seq),
            },
        );
        part.log.push(Entry::Data { pid, value });
        Ok(())
    }

    /// `TxnOffsetCommit` (with `AddOffsetsToTxn`).
    #[allow(clippy::too_many_arguments)]
    pub fn txn_offsets(
        &mut self,
        txnid: &str,
        pid: u32,
        epoch: u16,
        generation: u32,
        member: usize,
        offsets: BTreeMap<u32, u64>,
        read_under: BTreeSet<u32>,
    ) -> Result<(), Refusal> {
        if generation != self.generation || !self.members.contains_key(&member) {
            return Err(Refusal::IllegalGeneration);
        }
        let meta = self.meta(txnid, pid, epoch)?;
        let Some(ongoing) = meta.ongoing.as_mut() else {
            return Err(Refusal::InvalidTxnState);
        };
        ongoing.offsets = Some((generation, offsets, read_under));
        Ok(())
    }

    /// `EndTxn`.
    pub fn end_txn(
        &mut self,
        txnid: &str,
        pid: u32,
        epoch: u16,
        commit: bool,
    ) -> Result<(), Refusal> {
        let meta = self.meta(txnid, pid, epoch)?;
        if meta.ongoing.is_none() {
            // librdkafka does not send EndTxn for an empty transaction; an
            // abort of one the coordinator ended already is answered so.
            return if commit {
                Err(Refusal::InvalidTxnState)
            } else {
                Ok(())
            };
        }
        self.end(txnid, commit);
        Ok(())
    }

    /// Ends `txnid`'s ongoing transaction: markers, offsets.
    fn end(&mut self, txnid: &str, commit: bool) {
        let Some(meta) = self.txns.get_mut(txnid) else {
            return;
        };
        let Some(ongoing) = meta.ongoing.take() else {
            return;
        };
        let pid = meta.pid;
        if commit {
            self.commits += 1;
            if let Some((generation, offsets, read)) = ongoing.offsets {
                if read.iter().any(|g| *g != generation) {
                    self.broken.push(Broken::SpansGenerations {
                        sent: generation,
                        read,
                    });
                }
                self.committed.extend(offsets);
            }
        } else {
            self.aborts += 1;
        }
        for tp in ongoing.partitions {
            let part = self.partitions.entry(tp).or_default();
            part.log.push(Entry::Marker { pid });
            if commit {
                Self::fold_marker(
                    tp,
                    part,
                    pid,
                    &mut self.outputs,
                    &mut self.state,
                    &mut self.ever,
                    &mut self.broken,
                );
            }
        }
    }

    /// What the marker just appended to `part` committed: `pid`'s records
    /// since its previous marker there.
    fn fold_marker(
        tp: Tp,
        part: &Partition,
        pid: u32,
        outputs: &mut BTreeMap<u64, u32>,
        state: &mut BTreeMap<u32, i64>,
        ever: &mut BTreeMap<u32, BTreeSet<i64>>,
        broken: &mut Vec<Broken>,
    ) {
        let last = part.log.len() - 1;
        let since = part.log[..last]
            .iter()
            .rposition(|e| matches!(e, Entry::Marker { pid: p, .. } if *p == pid))
            .map_or(0, |i| i + 1);
        for e in &part.log[since..last] {
            let Entry::Data { pid: p, value } = e else {
                continue;
            };
            if *p != pid {
                continue;
            }
            match *value {
                Value::Output { input } => {
                    let n = outputs.entry(input).or_insert(0);
                    *n += 1;
                    if *n > 1 {
                        broken.push(Broken::Duplicate { input, tp });
                    }
                }
                Value::Change { key, value } => {
                    state.insert(key, value);
                    ever.entry(key).or_default().insert(value);
                }
            }
        }
    }

    /// The coordinator's scan for transactions past their timeout: each is
    /// aborted and its epoch bumped (the producer is fenced).
    pub fn expire(&mut self, now: Time) -> usize {
        let expired: Vec<String> = self
            .txns
            .iter()
            .filter(|(_, m)| {
                m.ongoing
                    .as_ref()
                    .is_some_and(|o| now.saturating_sub(o.started) > self.txn_timeout)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.end(id, false);
            if let Some(m) = self.txns.get_mut(id) {
                m.epoch += 1;
            }
        }
        expired.len()
    }

    /// Whether a transaction has offsets pending on input partition `p`
    /// (KIP-447: an `OffsetFetch` with `require_stable` waits for it).
    pub fn pending_offsets(&self, p: u32) -> bool {
        self.txns.values().any(|m| {
            m.ongoing
                .as_ref()
                .and_then(|o| o.offsets.as_ref())
                .is_some_and(|(_, offsets, _)| offsets.contains_key(&p))
        })
    }

    /// Whether any transaction is open at the coordinator.
    pub fn any_open(&self) -> bool {
        self.txns.values().any(|m| m.ongoing.is_some())
    }

    /// Whether `txnid` has a transaction open at the coordinator.
    pub fn open(&self, txnid: &str) -> bool {
        self.txns.get(txnid).is_some_and(|m| m.ongoing.is_some())
    }

    /// A new generation with `assignment` (worker -> input partitions).
    pub fn rebalance(&mut self, assignment: BTreeMap<usize, BTreeSet<u32>>) {
        self.generation += 1;
        self.history.push(assignment.clone());
        self.members = assignment;
    }

    /// The partitions `member` owned in every generation from `since` to
    /// now: a member that skipped generations (it was busy, paused or
    /// expired meanwhile) keeps its position only on those; any other
    /// partition was another member's, or nobody's, in between, and is
    /// read again from its committed offset.
    pub fn owned_throughout(&self, member: usize, since: u32) -> BTreeSet<u32> {
        let mut owned: Option<BTreeSet<u32>> = None;
        for generation in &self.history[since as usize..] {
            let mine = generation.get(&member).cloned().unwrap_or_default();
            owned = Some(match owned {
                None => mine,
                Some(o) => o.intersection(&mine).copied().collect(),
            });
        }
        owned.unwrap_or_default()
    }
}
