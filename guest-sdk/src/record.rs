//! Input records and the processor's configuration.

use crate::bindings::onceflow::processor::types as wit;
use crate::error::{Error, ErrorKind};

/// One input record, as read from Kafka (committed data only).
///
/// `Record` implements [`Default`], so tests can build one with
/// `Record { value: Some(b"...".to_vec()), ..Record::default() }`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// The input topic the record was read from.
    pub topic: String,
    /// The input partition. All records of one batch share it.
    pub partition: i32,
    /// The record's offset in its partition.
    pub offset: i64,
    /// The record's timestamp, in milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// The key, or `None` for a null key.
    pub key: Option<Vec<u8>>,
    /// The value, or `None` for a tombstone.
    pub value: Option<Vec<u8>>,
    /// The headers, in their original order. Names need not be unique.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Record {
    /// The key as UTF-8 text.
    ///
    /// Fails with [`ErrorKind::InvalidData`] when the key is null or not
    /// UTF-8.
    pub fn key_str(&self) -> Result<&str, Error> {
        text(self.key.as_deref(), "key")
    }

    /// The value as UTF-8 text.
    ///
    /// Fails with [`ErrorKind::InvalidData`] when the value is absent (a
    /// tombstone) or not UTF-8.
    pub fn value_str(&self) -> Result<&str, Error> {
        text(self.value.as_deref(), "value")
    }

    /// The value of the first header called `name`, if any.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_slice())
    }

    /// The value deserialised from JSON.
    ///
    /// Fails with [`ErrorKind::InvalidData`] when the value is absent or is
    /// not JSON of the shape `T` expects; the message includes serde_json's
    /// reason. Processors that must produce their own, stable messages
    /// (for a dead-letter topic, say) parse into `serde_json::Value` and check
    /// the fields by hand instead.
    #[cfg(feature = "json")]
    pub fn value_json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        let value = self
            .value
            .as_deref()
            .ok_or_else(|| Error::with_kind(ErrorKind::InvalidData, "record has no value"))?;
        serde_json::from_slice(value).map_err(|e| {
            Error::with_kind(
                ErrorKind::InvalidData,
                format!("record value is not the expected JSON: {e}"),
            )
        })
    }
}

fn text<'r>(bytes: Option<&'r [u8]>, what: &str) -> Result<&'r str, Error> {
    let bytes = bytes
        .ok_or_else(|| Error::with_kind(ErrorKind::InvalidData, format!("record has no {what}")))?;
    std::str::from_utf8(bytes).map_err(|_| {
        Error::with_kind(
            ErrorKind::InvalidData,
            format!("record {what} is not UTF-8 text"),
        )
    })
}

impl From<wit::Record> for Record {
    fn from(record: wit::Record) -> Self {
        Self {
            topic: record.topic,
            partition: record.partition,
            offset: record.offset,
            timestamp: record.timestamp,
            key: record.key,
            value: record.value,
            headers: record
                .headers
                .into_iter()
                .map(|header| (header.key, header.value))
                .collect(),
        }
    }
}

/// The processor's configuration: the key-value pairs of the manifest's
/// `[config]` table, in the order the host passed them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    entries: Vec<(String, String)>,
}

impl Config {
    /// An empty configuration.
    pub const fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    /// The value of `key`, if the manifest sets it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// All key-value pairs.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// How many keys are set.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Config {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self {
            entries: iter
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }
}

impl From<Vec<(String, String)>> for Config {
    fn from(entries: Vec<(String, String)>) -> Self {
        Self { entries }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: Option<&[u8]>, value: Option<&[u8]>) -> Record {
        Record {
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            headers: vec![("h".into(), b"1".to_vec()), ("h".into(), b"2".to_vec())],
            ..Record::default()
        }
    }

    #[test]
    fn text_accessors_report_absent_and_invalid() {
        let r = record(Some(b"k"), Some(b"v"));
        assert_eq!(r.key_str().unwrap(), "k");
        assert_eq!(r.value_str().unwrap(), "v");
        let r = record(None, Some(&[0xff]));
        assert_eq!(r.key_str().unwrap_err().to_string(), "record has no key");
        let error = r.value_str().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidData);
        assert_eq!(error.to_string(), "record value is not UTF-8 text");
    }

    #[test]
    fn header_returns_the_first_match() {
        let r = record(None, None);
        assert_eq!(r.header("h"), Some(&b"1"[..]));
        assert_eq!(r.header("x"), None);
    }

    #[cfg(feature = "json")]
    #[test]
    fn value_json_decodes_or_explains() {
        let r = record(None, Some(br#"{"a": 1}"#));
        let v: serde_json::Value = r.value_json().unwrap();
        assert_eq!(v["a"], 1);
        let r = record(None, Some(b"nope"));
        let error = r.value_json::<serde_json::Value>().unwrap_err();
        assert!(
            error
                .message()
                .starts_with("record value is not the expected JSON")
        );
    }

    #[test]
    fn config_looks_up_keys() {
        let config: Config = [("a", "1"), ("b", "2")].into_iter().collect();
        assert_eq!(config.get("b"), Some("2"));
        assert_eq!(config.get("c"), None);
        assert_eq!(config.len(), 2);
        assert!(Config::new().is_empty());
    }
}
