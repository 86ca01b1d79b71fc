//! Topic admin: the admin client, topic configuration, waiting for brokers
//! and topics, creating topics.

use super::*;

/// How long metadata and admin calls may take.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A topic the host creates for itself.
pub(crate) struct TopicSpec<'a> {
    pub name: &'a str,
    pub partitions: i32,
    pub config: &'a [(&'a str, &'a str)],
}

/// An admin client.
pub(crate) fn admin(conn: &Connection) -> Result<AdminClient<QuietContext>, KafkaError> {
    conn.config()
        .create_with_context(QuietContext::default())
        .map_err(|e| KafkaError::client("creating an admin client", e))
}

/// The configuration of `topic` as the brokers report it (every entry,
/// defaults included), its replication factor (the smallest of its
/// partitions') and the number of brokers.
pub(crate) fn topic_config(
    conn: &Connection,
    topic: &str,
) -> Result<(std::collections::BTreeMap<String, String>, usize, usize), KafkaError> {
    use rdkafka::admin::ResourceSpecifier;
    let admin = admin(conn)?;
    let opts = rdkafka::admin::AdminOptions::new().request_timeout(Some(ADMIN_TIMEOUT));
    let results = futures::executor::block_on(
        admin.describe_configs(&[ResourceSpecifier::Topic(topic)], &opts),
    )
    .map_err(|e| KafkaError::client(format!("describing topic {topic}"), e))?;
    let mut config = std::collections::BTreeMap::new();
    for r in results {
        let resource = r.map_err(|code| {
            if is_authorization(code) {
                KafkaError::not_authorized(format!("topic {topic:?}"), "DescribeConfigs", code)
            } else {
                KafkaError::topic(topic, format!("cannot read its configuration: {code}"))
            }
        })?;
        for e in resource.entries {
            if let Some(v) = e.value {
                config.insert(e.name, v);
            }
        }
    }
    let md = admin
        .inner()
        .fetch_metadata(Some(topic), ADMIN_TIMEOUT)
        .map_err(|e| KafkaError::client(format!("reading the metadata of {topic}"), e))?;
    let replicas = md
        .topics()
        .iter()
        .flat_map(|t| t.partitions())
        .map(|p| p.replicas().len())
        .min()
        .unwrap_or(0);
    Ok((config, replicas, md.brokers().len()))
}

/// A client for metadata calls only.
pub(crate) fn metadata_client(conn: &Connection) -> Result<BaseConsumer<QuietContext>, KafkaError> {
    conn.config()
        .create_with_context(QuietContext::default())
        .map_err(|e| KafkaError::client("creating a metadata client", e))
}

/// Why an attempt of [`wait_until`] did not succeed.
pub(crate) enum NotYet {
    /// Try again; the reason is logged.
    Retry(String),
    /// Waiting cannot help (a refused ACL): give up at once.
    Fatal(KafkaError),
}

impl From<String> for NotYet {
    fn from(reason: String) -> Self {
        Self::Retry(reason)
    }
}

impl From<KafkaError> for NotYet {
    /// A refusal is fatal; anything else is worth another try.
    fn from(e: KafkaError) -> Self {
        match e {
            e @ KafkaError::NotAuthorized { .. } => Self::Fatal(e),
            e => Self::Retry(crate::types::error_chain(&e)),
        }
    }
}

/// Calls `attempt` until it succeeds or `deadline` passes, logging what it
/// waits for: once when it starts waiting, then every 10 s with the latest
/// reason. `what` names what is awaited (e.g. "the Kafka brokers at
/// host:port"), `hint` what to check if it never comes. The timeout names
/// both, how long it waited and the last reason. A [`NotYet::Fatal`]
/// attempt ends the wait with its error.
pub(crate) fn wait_until<T, E: Into<NotYet>>(
    what: &str,
    hint: &str,
    deadline: Instant,
    mut attempt: impl FnMut(Duration) -> Result<T, E>,
) -> Result<T, KafkaError> {
    let started = Instant::now();
    let mut last_log: Option<Instant> = None;
    loop {
        // Each attempt gets at most 5 s, and never past the deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        let outcome = attempt(left.clamp(Duration::from_millis(500), Duration::from_secs(5)))
            .map_err(Into::into);
        let reason = match outcome {
            Err(NotYet::Fatal(e)) => return Err(e),
            Err(NotYet::Retry(reason)) => reason,
            Ok(v) => {
                if last_log.is_some() {
                    tracing::info!(
                        "done waiting for {what} ({:.1} s)",
                        started.elapsed().as_secs_f64()
                    );
                }
                return Ok(v);
            }
        };
        if Instant::now() >= deadline {
            return Err(KafkaError::timeout(
                format!("waiting for {what}"),
                format!(
                    "not there within {} s (last: {reason}): {hint}",
                    deadline
                        .saturating_duration_since(started)
                        .as_secs_f64()
                        .round()
                ),
            ));
        }
        match last_log {
            None => {
                tracing::info!(
                    "waiting for {what} (up to {} s): {reason}; {hint}",
                    deadline
                        .saturating_duration_since(started)
                        .as_secs_f64()
                        .round()
                );
                last_log = Some(Instant::now());
            }
            Some(t) if t.elapsed() >= Duration::from_secs(10) => {
                tracing::warn!(
                    "still waiting for {what} after {} s: {reason}",
                    started.elapsed().as_secs()
                );
                last_log = Some(Instant::now());
            }
            Some(_) => {}
        }
        std::thread::sleep(Duration::from_millis(500).min(left));
    }
}

/// Waits until a broker of the cluster answers, up to `deadline`: after the
/// first failed try (at most 5 s) it logs the address it waits for and what
/// to check, again every 10 s, and the error at the end names both. Returns
/// how many brokers the cluster has.
pub fn wait_for_brokers(conn: &Connection, deadline: Instant) -> Result<usize, KafkaError> {
    let client = metadata_client(conn)?;
    wait_until(
        &format!("the Kafka brokers at {}", conn.bootstrap_servers),
        "is Kafka running there, and do --bootstrap-servers (ONCEFLOW_BOOTSTRAP) and the -X settings reach it?",
        deadline,
        |timeout| match client.fetch_metadata(None, timeout) {
            Ok(md) if !md.brokers().is_empty() => Ok(md.brokers().len()),
            Ok(_) => Err("the cluster lists no brokers yet".to_owned()),
            Err(e) => Err(e.to_string()),
        },
    )
}

/// Waits until every partition of each of `topics` has a leader that
/// answers for its offsets (a topic just created may not have one for a
/// moment: metadata calls then say UnknownPartition or
/// NotLeaderForPartition), up to `deadline`.
pub(crate) fn wait_for_topics(
    conn: &Connection,
    topics: &[&str],
    deadline: Instant,
) -> Result<(), KafkaError> {
    let client = metadata_client(conn)?;
    wait_until(
        &format!("the leaders of {}", topics.join(", ")),
        &format!(
            "are the brokers at {} healthy (`kafka-topics.sh --describe` shows each partition's leader)?",
            conn.bootstrap_servers
        ),
        deadline,
        |timeout| {
            for topic in topics {
                let md = client
                    .fetch_metadata(Some(topic), timeout)
                    .map_err(|e| format!("{topic}: {e}"))?;
                let t = md
                    .topics()
                    .first()
                    .ok_or_else(|| format!("{topic}: not in the metadata yet"))?;
                if let Some(e) = t.error() {
                    return Err(format!("{topic}: {}", RDKafkaErrorCode::from(e)));
                }
                if t.partitions().is_empty() {
                    return Err(format!("{topic}: no partitions yet"));
                }
                for p in t.partitions() {
                    if let Some(e) = p.error() {
                        return Err(format!("{topic}/{}: {}", p.id(), RDKafkaErrorCode::from(e)));
                    }
                    if p.leader() < 0 {
                        return Err(format!("{topic}/{}: no leader yet", p.id()));
                    }
                    client
                        .fetch_watermarks(topic, p.id(), timeout)
                        .map_err(|e| format!("{topic}/{}: {e}", p.id()))?;
                }
            }
            Ok(())
        },
    )
}

/// How many partitions each of `topics` has (`onceflow produce`); a topic
/// that does not exist is an error that names it.
pub fn partition_counts(
    conn: &Connection,
    topics: &[&str],
    timeout: Duration,
) -> Result<BTreeMap<String, i32>, KafkaError> {
    let client = metadata_client(conn)?;
    let mut counts = BTreeMap::new();
    for topic in topics {
        let md = client
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| KafkaError::client(format!("reading the metadata of {topic}"), e))?;
        match md.topics().first() {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                counts.insert((*topic).to_owned(), t.partitions().len() as i32);
            }
            Some(t) => {
                return Err(KafkaError::topic(
                    *topic,
                    match t.error() {
                        Some(e) => format!(
                            "{}: create it first (kafka-topics.sh --create, or scripts/kafka topics --create)",
                            RDKafkaErrorCode::from(e)
                        ),
                        None => "it has no partitions".to_owned(),
                    },
                ));
            }
            None => return Err(KafkaError::topic(*topic, "not in the cluster's metadata")),
        }
    }
    Ok(counts)
}

/// Creates topics that do not exist yet, replicated up to 3 times (as many
/// as there are brokers).
pub(crate) fn create_topics(conn: &Connection, specs: &[TopicSpec<'_>]) -> Result<(), KafkaError> {
    let Some(first) = specs.first() else {
        return Ok(());
    };
    let admin = admin(conn)?;
    let probe = metadata_client(conn)?;
    // The brokers, from a request about one topic: every answer lists them,
    // and one about every topic grows with the cluster (a few thousand
    // topics on a host of hundreds of deployments).
    let brokers = probe
        .fetch_metadata(Some(first.name), ADMIN_TIMEOUT)
        .map(|m| m.brokers().len())
        .unwrap_or(1)
        .clamp(1, 3) as i32;
    let new: Vec<NewTopic<'_>> = specs
        .iter()
        .map(|spec| {
            let mut t = NewTopic::new(spec.name, spec.partitions, TopicReplication::Fixed(brokers))
                .set("min.insync.replicas", if brokers >= 3 { "2" } else { "1" });
            for (k, v) in spec.config {
                t = t.set(k, v);
            }
            t
        })
        .collect();
    let results = futures::executor::block_on(admin.create_topics(
        &new,
        &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)),
    ))
    .map_err(|e| KafkaError::client("creating topics", e))?;
    for r in results {
        match r {
            Ok(topic) => tracing::info!(%topic, "created topic"),
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => {
                tracing::debug!(%topic, "topic already exists")
            }
            Err((topic, code)) if is_authorization(code) => {
                return Err(KafkaError::not_authorized(
                    format!("topic {topic:?}"),
                    "Create",
                    code,
                ));
            }
            // No answer in time, or fewer brokers than just seen (one
            // fenced or restarting): the caller may try again.
            Err((topic, code)) if super::errors::TRANSIENT.contains(&code) => {
                return Err(KafkaError::client(
                    format!(
                        "creating the topic {topic:?} ({brokers} broker(s) seen a moment ago: \
                         is one fenced by its controller, restarting or not answering?)"
                    ),
                    ClientError::AdminOp(code),
                ));
            }
            Err((topic, code)) => {
                return Err(KafkaError::topic(
                    topic,
                    format!("cannot create the topic: {code}"),
                ));
            }
        }
    }
    Ok(())
}

/// The topic names a consumer has seen, shared by the records that come
/// from them: a polled record costs no allocation for its topic's name.
#[derive(Debug, Default)]
pub(crate) struct TopicNames(Vec<Arc<str>>);

impl TopicNames {
    /// The shared name `topic` (a linear search: a consumer reads a few
    /// topics, its inputs and tables).
    pub(crate) fn get(&mut self, topic: &str) -> Arc<str> {
        if let Some(name) = self.0.iter().find(|n| &***n == topic) {
            return name.clone();
        }
        let name: Arc<str> = Arc::from(topic);
        self.0.push(name.clone());
        name
    }
}
