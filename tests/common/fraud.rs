//! The fraud example's workload (payments and account updates in rounds)
//! and an independent model of the alerts its join must emit. Shared by
//! the offline and the broker tests.

use std::collections::{BTreeMap, BTreeSet};

/// One record to produce: topic, key, value (none: a tombstone), time.
pub type Out = (String, String, Option<String>, i64);

/// Round `r` of the workload: account updates (some tombstones) first,
/// then payments, later in time, on accounts in and out of the table.
pub fn round(r: u64, base: i64, payments: &str, accounts: &str) -> (Vec<Out>, Vec<Out>) {
    let mut state = r.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let start = base + r as i64 * 10_000;
    let mut updates = Vec::new();
    for i in 0..15 {
        let account = format!("acct-{}", next() % 40);
        let value = match next() % 20 {
            0 => None,
            1..=3 => Some(format!(
                "{{\"limit\":{},\"status\":\"blocked\"}}",
                next() % 1000
            )),
            _ => Some(format!(
                "{{\"limit\":{},\"status\":\"active\"}}",
                next() % 1000
            )),
        };
        updates.push((accounts.to_owned(), account, value, start + i));
    }
    let mut pays = Vec::new();
    for i in 0..40 {
        let account = format!("acct-{}", next() % 45);
        let amount = next() % 1500;
        let value = format!(
            "{{\"payment_id\":\"p{r}-{i}\",\"account\":\"{account}\",\"amount\":{amount}}}"
        );
        pays.push((payments.to_owned(), account, Some(value), start + 5_000 + i));
    }
    (updates, pays)
}

/// The alerts `(partition, key, value)` the join must emit: the records in
/// order, account updates applied to the table, payments checked against
/// it (the rounds keep every update before the payments after it in time
/// too, so timestamp order is this order).
pub fn model(records: &[Out], accounts: &str, partitions: i32) -> BTreeSet<(i32, String, String)> {
    let mut table: BTreeMap<String, (i64, String)> = BTreeMap::new();
    let mut alerts = BTreeSet::new();
    for (topic, key, value, _) in records {
        let value = value
            .as_deref()
            .map(|v| serde_json::from_str::<serde_json::Value>(v).expect("the workload's JSON"));
        if topic == accounts {
            match value {
                Some(v) => {
                    let limit = v["limit"].as_i64().expect("limit");
                    let status = v["status"].as_str().expect("status").to_owned();
                    table.insert(key.clone(), (limit, status));
                }
                None => {
                    table.remove(key);
                }
            }
            continue;
        }
        let v = value.expect("a payment");
        let Some((limit, status)) = table.get(key) else {
            continue;
        };
        let amount = v["amount"].as_i64().expect("amount");
        let reason = if status == "blocked" {
            "blocked"
        } else if amount > *limit {
            "over-limit"
        } else {
            continue;
        };
        let alert = format!(
            "{{\"payment_id\":\"{}\",\"account\":\"{key}\",\"amount\":{amount},\"limit\":{limit},\"reason\":\"{reason}\"}}",
            v["payment_id"].as_str().expect("payment_id")
        );
        let p = onceflow::offline::kafka_partition(key.as_bytes(), partitions);
        alerts.insert((p, key.clone(), alert));
    }
    alerts
}
