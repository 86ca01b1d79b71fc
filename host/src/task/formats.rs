//! Inputs' formats in a task: a batch's values decoded before the processor
//! sees them (docs/formats.md); a value that does not decode goes to the
//! error policy in its place, as if the processor had refused its record.

use super::{Task, TaskError};
use crate::schema::{Codecs, FormatError};
use crate::types::{Header, InputRecord};

impl Task {
    /// The batch with each value as the processor sees it (decoded from
    /// its topic's format); a value that does not decode stays as it is,
    /// noted in `undecodable` for the error policy.
    pub(super) fn decode(
        &mut self,
        codecs: &Codecs,
        batch: &[InputRecord],
    ) -> Result<Vec<InputRecord>, TaskError> {
        self.undecodable.clear();
        let mut out = Vec::with_capacity(batch.len());
        for record in batch {
            let mut record = record.clone();
            if let Some(value) = record.value.as_deref()
                && let Some(decoded) = codecs.decode(&record.topic, value)
            {
                match decoded {
                    Ok(decoded) => {
                        record.value = Some(decoded.value);
                        record
                            .headers
                            .extend(decoded.headers.into_iter().map(|(key, value)| Header {
                                key: key.to_owned(),
                                value,
                            }));
                    }
                    Err(FormatError::Invalid(why)) => self.undecodable.push((
                        record.topic.clone(),
                        record.offset,
                        format!(
                            "the value is not {}: {why}",
                            codecs.format_name(&record.topic)
                        ),
                    )),
                    Err(e @ FormatError::Unavailable(_)) => {
                        return Err(TaskError::SchemaRegistry(format!(
                            "{}/{}@{}: {e}",
                            record.topic, record.partition, record.offset
                        )));
                    }
                }
            }
            out.push(record);
        }
        Ok(out)
    }

    /// Where the first of `records` whose value did not decode is.
    pub(super) fn undecodable_at(&self, records: &[InputRecord]) -> Option<usize> {
        if self.undecodable.is_empty() {
            return None;
        }
        records.iter().position(|r| {
            self.undecodable
                .iter()
                .any(|(t, o, _)| *o == r.offset && *t == r.topic)
        })
    }

    /// Why `record`'s value did not decode, taken off the batch's list.
    pub(super) fn take_undecodable(&mut self, record: &InputRecord) -> String {
        let at = self
            .undecodable
            .iter()
            .position(|(t, o, _)| *o == record.offset && *t == record.topic);
        match at {
            Some(at) => self.undecodable.swap_remove(at).2,
            None => "the value did not decode".to_owned(),
        }
    }
}
