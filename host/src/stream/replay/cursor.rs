//! Reading a partition forward, as replay walks its transactions: each log
//! (an input, a table's topic, a changelog) is read once from the first
//! offset a replay needs, by a consumer of its own that stays assigned,
//! instead of an assignment (and its first fetch's wait) per read.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::kafka::{self, Connection, KafkaError, Polled, QuietContext, TopicNames};
use crate::types::InputRecord;

/// How long a read may go without a record or the partition's end.
const STALL: Duration = Duration::from_secs(60);

/// One partition of one topic, read_committed, forward.
pub(super) struct Cursor {
    consumer: kafka::Reader,
    topic: String,
    partition: i32,
    names: TopicNames,
    /// Records fetched and not passed yet, in offset order.
    buffer: VecDeque<InputRecord>,
    /// Where the consumer was assigned from: no record before it is here.
    start: i64,
    /// The partition's end was reached and nothing came after it.
    at_end: bool,
}

impl Cursor {
    /// A cursor on `topic`'s `partition` from `from`.
    pub(super) fn new(
        conn: &Connection,
        group: &str,
        topic: &str,
        partition: i32,
        from: i64,
    ) -> Result<Self, KafkaError> {
        let consumer = conn.reader(group, "read_committed", 10, QuietContext::default())?;
        kafka::assign(&consumer, &[(topic, partition, Some(from))])?;
        Ok(Self {
            consumer,
            topic: topic.to_owned(),
            partition,
            names: TopicNames::default(),
            buffer: VecDeque::new(),
            start: from,
            at_end: false,
        })
    }

    /// Moves to `from`: records before it are passed; a position before
    /// what was read assigns the consumer again.
    fn seek(&mut self, from: i64) -> Result<(), KafkaError> {
        if from < self.start {
            kafka::assign(&self.consumer, &[(&self.topic, self.partition, Some(from))])?;
            self.buffer.clear();
            self.start = from;
            self.at_end = false;
            return Ok(());
        }
        while self.buffer.front().is_some_and(|r| r.offset < from) {
            self.buffer.pop_front();
        }
        self.start = from;
        Ok(())
    }

    /// Fetches until `enough` holds of the buffer or the partition ends.
    fn fill(&mut self, enough: impl Fn(&VecDeque<InputRecord>) -> bool) -> Result<(), KafkaError> {
        let mut last = Instant::now();
        while !enough(&self.buffer) && !self.at_end {
            match kafka::poll(&self.consumer, Duration::from_millis(100)) {
                Polled::Record(r) => {
                    let record = r.input(&mut self.names);
                    if record.offset >= self.start {
                        self.buffer.push_back(record);
                    }
                    last = Instant::now();
                }
                Polled::End => self.at_end = true,
                Polled::Failed(e) if last.elapsed() > STALL => return Err(e),
                Polled::Failed(_) | Polled::Nothing => {
                    if last.elapsed() > STALL {
                        return Err(KafkaError::timeout(
                            format!("reading {}/{}", self.topic, self.partition),
                            "no record and no end of the partition for a minute: are the \
                             brokers reachable?",
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The records from `from` up to `to` (exclusive), passed.
    pub(super) fn take_below(
        &mut self,
        from: i64,
        to: i64,
    ) -> Result<Vec<InputRecord>, KafkaError> {
        if from >= to {
            return Ok(Vec::new());
        }
        self.seek(from)?;
        self.fill(|b| b.back().is_some_and(|r| r.offset + 1 >= to))?;
        let mut out = Vec::new();
        while self.buffer.front().is_some_and(|r| r.offset < to) {
            out.extend(self.buffer.pop_front());
        }
        self.start = to;
        Ok(out)
    }

    /// The first `n` records from `from` (fewer if the partition has no
    /// more), kept: a later read may pass them again.
    pub(super) fn first(&mut self, from: i64, n: usize) -> Result<Vec<InputRecord>, KafkaError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        self.seek(from)?;
        self.fill(|b| b.len() >= n)?;
        Ok(self.buffer.iter().take(n).cloned().collect())
    }
}
