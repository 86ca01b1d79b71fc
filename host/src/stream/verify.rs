//! `onceflow verify`: an independent check of a pipeline's outputs against
//! its input, reading only committed data (the seeds' verification stream).
//!
//! The input is a topic of JSON records, each with a unique id, a grouping
//! key and an integer amount (`--id`, `--key`, `--sum`). From it alone the
//! checker computes what exactly-once processing must have produced, and
//! compares:
//!
//! - `--echo T`: every valid input's id appears exactly once as a key of T
//!   (gaps and duplicates reported);
//! - `--totals T`: per key, the values of `--total-field` in T, in order,
//!   are exactly the running sums of the key's valid inputs in input order,
//!   ending at the key's total;
//! - `--dead-letter T`: every invalid input appears exactly once in T
//!   (matched by the `onceflow.error.*` coordinates headers);
//! - every topic read: no open transaction (last stable offset behind the
//!   high watermark).
//!
//! It knows nothing of the processor: point it at any pipeline with that
//! shape.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use rdkafka::consumer::BaseConsumer;
use serde::Serialize;

use crate::kafka::{self, Connection, KafkaError};
use crate::task::dead_letter_headers;

/// What to check.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// The cluster, and `-X` properties.
    pub kafka: Connection,
    /// The input topic.
    pub input: String,
    /// JSON field with the record's unique id.
    pub id_field: String,
    /// JSON field with the grouping key.
    pub key_field: String,
    /// JSON field with the integer amount.
    pub sum_field: String,
    /// Topic keyed by input id, one record per valid input.
    pub echo: Option<String>,
    /// Topic keyed by group key with running totals.
    pub totals: Option<String>,
    /// JSON field of the running total in `totals`.
    pub total_field: String,
    /// Dead-letter topic for invalid inputs.
    pub dead_letter: Option<String>,
    /// Read uncommitted data too (to show what exactly-once hides).
    pub read_uncommitted: bool,
    /// Longest the reads may take.
    pub timeout: Duration,
    /// Values in the schema registry's wire format are read as JSON with
    /// their schema from here (`None`: as they are).
    pub schema_registry: Option<std::sync::Arc<crate::schema::Registry>>,
}

/// The outcome; `findings` empty means the pipeline is exact.
#[derive(Debug, Default, Clone, Serialize)]
pub struct VerifyReport {
    /// Input records read.
    pub inputs: u64,
    /// Inputs with a valid id, key and integer amount.
    pub valid: u64,
    /// The others.
    pub invalid: u64,
    /// Echo records read.
    pub echo_records: u64,
    /// Valid ids missing from the echo topic.
    pub missing: u64,
    /// Extra copies of ids in the echo topic.
    pub duplicates: u64,
    /// Echo keys that match no valid input.
    pub unexpected: u64,
    /// Totals records read.
    pub totals_records: u64,
    /// Keys whose totals sequence is not exactly the running sums.
    pub keys_wrong: u64,
    /// Keys checked.
    pub keys: u64,
    /// Dead letters read.
    pub dead_letters: u64,
    /// Per key, the final total computed from the input.
    #[serde(skip)]
    pub key_totals: BTreeMap<String, i64>,
    /// Everything wrong, for people (the first few of each kind).
    pub findings: Vec<String>,
}

impl VerifyReport {
    /// Whether nothing is wrong.
    pub fn is_exact(&self) -> bool {
        self.findings.is_empty()
    }
}

/// One consumed record.
struct Rec {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
}

/// Most examples listed per kind of finding.
const EXAMPLES: usize = 10;

/// Runs the checks.
pub fn verify(o: &VerifyOptions) -> Result<VerifyReport, KafkaError> {
    let mut report = VerifyReport::default();
    let deadline = Instant::now() + o.timeout;

    let topics: Vec<&String> = std::iter::once(&o.input)
        .chain(o.echo.iter())
        .chain(o.totals.iter())
        .chain(o.dead_letter.iter())
        .collect();
    for t in &topics {
        for (p, lso, hw) in open_transactions(o, t)? {
            report.findings.push(format!(
                "open transaction: {t}/{p}: last stable offset {lso} is behind the high watermark {hw}"
            ));
        }
    }

    // The input, and what it implies.
    let inputs = read_all(o, &o.input, deadline)?;
    report.inputs = inputs.len() as u64;
    let mut valid_ids: HashMap<String, ()> = HashMap::new();
    let mut expected_totals: HashMap<String, Vec<i64>> = HashMap::new();
    let mut invalid: HashMap<(i32, i64), u32> = HashMap::new();
    for r in &inputs {
        match parse_input(r.value.as_deref(), o) {
            Some((id, key, amount)) => {
                report.valid += 1;
                valid_ids.insert(id, ());
                let seq = expected_totals.entry(key).or_default();
                let last = seq.last().copied().unwrap_or(0);
                seq.push(last.saturating_add(amount));
            }
            None => {
                report.invalid += 1;
                invalid.insert((r.partition, r.offset), 0);
            }
        }
    }
    report.keys = expected_totals.len() as u64;
    report.key_totals = expected_totals
        .iter()
        .map(|(k, v)| (k.clone(), v.last().copied().unwrap_or(0)))
        .collect();

    if let Some(echo) = &o.echo {
        check_echo(o, echo, deadline, &valid_ids, &mut report)?;
    }
    if let Some(totals) = &o.totals {
        check_totals(o, totals, deadline, &expected_totals, &mut report)?;
    }
    if let Some(dlq) = &o.dead_letter {
        check_dead_letters(o, dlq, deadline, invalid, &mut report)?;
    }
    Ok(report)
}

/// The echo topic against the valid inputs: each once.
fn check_echo(
    o: &VerifyOptions,
    echo: &str,
    deadline: Instant,
    valid_ids: &HashMap<String, ()>,
    report: &mut VerifyReport,
) -> Result<(), KafkaError> {
    let records = read_all(o, echo, deadline)?;
    report.echo_records = records.len() as u64;
    let mut seen: HashMap<String, u64> = HashMap::new();
    for r in &records {
        let id = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned();
        *seen.entry(id).or_insert(0) += 1;
    }
    let mut missing = Vec::new();
    for id in valid_ids.keys() {
        match seen.get(id) {
            None => {
                report.missing += 1;
                missing.push(id.clone());
            }
            Some(&n) if n > 1 => report.duplicates += n - 1,
            _ => {}
        }
    }
    report.unexpected = seen
        .keys()
        .filter(|id| !valid_ids.contains_key(*id))
        .count() as u64;
    if report.missing > 0 {
        missing.sort();
        missing.truncate(EXAMPLES);
        report.findings.push(format!(
            "{echo}: {} valid inputs missing (gap), e.g. {missing:?}",
            report.missing
        ));
    }
    if report.duplicates > 0 {
        let mut dups: Vec<_> = seen
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, n)| format!("{id} x{n}"))
            .collect();
        dups.sort();
        dups.truncate(EXAMPLES);
        report.findings.push(format!(
            "{echo}: {} duplicate records, e.g. {dups:?}",
            report.duplicates
        ));
    }
    if report.unexpected > 0 {
        report.findings.push(format!(
            "{echo}: {} keys match no valid input",
            report.unexpected
        ));
    }
    Ok(())
}

/// The totals topic against the running sums of the valid inputs per key.
fn check_totals(
    o: &VerifyOptions,
    totals: &str,
    deadline: Instant,
    expected_totals: &HashMap<String, Vec<i64>>,
    report: &mut VerifyReport,
) -> Result<(), KafkaError> {
    let records = read_all(o, totals, deadline)?;
    report.totals_records = records.len() as u64;
    let mut observed: HashMap<String, Vec<Option<i64>>> = HashMap::new();
    for r in &records {
        let key = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned();
        let total = r
            .value
            .as_deref()
            .and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
            .and_then(|v| v.get(&o.total_field).and_then(serde_json::Value::as_i64));
        observed.entry(key).or_default().push(total);
    }
    let mut examples = Vec::new();
    for (key, expected) in expected_totals {
        let got = observed.remove(key).unwrap_or_default();
        let exact =
            got.len() == expected.len() && got.iter().zip(expected).all(|(g, e)| *g == Some(*e));
        if !exact {
            report.keys_wrong += 1;
            if examples.len() < EXAMPLES {
                examples.push(describe_divergence(key, expected, &got));
            }
        }
    }
    for (key, got) in observed {
        report.keys_wrong += 1;
        if examples.len() < EXAMPLES {
            examples.push(format!(
                "{key}: {} totals for a key with no valid input",
                got.len()
            ));
        }
    }
    if report.keys_wrong > 0 {
        report.findings.push(format!(
            "{totals}: {} keys whose totals are not exactly the running sums: {}",
            report.keys_wrong,
            examples.join("; ")
        ));
    }
    Ok(())
}

/// The dead-letter topic against the invalid inputs (by partition and
/// offset): each once.
fn check_dead_letters(
    o: &VerifyOptions,
    dlq: &str,
    deadline: Instant,
    mut invalid: HashMap<(i32, i64), u32>,
    report: &mut VerifyReport,
) -> Result<(), KafkaError> {
    let records = read_all(o, dlq, deadline)?;
    report.dead_letters = records.len() as u64;
    let mut foreign = 0u64;
    for r in &records {
        let header = |name: &str| {
            r.headers
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
        };
        let topic_ok = r
            .headers
            .iter()
            .any(|(k, v)| k == dead_letter_headers::TOPIC && v.as_slice() == o.input.as_bytes());
        match (
            topic_ok,
            header(dead_letter_headers::PARTITION),
            header(dead_letter_headers::OFFSET),
        ) {
            (true, Some(p), Some(off)) => match invalid.get_mut(&(p as i32, off)) {
                Some(n) => *n += 1,
                None => foreign += 1,
            },
            _ => foreign += 1,
        }
    }
    let missing = invalid.values().filter(|n| **n == 0).count();
    let dups: u32 = invalid.values().filter(|n| **n > 1).map(|n| n - 1).sum();
    if missing > 0 {
        report.findings.push(format!(
            "{dlq}: {missing} invalid inputs were not dead-lettered"
        ));
    }
    if dups > 0 {
        report
            .findings
            .push(format!("{dlq}: {dups} duplicate dead letters"));
    }
    if foreign > 0 {
        report.findings.push(format!(
            "{dlq}: {foreign} dead letters match no invalid input"
        ));
    }
    Ok(())
}

fn describe_divergence(key: &str, expected: &[i64], got: &[Option<i64>]) -> String {
    let first = expected
        .iter()
        .zip(got)
        .position(|(e, g)| Some(*e) != *g)
        .unwrap_or(expected.len().min(got.len()));
    let kind = if got.len() > expected.len() {
        "duplicates"
    } else if got.len() < expected.len() {
        "gap"
    } else {
        "wrong values"
    };
    format!(
        "{key}: {kind}: {} totals for {} inputs, first difference at #{first} (expected {:?}, got {:?})",
        got.len(),
        expected.len(),
        expected.get(first),
        got.get(first).copied().flatten()
    )
}

/// Parses an input value; `None` if it lacks a string id, a string key or
/// an integer amount.
fn parse_input(value: Option<&[u8]>, o: &VerifyOptions) -> Option<(String, String, i64)> {
    let v: serde_json::Value = serde_json::from_slice(value?).ok()?;
    let id = v.get(&o.id_field)?.as_str()?.to_owned();
    let key = v.get(&o.key_field)?.as_str()?.to_owned();
    let amount = v.get(&o.sum_field)?.as_i64()?;
    Some((id, key, amount))
}

type Client = BaseConsumer<kafka::QuietContext>;

/// A reader. It never joins its group, but librdkafka's `assign` needs one
/// and looks up its coordinator, which brokers that enforce ACLs allow only
/// a principal that may describe the group: named after the input topic, it
/// falls under the tenant's group prefix as the topic does under its topic
/// prefix (`-X group.id=...` still wins).
fn client(o: &VerifyOptions, isolation: &str) -> Result<Client, KafkaError> {
    o.kafka.reader(
        &format!("{}.onceflow-verify", o.input),
        isolation,
        10,
        kafka::QuietContext::default(),
    )
}

fn partitions(consumer: &Client, topic: &str) -> Result<Vec<i32>, KafkaError> {
    kafka::partitions(consumer, topic)?.ok_or_else(|| KafkaError::topic(topic, "does not exist"))
}

/// Partitions whose last stable offset is behind the high watermark.
fn open_transactions(o: &VerifyOptions, topic: &str) -> Result<Vec<(i32, i64, i64)>, KafkaError> {
    let committed = client(o, "read_committed")?;
    let uncommitted = client(o, "read_uncommitted")?;
    let mut open = Vec::new();
    for p in partitions(&committed, topic)? {
        let (_, lso) = kafka::watermarks(&committed, topic, p)?;
        let (_, hw) = kafka::watermarks(&uncommitted, topic, p)?;
        if lso < hw {
            open.push((p, lso, hw));
        }
    }
    Ok(open)
}

/// Every record of a topic, partition by partition in offset order, up to
/// the end as of now.
fn read_all(o: &VerifyOptions, topic: &str, deadline: Instant) -> Result<Vec<Rec>, KafkaError> {
    let isolation = if o.read_uncommitted {
        "read_uncommitted"
    } else {
        "read_committed"
    };
    let consumer = client(o, isolation)?;
    let mut assigned = Vec::new();
    for p in partitions(&consumer, topic)? {
        let (low, high) = kafka::watermarks(&consumer, topic, p)?;
        if high > low {
            assigned.push((topic, p, Some(low)));
        }
    }
    let mut out = Vec::new();
    if assigned.is_empty() {
        return Ok(out);
    }
    let codec = o.schema_registry.as_ref().map(|r| {
        (
            crate::schema::registry::RegistrySource::new(r.clone(), None),
            std::cell::RefCell::new(HashMap::new()),
        )
    });
    kafka::assign(&consumer, &assigned)?;
    kafka::read_to_end(&consumer, assigned.len(), topic, deadline, |m| {
        out.push(Rec {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(|v| match &codec {
                Some((source, seen)) => as_json(source, &mut seen.borrow_mut(), v),
                None => v.to_vec(),
            }),
            headers: m.headers(),
        });
        ControlFlow::Continue(())
    })?;
    Ok(out)
}

/// A value in the schema registry's wire format as JSON, or as it is (a
/// value that does not decode is then what it is: not the expected JSON).
fn as_json(
    source: &crate::schema::registry::RegistrySource,
    seen: &mut HashMap<u32, Option<std::sync::Arc<crate::schema::Parsed>>>,
    value: &[u8],
) -> Vec<u8> {
    use crate::schema::SchemaSource;
    let Ok((id, datum)) = crate::schema::unframe(value) else {
        return value.to_vec();
    };
    let schema = seen
        .entry(id)
        .or_insert_with(|| source.schema(id).ok())
        .clone();
    schema
        .and_then(|s| s.payload_to_json(datum).ok())
        .unwrap_or_else(|| value.to_vec())
}
