//! Publishing small records: the fleet's control topics (the registry,
//! statuses, grants, components, usage), guest log lines and a deploy's
//! admission. One producer context for all of them ([`Publisher`]): the
//! host's librdkafka log, and each record either acknowledged to a caller
//! that waits for its offset or forgotten.
//!
//! A *renewing* publisher ([`Publisher::renewing`], the control plane's)
//! replaces its producer when it has had nothing acknowledged for
//! [`STUCK_AFTER`] (doubling while replacements do no better), or after a
//! fatal error. In the fleet drill of 2026-12-07 a host's
//! statuses and heartbeat stopped reaching `_onceflow.status` for good
//! after its librdkafka logged "new leader-1 not found in cache"; librdkafka
//! 2.12.1 can leave a partition a produce answer once called leaderless
//! unknown to that producer for good (confluentinc/librdkafka#5430). A
//! later drill saw it whole: the broker's controller fenced its broker for
//! 0.3 s under load, and the producers that had records for it then (a
//! host's control producer, the drill's load producer) delivered nothing
//! again. (Not reproduced in isolation: a broker fenced while it served,
//! its controller link cut through toxiproxy, made a host log the warning,
//! and its producer recovered.) The records the old producer still held are
//! dropped: a caller waiting for one gets an error, and statuses are
//! published again within seconds.

use std::sync::{Mutex, RwLock, mpsc};

use rdkafka::client::ClientContext;
use rdkafka::producer::{DeliveryResult, ThreadedProducer};

use super::*;

type Delivery = mpsc::SyncSender<Result<i64, ClientError>>;

/// The publishers' context: librdkafka's log and errors as the host logs
/// them (errors rate-limited, as warnings: a publisher's records are retried
/// or reported to whoever waits for them), and each delivery report to the
/// caller waiting for it, if any (else a failure is kept for
/// [`Publisher::delivered`]).
struct PublishCtx {
    /// The first forgotten record's failed delivery since it was last
    /// taken: its topic and the error.
    failed: Mutex<Option<(String, ClientError)>>,
    errors: ErrorLog,
    /// When a record was last acknowledged, or the producer was created
    /// (a renewing publisher's health: [`Publisher::mend`]).
    progress: Mutex<Instant>,
}

impl Default for PublishCtx {
    fn default() -> Self {
        PublishCtx {
            failed: Mutex::default(),
            errors: ErrorLog::default(),
            progress: Mutex::new(Instant::now()),
        }
    }
}

impl PublishCtx {
    fn progressed(&self) {
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn since_progress(&self) -> Duration {
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }
}

impl ClientContext for PublishCtx {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        log(level, fac, message);
    }

    fn error(&self, error: ClientError, reason: &str) {
        self.errors.report("producer", &error, reason);
    }
}

impl ProducerContext for PublishCtx {
    type DeliveryOpaque = Box<Option<Delivery>>;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Self::DeliveryOpaque) {
        if result.is_ok() {
            self.progressed();
        }
        match (*opaque, result) {
            (Some(tx), _) => {
                let _ = tx.send(match result {
                    Ok(m) => Ok(m.offset()),
                    Err((e, _)) => Err(e.clone()),
                });
            }
            (None, Err((e, m))) => {
                let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
                if failed.is_none() {
                    *failed = Some((m.topic().to_owned(), e.clone()));
                }
            }
            (None, Ok(_)) => {}
        }
    }
}

/// The longest [`Publisher::init_transactions`] waits for a broker
/// connection before it asks for its producer id anyway.
const CONNECT_FIRST_WAIT: Duration = Duration::from_secs(5);

/// Connects a new transactional producer to a broker (a metadata request
/// for `topic`, waited for at most `timeout`) before its
/// `init_transactions`. A producer connects only when it has something to
/// send, and `init_transactions` called with no broker connection up finds
/// no broker to ask for the transaction coordinator: it asks again on
/// librdkafka's 500 ms coordinator-query timer (seen in the recovery
/// benchmark: the real `init_transactions` returning 0.5 s after probes
/// that had found the abort done; and in each deploy's admission, which
/// took 0.5 s of a 1.2 s `onceflow deploy`). A failure here is left to
/// `init_transactions` to report.
pub(crate) fn connect_first<C: ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
    timeout: Duration,
) {
    if let Err(e) = client.fetch_metadata(Some(topic), timeout) {
        tracing::debug!(topic, "no broker connection before init_transactions: {e}");
    }
}

/// How long a renewing publisher may hold records without any being
/// acknowledged before it replaces its producer. An acknowledgement with
/// `acks=all` takes milliseconds; a registry write waits 30 s for its own.
pub(crate) const STUCK_AFTER: Duration = Duration::from_secs(30);

type Inner = Arc<ThreadedProducer<PublishCtx>>;

/// A producer of small records, with its own thread serving deliveries.
pub(crate) struct Publisher {
    producer: RwLock<Inner>,
    /// What a transactional publisher's errors say it was doing.
    context: String,
    transactional_id: Option<String>,
    /// A renewing publisher's settings, to create its next producer with.
    renewal: Option<Renewal>,
}

/// What a renewing publisher needs to replace its producer.
struct Renewal {
    config: rdkafka::ClientConfig,
    /// Producers replaced in a row with nothing acknowledged between: each
    /// doubles the wait before the next (up to 8 times [`STUCK_AFTER`]), for
    /// a leader this host cannot reach, which a new producer does not cure.
    streak: std::sync::atomic::AtomicU32,
}

/// A record sent whose acknowledgement the caller waits for.
pub(crate) struct Acked {
    topic: String,
    rx: mpsc::Receiver<Result<i64, ClientError>>,
}

/// How a transactional publisher's call failed.
pub(crate) enum TxnCall {
    /// Another producer with the same transactional id fenced this one, or
    /// the transaction became abortable: read again and retry.
    Raced(KafkaError),
    /// Anything else (not authorized included): give up.
    Failed(KafkaError),
}

impl Publisher {
    /// A publisher named `client_id` with `settings` (after the
    /// connection's own, before `-X`).
    pub(crate) fn new(
        conn: &Connection,
        client_id: &str,
        settings: &[(&str, &str)],
    ) -> Result<Publisher, KafkaError> {
        let mut all = vec![("client.id", client_id)];
        all.extend_from_slice(settings);
        let config = conn.config_with(&all);
        let producer = Self::create(&config, client_id)?;
        Ok(Publisher {
            producer: RwLock::new(producer),
            context: client_id.to_owned(),
            transactional_id: None,
            renewal: None,
        })
    }

    /// A publisher like [`Publisher::new`] that replaces its producer when
    /// it is stuck (see the module's docs). Only for records that may be
    /// lost with an error to their waiter, or published again (statuses):
    /// never for records a later [`Publisher::delivered`] must account for.
    pub(crate) fn renewing(
        conn: &Connection,
        client_id: &str,
        settings: &[(&str, &str)],
    ) -> Result<Publisher, KafkaError> {
        let mut publisher = Publisher::new(conn, client_id, settings)?;
        let mut all = vec![("client.id", client_id)];
        all.extend_from_slice(settings);
        publisher.renewal = Some(Renewal {
            config: conn.config_with(&all),
            streak: Default::default(),
        });
        Ok(publisher)
    }

    fn create(config: &rdkafka::ClientConfig, client_id: &str) -> Result<Inner, KafkaError> {
        config
            .create_with_context(PublishCtx::default())
            .map(Arc::new)
            .map_err(|e| KafkaError::client(format!("creating the producer {client_id}"), e))
    }

    /// The producer in use now.
    fn producer(&self) -> Inner {
        self.producer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A renewing publisher's health check, for its owner to call every few
    /// seconds (the fleet: before each heartbeat): if its producer holds
    /// records and has had none acknowledged for [`STUCK_AFTER`] (doubling
    /// with each replacement in a row), it is replaced; a fatal error
    /// replaces it at once. The brokers are not asked first: in the fleet
    /// drill of 2026-12-07 a stuck producer (its heartbeats stopped at the
    /// broker's fence, librdkafka#5430) was never replaced by the first form
    /// of this check, which did. Replacing a producer during a real outage
    /// costs a client and a warning, at 30, 60, 120 and then every 240 s.
    /// Does nothing on a publisher that is not renewing. `topic` names the
    /// records it writes, for the warning.
    pub(crate) fn mend(&self, topic: &str) {
        let Some(renewal) = &self.renewal else {
            return;
        };
        use std::sync::atomic::Ordering::Relaxed;
        let producer = self.producer();
        let fatal = producer.client().fatal_error();
        if fatal.is_none() {
            if producer.in_flight_count() == 0 {
                // Nothing owed: the clock starts with the next record.
                producer.context().progressed();
                renewal.streak.store(0, Relaxed);
                return;
            }
            let streak = renewal.streak.load(Relaxed);
            if producer.context().since_progress() < STUCK_AFTER * (1 << streak.min(3)) {
                return;
            }
        }
        let held = producer.in_flight_count();
        let next = match Self::create(&renewal.config, &self.context) {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(client = %self.context, "cannot replace a stuck producer: {e}");
                return;
            }
        };
        {
            let mut current = self.producer.write().unwrap_or_else(|p| p.into_inner());
            if !Arc::ptr_eq(&current, &producer) {
                // Another thread replaced it meanwhile.
                return;
            }
            *current = next;
        }
        let streak = renewal.streak.fetch_add(1, Relaxed) + 1;
        match fatal {
            Some((code, reason)) => tracing::warn!(
                client = %self.context,
                "the producer hit a fatal error ({code:?}: {reason}); replaced it with a new one ({held} records it held are dropped and reported to whoever waits for them)"
            ),
            None => tracing::warn!(
                client = %self.context,
                topic,
                "the producer had nothing acknowledged for {} s: replaced it with a new one ({held} records \
                 it held are dropped and reported to whoever waits for them; {streak} in a row). Either \
                 librdkafka left it stuck (a partition once reported leaderless, librdkafka#5430) or the \
                 brokers are out of reach",
                producer.context().since_progress().as_secs()
            ),
        }
        // Dropping the old producer (its last handle) purges what it held
        // and waits at most about 0.6 s.
        drop(producer);
    }

    /// A transactional publisher (`transactional.id` = `transactional_id`);
    /// `context` says in its errors what its transactions are for.
    pub(crate) fn transactional(
        conn: &Connection,
        client_id: &str,
        transactional_id: &str,
        context: &str,
        settings: &[(&str, &str)],
    ) -> Result<Publisher, KafkaError> {
        let mut all = vec![("transactional.id", transactional_id)];
        all.extend_from_slice(settings);
        let mut publisher = Publisher::new(conn, client_id, &all)?;
        publisher.context = context.to_owned();
        publisher.transactional_id = Some(transactional_id.to_owned());
        Ok(publisher)
    }

    fn record<'a>(
        topic: &'a str,
        key: &'a str,
        payload: Option<&'a [u8]>,
        tx: Option<Delivery>,
    ) -> BaseRecord<'a, str, [u8], Box<Option<Delivery>>> {
        let record = BaseRecord::with_opaque_to(topic, Box::new(tx)).key(key);
        match payload {
            Some(p) => record.payload(p),
            None => record,
        }
    }

    /// Queues one record whose delivery report goes to the [`Acked`].
    fn enqueue_acked(
        &self,
        topic: &str,
        key: &str,
        payload: Option<&[u8]>,
    ) -> Result<Acked, ClientError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.producer()
            .send(Self::record(topic, key, payload, Some(tx)))
            .map_err(|(e, _)| e)?;
        Ok(Acked {
            topic: topic.to_owned(),
            rx,
        })
    }

    /// Sends one record (`payload: None`: a tombstone) whose
    /// acknowledgement [`Acked::wait`] returns.
    pub(crate) fn send_acked(
        &self,
        topic: &str,
        key: &str,
        payload: Option<&[u8]>,
    ) -> Result<Acked, KafkaError> {
        self.enqueue_acked(topic, key, payload)
            .map_err(|e| KafkaError::client(format!("writing to {topic}"), e))
    }

    /// Writes one record and waits up to `timeout` for the broker's
    /// acknowledgement: its offset.
    pub(crate) fn publish(
        &self,
        topic: &str,
        key: &str,
        payload: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<i64, KafkaError> {
        self.send_acked(topic, key, payload)?.wait(timeout)
    }

    /// Sends one record and forgets it (statuses, log lines): an error only
    /// when the producer's queue refused it.
    pub(crate) fn send(
        &self,
        topic: &str,
        key: &str,
        payload: Option<&[u8]>,
    ) -> Result<(), KafkaError> {
        self.producer()
            .send(Self::record(topic, key, payload, None))
            .map_err(|(e, _)| KafkaError::client(format!("writing to {topic}"), e))
    }

    /// Sends `out` (headers, partition and timestamp as given) and forgets
    /// it until [`Publisher::delivered`], waiting for room in the queue.
    pub(crate) fn send_record(&self, out: Outgoing<'_>) -> Result<(), KafkaError> {
        let headers = owned_headers(out.headers);
        let producer = self.producer();
        loop {
            match producer.send(record(&out, headers.as_ref(), Box::new(None))) {
                Ok(()) => return Ok(()),
                Err((ClientError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err((e, _)) => {
                    return Err(KafkaError::client(format!("sending to {}", out.topic), e));
                }
            }
        }
    }

    /// Waits up to `bound` for everything sent to be acknowledged; the
    /// first delivery that failed since the last call is the error (`what`
    /// says what was sent: "dead letters to <topic>").
    pub(crate) fn delivered(&self, bound: Duration, what: &str) -> Result<(), KafkaError> {
        let producer = self.producer();
        if producer.flush(bound).is_err() {
            return Err(KafkaError::timeout(
                format!("sending {what}"),
                format!("not acknowledged within {bound:?}: are the brokers reachable?"),
            ));
        }
        let failed = producer
            .context()
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match failed {
            Some((_, e)) => Err(KafkaError::client(format!("sending {what}"), e)),
            None => Ok(()),
        }
    }

    /// The first record sent and forgotten ([`Publisher::send`]) whose
    /// delivery failed since the last call, if any.
    pub(crate) fn take_failure(&self) -> Option<KafkaError> {
        self.producer()
            .context()
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .map(|(topic, e)| KafkaError::client(format!("writing to {topic}"), e))
    }

    /// Waits up to `timeout` for what was sent to be acknowledged.
    pub(crate) fn flush(&self, timeout: Duration) {
        let _ = self.producer().flush(timeout);
    }

    fn txn_call(&self, what: &str, r: Result<(), ClientError>) -> Result<(), TxnCall> {
        r.map_err(|e| self.txn_failure(what, e))
    }

    /// A transactional publisher's client error, classified.
    fn txn_failure(&self, what: &str, e: ClientError) -> TxnCall {
        if is_fencing(&e) || matches!(classify(&e), TxnFailure::Abort) {
            return TxnCall::Raced(KafkaError::client(format!("{what} ({})", self.context), e));
        }
        match authorization_failure(&e) {
            Some(code) => TxnCall::Failed(KafkaError::not_authorized(
                format!(
                    "transactional id {:?}",
                    self.transactional_id.as_deref().unwrap_or_default()
                ),
                "Write",
                code,
            )),
            None => TxnCall::Failed(KafkaError::client(format!("{what} ({})", self.context), e)),
        }
    }

    /// Sends one record inside the open transaction, its acknowledgement
    /// to wait for after the commit.
    pub(crate) fn send_in_transaction(
        &self,
        topic: &str,
        key: &str,
        payload: Option<&[u8]>,
    ) -> Result<Acked, TxnCall> {
        self.enqueue_acked(topic, key, payload)
            .map_err(|e| self.txn_failure(&format!("writing to {topic}"), e))
    }

    /// `init_transactions`: fences an earlier producer with the same
    /// transactional id. Connects to a broker first ([`connect_first`], a
    /// metadata request for `topic`, one the transactions write).
    pub(crate) fn init_transactions(&self, topic: &str, timeout: Duration) -> Result<(), TxnCall> {
        connect_first(
            self.producer().client(),
            topic,
            timeout.min(CONNECT_FIRST_WAIT),
        );
        self.txn_call(
            "init_transactions",
            self.producer().init_transactions(timeout),
        )
    }

    /// `begin_transaction`.
    pub(crate) fn begin_transaction(&self) -> Result<(), TxnCall> {
        self.txn_call("begin_transaction", self.producer().begin_transaction())
    }

    /// `commit_transaction`: every record sent in it is acknowledged when
    /// it returns.
    pub(crate) fn commit_transaction(&self, timeout: Duration) -> Result<(), TxnCall> {
        self.txn_call(
            "commit_transaction",
            self.producer().commit_transaction(timeout),
        )
    }

    /// `abort_transaction` (its outcome ignored: a publisher whose abort
    /// failed is dropped, and the next one's `init_transactions` aborts).
    pub(crate) fn abort_transaction(&self, timeout: Duration) {
        let _ = self.producer().abort_transaction(timeout);
    }
}

impl Acked {
    /// The record's offset, once acknowledged within `timeout`.
    pub(crate) fn wait(self, timeout: Duration) -> Result<i64, KafkaError> {
        let topic = self.topic;
        match self.rx.recv_timeout(timeout) {
            Ok(Ok(offset)) => Ok(offset),
            Ok(Err(e)) => Err(KafkaError::client(format!("writing to {topic}"), e)),
            Err(_) => Err(KafkaError::timeout(
                format!("writing to {topic}"),
                format!(
                    "no acknowledgement within {} s: is the cluster reachable?",
                    timeout.as_secs()
                ),
            )),
        }
    }
}

/// Writes `records`, each to its topic and partition (its timestamp when
/// not 0, else the producer's clock), with an idempotent producer, and
/// waits up to `bound` for them all to be acknowledged (`onceflow
/// produce`).
pub fn produce_records(
    conn: &Connection,
    records: &[crate::types::InputRecord],
    bound: Duration,
) -> Result<(), KafkaError> {
    let publisher = Publisher::new(conn, "onceflow-produce", &[("enable.idempotence", "true")])?;
    for r in records {
        publisher.send_record(Outgoing {
            topic: &r.topic,
            partition: Some(r.partition),
            key: r.key.as_deref(),
            value: r.value.as_deref(),
            headers: &r.headers,
            timestamp: (r.timestamp != 0).then_some(r.timestamp),
        })?;
    }
    publisher.delivered(bound, &format!("{} records", records.len()))
}
