//! JSON Schema: values checked against a schema (owns `jsonschema`).
//!
//! In the schema registry's wire format a JSON Schema value is the JSON
//! text itself after the 5-byte header: the processor reads it as it is,
//! once the host checked it against its writer's schema (and the input's
//! own, when the manifest gives one); an emitted value is checked against
//! the output's schema before it is written. The validator fetches
//! nothing: a `$ref` to another document is refused when the schema is
//! read (the host reaches no network on a tenant's behalf).

use serde_json::Value;

/// A compiled JSON Schema.
pub struct JsonSchema {
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for JsonSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JsonSchema")
    }
}

impl JsonSchema {
    /// Compiles a schema's JSON text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let schema: Value =
            serde_json::from_str(text).map_err(|e| format!("not a JSON Schema (not JSON): {e}"))?;
        let validator = jsonschema::validator_for(&schema)
            .map_err(|e| format!("not a JSON Schema this host can use: {e}"))?;
        Ok(Self { validator })
    }

    /// Checks a value; the error names where it does not fit.
    pub fn check(&self, value: &Value) -> Result<(), String> {
        self.validator.validate(value).map_err(|e| {
            let path = e.instance_path().to_string();
            if path.is_empty() {
                format!("the value does not fit its JSON Schema: {e}")
            } else {
                format!("`{path}` does not fit its JSON Schema: {e}")
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAYMENT: &str = r#"{"type":"object","required":["payment_id","account","amount"],
        "properties":{"payment_id":{"type":"string"},"account":{"type":"string"},
        "amount":{"type":"integer"}},"additionalProperties":false}"#;

    #[test]
    fn a_value_is_checked_and_the_error_says_where() {
        let s = JsonSchema::parse(PAYMENT).unwrap();
        s.check(&serde_json::json!({"payment_id":"p","account":"a","amount":5}))
            .unwrap();
        let e = s
            .check(&serde_json::json!({"payment_id":"p","account":"a","amount":"N/A"}))
            .unwrap_err();
        assert!(e.contains("`/amount`") && e.contains("integer"), "{e}");
        let e = s
            .check(&serde_json::json!({"payment_id":"p","amount":1}))
            .unwrap_err();
        assert!(e.contains("account"), "{e}");
    }

    #[test]
    fn a_schema_that_is_not_one_is_refused() {
        assert!(JsonSchema::parse("{").unwrap_err().contains("not JSON"));
        let e = JsonSchema::parse(r#"{"type":"widget"}"#).unwrap_err();
        assert!(e.contains("JSON Schema"), "{e}");
        // Nothing is fetched for a schema.
        let e = JsonSchema::parse(r#"{"$ref":"http://127.0.0.1:9/other.json"}"#).unwrap_err();
        assert!(e.contains("JSON Schema"), "{e}");
    }
}
