//! Wallet: keeps a balance per account in the state store `balances` and, for
//! every payment, emits the new balance (alias `balances`) and an audit copy
//! of the payment (alias `audit`).
//!
//! Input values are JSON objects `{"payment_id": str, "account": str,
//! "amount": int}`. They are checked by hand, field by field, so that the
//! error messages (which end up in the dead-letter topic) are ours and can be
//! reproduced exactly by a processor written in another language.

use onceflow_sdk::{Context, Error, Processor, Record};
use serde_json::{Map, Value};

/// The wallet processor.
pub struct Wallet;

/// A payment that passed validation.
#[derive(Debug, PartialEq, Eq)]
struct Payment {
    payment_id: String,
    account: String,
    amount: i64,
}

impl Processor for Wallet {
    fn process(ctx: &mut Context, record: &Record) -> Result<(), Error> {
        let payment = parse_payment(record.value.as_deref())?;

        let balances = ctx.store("balances");
        let balance = balances
            .get_i64(&payment.account)?
            .unwrap_or(0)
            .checked_add(payment.amount)
            .ok_or_else(|| {
                Error::new(format!(
                    "invalid payment: balance overflow for account \"{}\"",
                    payment.account
                ))
            })?;

        // Every check has passed: only now change anything.
        balances.put_i64(&payment.account, balance)?;
        let report = format!(
            r#"{{"account":{},"balance":{},"payment_id":{}}}"#,
            json_string(&payment.account),
            balance,
            json_string(&payment.payment_id)
        );
        ctx.emit("balances", &payment.account, report)?;
        let raw = record.value.as_deref().unwrap_or_default();
        ctx.emit("audit", &payment.payment_id, raw)
    }
}

onceflow_sdk::export_processor!(Wallet);

/// Checks a payment, in a fixed order, with fixed messages.
fn parse_payment(value: Option<&[u8]>) -> Result<Payment, Error> {
    let value = value.ok_or_else(|| invalid("missing value"))?;
    let value: Value = serde_json::from_slice(value).map_err(|_| invalid("not valid JSON"))?;
    let Value::Object(mut fields) = value else {
        return Err(invalid("not a JSON object"));
    };
    let payment_id = string_field(&mut fields, "payment_id")?;
    let account = string_field(&mut fields, "account")?;
    let amount = match fields.get("amount") {
        None => return Err(missing("amount")),
        Some(amount) => amount
            .as_i64()
            .ok_or_else(|| invalid("field \"amount\" must be an integer"))?,
    };
    Ok(Payment {
        payment_id,
        account,
        amount,
    })
}

fn string_field(fields: &mut Map<String, Value>, name: &str) -> Result<String, Error> {
    match fields.remove(name) {
        None => Err(missing(name)),
        Some(Value::String(text)) => Ok(text),
        Some(_) => Err(invalid(&format!("field \"{name}\" must be a string"))),
    }
}

fn missing(name: &str) -> Error {
    invalid(&format!("missing field \"{name}\""))
}

fn invalid(reason: &str) -> Error {
    Error::new(format!("invalid payment: {reason}"))
}

/// `text` as a JSON string literal, escaped.
fn json_string(text: &str) -> String {
    Value::from(text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use onceflow_sdk::testing::TestHost;

    fn host() -> TestHost {
        TestHost::new()
            .with_store("balances")
            .with_output("balances")
            .with_output("audit")
    }

    fn payment(value: &str) -> Record {
        Record {
            topic: "payments".into(),
            value: Some(value.as_bytes().to_vec()),
            ..Record::default()
        }
    }

    fn error_of(value: Option<&[u8]>) -> String {
        let record = Record {
            value: value.map(<[u8]>::to_vec),
            ..Record::default()
        };
        host().process::<Wallet>(&record).unwrap_err().to_string()
    }

    #[test]
    fn payments_update_the_balance_and_are_reported() {
        let mut host = host();
        let first = r#"{"payment_id":"p1","account":"alice","amount":100}"#;
        let second = r#"{"payment_id": "p2", "account": "alice", "amount": -30}"#;
        host.process::<Wallet>(&payment(first)).unwrap();
        host.process::<Wallet>(&payment(second)).unwrap();
        assert_eq!(host.get("balances", "alice"), Some(b"70".to_vec()));
        let emitted = host.take_emitted();
        assert_eq!(emitted.len(), 4);
        assert_eq!(emitted[2].alias, "balances");
        assert_eq!(emitted[2].key.as_deref(), Some(&b"alice"[..]));
        assert_eq!(
            emitted[2].value.as_deref(),
            Some(&br#"{"account":"alice","balance":70,"payment_id":"p2"}"#[..])
        );
        assert_eq!(emitted[3].alias, "audit");
        assert_eq!(emitted[3].key.as_deref(), Some(&b"p2"[..]));
        assert_eq!(emitted[3].value.as_deref(), Some(second.as_bytes()));
    }

    #[test]
    fn strings_are_escaped_in_the_report() {
        let mut host = host();
        let value = r#"{"payment_id":"p\"1","account":"a\\b\n","amount":1}"#;
        host.process::<Wallet>(&payment(value)).unwrap();
        assert_eq!(
            host.emitted()[0].value.as_deref(),
            Some(&br#"{"account":"a\\b\n","balance":1,"payment_id":"p\"1"}"#[..])
        );
    }

    #[test]
    fn malformed_payments_get_exact_messages() {
        let cases: &[(Option<&str>, &str)] = &[
            (None, "invalid payment: missing value"),
            (Some("{"), "invalid payment: not valid JSON"),
            (Some("[1]"), "invalid payment: not a JSON object"),
            (Some("{}"), "invalid payment: missing field \"payment_id\""),
            (
                Some(r#"{"payment_id":1}"#),
                "invalid payment: field \"payment_id\" must be a string",
            ),
            (
                Some(r#"{"payment_id":"p","amount":1}"#),
                "invalid payment: missing field \"account\"",
            ),
            (
                Some(r#"{"payment_id":"p","account":null,"amount":1}"#),
                "invalid payment: field \"account\" must be a string",
            ),
            (
                Some(r#"{"payment_id":"p","account":"a"}"#),
                "invalid payment: missing field \"amount\"",
            ),
        ];
        for (value, message) in cases {
            assert_eq!(error_of(value.map(str::as_bytes)), *message, "{value:?}");
        }
        for amount in [r#""N/A""#, "1.5", "1e30", "1.0", "9223372036854775808"] {
            let value = format!(r#"{{"payment_id":"p","account":"a","amount":{amount}}}"#);
            assert_eq!(
                error_of(Some(value.as_bytes())),
                "invalid payment: field \"amount\" must be an integer",
                "{amount}"
            );
        }
        assert_eq!(
            error_of(Some(&[0xff, 0xfe])),
            "invalid payment: not valid JSON"
        );
    }

    #[test]
    fn overflow_is_rejected_and_changes_nothing() {
        let mut host = host().with_state("balances", "a", i64::MAX.to_string());
        let value = r#"{"payment_id":"p","account":"a","amount":1}"#;
        let error = host.process::<Wallet>(&payment(value)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid payment: balance overflow for account \"a\""
        );
        assert_eq!(
            host.get("balances", "a"),
            Some(i64::MAX.to_string().into_bytes())
        );
        assert!(host.emitted().is_empty());
    }
}
