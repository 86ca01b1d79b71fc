//! Shared by the benchmark's two binaries (see bench/README.md):
//!
//! - `raw-pipe`: a consume-transform-produce loop over rdkafka with
//!   transactions and no Wasm: the ceiling Onceflow is measured against
//!   (the wallet's balances kept in a map, with a changelog topic);
//! - `bench-tool`: generates the input, waits for the outputs while
//!   measuring throughput, latency, CPU and RSS, and checks the enrich
//!   outputs.
//!
//! The transforms here do natively what `examples/wallet` and
//! `examples/enrich` do in Wasm, with the same validation messages, so the
//! raw loop writes the same records ([`Balances`]: the wallet's, balances and
//! changelog included).

use std::collections::HashMap;

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

/// A payment's fields, checked in the order `examples/wallet` checks them.
fn payment(value: Option<&[u8]>) -> Result<(String, String, i64), String> {
    let mut fields = parse_object(value, "payment")?;
    let payment_id = string_field(&mut fields, "payment_id", "payment")?;
    let account = string_field(&mut fields, "account", "payment")?;
    let amount = int_field(&fields, "amount", "payment")?;
    Ok((payment_id, account, amount))
}

fn wallet(value: Option<&[u8]>) -> Result<Vec<Emit>, String> {
    let (payment_id, account, amount) = payment(value)?;
    Ok(wallet_records(payment_id, account, "amount", amount, value))
}

/// A wallet's two records for a payment: the account's report (output 0,
/// `{"account":…,"<field>":<figure>,"payment_id":…}`) and the payment
/// unchanged (output 1).
fn wallet_records(
    payment_id: String,
    account: String,
    field: &str,
    figure: i64,
    value: Option<&[u8]>,
) -> Vec<Emit> {
    let report = format!(
        r#"{{"account":{},"{field}":{figure},"payment_id":{}}}"#,
        json_string(&account),
        json_string(&payment_id)
    );
    vec![
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
    ]
}

/// The wallet with its state, as `examples/wallet` (raw-pipe's
/// `--changelog`): a balance per account in a map; per valid payment the
/// balance report (output 0, the example's exact bytes) and the payment
/// unchanged (output 1); at commit, the new balance of every account changed
/// since the last one ([`Balances::changelog`]: decimal text, as the SDK's
/// `put_i64` writes it), as Onceflow writes a store's changelog (one record
/// per dirty key, at commit, on the task's partition) and as Kafka Streams'
/// cached stores do.
///
/// The map lives in memory only: the loop never aborts a transaction or
/// takes over partitions (one instance per group), so it never has to
/// restore it.
#[derive(Debug, Default)]
pub struct Balances {
    accounts: HashMap<String, i64>,
    /// The accounts changed since the last [`Balances::changelog`], with the
    /// input partition their payments came from.
    dirty: HashMap<String, i32>,
}

impl Balances {
    /// The records for one payment read from input partition `partition`, or
    /// the dead-letter message (nothing changes then).
    pub fn pay(&mut self, value: Option<&[u8]>, partition: i32) -> Result<Vec<Emit>, String> {
        let (payment_id, account, amount) = payment(value)?;
        let balance = self
            .accounts
            .get(&account)
            .copied()
            .unwrap_or(0)
            .checked_add(amount)
            .ok_or_else(|| {
                format!("invalid payment: balance overflow for account \"{account}\"")
            })?;
        self.accounts.insert(account.clone(), balance);
        // No key allocated per payment for an account already dirty (the
        // baseline must not do more than it needs to).
        if !self.dirty.contains_key(&account) {
            self.dirty.insert(account.clone(), partition);
        }
        Ok(wallet_records(
            payment_id, account, "balance", balance, value,
        ))
    }

    /// The changelog records for the accounts changed since the last call:
    /// (partition, account, balance as decimal text).
    pub fn changelog(&mut self) -> Vec<(i32, String, Vec<u8>)> {
        self.dirty
            .drain()
            .map(|(account, partition)| {
                let balance = self.accounts.get(&account).copied().unwrap_or(0);
                (partition, account, balance.to_string().into_bytes())
            })
            .collect()
    }
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
    /// Page views for `examples/pageviews` (see [`pageviews`]): keyed by
    /// page, with explicit event timestamps hours in the past, mostly
    /// increasing, some out of order within the grace, a few late.
    Pageviews,
    /// The accounts table of `examples/fraud` (see [`fraud`]): every
    /// account, then updates of some, then tombstones of a few; produced
    /// once, before the payments.
    Accounts,
    /// Payments for `examples/fraud` (see [`fraud`]), keyed by account, on
    /// accounts in and out of the table; 1 in `INVALID_EVERY` malformed.
    Fraud,
    /// Wallet payments for the recovery benchmark: payment `i` opens
    /// account `i` (see [`fill_account`]), so `n` of them leave `n` accounts
    /// of about [`FILL_ACCOUNT_BYTES`] of state each; never malformed.
    Fill,
}

/// The key bytes of a [`Kind::Fill`] account: with its balance, about
/// 100 bytes of state per account (10 M accounts: about 1 GB).
pub const FILL_ACCOUNT_BYTES: usize = 96;

/// Account `i` of [`Kind::Fill`]: its number and pseudo-random hex (no
/// store compresses it away), [`FILL_ACCOUNT_BYTES`] long.
pub fn fill_account(i: u64) -> String {
    let pad: String = (0..5u64)
        .map(|k| format!("{:016x}", mix(i.wrapping_mul(8).wrapping_add(k))))
        .collect();
    format!("acct-{i:010}-{pad}")
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
    /// Record number `i` (payments, orders and fraud payments; page views
    /// and accounts come from [`pageviews::views`] and
    /// [`fraud::table_records`]).
    pub fn generate(self, i: u64) -> Generated {
        let r = mix(i);
        let invalid = i % INVALID_EVERY == INVALID_EVERY - 1;
        match self {
            Kind::Pageviews | Kind::Accounts => {
                panic!("{self:?} records are generated as a sequence, not one by one")
            }
            Kind::Fraud => fraud::payment(i),
            Kind::Fill => {
                let account = fill_account(i);
                let id = format!("f{i}");
                let value = format!(
                    r#"{{"payment_id":"{id}","account":"{account}","amount":{}}}"#,
                    1 + r % 1000
                );
                Generated {
                    key: account,
                    value,
                    invalid: false,
                    output: None,
                    id,
                }
            }
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

/// Kafka's default partitioner for keyed records: murmur2, sign bit
/// cleared, modulo the partition count (the Java client's; a copy of
/// `onceflow::offline::kafka_partition`). The generators send each record to
/// this partition explicitly, so the models and the topics agree.
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

/// The pageviews workload and a model of what `examples/pageviews` (and
/// its Kafka Streams twin) must emit: tumbling one-minute windows with a
/// ten-second grace, one final count per page and window once stream time
/// (per partition) passes its end plus the grace. The generator and the
/// model follow `tests/common/pageviews.rs`, with more pages and smaller
/// steps so that 300,000 views span about four hours of event time.
pub mod pageviews {
    use std::collections::BTreeMap;

    /// Window size, ms.
    pub const SIZE: i64 = 60_000;
    /// Grace, ms.
    pub const GRACE: i64 = 10_000;
    /// Pages the views spread over.
    pub const PAGES: u64 = 100;
    /// How far before now the views start: the broker refuses timestamps
    /// more than an hour in its future (`log.message.timestamp.after.max.ms`)
    /// and the topics keep 7 days.
    pub const BASE_BEFORE_NOW_MS: i64 = 6 * 3600 * 1000;

    /// The first view's time for a run starting at `now_ms`: six hours
    /// earlier, on a minute boundary.
    pub fn base(now_ms: i64) -> i64 {
        let base = now_ms - BASE_BEFORE_NOW_MS;
        base - base.rem_euclid(SIZE)
    }

    /// The view's record value (not read by the processors).
    pub fn value(page: &str) -> String {
        format!("{{\"page\":\"{page}\"}}")
    }

    /// The first `n` views `(page, time)` from `base`: mostly moving
    /// forward (85%, by 0-60 ms), out of order by up to 15 s (12%: within
    /// the grace, or late when that crosses a closed window), 60-120 s
    /// back (3%: late), and 1 in 10,000 a jump of several windows forward.
    /// A prefix of a longer run is the shorter run.
    pub fn views(n: usize, base: i64) -> Vec<(String, i64)> {
        let mut state: u64 = 0x0dd_b1a5e5;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state >> 33
        };
        let mut now = base;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let page = format!("/page-{}", next() % PAGES);
            let r = next() % 10_000;
            let at = match r {
                0..=8_499 => {
                    now += (next() % 60) as i64;
                    now
                }
                8_500..=9_699 => now - (next() % 15_000) as i64,
                9_700..=9_998 => now - 60_000 - (next() % 60_000) as i64,
                _ => {
                    now += 150_000 + (next() % 200_000) as i64;
                    now
                }
            };
            out.push((page, at));
        }
        out
    }

    /// What the windowed count must emit for `views` over `partitions`
    /// partitions.
    #[derive(Debug, Default)]
    pub struct Expected {
        /// Every window closed by the end of its partition's stream time:
        /// (page, start) -> final count.
        pub closed: BTreeMap<(String, i64), u64>,
        /// Windows still open at the end (never emitted).
        pub open: usize,
        /// Late views (page, time) -> how many (dead-lettered by Onceflow,
        /// dropped by Kafka Streams).
        pub late: BTreeMap<(String, i64), u64>,
    }

    impl Expected {
        pub fn late_count(&self) -> u64 {
            self.late.values().sum()
        }
    }

    /// The model: per partition (Kafka's partitioner on the page), stream
    /// time is the largest view time so far, counting the view itself; a
    /// view whose window closed (end + grace <= stream time) is late.
    pub fn model(views: &[(String, i64)], partitions: i32) -> Expected {
        let mut time: BTreeMap<i32, i64> = BTreeMap::new();
        let mut counts: BTreeMap<(i32, String, i64), u64> = BTreeMap::new();
        let mut expected = Expected::default();
        for (page, at) in views {
            let p = super::kafka_partition(page.as_bytes(), partitions);
            let now = time.entry(p).or_insert(i64::MIN);
            *now = (*now).max(*at);
            let start = at - at.rem_euclid(SIZE);
            if start + SIZE + GRACE <= *now {
                *expected.late.entry((page.clone(), *at)).or_default() += 1;
            } else {
                *counts.entry((p, page.clone(), start)).or_default() += 1;
            }
        }
        for ((p, page, start), count) in counts {
            if start + SIZE + GRACE <= time[&p] {
                expected.closed.insert((page, start), count);
            } else {
                expected.open += 1;
            }
        }
        expected
    }
}

/// The fraud workload (payments joined with an accounts table) and a model
/// of the alerts `examples/fraud` (and its Kafka Streams twin) must emit. As
/// `tests/common/fraud.rs`, but with the whole table first (every account,
/// then updates, then tombstones, all earlier in time than any payment) and
/// payments deterministic in their number, so the alerts of any range of
/// payments follow from the final table.
pub mod fraud {
    use std::collections::HashMap;

    use super::{Generated, INVALID_EVERY, mix};

    /// Accounts in the table (before the tombstones).
    pub const ACCOUNTS: u64 = 10_000;
    /// Payments go to accounts `0..ACCOUNTS + UNKNOWN`: about 9% to
    /// accounts that were never in the table (an inner join: no alert).
    pub const UNKNOWN: u64 = ACCOUNTS / 10;
    /// Every this-many-th account is updated after all were created.
    pub const UPDATE_EVERY: u64 = 13;
    /// Every this-many-th account is deleted (a tombstone) at the end.
    pub const DELETE_EVERY: u64 = 97;

    pub fn account(j: u64) -> String {
        format!("acct-{j:05}")
    }

    fn settings(r: u64) -> (i64, bool) {
        let limit = 100 + (r % 1_900) as i64;
        let blocked = (r >> 32).is_multiple_of(50);
        (limit, blocked)
    }

    fn settings_value((limit, blocked): (i64, bool)) -> String {
        let status = if blocked { "blocked" } else { "active" };
        format!("{{\"limit\":{limit},\"status\":\"{status}\"}}")
    }

    /// The table's records in the order they are produced: key and value
    /// (None: a tombstone).
    pub fn table_records() -> Vec<(String, Option<String>)> {
        let mut out = Vec::new();
        for j in 0..ACCOUNTS {
            let s = settings(mix(j ^ 0xacc0_0000_0000));
            out.push((account(j), Some(settings_value(s))));
        }
        for j in (0..ACCOUNTS).filter(|j| j.is_multiple_of(UPDATE_EVERY)) {
            let s = settings(mix(j ^ 0xacc1_0000_0000));
            out.push((account(j), Some(settings_value(s))));
        }
        for j in (0..ACCOUNTS).filter(|j| j % DELETE_EVERY == DELETE_EVERY - 1) {
            out.push((account(j), None));
        }
        out
    }

    /// The table after all its records: account -> (limit, blocked).
    pub fn table() -> HashMap<String, (i64, bool)> {
        let mut table = HashMap::new();
        for (key, value) in table_records() {
            match value {
                Some(v) => {
                    let v: serde_json::Value = serde_json::from_str(&v).expect("our JSON");
                    let limit = v["limit"].as_i64().expect("limit");
                    table.insert(key, (limit, v["status"] == "blocked"));
                }
                None => {
                    table.remove(&key);
                }
            }
        }
        table
    }

    /// Payment number `i`: key = account, `{"payment_id","account","amount"}`
    /// with an amount of 0-1499; 1 in `INVALID_EVERY` malformed
    /// (`"amount":"N/A"`, dead-lettered by Onceflow, dropped by Kafka
    /// Streams).
    pub fn payment(i: u64) -> Generated {
        let r = mix(i ^ 0xf4a0_d000_0000_0000);
        let invalid = i % INVALID_EVERY == INVALID_EVERY - 1;
        let account = account(r % (ACCOUNTS + UNKNOWN));
        let amount = (r >> 24) % 1_500;
        let id = format!("f{i}");
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

    /// The alert payment `i` raises against the final `table`, if any:
    /// blocked before over-limit, nothing for an account not in the table.
    pub fn alert(i: u64, table: &HashMap<String, (i64, bool)>) -> Option<String> {
        let g = payment(i);
        if g.invalid {
            return None;
        }
        let &(limit, blocked) = table.get(&g.key)?;
        let v: serde_json::Value = serde_json::from_str(&g.value).expect("our JSON");
        let amount = v["amount"].as_i64().expect("amount");
        let reason = if blocked {
            "blocked"
        } else if amount > limit {
            "over-limit"
        } else {
            return None;
        };
        Some(format!(
            "{{\"payment_id\":\"{}\",\"account\":\"{}\",\"amount\":{amount},\"limit\":{limit},\"reason\":\"{reason}\"}}",
            g.id, g.key
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_payments_open_one_account_each_of_the_stated_size() {
        let a = Kind::Fill.generate(7);
        let b = Kind::Fill.generate(8);
        assert_eq!(a.key.len(), FILL_ACCOUNT_BYTES);
        assert_eq!(b.key.len(), FILL_ACCOUNT_BYTES);
        assert!(a.key.starts_with("acct-0000000007-"), "{}", a.key);
        assert_ne!(a.key, b.key);
        assert!(!a.invalid && a.value.contains(&a.key) && a.value.contains(r#""payment_id":"f7""#));
    }

    #[test]
    fn murmur2_partitions_as_the_java_client() {
        // Values from Kafka's own partitioner tests (Utils.murmur2).
        assert_eq!(murmur2(b"21"), (-973932308i32) as u32);
        assert_eq!(murmur2(b"foobar"), (-790332482i32) as u32);
        assert_eq!(murmur2(b"a-little-bit-long-string"), (-985981536i32) as u32);
        assert_eq!(
            murmur2(b"a-little-bit-longer-string"),
            (-1486304829i32) as u32
        );
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            (-58897971i32) as u32
        );
        assert_eq!(murmur2(b"abc"), 479470107);
    }

    #[test]
    fn pageviews_span_hours_with_late_views_and_closed_windows() {
        let base = pageviews::base(1_800_000_000_000);
        assert_eq!(base % 60_000, 0);
        let views = pageviews::views(300_000, base);
        let last = views.iter().map(|v| v.1).max().unwrap();
        // The full run's views end over an hour before now.
        assert!(last - base < 5 * 3600 * 1000, "{}", last - base);
        assert_eq!(pageviews::views(1000, base), views[..1000]);
        let expected = pageviews::model(&views[..60_000], 6);
        let late = expected.late_count();
        assert!(late > 1000 && late < 6000, "{late}");
        assert!(expected.closed.len() > 1000, "{}", expected.closed.len());
        let counted: u64 = expected.closed.values().sum();
        assert!(counted + late <= 60_000);
    }

    #[test]
    fn fraud_payments_raise_some_alerts() {
        let table = fraud::table();
        assert!(table.len() > 9_000 && table.len() < 10_000);
        let alerts = (0..10_000).filter_map(|i| fraud::alert(i, &table)).count();
        assert!(alerts > 2_000 && alerts < 5_000, "{alerts}");
        let a = (0..100).find_map(|i| fraud::alert(i, &table)).unwrap();
        assert!(a.starts_with(r#"{"payment_id":"f"#), "{a}");
    }

    #[test]
    fn generated_records_go_through_the_transforms_as_announced() {
        for kind in [Kind::Payments, Kind::Orders] {
            let transform = match kind {
                Kind::Payments => Transform::Wallet,
                _ => Transform::Enrich,
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
    fn balances_keep_the_running_sum_and_write_what_the_wallet_writes() {
        let mut balances = Balances::default();
        balances
            .pay(Some(br#"{"payment_id":"p1","account":"a","amount":5}"#), 3)
            .unwrap();
        let second = balances
            .pay(Some(br#"{"payment_id":"p2","account":"a","amount":-7}"#), 3)
            .unwrap();
        assert_eq!(
            second,
            vec![
                Emit {
                    output: 0,
                    key: "a".into(),
                    value: br#"{"account":"a","balance":-2,"payment_id":"p2"}"#.to_vec(),
                },
                Emit {
                    output: 1,
                    key: "p2".into(),
                    value: br#"{"payment_id":"p2","account":"a","amount":-7}"#.to_vec(),
                },
            ]
        );
        balances
            .pay(Some(br#"{"payment_id":"p3","account":"b","amount":1}"#), 0)
            .unwrap();
        // One record per account changed, its latest balance, then none.
        let mut changelog = balances.changelog();
        changelog.sort();
        assert_eq!(
            changelog,
            vec![
                (0, "b".into(), b"1".to_vec()),
                (3, "a".into(), b"-2".to_vec())
            ]
        );
        assert_eq!(balances.changelog(), vec![]);
        // A payment that fails changes nothing.
        let max = format!(
            r#"{{"payment_id":"p4","account":"a","amount":{}}}"#,
            i64::MAX
        );
        balances.pay(Some(b"{}"), 3).unwrap_err();
        balances
            .pay(Some(br#"{"payment_id":"p5","account":"a","amount":3}"#), 3)
            .unwrap();
        assert_eq!(
            balances.pay(Some(max.as_bytes()), 3),
            Err("invalid payment: balance overflow for account \"a\"".into())
        );
        assert_eq!(balances.changelog(), vec![(3, "a".into(), b"1".to_vec())]);
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
