//! The worker's transactional producer: its context (delivery reports:
//! changelog positions and failures), its creation and `init_transactions`,
//! the retries of transactional calls, and the fencing of
//! the previous owners' transactional ids when partitions arrive.

use super::*;
use crate::stream::protocol::Drained;

/// How long a blocking transactional call may take before the producer is
/// considered to be in an unknown state.
pub(super) const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Retries of a retriable transactional call.
pub(super) const TXN_RETRIES: u32 = 5;

/// Delivery reports: the last offset acknowledged per changelog partition
/// (the store's position after the commit), and failures.
#[derive(Default)]
pub(super) struct Deliveries {
    pub(super) changelog_offsets: HashMap<(String, i32), i64>,
    pub(super) failures: u64,
    pub(super) first_failure: Option<(Option<RDKafkaErrorCode>, FailedDelivery)>,
}

/// A record the brokers did not take.
pub(super) struct FailedDelivery {
    pub(super) topic: String,
    /// The error, and the topic.
    pub(super) message: String,
}

pub(super) struct ProducerCtx {
    pub(super) changelog_topics: Vec<String>,
    pub(super) deliveries: Mutex<Deliveries>,
    pub(super) errors: kafka::ErrorLog,
    /// Set once another producer replaced this one (see [`retire`]): what
    /// librdkafka says about it from then on is its purge, logged at debug.
    retired: std::sync::atomic::AtomicBool,
}

impl ProducerCtx {
    pub(super) fn deliveries(&self) -> MutexGuard<'_, Deliveries> {
        self.deliveries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ClientContext for ProducerCtx {
    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.report("producer", &error, reason);
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        if self.retired.load(Ordering::Relaxed) {
            tracing::debug!(target: "librdkafka", "librdkafka (a retired producer): {fac} {message}");
            return;
        }
        crate::kafka::log(level, fac, message);
    }
}

impl ProducerContext for ProducerCtx {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let mut d = self.deliveries();
        match result {
            Ok(m) => {
                if self.changelog_topics.iter().any(|t| t == m.topic()) {
                    let slot = d
                        .changelog_offsets
                        .entry((m.topic().to_owned(), m.partition()))
                        .or_insert(-1);
                    *slot = (*slot).max(m.offset());
                }
            }
            Err((e, m)) => {
                d.failures += 1;
                if d.first_failure.is_none() {
                    d.first_failure = Some((
                        e.rdkafka_error_code(),
                        FailedDelivery {
                            topic: m.topic().to_owned(),
                            message: format!("{e} (topic {})", m.topic()),
                        },
                    ));
                }
            }
        }
    }
}

/// Worker `n`'s client id, also its transactional id.
pub(super) fn client_id(d: &Deployment, n: u32) -> String {
    crate::stream::names::transactional_id(&d.manifest.application_id(), &d.options.instance_id, n)
}

/// Worker `n`'s producer, transactional under exactly-once: its
/// `init_transactions` fences any earlier producer with the same
/// transactional id (a crashed incarnation of this worker, or this worker's
/// previous producer) and aborts its open transaction.
pub(super) fn new_producer(
    d: &Deployment,
    n: u32,
) -> Result<Arc<BaseProducer<ProducerCtx>>, StreamError> {
    let producer = create_producer(d, n)?;
    if d.exactly_once() {
        init_producer(d, n, &producer)?;
    }
    Ok(producer)
}

/// The worker's producer, its transactions not initialised yet.
pub(super) fn create_producer(
    d: &Deployment,
    n: u32,
) -> Result<Arc<BaseProducer<ProducerCtx>>, StreamError> {
    let client_id = client_id(d, n);
    let transactional_id = d.exactly_once().then(|| client_id.clone());
    let producer: BaseProducer<ProducerCtx> =
        producer_config(&d.options, transactional_id.as_deref(), &client_id)
            .create_with_context(ProducerCtx {
                changelog_topics: d.changelogs.iter().map(|(_, t)| t.clone()).collect(),
                deliveries: Mutex::default(),
                errors: kafka::ErrorLog::default(),
                retired: Default::default(),
            })
            .map_err(|e| StreamError::kafka("creating the producer", e))?;
    Ok(Arc::new(producer))
}

/// How long an abort waits for the records of the transaction that were
/// sent already to be acknowledged, before it replaces the producer instead
/// (see [`drain_in_flight`]). A healthy broker answers within
/// milliseconds; a request held longer is what a new epoch is for.
pub(super) const ABORT_DRAIN: Duration = Duration::from_secs(5);

/// Waits for the records of `producer`'s open transaction that were sent
/// already, without purging one: librdkafka's own abort waits for those
/// ("purging these messages may lead to gaps in the idempotent producer
/// sequences", rdkafka_txnmgr.c), but it cannot serve our delivery reports
/// while it waits, so they are served here first. What the abort does next
/// is the protocol's ([`after_drain`](crate::stream::protocol::after_drain)): a purged request is not
/// recalled, and arriving after the next transaction added its partition it
/// would pass the leader's checks (same producer id and epoch, an ongoing
/// transaction, its sequence the next expected) and commit with that
/// transaction: records of an aborted transaction, processed again, written
/// twice (before: `abort_with_requests_in_flight`,
/// tests/kafka/abort_in_flight.rs).
pub(super) fn drain_in_flight(producer: &BaseProducer<ProducerCtx>) -> Drained {
    match kafka::drain(producer, ABORT_DRAIN) {
        Ok(()) => Drained::All,
        Err(_) => Drained::Unacknowledged(producer.in_flight_count().max(0) as u64),
    }
}

/// `abort_transaction` (EndTxn abort), once nothing of the transaction is
/// in flight ([`drain_in_flight`]).
pub(super) fn end_transaction(producer: &BaseProducer<ProducerCtx>) -> Result<(), KafkaError> {
    producer.abort_transaction(TXN_CALL_TIMEOUT)
}

/// Drops a producer that a new one with the same transactional id fenced
/// (or is about to): its queued and in-flight records are purged (the new
/// epoch refuses any that still arrive) and its log goes quiet.
pub(super) fn retire(producer: &BaseProducer<ProducerCtx>) {
    producer.context().retired.store(true, Ordering::Relaxed);
    producer.purge(PurgeConfig::default().queue().inflight());
}

/// `init_transactions`: fences the previous incarnation of the worker's
/// transactional id and aborts its open transaction.
pub(super) fn init_producer(
    d: &Deployment,
    n: u32,
    producer: &BaseProducer<ProducerCtx>,
) -> Result<(), StreamError> {
    let started = Instant::now();
    let client_id = client_id(d, n);
    let topic = d.manifest.sources().first().map(|t| t.to_string());
    abort_previous_quickly(&d.options, &client_id, topic.as_deref());
    if let Some(topic) = &topic {
        kafka::connect_first(producer.client(), topic, ABORT_PROBE_WAIT);
    }
    producer.init_transactions(TXN_CALL_TIMEOUT).map_err(
        |e| match kafka::authorization_failure(&e) {
            Some(code) => refused(d, n, code, None),
            None => Restart::kafka("init_transactions", e),
        },
    )?;
    tracing::debug!(
        worker = n,
        init_ms = started.elapsed().as_millis() as u64,
        "transactional producer ready"
    );
    Ok(())
}

/// The brokers' authorizer refused worker `n` something (an ACL is
/// missing): what, named from the answer's code (`topic` when the call
/// names one). Retrying cannot help, so the deployment stops with this, as
/// Kafka Streams stops on an authorization exception; grant the ACL, then
/// start (or `resume`) it again.
pub(super) fn refused(
    d: &Deployment,
    n: u32,
    code: RDKafkaErrorCode,
    topic: Option<&str>,
) -> StreamError {
    let (resource, operation) = match code {
        RDKafkaErrorCode::GroupAuthorizationFailed => (
            format!("consumer group {:?}", d.manifest.application_id()),
            "Read",
        ),
        RDKafkaErrorCode::TransactionalIdAuthorizationFailed => {
            (format!("transactional id {:?}", client_id(d, n)), "Write")
        }
        RDKafkaErrorCode::TopicAuthorizationFailed => match topic {
            Some(t) => (format!("topic {t:?}"), "Write"),
            None => (
                format!(
                    "a topic of {} (inputs and tables {}, outputs, dead letters, changelogs)",
                    d.manifest.application_id(),
                    d.manifest.sources().join(", ")
                ),
                "Read or Write",
            ),
        },
        _ => ("the cluster".to_owned(), "IdempotentWrite"),
    };
    StreamError::Kafka(kafka::KafkaError::not_authorized(resource, operation, code))
}

/// Fences the transactional id `id` of another instance's worker (see
/// `Core::start_fencing`): `init_transactions` under it bumps its epoch and
/// aborts its open transaction.
pub(super) fn fence(
    options: &crate::stream::RunOptions,
    worker: u32,
    id: &str,
    topic: Option<&str>,
) {
    let started = Instant::now();
    abort_previous_quickly(options, id, topic);
    let fenced = producer_config(options, Some(id), &format!("{id}-fence"))
        .create::<BaseProducer>()
        .map_err(|e| e.to_string())
        .and_then(|p| {
            if let Some(topic) = topic {
                kafka::connect_first(p.client(), topic, ABORT_PROBE_WAIT);
            }
            p.init_transactions(TXN_CALL_TIMEOUT)
                .map_err(|e| e.to_string())
        });
    match fenced {
        Ok(()) => tracing::info!(
            worker,
            transactional_id = %id,
            ms = started.elapsed().as_millis() as u64,
            "fenced a departed instance's worker (its open transaction is aborted)"
        ),
        Err(e) => tracing::info!(
            worker,
            transactional_id = %id,
            "could not fence a departed instance's worker ({e}); waiting for its \
             transaction to time out"
        ),
    }
}

/// How long each of [`abort_previous_quickly`]'s first
/// [`ABORT_PROBES_AT_FIRST_WAIT`] probes waits for its answer (each later
/// one waits twice as long as the one before), and how long the probes go
/// on at most.
pub(super) const ABORT_PROBE_WAIT: Duration = Duration::from_millis(150);
pub(super) const ABORT_PROBES_AT_FIRST_WAIT: u32 = 3;
pub(super) const ABORT_PROBE_BUDGET: Duration = Duration::from_secs(3);

/// The wait of the probe after `probes` probes that got no producer id:
/// [`ABORT_PROBE_WAIT`] for the first few (an abort usually completes
/// within 0.5 s), then doubling, within what is left of the budget (at
/// least the first wait), so that an answer slower than the first wait
/// is still awaited by some probe.
fn probe_wait(probes: u32, spent: Duration) -> Duration {
    let doublings = (probes + 1)
        .saturating_sub(ABORT_PROBES_AT_FIRST_WAIT)
        .min(8);
    let wait = ABORT_PROBE_WAIT * (1 << doublings);
    wait.min(ABORT_PROBE_BUDGET.saturating_sub(spent))
        .max(ABORT_PROBE_WAIT)
}

/// Waits until the open transaction of `transactional_id`'s previous
/// incarnation (crashed, or a departed host's worker) is aborted, so that
/// the `init_transactions` that follows succeeds at its first request.
///
/// An `InitProducerId` that meets an open transaction makes the
/// coordinator abort it and answers CONCURRENT_TRANSACTIONS until the abort
/// is complete (its markers written: a few milliseconds to most of a second
/// on a busy broker); librdkafka asks again only after a fixed 500 ms
/// (`rd_kafka_idemp_pid_timer_restart`, not configurable), so a restart
/// would pay 0.5 s for every answer that came too early (0, 1 or 2 of them
/// in the recovery benchmark: results/2026-12-05-recovery.md). Instead,
/// throwaway producers ask, one after another, each dropped after its wait
/// ([`probe_wait`]: 150 ms, then doubling) unless it got its producer id
/// (the abort is done, or nothing was open), for at most
/// [`ABORT_PROBE_BUDGET`]; an answer the probes cannot help with (not
/// authorized, say) ends them at once and the real `init_transactions`
/// reports it. Fencing is unchanged: every successful `InitProducerId` bumps
/// the epoch, and the caller's comes last.
///
/// A probe dropped with its request still on the way could have it handled
/// after the caller's, and fence the caller's producer (eos-audit-3 finding
/// 9; safe, but a restart, and again at every restart while requests are
/// that slow). The growing waits close that: once a probe waits longer than
/// requests take, it is answered, and the earlier probes' requests, sent
/// before its own, have landed by then. Only when no probe is answered
/// within the budget (requests slower than about 1.2 s) can one still land
/// late (`k_a_late_fencing_probe_does_not_fence_the_new_producer`).
pub(super) fn abort_previous_quickly(
    options: &crate::stream::RunOptions,
    transactional_id: &str,
    topic: Option<&str>,
) {
    let started = Instant::now();
    let mut probes = 0;
    let outcome = loop {
        let wait = probe_wait(probes, started.elapsed());
        let probe = match producer_config(
            options,
            Some(transactional_id),
            &format!("{transactional_id}-probe"),
        )
        .create::<BaseProducer>()
        {
            Ok(p) => p,
            Err(e) => break Err(e),
        };
        probes += 1;
        if let Some(topic) = topic {
            kafka::connect_first(probe.client(), topic, wait);
        }
        let outcome = probe.init_transactions(wait);
        drop(probe);
        match outcome {
            // A timeout, or CONCURRENT_TRANSACTIONS: the abort goes on.
            Err(KafkaError::Transaction(e))
                if e.is_retriable() && started.elapsed() < ABORT_PROBE_BUDGET => {}
            outcome => break outcome,
        }
    };
    tracing::debug!(
        transactional_id,
        probes,
        ms = started.elapsed().as_millis() as u64,
        // Ok: no transaction open (any more).
        outcome = ?outcome.err(),
        "abort probes"
    );
}

/// Errors that sending the same record again cannot cure.
pub(super) fn is_unsendable(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
    )
}

/// Errors that leave a request's outcome unknown.
pub(super) fn is_timeout(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::MessageTimedOut
            | RDKafkaErrorCode::TimedOutQueue
    )
}

/// Calls a transactional operation again while it fails retriably, within
/// one budget of [`TXN_CALL_TIMEOUT`] for all attempts together: a timed-out
/// call resumes where it was on the next attempt, but when librdkafka has
/// lost its coordinator (librdkafka#5511) no attempt succeeds, and only a
/// new producer (a new session) finds it again.
pub(super) fn retry(
    operation: &str,
    mut call: impl FnMut(Duration) -> Result<(), KafkaError>,
) -> Result<(), KafkaError> {
    let deadline = Instant::now() + TXN_CALL_TIMEOUT;
    let mut attempt = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match call(left.max(Duration::from_secs(1))) {
            Err(e)
                if kafka::classify(&e) == TxnFailure::Retry
                    && attempt < TXN_RETRIES
                    && Instant::now() < deadline =>
            {
                attempt += 1;
                tracing::warn!("{operation}: {e}; retrying (attempt {attempt})");
                std::thread::sleep(Duration::from_millis(100 << attempt).min(left));
            }
            other => return other,
        }
    }
}

impl Core {
    /// Starts fencing the workers of other instances that ran `partitions`
    /// before and are no longer in the group (killed, or paused past their
    /// session), on a thread of its own while the stores open: a
    /// transaction session started under their transactional ids aborts
    /// their last transaction at once. Left open, it would hold the
    /// committed offsets unstable (KIP-447) and the changelogs' ends until
    /// the broker aborts it after the transaction timeout, on its next scan
    /// for expired transactions (every 10 s by default): 10 to 20 s before a
    /// failover could go on. A zombie still alive finds itself fenced at its
    /// next commit, as when its own instance restarts.
    ///
    /// Nothing waits for the thread: the coordinator begins aborting at the
    /// first InitProducerId, sent as soon as the fencing producer has found
    /// it, and `restore_pending` goes on once the offsets are stable; the
    /// rest of `init_transactions` is librdkafka's 500 ms retry timers
    /// (0.5 to 1 s measured in the failover benchmark).
    ///
    /// The previous owners are known from the process's view of the group
    /// (`kafka::GroupWatch`; read every second with standbys, every 5 s without: a
    /// partition that moved in the last seconds before its owner died may
    /// still wait for the transaction timeout). A worker fenced twice (its
    /// partitions came in two assignments) is harmless: its epoch is bumped
    /// again.
    pub(super) fn start_fencing(&self, consumer: &BaseConsumer<WorkerContext>, partitions: &[i32]) {
        if !self.d.exactly_once() {
            return;
        }
        let app = self.d.manifest.application_id();
        let me = &self.d.options.instance_id;
        let previous: BTreeSet<String> = partitions
            .iter()
            .filter_map(|p| self.d.standbys.previous_owner(&app, me, *p))
            .collect();
        if previous.is_empty() {
            return;
        }
        let members = match kafka::group_members(consumer, &app) {
            Ok(Some(members)) => members,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!("cannot describe the group to fence departed workers: {e}");
                return;
            }
        };
        let draining = |id: &str| {
            let host = crate::stream::standby::instance_of(&app, id);
            host.zip(self.d.options.draining.as_ref())
                .is_some_and(|(host, draining)| (draining.0)(host))
        };
        let departed: Vec<String> = previous
            .into_iter()
            .filter(|id| !members.iter().any(|m| m.client_id == *id))
            .filter(|id| {
                let clean = draining(id);
                if clean {
                    tracing::info!(
                        worker = self.worker,
                        transactional_id = %id,
                        "not fencing a departed worker: its host drains (it committed before it left)"
                    );
                }
                !clean
            })
            .collect();
        if departed.is_empty() {
            return;
        }
        let options = self.d.options.clone();
        let worker = self.worker;
        let topic = self.d.manifest.sources().first().map(|t| t.to_string());
        let span = tracing::Span::current();
        let spawned = std::thread::Builder::new()
            .name(format!("onceflow-fence-{worker}"))
            .spawn(move || {
                let _span = span.enter();
                for id in departed {
                    fence(&options, worker, &id, topic.as_deref());
                }
            });
        if let Err(e) = spawned {
            tracing::info!("cannot start a thread to fence departed workers: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probes' waits when none is answered and each takes its whole
    /// wait: three short ones, then doubling within the budget.
    #[test]
    fn probe_waits_grow_within_the_budget() {
        let (mut spent, mut waits) = (Duration::ZERO, Vec::new());
        while spent < ABORT_PROBE_BUDGET {
            let wait = probe_wait(waits.len() as u32, spent);
            waits.push(wait.as_millis());
            spent += wait;
        }
        assert_eq!(waits, [150, 150, 150, 300, 600, 1200, 450]);
    }
}
