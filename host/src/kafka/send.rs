//! Sending: a record into the producer's queue (waiting for room), an
//! output, and draining the producer.

use super::*;

/// A record to send.
pub(crate) struct Outgoing<'a> {
    /// Topic.
    pub topic: &'a str,
    /// Partition (`None`: from the key, Java's murmur2).
    pub partition: Option<i32>,
    /// Key.
    pub key: Option<&'a [u8]>,
    /// Value (`None`: tombstone).
    pub value: Option<&'a [u8]>,
    /// Headers.
    pub headers: &'a [Header],
    /// Timestamp, ms (`None`: the producer's clock).
    pub timestamp: Option<i64>,
}

/// Sends one record, waiting for room in the producer's queue.
pub(crate) fn send<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &BaseProducer<C>,
    out: Outgoing<'_>,
) -> Result<(), ClientError> {
    let headers = owned_headers(out.headers);
    loop {
        match producer.send(record(&out, headers.as_ref(), ())) {
            Ok(()) => return Ok(()),
            Err((ClientError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                producer.poll(Duration::from_millis(50));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// librdkafka's headers for `headers` (none when empty).
pub(super) fn owned_headers(headers: &[Header]) -> Option<OwnedHeaders> {
    (!headers.is_empty()).then(|| {
        headers
            .iter()
            .fold(OwnedHeaders::new_with_capacity(headers.len()), |hs, h| {
                hs.insert(KHeader {
                    key: &h.key,
                    value: Some(&h.value),
                })
            })
    })
}

/// The record librdkafka sends for `out`, with `opaque` for its delivery
/// report.
pub(super) fn record<'a, D: rdkafka::util::IntoOpaque>(
    out: &Outgoing<'a>,
    headers: Option<&OwnedHeaders>,
    opaque: D,
) -> BaseRecord<'a, [u8], [u8], D> {
    let mut record: BaseRecord<'a, [u8], [u8], D> = BaseRecord::with_opaque_to(out.topic, opaque);
    if let Some(k) = out.key {
        record = record.key(k);
    }
    if let Some(v) = out.value {
        record = record.payload(v);
    }
    if let Some(p) = out.partition {
        record = record.partition(p);
    }
    if let Some(t) = out.timestamp.filter(|t| *t > 0) {
        record = record.timestamp(t);
    }
    if let Some(h) = headers {
        record = record.headers(h.clone());
    }
    record
}

/// Sends an output record (partition chosen from the key).
pub(crate) fn send_output<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &BaseProducer<C>,
    o: &OutputRecord,
) -> Result<(), ClientError> {
    send(
        producer,
        Outgoing {
            topic: &o.topic,
            partition: None,
            key: o.key.as_deref(),
            value: o.value.as_deref(),
            headers: &o.headers,
            timestamp: o.timestamp,
        },
    )
}

/// Waits until every produced record is acknowledged (or failed) and its
/// delivery report served. rdkafka's `flush` polls in 100 ms steps, which
/// would add up to 100 ms to every commit. A short `poll` does not help:
/// rdkafka 0.39's `BaseProducer::poll` loops until its deadline and hands
/// librdkafka the time left in whole milliseconds, so `poll(1 ms)` asks
/// for 0 ms and spins for the whole millisecond (half the commit thread's
/// CPU was `clock_gettime` in a profile of the wallet). So: serve one event
/// at a time without waiting while they come, and nap [`DRAIN_NAP`] when
/// none is ready.
pub(crate) fn drain<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &BaseProducer<C>,
    timeout: Duration,
) -> Result<(), ClientError> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let before = producer.in_flight_count();
        if before == 0 {
            return Ok(());
        }
        // At most one event; every event served lowers the count.
        producer.poll(Duration::ZERO);
        let after = producer.in_flight_count();
        if after == 0 {
            return Ok(());
        }
        if after < before {
            continue;
        }
        if std::time::Instant::now() >= deadline {
            return Err(ClientError::Flush(RDKafkaErrorCode::OperationTimedOut));
        }
        std::thread::sleep(DRAIN_NAP);
    }
}

/// How long [`drain`] sleeps when no delivery report is ready: what it
/// adds to a commit at most, against a spinning thread.
const DRAIN_NAP: Duration = Duration::from_micros(200);
