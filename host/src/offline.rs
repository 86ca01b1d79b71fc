//! The offline runner (`onceflow test`): feeds a processor records from a
//! JSON Lines file with in-memory stores, as Kafka Streams'
//! TopologyTestDriver does for topologies. Same sandbox, same task logic
//! (batching, poison-record isolation, error policy) as the real host; no
//! Kafka.
//!
//! Input, one JSON object per line, processed in file order (a table's
//! records, by its topic, update its store where they stand):
//! `{"topic": "payments", "key": "a", "value": "{...}", "partition": 0,
//!   "headers": {"h": "v"}, "timestamp": 1700000000000}`
//! with `key_base64` / `value_base64` in place of `key` / `value` for binary
//! data; `key`/`value` may be `null`. Output, one line per record emitted,
//! in emit order: `{"topic", "key", "value"}` (`key_base64`/`value_base64`
//! when not UTF-8), `"headers"` when the record has any (as in the input; a
//! repeated header shows its last value), plus `"error"` on dead letters,
//! whose other `onceflow.error.*` headers (the source's position) are left out.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::manifest::Manifest;
use crate::sandbox::Processor;
use crate::schema::{
    Codecs, LocalSchemas, Parsed, SchemaFiles, SchemaKind, SchemaSource, SetupError, value_subject,
};
use crate::state::{MemoryPartition, window};
use crate::task::{BatchOutcome, Task, TaskConfig, TaskError, dead_letter_headers};
use crate::types::{Header, InputRecord, OutputRecord};

/// Why an input file was refused.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Reading failed.
    #[error("cannot read {file}")]
    Read {
        /// The input file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line is not a valid input record.
    #[error("{file}:{line}: {message}")]
    Line {
        /// The input file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InputLine {
    topic: String,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    key_base64: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    value_base64: Option<String>,
    #[serde(default)]
    partition: Option<i32>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    timestamp: Option<i64>,
}

/// Parses an input file. Records without a partition go to
/// `murmur2(key) % partitions`, as Kafka's default partitioner does (keyless
/// records to partition 0). Offsets count from 0 per topic and partition.
pub fn read_input(
    reader: impl BufRead,
    file: &str,
    manifest: &Manifest,
    partitions: i32,
) -> Result<Vec<InputRecord>, InputError> {
    read_input_as(reader, file, manifest, &|_| partitions, None)
}

/// The formats of an offline run: schemas from the schema files beside
/// the manifest, numbered from 1 (no registry). An Avro or Protobuf input's
/// `value` (JSON text) is written as its topic has it ([`InputWriter`]);
/// outputs are read back as JSON for people.
pub struct OfflineFormats {
    codecs: Arc<Codecs>,
    inputs: InputWriter,
}

impl OfflineFormats {
    /// The formats of `manifest`, or `None` when all its values are bytes.
    pub fn for_manifest(manifest: &Manifest) -> Result<Option<Self>, SetupError> {
        let files = SchemaFiles::read(manifest)?;
        let local = Arc::new(LocalSchemas::default());
        let inputs = InputWriter::new(manifest, &files, &*local)?;
        let source: Arc<dyn SchemaSource> = local;
        Ok(Codecs::for_manifest(manifest, &files, Some(source))?
            .map(|codecs| Self { codecs, inputs }))
    }

    /// How the input file's values are written.
    pub fn inputs(&self) -> &InputWriter {
        &self.inputs
    }

    /// An output as people read it: an encoded value as JSON again.
    pub fn readable(&self, record: &OutputRecord) -> OutputRecord {
        let mut r = record.clone();
        if let Some(v) = r.value.as_deref()
            && let Some(Ok(json)) = self.codecs.output_as_json(&r.topic, v)
        {
            r.value = Some(json);
        }
        r
    }
}

/// An input file's text values written as their topics hold them: for an
/// input of a registry format, with the input's schema (and Protobuf
/// `message`) in the registry's wire format, under the id `source` gives
/// the schema as `<topic>-value` (`onceflow test`: the files numbered from
/// 1; `onceflow produce`: the registry's, registering it if new). A
/// `value_base64` is taken as it is (the bytes on the topic: a poison
/// value, say).
pub struct InputWriter {
    /// topic -> (id, schema, the Protobuf message named).
    framed: BTreeMap<String, (u32, Arc<Parsed>, Option<String>)>,
}

impl InputWriter {
    /// The writer of `manifest`'s inputs, their schemas from `files`.
    pub fn new(
        manifest: &Manifest,
        files: &SchemaFiles,
        source: &dyn SchemaSource,
    ) -> Result<Self, SetupError> {
        let mut framed = BTreeMap::new();
        for (topic, f) in &manifest.input_formats {
            let Some(kind) = SchemaKind::of(f.format) else {
                continue;
            };
            let key = format!("inputs.{topic}");
            let Some(path) = &f.schema else {
                return Err(SetupError::Schema {
                    path: manifest.path.clone(),
                    key,
                    message: format!(
                        "the input file's JSON values are written as {} with the input's \
                         schema: give it one (schema = \"schemas/<name>\")",
                        f.format.name()
                    ),
                });
            };
            let text = files.0.get(&path.to_string_lossy().replace('\\', "/"));
            let text = text.map(String::as_str).unwrap_or_default();
            let schema = Parsed::parse(kind, text).map_err(|message| SetupError::Schema {
                path: path.clone(),
                key: key.clone(),
                message,
            })?;
            let id = source.id_of(&value_subject(topic), text, kind)?;
            framed.insert(topic.clone(), (id, Arc::new(schema), f.message.clone()));
        }
        Ok(Self { framed })
    }

    /// The schema id values of `topic` are written under, if framed.
    pub fn schema_id(&self, topic: &str) -> Option<u32> {
        self.framed.get(topic).map(|(id, _, _)| *id)
    }

    /// An input line's text value as its topic holds it.
    fn encode(&self, topic: &str, json: &[u8]) -> Result<Vec<u8>, String> {
        match self.framed.get(topic).map(|(id, s, m)| (id, &**s, m)) {
            Some((id, Parsed::Avro(schema), _)) => schema
                .encode(json)
                .map(|datum| crate::schema::frame(*id, &datum)),
            Some((id, Parsed::Json(schema), _)) => serde_json::from_slice(json)
                .map_err(|e| format!("the value is not JSON: {e}"))
                .and_then(|v| schema.check(&v))
                .map(|()| crate::schema::frame(*id, json)),
            Some((id, Parsed::Protobuf(schema), message)) => schema
                .message(message.as_deref())
                .and_then(|m| schema.encode(&m, json))
                .map(|framed| crate::schema::frame(*id, &framed)),
            None => Ok(json.to_vec()),
        }
    }
}

/// [`read_input`], each text value written in its topic's format.
pub fn read_input_as(
    reader: impl BufRead,
    file: &str,
    manifest: &Manifest,
    partitions: &dyn Fn(&str) -> i32,
    formats: Option<&InputWriter>,
) -> Result<Vec<InputRecord>, InputError> {
    let mut records = Vec::new();
    let mut offsets: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for (n, line) in reader.lines().enumerate() {
        let line_no = n + 1;
        let line = line.map_err(|source| InputError::Read {
            file: file.to_owned(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| InputError::Line {
            file: file.to_owned(),
            line: line_no,
            message,
        };
        let parsed: InputLine = serde_json::from_str(&line).map_err(|e| {
            bad(format!(
                "{e}; expected {{\"topic\", \"key\", \"value\", \"partition\"?, \"headers\"?, \"timestamp\"?}}"
            ))
        })?;
        if !manifest.sources().contains(&parsed.topic.as_str()) {
            return Err(bad(format!(
                "topic {:?} is not an input or a table of {} (inputs and tables: {})",
                parsed.topic,
                manifest.name,
                manifest.sources().join(", ")
            )));
        }
        let key = bytes_field("key", parsed.key, parsed.key_base64).map_err(&bad)?;
        let as_text = parsed.value.is_some();
        let mut value = bytes_field("value", parsed.value, parsed.value_base64).map_err(&bad)?;
        if let (Some(formats), Some(v), true) = (formats, value.as_deref(), as_text) {
            value = Some(formats.encode(&parsed.topic, v).map_err(|e| {
                bad(format!(
                    "the value does not fit topic {}'s schema: {e} (give a poison value as \
                     value_base64: it is taken as it is)",
                    parsed.topic
                ))
            })?);
        }
        let partitions = partitions(&parsed.topic);
        let partition = match parsed.partition {
            Some(p) if p < 0 || p >= partitions => {
                return Err(bad(format!(
                    "partition {p} is out of range: topic {} has {partitions} partitions",
                    parsed.topic
                )));
            }
            Some(p) => p,
            None => key.as_deref().map_or(0, |k| kafka_partition(k, partitions)),
        };
        let offset = offsets
            .entry((parsed.topic.clone(), partition))
            .or_insert(0);
        records.push(InputRecord {
            topic: parsed.topic.into(),
            partition,
            offset: *offset,
            timestamp: parsed.timestamp.unwrap_or(0),
            key,
            value,
            headers: parsed
                .headers
                .into_iter()
                .map(|(key, v)| Header {
                    key,
                    value: v.into_bytes(),
                })
                .collect(),
        });
        *offset += 1;
    }
    Ok(records)
}

fn bytes_field(
    name: &str,
    text: Option<String>,
    base64: Option<String>,
) -> Result<Option<Vec<u8>>, String> {
    match (text, base64) {
        (Some(_), Some(_)) => Err(format!("give either {name} or {name}_base64, not both")),
        (Some(t), None) => Ok(Some(t.into_bytes())),
        (None, Some(b)) => BASE64
            .decode(b.as_bytes())
            .map(Some)
            .map_err(|e| format!("{name}_base64 is not valid base64: {e}")),
        (None, None) => Ok(None),
    }
}

/// Kafka's default partitioner for keyed records: murmur2, sign bit
/// cleared, modulo the partition count (Java client `Utils.murmur2`).
pub fn kafka_partition(key: &[u8], partitions: i32) -> i32 {
    ((murmur2(key) & 0x7fff_ffff) % partitions.max(1) as u32) as i32
}

/// Kafka's murmur2 (seed 0x9747b28c).
pub fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = 0x9747_b28c ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// One output line.
#[derive(Serialize)]
struct OutputLine<'a> {
    topic: &'a str,
    #[serde(flatten)]
    key: BytesField<'a>,
    #[serde(flatten)]
    value: BytesField<'a>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<&'a str, std::borrow::Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// A key or value: UTF-8 text as `name`, anything else as `name_base64`.
struct BytesField<'a> {
    name: &'static str,
    bytes: Option<&'a [u8]>,
}

impl Serialize for BytesField<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        match self.bytes {
            None => map.serialize_entry(self.name, &())?,
            Some(b) => match std::str::from_utf8(b) {
                Ok(text) => map.serialize_entry(self.name, text)?,
                Err(_) => {
                    map.serialize_entry(&format!("{}_base64", self.name), &BASE64.encode(b))?
                }
            },
        }
        map.end()
    }
}

/// Writes an output record as one JSON line.
pub fn write_output(
    out: &mut impl Write,
    record: &OutputRecord,
    dead_letter_topic: Option<&str>,
) -> std::io::Result<()> {
    let error = if Some(&*record.topic) == dead_letter_topic {
        record
            .headers
            .iter()
            .find(|h| h.key == dead_letter_headers::ERROR)
            .map(|h| String::from_utf8_lossy(&h.value).into_owned())
    } else {
        None
    };
    let headers = record
        .headers
        .iter()
        .filter(|h| error.is_none() || !h.key.starts_with(dead_letter_headers::PREFIX))
        .map(|h| (h.key.as_str(), String::from_utf8_lossy(&h.value)))
        .collect();
    let line = OutputLine {
        topic: &record.topic,
        key: BytesField {
            name: "key",
            bytes: record.key.as_deref(),
        },
        value: BytesField {
            name: "value",
            bytes: record.value.as_deref(),
        },
        headers,
        error,
    };
    serde_json::to_writer(&mut *out, &line)?;
    out.write_all(b"\n")
}

/// Settings of an offline run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Most records per `process` call.
    pub batch_size: usize,
}

/// Totals of an offline run.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunSummary {
    /// Input records.
    pub records: u64,
    /// Output records (dead letters included).
    pub outputs: u64,
    /// Dead-lettered records.
    pub dead_lettered: u64,
    /// Skipped records.
    pub skipped: u64,
    /// `process` calls.
    pub calls: u64,
    /// Late records dropped.
    pub late_dropped: u64,
    /// `punctuate` calls.
    pub punctuations: u64,
}

/// The offline runner's tasks, one per input partition seen.
pub struct OfflineRunner {
    processor: Processor,
    config: TaskConfig,
    tasks: BTreeMap<i32, Task>,
}

impl OfflineRunner {
    /// A runner for a loaded processor and its manifest.
    pub fn new(processor: Processor, manifest: &Manifest) -> Self {
        Self::with_formats(processor, manifest, None)
    }

    /// The same, with the manifest's formats ([`OfflineFormats`]).
    pub fn with_formats(
        processor: Processor,
        manifest: &Manifest,
        formats: Option<&OfflineFormats>,
    ) -> Self {
        Self {
            processor,
            config: TaskConfig::from_manifest(manifest)
                .with_codecs(formats.map(|f| f.codecs.clone())),
            tasks: BTreeMap::new(),
        }
    }

    fn task(&mut self, partition: i32) -> &mut Task {
        let (processor, config) = (&self.processor, &self.config);
        self.tasks.entry(partition).or_insert_with(|| {
            Task::new(
                partition,
                processor.clone(),
                config.clone(),
                Box::new(MemoryPartition::default()),
            )
        })
    }

    /// Processes records in input order, in batches of consecutive records
    /// of one partition, handing each batch's outputs to `sink`. Every batch
    /// "commits" as soon as it is processed. Stops at the first record that
    /// fails under the `fail` policy.
    pub fn run(
        &mut self,
        records: &[InputRecord],
        options: &RunOptions,
        mut sink: impl FnMut(&OutputRecord) -> std::io::Result<()>,
    ) -> Result<RunSummary, RunError> {
        let mut summary = RunSummary::default();
        let batch_size = options.batch_size.max(1);
        let mut start = 0;
        while start < records.len() {
            let partition = records[start].partition;
            let mut end = start + 1;
            while end < records.len()
                && end - start < batch_size
                && records[end].partition == partition
            {
                end += 1;
            }
            let batch = &records[start..end];
            let task = self.task(partition);
            let mut outcome = BatchOutcome::default();
            if let Err(e) = task.process_batch(batch, &mut outcome) {
                // Unlike a transaction, show what the records before the
                // failing one produced, as TopologyTestDriver does.
                task.abort();
                for o in &outcome.outputs {
                    sink(o).map_err(RunError::Output)?;
                }
                return Err(RunError::Task(e));
            }
            task.apply_committed(Vec::new(), None)?;
            // What replay needs is in Kafka's topics, not here.
            task.take_replay();
            summary.records += batch.len() as u64;
            summary.outputs += outcome.outputs.len() as u64;
            summary.dead_lettered += outcome.dead_lettered;
            summary.skipped += outcome.skipped;
            summary.calls += outcome.calls;
            summary.late_dropped += outcome.late_dropped;
            summary.punctuations += outcome.punctuations;
            for o in &outcome.outputs {
                sink(o).map_err(RunError::Output)?;
            }
            start = end;
        }
        Ok(summary)
    }

    /// Every partition's stores, one [`StateEntry`] per key (per window
    /// in a window store).
    pub fn dump_state(&self) -> Result<Vec<StateEntry>, RunError> {
        let mut out = Vec::new();
        for (partition, task) in &self.tasks {
            out.extend(state_entries(
                *partition,
                task.dump_state()?,
                &self.config.window_stores,
            ));
        }
        Ok(out)
    }
}

/// A task's stores (`Task::dump_state`) as [`StateEntry`]s, a window
/// store's keys split into key and window start.
pub fn state_entries(
    partition: i32,
    stores: Vec<(String, Vec<crate::types::Entry>)>,
    window_stores: &[(String, u64)],
) -> Vec<StateEntry> {
    let mut out = Vec::new();
    for (store, entries) in stores {
        let windowed = window_stores.iter().any(|(w, _)| *w == store);
        for (key, value) in entries {
            let (key, start) = split_window(windowed, key);
            out.push(StateEntry {
                partition,
                store: store.clone(),
                key,
                start,
                value,
            });
        }
    }
    out
}

/// A window store's key as (key, window start); any other's as it is.
fn split_window(windowed: bool, key: Vec<u8>) -> (Vec<u8>, Option<i64>) {
    match windowed.then(|| window::decode(&key)).flatten() {
        Some(w) => (w.key, Some(w.start)),
        None => (key, None),
    }
}

/// Why an offline run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Processing stopped.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// Writing the outputs failed.
    #[error("cannot write the output")]
    Output(#[source] std::io::Error),
}

/// One entry of a store, for `--dump-state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    /// The task's partition.
    pub partition: i32,
    /// The store.
    pub store: String,
    /// The key.
    pub key: Vec<u8>,
    /// In a window store: the window's start (ms).
    pub start: Option<i64>,
    /// The value.
    pub value: Vec<u8>,
}

/// One `--dump-state` line: `{"store", "partition", "key", "start"?,
/// "value"}` (`start` for a window store's windows).
pub fn write_state_entry(out: &mut impl Write, entry: &StateEntry) -> std::io::Result<()> {
    write_state_line(
        out,
        &entry.store,
        entry.partition,
        &entry.key,
        entry.start,
        Some(&entry.value),
    )
}

/// One state change, as a `--dump-state` line; a delete has `"value":
/// null`. A window store's key is split as there (`windowed`).
pub fn write_state_change(
    out: &mut impl Write,
    store: &str,
    partition: i32,
    windowed: bool,
    (key, value): &(Vec<u8>, Option<Vec<u8>>),
) -> std::io::Result<()> {
    let (key, start) = split_window(windowed, key.clone());
    write_state_line(out, store, partition, &key, start, value.as_deref())
}

fn write_state_line(
    out: &mut impl Write,
    store: &str,
    partition: i32,
    key: &[u8],
    start: Option<i64>,
    value: Option<&[u8]>,
) -> std::io::Result<()> {
    #[derive(Serialize)]
    struct StateLine<'a> {
        store: &'a str,
        partition: i32,
        #[serde(flatten)]
        key: BytesField<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        start: Option<i64>,
        #[serde(flatten)]
        value: BytesField<'a>,
    }
    serde_json::to_writer(
        &mut *out,
        &StateLine {
            store,
            partition,
            key: BytesField {
                name: "key",
                bytes: Some(key),
            },
            start,
            value: BytesField {
                name: "value",
                bytes: value,
            },
        },
    )?;
    out.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn manifest() -> Manifest {
        Manifest::parse(
            "name = \"w\"\ntenant = \"t\"\ninputs = [\"in\"]\n[build]\nlanguage = \"rust\"\n",
            PathBuf::from("m/onceflow.toml"),
        )
        .unwrap()
    }

    #[test]
    fn murmur2_matches_the_java_client() {
        // Values from Kafka's UtilsTest / DefaultPartitionerTest.
        assert_eq!(murmur2(b"21") as i32, -973932308);
        assert_eq!(murmur2(b"foobar") as i32, -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string") as i32, -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string") as i32, -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") as i32,
            -58897971
        );
        assert_eq!(murmur2(b"abc") as i32, 479470107);
    }

    #[test]
    fn input_lines_parse_with_offsets_and_partitions() {
        let text = r#"{"topic":"in","key":"a","value":"1"}
{"topic":"in","key":"b","value_base64":"AAE=","partition":1,"headers":{"h":"v"},"timestamp":5}

{"topic":"in","key":null,"value":null,"partition":1}"#;
        let recs = read_input(text.as_bytes(), "f", &manifest(), 2).unwrap();
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[0].partition, kafka_partition(b"a", 2));
        assert_eq!((recs[1].partition, recs[1].offset), (1, 0));
        assert_eq!((recs[2].partition, recs[2].offset), (1, 1));
        assert_eq!(recs[1].value.as_deref(), Some(&[0u8, 1][..]));
        assert_eq!(recs[1].headers[0].key, "h");
        assert_eq!(recs[1].timestamp, 5);
        assert_eq!(recs[2].key, None);
    }

    #[test]
    fn bad_lines_name_file_and_line() {
        let cases = [
            (r#"{"topic":"other","value":"x"}"#, "not an input"),
            (r#"{"topic":"in","valu":"x"}"#, "unknown field"),
            (
                r#"{"topic":"in","value":"x","value_base64":"eA=="}"#,
                "not both",
            ),
            (r#"{"topic":"in","value_base64":"%%"}"#, "not valid base64"),
            (r#"{"topic":"in","partition":7}"#, "out of range"),
            ("not json", "expected"),
        ];
        for (line, needle) in cases {
            let text = format!("{{\"topic\":\"in\"}}\n{line}");
            let err = read_input(text.as_bytes(), "in.jsonl", &manifest(), 2)
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("in.jsonl:2: "), "{err}");
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
    }

    #[test]
    fn output_lines_use_text_or_base64() {
        let mut buf = Vec::new();
        let rec = OutputRecord {
            topic: "t".into(),
            key: Some(b"k".to_vec()),
            value: Some(vec![0xff, 0x00]),
            headers: vec![],
            timestamp: None,
        };
        write_output(&mut buf, &rec, None).unwrap();
        let none = OutputRecord {
            topic: "dlq".into(),
            key: None,
            value: Some(b"v".to_vec()),
            headers: vec![Header {
                key: dead_letter_headers::ERROR.into(),
                value: b"bad".to_vec(),
            }],
            timestamp: None,
        };
        write_output(&mut buf, &none, Some("dlq")).unwrap();
        // Headers show (before: never), the host's dead-letter position
        // headers do not; the guest's own on a dead letter do.
        let with_headers = OutputRecord {
            topic: "t".into(),
            key: None,
            value: None,
            headers: vec![Header {
                key: "trace".into(),
                value: b"abc".to_vec(),
            }],
            timestamp: None,
        };
        write_output(&mut buf, &with_headers, None).unwrap();
        let mut dead = none.clone();
        dead.headers.push(Header {
            key: dead_letter_headers::OFFSET.into(),
            value: b"7".to_vec(),
        });
        dead.headers.push(Header {
            key: "trace".into(),
            value: b"abc".to_vec(),
        });
        write_output(&mut buf, &dead, Some("dlq")).unwrap();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "{\"topic\":\"t\",\"key\":\"k\",\"value_base64\":\"/wA=\"}\n\
             {\"topic\":\"dlq\",\"key\":null,\"value\":\"v\",\"error\":\"bad\"}\n\
             {\"topic\":\"t\",\"key\":null,\"value\":null,\"headers\":{\"trace\":\"abc\"}}\n\
             {\"topic\":\"dlq\",\"key\":null,\"value\":\"v\",\"headers\":{\"trace\":\"abc\"},\"error\":\"bad\"}\n"
        );
    }
}
