//! Reading: a partition's watermarks and position, a topic read to its end,
//! records as the library's own (`to_input`), the group's members and their
//! assignments.

use super::*;

/// The partitions of `topic`, or `None` when it does not exist. A topic
/// this client's principal may not describe is an error
/// ([`KafkaError::NotAuthorized`]): the brokers answer so whether it
/// exists or not, and "does not exist" would send the user the wrong way.
pub(crate) fn partitions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
) -> Result<Option<Vec<i32>>, KafkaError> {
    let md = consumer
        .fetch_metadata(Some(topic), ADMIN_TIMEOUT)
        .map_err(|e| KafkaError::client(format!("fetching metadata of {topic}"), e))?;
    let Some(t) = md.topics().first() else {
        return Ok(None);
    };
    match t.error().map(RDKafkaErrorCode::from) {
        Some(code) if is_authorization(code) => Err(KafkaError::not_authorized(
            format!("topic {topic:?}"),
            "Describe",
            code,
        )),
        Some(_) => Ok(None),
        None if t.partitions().is_empty() => Ok(None),
        None => Ok(Some(t.partitions().iter().map(|p| p.id()).collect())),
    }
}

/// Polls an assigned reader (see [`Connection::reader`]) until each of its
/// `partitions` assigned partitions has reported its end, `on_record`
/// returns `Break`, or `deadline` passes ([`KafkaError::Timeout`]). Client
/// errors are logged (rate-limited) and polling goes on. With
/// read_committed, a partition's end is its last stable offset.
pub(crate) fn read_to_end<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: usize,
    what: &str,
    deadline: Instant,
    mut on_record: impl FnMut(&Record<'_>) -> ControlFlow<()>,
) -> Result<(), KafkaError> {
    let errors = ErrorLog::default();
    let mut ended = std::collections::HashSet::new();
    while ended.len() < partitions {
        match consumer
            .poll(Duration::from_millis(100))
            .map(|r| r.map(Record))
        {
            Some(Ok(record)) if on_record(&record).is_break() => return Ok(()),
            Some(Ok(_)) => {}
            Some(Err(ClientError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(e)) => {
                errors.report(what, &e, "reading to the end");
                std::thread::sleep(Duration::from_millis(50));
            }
            None => {}
        }
        if ended.len() < partitions && Instant::now() >= deadline {
            return Err(KafkaError::timeout(
                format!("reading {what}"),
                "did not reach the end of every partition in time: are the brokers reachable?",
            ));
        }
    }
    Ok(())
}

/// A reader of assigned partitions to their end ([`Connection::reader`]
/// with the quiet context): the fleet's control topics.
pub(crate) type Reader = BaseConsumer<QuietContext>;

/// A record read, as a reader's callers see it.
pub(crate) struct Record<'a>(BorrowedMessage<'a>);

impl Record<'_> {
    pub(crate) fn topic(&self) -> &str {
        self.0.topic()
    }

    pub(crate) fn partition(&self) -> i32 {
        self.0.partition()
    }

    pub(crate) fn offset(&self) -> i64 {
        self.0.offset()
    }

    pub(crate) fn key(&self) -> Option<&[u8]> {
        self.0.key()
    }

    /// The value (`None`: a tombstone).
    pub(crate) fn payload(&self) -> Option<&[u8]> {
        self.0.payload()
    }

    /// The headers' bytes: names and values.
    /// The record as an input record (`topics` shares the topics' names).
    pub(crate) fn input(&self, topics: &mut TopicNames) -> InputRecord {
        to_input(&self.0, topics)
    }

    /// Its timestamp, in ms since the epoch.
    pub(crate) fn timestamp(&self) -> Option<i64> {
        self.0.timestamp().to_millis()
    }

    pub(crate) fn header_bytes(&self) -> usize {
        self.0.headers().map_or(0, |hs| {
            hs.iter()
                .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
                .sum()
        })
    }

    /// The headers, each (name, value; an empty value for a null one).
    pub(crate) fn headers(&self) -> Vec<(String, Vec<u8>)> {
        self.0
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// What one poll of a reader gave.
pub(crate) enum Polled<'a> {
    Record(Record<'a>),
    /// The end of a partition (as of now).
    End,
    Failed(KafkaError),
    Nothing,
}

/// Polls `consumer` once, up to `timeout`.
pub(crate) fn poll<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    timeout: Duration,
) -> Polled<'_> {
    match consumer.poll(timeout) {
        Some(Ok(m)) => Polled::Record(Record(m)),
        Some(Err(ClientError::PartitionEOF(_))) => Polled::End,
        Some(Err(e)) => Polled::Failed(KafkaError::client("polling", e)),
        None => Polled::Nothing,
    }
}

/// Assigns `(topic, partition, from)` to a reader; `from: None` is the
/// beginning.
pub(crate) fn assign<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &[(&str, i32, Option<i64>)],
) -> Result<(), KafkaError> {
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (topic, partition, from) in partitions {
        let offset = from.map_or(rdkafka::Offset::Beginning, rdkafka::Offset::Offset);
        tpl.add_partition_offset(topic, *partition, offset)
            .map_err(|e| KafkaError::client(format!("assigning {topic}/{partition}"), e))?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| KafkaError::client("assigning partitions", e))
}

/// A partition's (low, high) watermarks; for a read_committed client the
/// high one is the last stable offset.
pub(crate) fn watermarks<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64), KafkaError> {
    consumer
        .fetch_watermarks(topic, partition, ADMIN_TIMEOUT)
        .map_err(|e| KafkaError::client(format!("reading the bounds of {topic}/{partition}"), e))
}

/// The offset of `topic`'s `partition`'s first record stamped at or after
/// `ts_ms` (Kafka's ListOffsets by time); `None` when none is.
pub(crate) fn offset_at_time<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
    ts_ms: i64,
) -> Result<Option<i64>, KafkaError> {
    let mut list = rdkafka::TopicPartitionList::new();
    list.add_partition_offset(topic, partition, rdkafka::Offset::Offset(ts_ms))
        .map_err(|e| KafkaError::client(format!("asking {topic}/{partition} for a time"), e))?;
    let found = consumer
        .offsets_for_times(list, ADMIN_TIMEOUT)
        .map_err(|e| KafkaError::client(format!("finding a time in {topic}/{partition}"), e))?;
    Ok(found
        .find_partition(topic, partition)
        .and_then(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => Some(o),
            _ => None,
        }))
}

/// `topic`'s `partition`'s (low, high) watermarks as the consumer's last
/// fetch from it saw them (librdkafka keeps them per partition), without
/// asking the broker; `None` before the first fetch. For a read_committed
/// consumer the high one can be past the last stable offset (an open
/// transaction).
pub(crate) fn fetched_watermarks<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Option<(i64, i64)> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1_i64, -1_i64);
    // SAFETY: the client handle lives as long as `consumer`, which this
    // call borrows; the topic is a NUL-terminated string that outlives the
    // call; librdkafka only writes the two integers and keeps no pointer.
    // rust-rdkafka wraps only the querying variant (a broker round trip).
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        && low >= 0
        && high >= 0)
        .then_some((low, high))
}

/// The next offset an assigned reader will return from `topic`'s
/// `partition`: past the transaction markers and aborted records it skipped
/// (librdkafka advances past them); -1 before its first fetch.
pub(crate) fn position<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> i64 {
    consumer
        .position()
        .ok()
        .and_then(|tpl| {
            tpl.find_partition(topic, partition)
                .and_then(|p| p.offset().to_raw())
        })
        .unwrap_or(-1)
}

/// Copies a consumed message into an [`InputRecord`].
pub(crate) fn to_input(m: &BorrowedMessage<'_>, topics: &mut TopicNames) -> InputRecord {
    let headers = m
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| Header {
                    key: h.key.to_owned(),
                    value: h.value.map(<[u8]>::to_vec).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    InputRecord {
        topic: topics.get(m.topic()),
        partition: m.partition(),
        offset: m.offset(),
        timestamp: m.timestamp().to_millis().unwrap_or(0),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
    }
}

/// A member of a consumer group (classic protocol) and the partitions it
/// was assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupMember {
    /// Its `client.id`.
    pub client_id: String,
    /// Its assignment, `(topic, partition)`.
    pub partitions: Vec<(String, i32)>,
}

/// The members of `group` and their assignments, as the group coordinator
/// describes them (DescribeGroups); `None` while the group is not stable
/// (a rebalance is under way: the assignments are not final).
pub(crate) fn group_members<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    group: &str,
) -> Result<Option<Vec<GroupMember>>, KafkaError> {
    let list = consumer
        .fetch_group_list(Some(group), ADMIN_TIMEOUT)
        .map_err(|e| KafkaError::client(format!("describing consumer group {group}"), e))?;
    Ok(list
        .groups()
        .iter()
        .find(|g| g.name() == group)
        .and_then(stable_members))
}

/// A described group's members and their assignments; `None` unless it is
/// stable.
pub(crate) fn stable_members(info: &rdkafka::groups::GroupInfo) -> Option<Vec<GroupMember>> {
    let group = info.name();
    if info.state() != "Stable" {
        return None;
    }
    let mut members = Vec::new();
    for m in info.members() {
        let partitions = match m.assignment() {
            Some(bytes) if !bytes.is_empty() => parse_assignment(bytes).unwrap_or_else(|| {
                tracing::debug!(
                    group,
                    member = m.id(),
                    "an assignment this host cannot read"
                );
                Vec::new()
            }),
            _ => Vec::new(),
        };
        members.push(GroupMember {
            client_id: m.client_id().to_owned(),
            partitions,
        });
    }
    Some(members)
}

/// Reads a consumer protocol assignment (any version; none has tagged
/// fields): version (i16), then topics (i32 count) of name (i16 length,
/// bytes) and partitions (i32 count, i32 each), then user data.
fn parse_assignment(bytes: &[u8]) -> Option<Vec<(String, i32)>> {
    struct Reader<'a>(&'a [u8]);
    impl Reader<'_> {
        fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
            let (head, rest) = self.0.split_first_chunk::<N>()?;
            self.0 = rest;
            Some(*head)
        }
        fn i16(&mut self) -> Option<i16> {
            self.take().map(i16::from_be_bytes)
        }
        fn i32(&mut self) -> Option<i32> {
            self.take().map(i32::from_be_bytes)
        }
    }
    let mut r = Reader(bytes);
    let _version = r.i16()?;
    let topics = r.i32()?;
    let mut out = Vec::new();
    for _ in 0..topics.max(0) {
        let len = usize::try_from(r.i16()?).ok()?;
        let name = r.0.get(..len)?;
        let name = std::str::from_utf8(name).ok()?.to_owned();
        r.0 = &r.0[len..];
        let count = r.i32()?;
        for _ in 0..count.max(0) {
            out.push((name.clone(), r.i32()?));
        }
    }
    Some(out)
}

/// Next offsets per (topic, partition), as a partition list.
pub(crate) fn offsets_list(next: &BTreeMap<(String, i32), i64>) -> rdkafka::TopicPartitionList {
    let mut tpl = rdkafka::TopicPartitionList::new();
    for ((topic, partition), offset) in next {
        // Cannot fail: the offset is absolute.
        let _ = tpl.add_partition_offset(topic, *partition, rdkafka::Offset::Offset(*offset));
    }
    tpl
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes Kafka's `ConsumerProtocol.serializeAssignment` writes
    /// (version 3: topic "in" partitions 0 and 2, topic "t" partition 1,
    /// empty user data); a truncated copy is refused, not misread.
    #[test]
    fn reads_a_consumer_protocol_assignment() {
        let mut b = Vec::new();
        b.extend(3i16.to_be_bytes());
        b.extend(2i32.to_be_bytes());
        b.extend(2i16.to_be_bytes());
        b.extend(b"in");
        b.extend(2i32.to_be_bytes());
        b.extend(0i32.to_be_bytes());
        b.extend(2i32.to_be_bytes());
        b.extend(1i16.to_be_bytes());
        b.extend(b"t");
        b.extend(1i32.to_be_bytes());
        b.extend(1i32.to_be_bytes());
        b.extend((-1i32).to_be_bytes());
        assert_eq!(
            parse_assignment(&b),
            Some(vec![
                ("in".to_owned(), 0),
                ("in".to_owned(), 2),
                ("t".to_owned(), 1)
            ])
        );
        assert_eq!(parse_assignment(&b[..b.len() - 9]), None);
    }
}
