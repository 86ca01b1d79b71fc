//! Payments joined with an accounts table: a payment over its account's
//! limit, or on a blocked account, raises an alert. Kafka Streams'
//! `payments.join(accounts, joiner).filter(alert != null)`, in the sandbox.
//!
//! The table `accounts` is the compacted topic of the same name,
//! co-partitioned with the payments: the host keeps each task's partition
//! of it in a read-only store, updated by the topic's records in timestamp
//! order with the payments. A payment whose account is not in the table
//! raises nothing (an inner join).
//!
//! Input: key = account, value = `{"payment_id":"p1","account":"alice",
//! "amount":250}`. Table: key = account, value = `{"limit":200,
//! "status":"active"}` (`status` is `active` or `blocked`). Output
//! `alerts`: key = account, value = `{"payment_id":"p1","account":"alice",
//! "amount":250,"limit":200,"reason":"over-limit"}` (`reason` is `blocked`
//! before `over-limit`). A malformed payment or account value is
//! dead-lettered with the reason.

use onceflow_sdk::{Context, Error, Processor, Record};
use serde_json::Value;

struct Fraud;

/// An integer field of a JSON object.
fn integer(value: &Value, field: &str, what: &str) -> Result<i64, Error> {
    value
        .get(field)
        .and_then(Value::as_i64)
        .ok_or_else(|| Error::new(format!("{what}: field \"{field}\" must be an integer")))
}

/// A string field of a JSON object.
fn text<'v>(value: &'v Value, field: &str, what: &str) -> Result<&'v str, Error> {
    value
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| Error::new(format!("{what}: field \"{field}\" must be a string")))
}

impl Processor for Fraud {
    fn process(ctx: &mut Context, record: &Record) -> Result<(), Error> {
        let account = record.key_str()?;
        let payment: Value = record.value_json()?;
        let payment_id = text(&payment, "payment_id", "payment")?;
        let payer = text(&payment, "account", "payment")?;
        let amount = integer(&payment, "amount", "payment")?;

        let Some(stored) = ctx.store("accounts").get(account)? else {
            return Ok(());
        };
        let what = format!("account {account}");
        let settings: Value = serde_json::from_slice(&stored)
            .map_err(|e| Error::new(format!("{what}: its table value is not JSON: {e}")))?;
        let limit = integer(&settings, "limit", &what)?;
        let reason = match text(&settings, "status", &what)? {
            "blocked" => "blocked",
            _ if amount > limit => "over-limit",
            _ => return Ok(()),
        };
        let alert = format!(
            "{{\"payment_id\":{},\"account\":{},\"amount\":{amount},\"limit\":{limit},\"reason\":\"{reason}\"}}",
            Value::from(payment_id),
            Value::from(payer)
        );
        ctx.emit("alerts", account, alert)
    }
}

onceflow_sdk::export_processor!(Fraud);

#[cfg(test)]
mod tests {
    use super::*;
    use onceflow_sdk::testing::TestHost;

    fn payment(account: &str, id: &str, amount: i64) -> Record {
        Record {
            key: Some(account.as_bytes().to_vec()),
            value: Some(
                format!(r#"{{"payment_id":"{id}","account":"{account}","amount":{amount}}}"#)
                    .into_bytes(),
            ),
            ..Record::default()
        }
    }

    #[test]
    fn alerts_on_blocked_accounts_and_payments_over_the_limit() {
        let mut host = TestHost::new()
            .with_output("alerts")
            .with_state("accounts", "a1", r#"{"limit":100,"status":"active"}"#)
            .with_state("accounts", "a2", r#"{"limit":1000,"status":"blocked"}"#);
        for (account, id, amount) in [
            ("a1", "p1", 50),
            ("a1", "p2", 150),
            ("a2", "p3", 10),
            ("a3", "p4", 5),
        ] {
            host.process::<Fraud>(&payment(account, id, amount))
                .unwrap();
        }
        let alerts: Vec<String> = host
            .emitted()
            .iter()
            .map(|e| String::from_utf8(e.value.clone().unwrap()).unwrap())
            .collect();
        assert_eq!(
            alerts,
            [
                r#"{"payment_id":"p2","account":"a1","amount":150,"limit":100,"reason":"over-limit"}"#,
                r#"{"payment_id":"p3","account":"a2","amount":10,"limit":1000,"reason":"blocked"}"#,
            ]
        );
    }

    #[test]
    fn a_malformed_account_value_is_named() {
        let mut host = TestHost::new().with_state("accounts", "a1", "not json");
        let error = host.process::<Fraud>(&payment("a1", "p1", 5)).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("account a1: its table value is not JSON"),
            "{error}"
        );
    }
}
