//! Word count: splits each input line into words and keeps a running count
//! per word in the state store `counts`, emitting every new count to alias
//! `counts`.
//!
//! A word is a maximal run of alphanumeric characters (Unicode), lowercased.
//! A line that is not UTF-8 is rejected with `not UTF-8 text`; a tombstone
//! (no value) has no words.

use onceflow_sdk::{Context, Error, Processor, Record};

/// The word-count processor.
pub struct WordCount;

impl Processor for WordCount {
    fn process(ctx: &mut Context, record: &Record) -> Result<(), Error> {
        let Some(value) = record.value.as_deref() else {
            return Ok(());
        };
        let line = std::str::from_utf8(value).map_err(|_| Error::new("not UTF-8 text"))?;
        let counts = ctx.store("counts");
        for word in words(line) {
            let count = counts.get_i64(&word)?.unwrap_or(0) + 1;
            counts.put_i64(&word, count)?;
            ctx.emit("counts", &word, count.to_string())?;
        }
        Ok(())
    }
}

onceflow_sdk::export_processor!(WordCount);

/// The words of `line`, lowercased, in order.
fn words(line: &str) -> impl Iterator<Item = String> + '_ {
    line.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
}

#[cfg(test)]
mod tests {
    use super::*;
    use onceflow_sdk::testing::TestHost;

    fn line(bytes: &[u8]) -> Record {
        Record {
            topic: "lines".into(),
            value: Some(bytes.to_vec()),
            ..Record::default()
        }
    }

    #[test]
    fn words_are_runs_of_alphanumerics_lowercased() {
        let found: Vec<String> = words("Hello, hello-World! Straße 42x  ").collect();
        assert_eq!(found, ["hello", "hello", "world", "straße", "42x"]);
    }

    #[test]
    fn counts_accumulate_and_every_new_count_is_emitted() {
        let mut host = TestHost::new().with_store("counts").with_output("counts");
        host.process::<WordCount>(&line(b"the cat and THE hat"))
            .unwrap();
        host.process::<WordCount>(&line(b"the end")).unwrap();
        assert_eq!(host.get("counts", "the"), Some(b"3".to_vec()));
        let emitted: Vec<(String, String)> = host
            .emitted()
            .into_iter()
            .map(|e| {
                (
                    String::from_utf8(e.key.unwrap()).unwrap(),
                    String::from_utf8(e.value.unwrap()).unwrap(),
                )
            })
            .collect();
        assert_eq!(emitted[3], ("the".into(), "2".into()));
        assert_eq!(emitted[5], ("the".into(), "3".into()));
        assert_eq!(emitted.len(), 7);
    }

    #[test]
    fn non_utf8_lines_are_rejected() {
        let mut host = TestHost::new();
        let error = host.process::<WordCount>(&line(&[b'a', 0xff])).unwrap_err();
        assert_eq!(error.to_string(), "not UTF-8 text");
        assert!(host.emitted().is_empty());
    }
}
