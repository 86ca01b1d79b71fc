//! Shared by the benchmark's two binaries (see bench/README.md):
//!
//! - `raw-pipe`: a consume-transform-produce loop over rdkafka with
//!   transactions and no Wasm and no state: the ceiling Onceflow is measured
//!   against;
//! - `bench-tool`: generates the input, waits for the outputs while
//!   measuring throughput, latency, CPU and RSS, and checks the enrich
//!   outputs.
//!
//! The transforms here do natively what `examples/wallet` (minus its state)
//! and `examples/enrich` do in Wasm, with the same validation messages, so the
//! raw loop writes the same number of records of the same size.

use serde_json::{Map, Value};

/// The dead-letter headers Onceflow writes (`host/src/task.rs`,
/// `dead_letter_headers`); `onceflow verify` matches dead letters by them.
pub mod dead_letter_headers {
    pub const ERROR: &str = "onceflow.error.message";
    pub const TOPIC: &str = "onceflow.error.topic";
    pub const PARTITION: &str = "onceflow.error.partition";
    pub const OFFSET: &str = "onceflow.error.offset";
    pub const PROCESSOR: &str = "onceflow.error.processor";
}

/// One record a transform wants written: to output number `output` (an index
/// into the loop's output topics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emit {
    pub output: usize,
    pub key: String,
    pub value: Vec<u8>,
}

/// Which transform the raw loop applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transform {
    /// The wallet without its state: per valid payment, an account record
    /// (output 0, keyed by account) and the payment unchanged (output 1,
    /// keyed by payment id).
    Wallet,
    /// The enrich example: positive orders get a region; amount >= 1000 to
    /// output 0 (large), otherwise output 1 (standard).
    Enrich,
}

impl Transform {
    /// The records for one input value, or the dead-letter message.
    pub fn apply(self, value: Option<&[u8]>) -> Result<Vec<Emit>, String> {
        match self {
            Transform::Wallet => wallet(value),
            Transform::Enrich => enrich(value),
        }
    }
}

fn parse_object(value: Option<&[u8]>, what: &str) -> Result<Map<String, Value>, String> {
    let value = value.ok_or_else(|| format!("invalid {what}: missing value"))?;
    match serde_json::from_slice::<Value>(value) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(format!("invalid {what}: not a JSON object")),
        Err(_) => Err(format!("invalid {what}: not valid JSON")),
    }
}

fn string_field(fields: &mut Map<String, Value>, name: &str, what: &str) -> Result<String, String> {
    match fields.remove(name) {
        None => Err(format!("invalid {what}: missing field \"{name}\"")),
        Some(Value::String(text)) => Ok(text),
        Some(_) => Err(format!("invalid {what}: field \"{name}\" must be a string")),
    }
}

fn int_field(fields: &Map<String, Value>, name: &str, what: &str) -> Result<i64, String> {
    match fields.get(name) {
        None => Err(format!("invalid {what}: missing field \"{name}\"")),
        Some(v) => v
            .as_i64()
            .ok_or_else(|| format!("invalid {what}: field \"{name}\" must be an integer")),
    }
}

fn json_string(text: &str) -> String {
    Value::from(text).to_string()
}

fn wallet(value: Option<&[u8]>) -> Result<Vec<Emit>, String> {
    let mut fields = parse_object(value, "payment")?;
    let payment_id = string_field(&mut fields, "payment_id", "payment")?;
    let account = string_field(&mut fields, "account", "payment")?;
    let amount = int_field(&fields, "amount", "payment")?;
    let report = format!(
        r#"{{"account":{},"amount":{},"payment_id":{}}}"#,
        json_string(&account),
        amount,
        json_string(&payment_id)
    );
    Ok(vec![
        Emit {
            output: 0,
            key: account,
            value: report.into_bytes(),
        },
        Emit {
            output: 1,
            key: payment_id,
            value: value.unwrap_or_default().to_vec(),
        },
    ])
}

/// The sales region of a country, as in examples/enrich.
pub fn region(country: &str) -> &'static str {
    match country {
        "DE" | "FR" | "IT" | "ES" | "NL" => "EU",
        "US" | "CA" | "MX" => "NA",
        "JP" | "CN" | "IN" | "AU" | "SG" => "APAC",
        _ => "OTHER",
    }
}

/// Orders of at least this amount go to the large output.
pub const LARGE: i64 = 1000;

fn enrich(value: Option<&[u8]>) -> Result<Vec<Emit>, String> {
    let mut fields = parse_object(value, "order")?;
    let order_id = string_field(&mut fields, "order_id", "order")?;
    let customer = string_field(&mut fields, "customer", "order")?;
    let amount = int_field(&fields, "amount", "order")?;
    let country = string_field(&mut fields, "country", "order")?;
    if amount <= 0 {
        return Ok(Vec::new());
    }
    let enriched = format!(
        r#"{{"order_id":{},"customer":{},"amount":{},"country":{},"region":"{}"}}"#,
        json_string(&order_id),
        json_string(&customer),
        amount,
        json_string(&country),
        region(&country)
    );
    Ok(vec![Emit {
        output: if amount >= LARGE { 0 } else { 1 },
        key: order_id,
        value: enriched.into_bytes(),
    }])
}

/// The benchmark's inputs: deterministic in the record number, so every
/// contender gets the same records and the checker can recompute them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Wallet payments over `ACCOUNTS` accounts, 1 in `INVALID_EVERY`
    /// malformed (`"amount":"N/A"`), like the tests' `Wallet` rig.
    Payments,
    /// Enrich orders; 1 in `INVALID_EVERY` malformed, about 5% with a
    /// non-positive amount (dropped), about a third large.
    Orders,
}

/// Accounts the payments spread over.
pub const ACCOUNTS: u64 = 1000;
/// Every this-many-th record is malformed.
pub const INVALID_EVERY: u64 = 100;

const COUNTRIES: [&str; 12] = [
    "DE", "FR", "US", "JP", "BR", "IN", "NL", "CA", "ZA", "SG", "MX", "GB",
];

/// A generated input record.
#[derive(Debug, Clone)]
pub struct Generated {
    pub key: String,
    pub value: String,
    /// Malformed: belongs in the dead-letter topic.
    pub invalid: bool,
    /// Orders: the output index it belongs in (None: dropped or invalid).
    pub output: Option<usize>,
    /// The record's id (payment_id / order_id).
    pub id: String,
}

fn mix(i: u64) -> u64 {
    // splitmix64: a good spread from consecutive numbers.
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Kind {
    /// Record number `i`.
    pub fn generate(self, i: u64) -> Generated {
        let r = mix(i);
        let invalid = i % INVALID_EVERY == INVALID_EVERY - 1;
        match self {
            Kind::Payments => {
                let account = format!("acct-{:04}", r % ACCOUNTS);
                let amount = ((r >> 20) % 1000) as i64 - 300;
                let id = format!("p{i}");
                let value = if invalid {
                    format!(r#"{{"payment_id":"{id}","account":"{account}","amount":"N/A"}}"#)
                } else {
                    format!(r#"{{"payment_id":"{id}","account":"{account}","amount":{amount}}}"#)
                };
                Generated {
                    key: account,
                    value,
                    invalid,
                    output: None,
                    id,
                }
            }
            Kind::Orders => {
                let id = format!("o{i}");
                let customer = format!("c{:05}", r % 20_000);
                let amount = ((r >> 24) % 3000) as i64 - 150;
                let country = COUNTRIES[((r >> 40) % COUNTRIES.len() as u64) as usize];
                let value = if invalid {
                    format!(
                        r#"{{"order_id":"{id}","customer":"{customer}","amount":"{amount}","country":"{country}"}}"#
                    )
                } else {
                    format!(
                        r#"{{"order_id":"{id}","customer":"{customer}","amount":{amount},"country":"{country}"}}"#
                    )
                };
                let output = match (invalid, amount) {
                    (true, _) => None,
                    (false, a) if a <= 0 => None,
                    (false, a) if a >= LARGE => Some(0),
                    _ => Some(1),
                };
                Generated {
                    key: id.clone(),
                    value,
                    invalid,
                    output,
                    id,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_records_go_through_the_transforms_as_announced() {
        for kind in [Kind::Payments, Kind::Orders] {
            let transform = match kind {
                Kind::Payments => Transform::Wallet,
                Kind::Orders => Transform::Enrich,
            };
            for i in 0..1000 {
                let g = kind.generate(i);
                match transform.apply(Some(g.value.as_bytes())) {
                    Err(message) => assert!(g.invalid, "{i}: {message}"),
                    Ok(emits) => {
                        assert!(!g.invalid, "{i}");
                        if kind == Kind::Orders {
                            assert_eq!(emits.first().map(|e| e.output), g.output, "{i}");
                        } else {
                            assert_eq!(emits.len(), 2);
                            assert_eq!(emits[1].key, g.id);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn enrich_matches_the_example() {
        let value = br#"{"country":"DE","amount":20,"customer":"c1","order_id":"o1"}"#;
        let emits = Transform::Enrich.apply(Some(value)).unwrap();
        assert_eq!(
            emits,
            vec![Emit {
                output: 1,
                key: "o1".into(),
                value:
                    br#"{"order_id":"o1","customer":"c1","amount":20,"country":"DE","region":"EU"}"#
                        .to_vec(),
            }]
        );
        assert_eq!(
            Transform::Enrich.apply(Some(b"{\"order_id\":\"o\"}")),
            Err("invalid order: missing field \"customer\"".into())
        );
    }
}
