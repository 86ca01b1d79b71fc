//! Enrich: a stateless filter and map with two outputs. Drops orders whose
//! amount is not positive, adds a `region` derived from the country, and
//! routes each order to alias `large` (amount >= 1000) or `standard`.
//!
//! Input values are JSON objects `{"order_id": str, "customer": str,
//! "amount": int, "country": str}`, checked by hand so that the messages in
//! the dead-letter topic are stable.

use onceflow_sdk::{Context, Error, Level, Processor, Record};
use serde_json::{Map, Value};

/// The enrich processor.
pub struct Enrich;

/// Orders of at least this amount go to alias `large`.
const LARGE: i64 = 1000;

#[derive(Debug)]
struct Order {
    order_id: String,
    customer: String,
    amount: i64,
    country: String,
}

impl Processor for Enrich {
    fn process(ctx: &mut Context, record: &Record) -> Result<(), Error> {
        let order = parse_order(record.value.as_deref())?;
        if order.amount <= 0 {
            ctx.log(
                Level::Debug,
                format!(
                    "dropping order \"{}\": amount {} is not positive",
                    order.order_id, order.amount
                ),
            );
            return Ok(());
        }
        let enriched = format!(
            r#"{{"order_id":{},"customer":{},"amount":{},"country":{},"region":"{}"}}"#,
            json_string(&order.order_id),
            json_string(&order.customer),
            order.amount,
            json_string(&order.country),
            region(&order.country)
        );
        let alias = if order.amount >= LARGE {
            "large"
        } else {
            "standard"
        };
        ctx.emit(alias, &order.order_id, enriched)
    }
}

onceflow_sdk::export_processor!(Enrich);

/// The sales region of an ISO 3166 alpha-2 country code (matched exactly,
/// upper case).
fn region(country: &str) -> &'static str {
    match country {
        "DE" | "FR" | "IT" | "ES" | "NL" => "EU",
        "US" | "CA" | "MX" => "NA",
        "JP" | "CN" | "IN" | "AU" | "SG" => "APAC",
        _ => "OTHER",
    }
}

/// Checks an order, in a fixed order, with fixed messages.
fn parse_order(value: Option<&[u8]>) -> Result<Order, Error> {
    let value = value.ok_or_else(|| invalid("missing value"))?;
    let value: Value = serde_json::from_slice(value).map_err(|_| invalid("not valid JSON"))?;
    let Value::Object(mut fields) = value else {
        return Err(invalid("not a JSON object"));
    };
    let order_id = string_field(&mut fields, "order_id")?;
    let customer = string_field(&mut fields, "customer")?;
    let amount = match fields.get("amount") {
        None => return Err(missing("amount")),
        Some(amount) => amount
            .as_i64()
            .ok_or_else(|| invalid("field \"amount\" must be an integer"))?,
    };
    let country = string_field(&mut fields, "country")?;
    Ok(Order {
        order_id,
        customer,
        amount,
        country,
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
    Error::new(format!("invalid order: {reason}"))
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
        TestHost::new().with_output("large").with_output("standard")
    }

    fn order(value: &str) -> Record {
        Record {
            topic: "orders".into(),
            value: Some(value.as_bytes().to_vec()),
            ..Record::default()
        }
    }

    #[test]
    fn orders_are_enriched_and_routed_by_amount() {
        let mut host = host();
        let small = r#"{"country":"DE","amount":20,"customer":"c1","order_id":"o1"}"#;
        let large = r#"{"order_id":"o2","customer":"c2","amount":1000,"country":"BR"}"#;
        host.process::<Enrich>(&order(small)).unwrap();
        host.process::<Enrich>(&order(large)).unwrap();
        let emitted = host.emitted();
        assert_eq!(emitted[0].alias, "standard");
        assert_eq!(emitted[0].key.as_deref(), Some(&b"o1"[..]));
        assert_eq!(
            emitted[0].value.as_deref(),
            Some(
                &br#"{"order_id":"o1","customer":"c1","amount":20,"country":"DE","region":"EU"}"#[..]
            )
        );
        assert_eq!(emitted[1].alias, "large");
        assert!(
            String::from_utf8_lossy(emitted[1].value.as_deref().unwrap())
                .ends_with(r#""country":"BR","region":"OTHER"}"#)
        );
    }

    #[test]
    fn orders_without_a_positive_amount_are_dropped_with_a_debug_line() {
        let mut host = host();
        let value = r#"{"order_id":"o3","customer":"c","amount":0,"country":"US"}"#;
        host.process::<Enrich>(&order(value)).unwrap();
        assert!(host.emitted().is_empty());
        assert_eq!(host.logs()[0].0, Level::Debug);
    }

    #[test]
    fn regions() {
        assert_eq!(region("NL"), "EU");
        assert_eq!(region("MX"), "NA");
        assert_eq!(region("SG"), "APAC");
        assert_eq!(region("de"), "OTHER");
    }

    #[test]
    fn malformed_orders_are_errors() {
        let cases = [
            ("nope", "invalid order: not valid JSON"),
            ("\"x\"", "invalid order: not a JSON object"),
            (
                r#"{"order_id":"o"}"#,
                "invalid order: missing field \"customer\"",
            ),
            (
                r#"{"order_id":"o","customer":"c","amount":"12"}"#,
                "invalid order: field \"amount\" must be an integer",
            ),
            (
                r#"{"order_id":"o","customer":"c","amount":12,"country":1}"#,
                "invalid order: field \"country\" must be a string",
            ),
        ];
        for (value, message) in cases {
            let error = host().process::<Enrich>(&order(value)).unwrap_err();
            assert_eq!(error.to_string(), message);
        }
        let error = host().process::<Enrich>(&Record::default()).unwrap_err();
        assert_eq!(error.to_string(), "invalid order: missing value");
    }
}
