//! What a client's errors mean: the logging context every client shares,
//! the error lines that are not errors, authorization failures, and how a
//! transactional call's failure is handled (`classify`).

use super::*;

/// Whether a code is the brokers' authorizer refusing this client's
/// principal (an ACL is missing).
pub(crate) fn is_authorization(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::GroupAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
    )
}

/// The authorizer's refusal in a client error, if that is what it is.
pub(crate) fn authorization_failure(e: &ClientError) -> Option<RDKafkaErrorCode> {
    e.rdkafka_error_code().filter(|c| is_authorization(*c))
}

/// Client-level errors (brokers down, transport failures) arrive on every
/// poll while a broker is away; this logs them at most every 5 s, with a
/// count, instead of thousands of lines a second.
#[derive(Default)]
pub(crate) struct ErrorLog {
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl ErrorLog {
    /// Records an error from librdkafka's error callback.
    pub(crate) fn report(&self, client: &str, error: &ClientError, reason: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.1 += 1;
        if s.0.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            tracing::warn!(
                "{client}: {error}: {reason} ({} similar errors since the last report)",
                s.1
            );
            *s = (Some(std::time::Instant::now()), 0);
        }
    }
}

/// The context of the helper consumers that read to a partition's end
/// (restore, verify): the end-of-partition events they ask for are not
/// errors, nor is a SASL handshake cut short by their own close, and other
/// client errors are rate-limited.
#[derive(Default)]
pub(crate) struct QuietContext {
    errors: ErrorLog,
}

impl rdkafka::client::ClientContext for QuietContext {
    fn error(&self, error: ClientError, reason: &str) {
        if is_sasl_handshake_cut(reason) {
            tracing::debug!("consumer: {error}: {reason}");
        } else if !is_end_of_partition(&error) {
            self.errors.report("consumer", &error, reason);
        }
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        log(level, fac, message);
    }
}

/// librdkafka's log lines, as every client context of the host logs them:
/// at their own level, except the ones that only say librdkafka is already
/// retrying something that heals by itself (a healthy run prints no
/// warning), which go to debug.
pub(crate) fn log(level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
    use rdkafka::config::RDKafkaLogLevel as L;
    match level {
        _ if is_sasl_handshake_cut(message)
            || is_retried_pid(fac, message)
            || is_stale_generation_txnerr(fac, message) =>
        {
            tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        L::Emerg | L::Alert | L::Critical | L::Error => {
            tracing::error!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        L::Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {message}"),
        L::Notice | L::Info => {
            tracing::info!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        L::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}"),
    }
}

/// Whether librdkafka says it failed to get a producer id and is retrying:
/// a cluster just started or a coordinator just moved answers "Not
/// coordinator" or "Coordinator load in progress" for a moment. If it never
/// heals, `init_transactions` times out, and that error is reported.
fn is_retried_pid(fac: &str, message: &str) -> bool {
    fac == "GETPID" && message.contains("Failed to acquire") && message.ends_with(": retrying")
}

/// Whether librdkafka says the open transaction failed because its offsets
/// were sent for a group generation that a rebalance just ended
/// (`send_offsets_to_transaction` answered ILLEGAL_GENERATION, or the member
/// was unknown or rebalancing). The worker gets the same error from the call,
/// aborts and rewinds, and logs that at info ([`is_stale_generation`]); a
/// host joining a deployment's group while its first transaction commits
/// printed this line at ERROR (the README's second host, 2026-12-03).
fn is_stale_generation_txnerr(fac: &str, message: &str) -> bool {
    fac == "TXNERR"
        && STALE_GENERATION
            .iter()
            .any(|(_, name)| message.contains(name))
}

/// Whether librdkafka reports a SASL handshake that its own disconnect cut
/// short: a client closed while its group coordinator's connection was
/// still authenticating. Benign (the request fails with a local transport
/// error, not an authentication error), but logged at ERROR and sent to
/// the error callback; `onceflow verify`'s short-lived readers met it on
/// every run against a SASL_SSL broker (also confluent-kafka-python#1780).
/// Wrong credentials say "Authentication failed" instead. The cut comes in
/// either step of the handshake: the mechanism handshake or the
/// authentication that follows it.
fn is_sasl_handshake_cut(text: &str) -> bool {
    text.contains("SaslAuthenticateRequest failed: Local: Broker transport failure")
        || (text.contains("mechanism handshake failed")
            && text.contains("Local: Broker transport failure"))
}

/// Whether an error only says that a consumer reached a partition's end:
/// it comes with the message stream, and also (as a "global" error) to the
/// client's error callback.
fn is_end_of_partition(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::PartitionEOF(_) | ClientError::Global(RDKafkaErrorCode::PartitionEOF)
    )
}

impl rdkafka::consumer::ConsumerContext for QuietContext {}

/// What to do about a failed transactional call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxnFailure {
    /// Call it again.
    Retry,
    /// Abort the transaction, rewind, carry on.
    Abort,
    /// The producer is unusable (fenced, fatal, or in an unknown state):
    /// re-create it and rejoin.
    Fatal,
}

/// Classifies a transactional error as librdkafka's transactional API
/// documents: fatal, abortable, retriable; none of the three is fatal.
pub(crate) fn classify(e: &ClientError) -> TxnFailure {
    match e {
        ClientError::Transaction(r) if r.is_fatal() => TxnFailure::Fatal,
        ClientError::Transaction(r) if r.txn_requires_abort() => TxnFailure::Abort,
        ClientError::Transaction(r) if r.is_retriable() => TxnFailure::Retry,
        _ => TxnFailure::Fatal,
    }
}

/// Whether an error means this producer or member was fenced by a newer
/// one (a zombie caught).
pub(crate) fn is_fencing(e: &ClientError) -> bool {
    let code = e.rdkafka_error_code();
    matches!(
        code,
        Some(
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::FencedInstanceId
        )
    )
}

/// Whether an error means another member joined with this consumer's
/// static id (KIP-345): this member is the zombie. Of [`is_fencing`]'s
/// errors the others fence a producer, whose consumer may be a sound
/// member still.
pub(crate) fn is_member_fencing(e: &ClientError) -> bool {
    e.rdkafka_error_code() == Some(RDKafkaErrorCode::FencedInstanceId)
}

impl KafkaError {
    /// Whether the brokers may answer if asked again later: no answer in
    /// time, a broker away, a leader or coordinator moving. Not a refusal
    /// (authorization, a bad topic, a bad setting), which asking again
    /// cannot cure.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            KafkaError::Timeout { .. } => true,
            KafkaError::Client { source, .. } => source
                .downcast_ref::<ClientError>()
                .and_then(|e| match e {
                    // (rdkafka reports no code for an admin call's error.)
                    ClientError::AdminOp(code) => Some(*code),
                    e => e.rdkafka_error_code(),
                })
                .is_some_and(|code| TRANSIENT.contains(&code)),
            KafkaError::Topic { .. } | KafkaError::NotAuthorized { .. } => false,
        }
    }
}

/// The client's codes of a broker that may answer later.
/// `InvalidReplicationFactor` comes only from creating a topic, whose factor
/// is the number of brokers just seen ([`super::create_topics`]): fewer
/// take it now (one fenced by its controller, or restarting).
pub(super) const TRANSIENT: [RDKafkaErrorCode; 12] = [
    RDKafkaErrorCode::OperationTimedOut,
    RDKafkaErrorCode::RequestTimedOut,
    RDKafkaErrorCode::BrokerTransportFailure,
    RDKafkaErrorCode::AllBrokersDown,
    RDKafkaErrorCode::NetworkException,
    RDKafkaErrorCode::LeaderNotAvailable,
    RDKafkaErrorCode::NotLeaderForPartition,
    RDKafkaErrorCode::NotCoordinator,
    RDKafkaErrorCode::CoordinatorNotAvailable,
    RDKafkaErrorCode::CoordinatorLoadInProgress,
    RDKafkaErrorCode::NotEnoughReplicas,
    RDKafkaErrorCode::InvalidReplicationFactor,
];

/// Whether `e` says the group's coordinator moved or is not ready yet (a
/// busy, restarting or re-electing broker): asked again, it answers.
pub(crate) fn coordinator_moving(e: &ClientError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::CoordinatorLoadInProgress
        )
    )
}

/// Whether an offset commit was refused because the group moved on: a
/// rebalance began (a new generation), or the member's session expired
/// (unknown member). Not fencing: the consumer rejoins by itself on its
/// next poll and gets its new assignment (Kafka Streams' "task migrated":
/// close the tasks, keep the producer, rejoin).
pub(crate) fn is_stale_generation(e: &ClientError) -> bool {
    e.rdkafka_error_code()
        .is_some_and(|code| STALE_GENERATION.iter().any(|(stale, _)| *stale == code))
}

/// The codes of a group that moved on, with the name librdkafka's log lines
/// give each (in parentheses, at the end of a TXNERR line).
const STALE_GENERATION: [(RDKafkaErrorCode, &str); 3] = [
    (RDKafkaErrorCode::IllegalGeneration, "(ILLEGAL_GENERATION)"),
    (
        RDKafkaErrorCode::RebalanceInProgress,
        "(REBALANCE_IN_PROGRESS)",
    ),
    (RDKafkaErrorCode::UnknownMemberId, "(UNKNOWN_MEMBER_ID)"),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// librdkafka's TXNERR line for a commit refused for a stale generation
    /// is not an error line (the worker aborts, rewinds and logs it at info).
    #[test]
    fn a_transaction_failed_by_a_rebalance_is_not_an_error_line() {
        // The line as librdkafka 2.12.1 wrote it (CI, the README's second host).
        let line = "Current transaction failed in state InTransaction: Failed to commit offsets to \
                    transaction on broker 127.0.0.1:19192/1: demo.payments((null))[2](Broker: \
                    Specified group generation id is not valid) (after 23ms) (ILLEGAL_GENERATION)";
        assert!(is_stale_generation_txnerr("TXNERR", line));
        assert!(!is_stale_generation_txnerr("GETPID", line));
        let fenced = "Current transaction failed in state InTransaction: ... (PRODUCER_FENCED)";
        assert!(!is_stale_generation_txnerr("TXNERR", fenced));
    }

    /// `committed` of a group whose coordinator moved (what the drill's
    /// overloaded broker answered) is asked again; a timeout and anything
    /// else are not.
    #[test]
    fn a_moving_coordinator_is_asked_again() {
        for code in [
            RDKafkaErrorCode::NotCoordinator,
            RDKafkaErrorCode::CoordinatorNotAvailable,
            RDKafkaErrorCode::CoordinatorLoadInProgress,
        ] {
            assert!(
                coordinator_moving(&ClientError::MetadataFetch(code)),
                "{code:?}"
            );
        }
        for code in [
            RDKafkaErrorCode::OperationTimedOut,
            RDKafkaErrorCode::GroupAuthorizationFailed,
        ] {
            assert!(
                !coordinator_moving(&ClientError::MetadataFetch(code)),
                "{code:?}"
            );
        }
    }

    /// A deployment that stopped on a broker's timeout is started again
    /// (the rolling drill: an admin call timed out on an overloaded broker
    /// and failed five deployments on a host for good); a refusal is not.
    #[test]
    fn timeouts_are_transient_and_refusals_are_not() {
        let client = |code| KafkaError::client("describing topic t", ClientError::AdminOp(code));
        assert!(client(RDKafkaErrorCode::OperationTimedOut).is_transient());
        assert!(client(RDKafkaErrorCode::AllBrokersDown).is_transient());
        assert!(KafkaError::timeout("x", "y").is_transient());
        assert!(!client(RDKafkaErrorCode::TopicAuthorizationFailed).is_transient());
        assert!(!client(RDKafkaErrorCode::InvalidConfig).is_transient());
        assert!(!KafkaError::topic("t", "missing").is_transient());
        // A topic created while its broker was fenced (the control-plane
        // test r_a_fenced_broker...: a deployment was `failed` for good).
        assert!(client(RDKafkaErrorCode::InvalidReplicationFactor).is_transient());
    }

    /// A commit refused for a stale generation (a rebalance began) used to
    /// count as fencing: the worker dropped producer and consumer and
    /// rejoined under its static id, which gets the old assignment back
    /// without a rebalance (issue 16, item 9).
    #[test]
    fn a_stale_generation_is_not_fencing() {
        for code in [
            RDKafkaErrorCode::IllegalGeneration,
            RDKafkaErrorCode::RebalanceInProgress,
            RDKafkaErrorCode::UnknownMemberId,
        ] {
            let e = ClientError::Global(code);
            assert!(!is_fencing(&e), "{code:?} is not fencing");
            assert!(is_stale_generation(&e), "{code:?} is a stale generation");
        }
        for code in [
            RDKafkaErrorCode::ProducerFenced,
            RDKafkaErrorCode::FencedInstanceId,
            RDKafkaErrorCode::InvalidProducerEpoch,
        ] {
            let e = ClientError::Global(code);
            assert!(is_fencing(&e), "{code:?} is fencing");
            assert!(!is_stale_generation(&e));
        }
    }

    #[test]
    fn a_producer_id_librdkafka_retries_is_not_a_warning() {
        assert!(is_retried_pid(
            "GETPID",
            "[thrd:main]: Failed to acquire transactional PID from broker TxnCoordinator/1: \
             Broker: Not coordinator: retrying"
        ));
        assert!(is_retried_pid(
            "GETPID",
            "Failed to acquire idempotence PID from broker 127.0.0.1:19192/1: \
             Broker: Coordinator load in progress: retrying"
        ));
        assert!(!is_retried_pid(
            "GETPID",
            "Failed to acquire transactional PID from broker TxnCoordinator/1: \
             Broker: Transactional Id authorization failed"
        ));
    }

    #[test]
    fn a_sasl_handshake_cut_by_a_close_is_not_an_error() {
        assert!(is_sasl_handshake_cut(
            "GroupCoordinator: SASL authentication error: SaslAuthenticateRequest failed: \
             Local: Broker transport failure (after 0ms in state DOWN)"
        ));
        assert!(is_sasl_handshake_cut(
            "GroupCoordinator: SASL SCRAM-SHA-512 mechanism handshake failed: \
             Local: Broker transport failure: broker's supported mechanisms: SCRAM-SHA-512"
        ));
        assert!(!is_sasl_handshake_cut(
            "sasl_ssl://127.0.0.1:9093/1: SASL authentication error: Authentication failed \
             during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
        ));
    }

    #[test]
    fn authorization_failures_are_told_apart() {
        for code in [
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::GroupAuthorizationFailed,
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
            RDKafkaErrorCode::ClusterAuthorizationFailed,
        ] {
            assert_eq!(
                authorization_failure(&ClientError::Global(code)),
                Some(code)
            );
        }
        assert_eq!(
            authorization_failure(&ClientError::Global(
                RDKafkaErrorCode::BrokerTransportFailure
            )),
            None
        );
        let e = KafkaError::not_authorized(
            "topic \"acme.payments\"",
            "Describe",
            RDKafkaErrorCode::TopicAuthorizationFailed,
        );
        assert!(
            e.to_string().starts_with(
                "topic \"acme.payments\": not authorized: the brokers refused Describe"
            ),
            "{e}"
        );
    }

    #[test]
    fn the_end_of_a_partition_is_not_an_error() {
        assert!(is_end_of_partition(&ClientError::PartitionEOF(3)));
        assert!(is_end_of_partition(&ClientError::Global(
            RDKafkaErrorCode::PartitionEOF
        )));
        assert!(!is_end_of_partition(&ClientError::Global(
            RDKafkaErrorCode::BrokerTransportFailure
        )));
    }
}
