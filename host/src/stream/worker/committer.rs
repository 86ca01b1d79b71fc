//! The committer: the thread that runs steps 2-4 of each transaction
//! (flush, offsets, commit: [`run_commit`]) while the worker goes on, and
//! the worker's view of a transaction in flight. The worker bounds every
//! transactional call the committer makes ([`InFlight::try_outcome`]).

use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use super::*;

/// A transaction whose steps 2-4 run on the committer.
pub(super) struct InFlight {
    pub(super) done: Receiver<Result<CommitOutcome, StreamError>>,
    /// The committer's call in progress, for its bound.
    pub(super) call: Arc<Mutex<Option<Call>>>,
}

impl InFlight {
    /// Waits for the outcome, or until the committer's call overruns its
    /// bound.
    pub(super) fn wait(&self) -> Result<CommitOutcome, StreamError> {
        loop {
            match self.done.recv_timeout(Duration::from_millis(100)) {
                Ok(outcome) => return outcome,
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(e) = self.overrun() {
                        return Err(e);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Restart::lost("the committer thread"));
                }
            }
        }
    }

    /// The outcome, if the commit has returned (or overrun its bound).
    pub(super) fn try_outcome(&self) -> Option<Result<CommitOutcome, StreamError>> {
        match self.done.try_recv() {
            Ok(outcome) => Some(outcome),
            Err(TryRecvError::Empty) => self.overrun().map(Err),
            Err(TryRecvError::Disconnected) => Some(Err(Restart::lost("the committer thread"))),
        }
    }

    /// The committer's call, if it has run past its bound: the session
    /// restarts; the committer keeps the old producer until the call
    /// returns, and the new producer's `init_transactions` (same
    /// transactional id) fences it and aborts its transaction.
    fn overrun(&self) -> Option<StreamError> {
        let call = lock_call(&self.call);
        let call = call.as_ref()?;
        (call.started.elapsed() > call.limit).then(|| {
            Restart::Overrun {
                operation: call.operation.to_owned(),
                limit: call.limit,
            }
            .into()
        })
    }
}

/// How steps 2-4 of the protocol (flush, offsets, commit) ended.
pub(super) enum CommitOutcome {
    /// Committed (at_least_once: flushed); the last changelog offset each
    /// changelog partition reached.
    Committed {
        changelog_offsets: HashMap<(String, i32), i64>,
    },
    Flush(KafkaError),
    /// Records of the transaction were not delivered.
    Undelivered {
        count: u64,
        code: Option<RDKafkaErrorCode>,
        first: FailedDelivery,
    },
    Offsets(KafkaError),
    Commit(KafkaError),
}

/// Steps 2-4 of the protocol on `producer`: flush (every record
/// acknowledged, so the delivery reports hold the changelog positions), the
/// offsets with the consumer's group metadata (none: at_least_once, where
/// the consumer commits them), and the commit. Each transactional call is
/// noted in `call` with its bound, which the worker watches
/// ([`InFlight::try_outcome`]).
pub(super) fn run_commit(
    producer: &BaseProducer<ProducerCtx>,
    offsets: TopicPartitionList,
    group: Option<rdkafka::consumer::ConsumerGroupMetadata>,
    call: &Mutex<Option<Call>>,
) -> CommitOutcome {
    if let Err(e) = kafka::drain(producer, TXN_CALL_TIMEOUT) {
        return CommitOutcome::Flush(e);
    }
    {
        let mut d = producer.context().deliveries();
        let failures = std::mem::take(&mut d.failures);
        if let Some((code, first)) = d.first_failure.take() {
            return CommitOutcome::Undelivered {
                count: failures,
                code,
                first,
            };
        }
    }
    if let Some(metadata) = group {
        if offsets.count() > 0 {
            let r = retry("send_offsets_to_transaction", |timeout| {
                timed(call, "send_offsets_to_transaction", timeout, || {
                    producer.send_offsets_to_transaction(&offsets, &metadata, timeout)
                })
            });
            if let Err(e) = r {
                return CommitOutcome::Offsets(e);
            }
        }
        let r = retry("commit_transaction", |timeout| {
            timed(call, "commit_transaction", timeout, || {
                producer.commit_transaction(timeout)
            })
        });
        if let Err(e) = r {
            return CommitOutcome::Commit(e);
        }
    }
    let changelog_offsets = std::mem::take(&mut producer.context().deliveries().changelog_offsets);
    CommitOutcome::Committed { changelog_offsets }
}

/// How long past its own timeout a transactional call may run before its
/// producer is given up.
const TXN_CALL_GRACE: Duration = Duration::from_secs(15);

/// A transactional call the committer is in.
pub(super) struct Call {
    operation: &'static str,
    started: Instant,
    /// Its own timeout and [`TXN_CALL_GRACE`].
    limit: Duration,
}

fn lock_call(call: &Mutex<Option<Call>>) -> MutexGuard<'_, Option<Call>> {
    call.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f`, a transactional call with its own `timeout`, noted in `call`
/// while it runs. librdkafka 2.12's `send_offsets_to_transaction` waits for
/// its coordinator's answer without a bound (`rd_kafka_txn_op_req1(…,
/// RD_POLL_INFINITE)`, "timeout is enforced by" the request chain), and in
/// the network-fault drill it never returned after a broker was killed: the
/// worker stood still for minutes. The worker gives a call `timeout` +
/// [`TXN_CALL_GRACE`].
fn timed<T>(
    call: &Mutex<Option<Call>>,
    operation: &'static str,
    timeout: Duration,
    f: impl FnOnce() -> T,
) -> T {
    *lock_call(call) = Some(Call {
        operation,
        started: Instant::now(),
        limit: timeout + TXN_CALL_GRACE,
    });
    let out = f();
    *lock_call(call) = None;
    out
}

/// A transaction handed to the committer.
struct Job {
    producer: Arc<BaseProducer<ProducerCtx>>,
    offsets: TopicPartitionList,
    group: rdkafka::consumer::ConsumerGroupMetadata,
    done: Sender<Result<CommitOutcome, StreamError>>,
}

/// The session's committer: one thread, started with the session, that
/// runs each transaction's steps 2-4 ([`run_commit`]) as the worker hands
/// them over, one at a time (before, a thread per commit and one per
/// transactional call). It ends when the session drops it, after the job
/// in hand.
pub(super) struct Committer {
    jobs: Sender<Job>,
    call: Arc<Mutex<Option<Call>>>,
}

impl Committer {
    /// `lose`: tests only ([`super::super::RunOptions::lose_commit_answers`]).
    pub(super) fn start(
        worker: u32,
        lose: Option<Arc<AtomicU64>>,
    ) -> Result<Committer, StreamError> {
        let (jobs, inbox) = std::sync::mpsc::channel::<Job>();
        let call = Arc::new(Mutex::new(None));
        let watched = Arc::clone(&call);
        let span = tracing::Span::current();
        std::thread::Builder::new()
            .name(format!("onceflow-commit-{worker}"))
            .spawn(move || {
                let _span = span.enter();
                for job in inbox {
                    let mut outcome =
                        run_commit(&job.producer, job.offsets, Some(job.group), &watched);
                    if matches!(outcome, CommitOutcome::Committed { .. })
                        && lose.as_ref().is_some_and(|n| {
                            n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                                n.checked_sub(1)
                            })
                            .is_ok()
                        })
                    {
                        tracing::info!(worker, "fault injected: the commit's answer is lost");
                        outcome = CommitOutcome::Commit(KafkaError::Global(
                            RDKafkaErrorCode::OperationTimedOut,
                        ));
                    }
                    let _ = job.done.send(Ok(outcome));
                }
            })
            .map_err(|e| Restart::spawn("the committer thread", e))?;
        Ok(Committer { jobs, call })
    }

    /// Hands a transaction's steps 2-4 over.
    pub(super) fn submit(
        &self,
        producer: &Arc<BaseProducer<ProducerCtx>>,
        offsets: TopicPartitionList,
        group: rdkafka::consumer::ConsumerGroupMetadata,
    ) -> Result<InFlight, StreamError> {
        let (done, outcome) = std::sync::mpsc::channel();
        self.jobs
            .send(Job {
                producer: Arc::clone(producer),
                offsets,
                group,
                done,
            })
            .map_err(|_| Restart::lost("the committer thread"))?;
        Ok(InFlight {
            done: outcome,
            call: Arc::clone(&self.call),
        })
    }

    /// Steps 2-4 here, on the worker's thread (at_least_once: a flush, no
    /// transactional call).
    pub(super) fn run_here(
        producer: &BaseProducer<ProducerCtx>,
        offsets: TopicPartitionList,
    ) -> CommitOutcome {
        run_commit(producer, offsets, None, &Mutex::new(None))
    }
}
