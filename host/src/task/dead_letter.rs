//! The dead letter of a record that failed alone: the input's key, value
//! and headers, with the host's `onceflow.error.*` headers saying why and
//! where it was.

use super::{BatchOutcome, MAX_OUTPUT_BYTES, Task, TaskError};
use crate::manifest::ErrorPolicy;
use crate::types::{Header, InputRecord, OutputRecord};

/// Longest reason a dead letter carries, in bytes (the rest is cut).
const MAX_REASON_BYTES: usize = 4096;

/// Header names on dead-lettered records.
pub mod dead_letter_headers {
    /// What every header the host adds to a dead letter starts with; an
    /// input's own headers with this prefix are dropped from its dead
    /// letter.
    pub const PREFIX: &str = "onceflow.error.";
    /// Why the record failed.
    pub const ERROR: &str = "onceflow.error.message";
    /// The input topic.
    pub const TOPIC: &str = "onceflow.error.topic";
    /// The input partition (decimal).
    pub const PARTITION: &str = "onceflow.error.partition";
    /// The input offset (decimal).
    pub const OFFSET: &str = "onceflow.error.offset";
    /// The application id (`tenant.processor`).
    pub const PROCESSOR: &str = "onceflow.error.processor";
    /// Present when the record's value was too large to go with it: the
    /// value's size in bytes (decimal). Read the original from the input
    /// topic at the given offset.
    pub const VALUE_DROPPED: &str = "onceflow.error.value-dropped";
}

/// The dead-letter record for `record`: its key, value and headers, plus
/// the reason and its coordinates as headers. The reason is cut to 4 KiB;
/// if the record would still be larger than Kafka takes, its value is
/// dropped and header `onceflow.error.value-dropped` gives its size.
pub fn dead_letter(
    record: &InputRecord,
    topic: &str,
    application_id: &str,
    mut reason: String,
) -> OutputRecord {
    use dead_letter_headers as h;
    if reason.len() > MAX_REASON_BYTES {
        let mut cut = MAX_REASON_BYTES;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
        reason.push_str(" [cut]");
    }
    // The host's headers win: an input that already carries
    // `onceflow.error.*` headers (forged upstream, or a dead letter fed back
    // in) loses them, so readers find exactly one of each, the host's.
    let mut headers: Vec<Header> = record
        .headers
        .iter()
        .filter(|x| !x.key.starts_with(h::PREFIX))
        .cloned()
        .collect();
    let mut add = |key: &str, value: String| {
        headers.push(Header {
            key: key.to_owned(),
            value: value.into_bytes(),
        })
    };
    add(h::ERROR, reason);
    add(h::TOPIC, record.topic.to_string());
    add(h::PARTITION, record.partition.to_string());
    add(h::OFFSET, record.offset.to_string());
    add(h::PROCESSOR, application_id.to_owned());
    let mut out = OutputRecord {
        topic: topic.into(),
        key: record.key.clone(),
        value: record.value.clone(),
        headers,
        timestamp: Some(record.timestamp),
    };
    if out.size() as u64 > MAX_OUTPUT_BYTES {
        let dropped = out.value.take().map_or(0, |v| v.len());
        out.headers.push(Header {
            key: h::VALUE_DROPPED.to_owned(),
            value: dropped.to_string().into_bytes(),
        });
    }
    if out.size() as u64 > MAX_OUTPUT_BYTES {
        // The input's own key and headers are too large: keep only what
        // says where the record was.
        out.key = None;
        out.headers.retain(|x| x.key.starts_with(h::PREFIX));
    }
    out
}

impl Task {
    /// Applies the error policy to `record`, which failed alone for
    /// `reason`: stop (`fail`), count it (`skip`), or its dead letter in
    /// the batch's outputs, in its place (`dead-letter`).
    pub(super) fn poison(
        &mut self,
        record: &InputRecord,
        reason: String,
        out: &mut BatchOutcome,
    ) -> Result<(), TaskError> {
        match &self.config.policy {
            ErrorPolicy::Fail => Err(TaskError::RecordFailed {
                topic: record.topic.to_string(),
                partition: record.partition,
                offset: record.offset,
                reason,
            }),
            ErrorPolicy::Skip => {
                tracing::warn!(
                    processor = %self.config.application_id,
                    topic = %record.topic,
                    partition = record.partition,
                    offset = record.offset,
                    "skipped a record: {reason}"
                );
                out.skipped += 1;
                Ok(())
            }
            ErrorPolicy::DeadLetter { topic } => {
                tracing::debug!(
                    topic = %record.topic,
                    partition = record.partition,
                    offset = record.offset,
                    "dead-lettered a record: {reason}"
                );
                let letter = dead_letter(record, topic, &self.config.application_id, reason);
                out.output_bytes += letter.size() as u64;
                out.outputs.push(letter);
                out.dead_lettered += 1;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An input carrying forged `onceflow.error.*` headers: its dead letter
    /// has one of each, the host's (before, the forged ones came first and
    /// `verify` read the forged offset).
    #[test]
    fn the_hosts_dead_letter_headers_win_over_the_inputs() {
        let forged = |key: &str, value: &str| Header {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
        };
        let record = InputRecord {
            topic: "in".into(),
            partition: 2,
            offset: 41,
            timestamp: 7,
            key: Some(b"k".to_vec()),
            value: Some(b"v".to_vec()),
            headers: vec![
                forged(dead_letter_headers::OFFSET, "999"),
                forged(dead_letter_headers::ERROR, "all good"),
                forged("trace-id", "abc"),
            ],
        };
        let out = dead_letter(&record, "dlq", "t.p", "boom".to_owned());
        let values = |key: &str| -> Vec<String> {
            out.headers
                .iter()
                .filter(|x| x.key == key)
                .map(|x| String::from_utf8_lossy(&x.value).into_owned())
                .collect()
        };
        assert_eq!(values(dead_letter_headers::OFFSET), ["41"]);
        assert_eq!(values(dead_letter_headers::ERROR), ["boom"]);
        assert_eq!(values(dead_letter_headers::PARTITION), ["2"]);
        assert_eq!(values("trace-id"), ["abc"], "other headers are kept");
    }
}
