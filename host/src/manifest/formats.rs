//! Formats in the manifest: an entry of `inputs` or `[outputs]` may be a
//! table naming its values' format and schema file (docs/formats.md).

use std::path::PathBuf;

use serde::Deserialize;

/// How a topic's record values are written: what the host decodes before
/// the processor sees a value, and encodes after it emits one
/// (docs/formats.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// Bytes as they are (the default): nothing decoded or checked.
    #[default]
    Bytes,
    /// JSON text: checked (a value that does not parse goes to the error
    /// policy), handed over as it is.
    Json,
    /// Avro in the Confluent wire format (magic byte, schema id, datum),
    /// schemas in a schema registry: the processor sees the value as JSON.
    Avro,
    /// Protobuf in the Confluent wire format (not served yet: refused).
    Protobuf,
    /// JSON text checked against a JSON Schema, in the Confluent wire
    /// format, schemas in a schema registry: the processor sees the JSON.
    JsonSchema,
}

impl Format {
    /// The name written in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            Format::Bytes => "bytes",
            Format::Json => "json",
            Format::Avro => "avro",
            Format::Protobuf => "protobuf",
            Format::JsonSchema => "json-schema",
        }
    }

    /// Whether values carry a schema id from a schema registry.
    pub fn uses_registry(self) -> bool {
        matches!(self, Format::Avro | Format::Protobuf | Format::JsonSchema)
    }
}

/// The format of one input's or output's values, with its schema file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueFormat {
    /// The format.
    pub format: Format,
    /// The schema file, relative to the manifest: for an output, the schema
    /// its values are written with (registered under `<topic>-value` at
    /// deploy); for an input, the reader schema values are resolved to
    /// (optional: without it, each value is read with its writer's schema).
    pub schema: Option<PathBuf>,
}

/// `{ topic = "...", format = "avro", schema = "schemas/x.avsc" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawFormatted {
    topic: String,
    #[serde(default)]
    format: Format,
    schema: Option<PathBuf>,
}

/// An entry of `inputs` or `[outputs]`: a topic's name, or a table with the
/// topic and its format.
pub(super) fn topic_entry(value: toml::Value) -> Result<(String, Option<ValueFormat>), String> {
    match value {
        toml::Value::String(topic) => Ok((topic, None)),
        toml::Value::Table(table) => {
            let f = RawFormatted::deserialize(toml::Value::Table(table))
                .map_err(|e| e.to_string().trim_end().to_owned())?;
            Ok((
                f.topic,
                Some(ValueFormat {
                    format: f.format,
                    schema: f.schema,
                }),
            ))
        }
        other => Err(format!(
            "{} ({}) is not a topic: write the topic's name, or a table such as \
             {{ topic = \"payments\", format = \"avro\" }}",
            other,
            other.type_str()
        )),
    }
}

/// Checks one input's (`output` false) or output's format; the error is
/// the key's suffix (`.schema`) and the message.
pub(super) fn check_format(f: &ValueFormat, output: bool) -> Result<(), (&'static str, String)> {
    match f.format {
        Format::Protobuf => {
            return Err((
                ".format",
                format!(
                    "{:?} is not served by this host yet: use \"avro\", \"json-schema\", \
                     \"json\" or \"bytes\" (docs/formats.md)",
                    f.format.name()
                ),
            ));
        }
        Format::Avro | Format::JsonSchema if output && f.schema.is_none() => {
            return Err((
                ".schema",
                format!(
                    "an {} output needs the schema its values are written with: \
                     schema = \"schemas/<name>.{}\", relative to the manifest",
                    f.format.name(),
                    if f.format == Format::Avro {
                        "avsc"
                    } else {
                        "json"
                    }
                ),
            ));
        }
        Format::Bytes | Format::Json if f.schema.is_some() => {
            return Err((
                ".schema",
                format!(
                    "format {:?} has no schema: remove `schema`, or use format \"avro\" or \
                     \"json-schema\"",
                    f.format.name()
                ),
            ));
        }
        _ => {}
    }
    if let Some(schema) = &f.schema
        && (schema.is_absolute()
            || schema
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir)))
    {
        return Err((
            ".schema",
            format!(
                "{} must be a path inside the manifest's directory (no `..`, not absolute): \
                 `onceflow deploy` uploads it with the manifest",
                schema.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::tests::{WALLET, parse};
    use super::*;

    #[test]
    fn formats_are_declared_per_input_and_output() {
        let text = WALLET
            .replace(
                "inputs = [\"payments\"]",
                "inputs = [{ topic = \"payments\", format = \"avro\", schema = \"s/p.avsc\" }, \"refunds\"]",
            )
            .replace(
                "balances = \"balances\"",
                "balances = { topic = \"balances\", format = \"avro\", schema = \"s/b.avsc\" }\nraw = { topic = \"raw\" }\nnotes = { topic = \"notes\", format = \"json\" }",
            );
        let m = parse(&text).unwrap();
        assert_eq!(m.inputs, ["payments", "refunds"]);
        assert_eq!(m.outputs["balances"], "balances");
        assert_eq!(m.outputs["raw"], "raw");
        assert_eq!(
            m.input_formats["payments"],
            ValueFormat {
                format: Format::Avro,
                schema: Some(PathBuf::from("s/p.avsc"))
            }
        );
        assert!(
            !m.input_formats.contains_key("refunds"),
            "a name alone is bytes"
        );
        assert!(!m.output_formats.contains_key("raw"), "no format is bytes");
        assert_eq!(m.output_formats["notes"].format, Format::Json);
        // Every manifest of before is unchanged.
        let old = parse(WALLET).unwrap();
        assert!(old.input_formats.is_empty() && old.output_formats.is_empty());
    }

    #[test]
    fn a_bad_format_names_the_key_and_what_to_do() {
        let refused = |input: &str, output: &str| {
            let text = WALLET
                .replace("inputs = [\"payments\"]", &format!("inputs = [{input}]"))
                .replace("balances = \"balances\"", &format!("balances = {output}"));
            parse(&text).unwrap_err().to_string()
        };
        let e = refused(
            r#""payments""#,
            r#"{ topic = "balances", format = "json-schema" }"#,
        );
        assert!(
            e.contains("`outputs.balances.schema`") && e.contains(".json"),
            "{e}"
        );
        let e = refused(
            r#"{ topic = "payments", format = "protobuf" }"#,
            r#""balances""#,
        );
        assert!(
            e.contains("`inputs.payments.format`") && e.contains("not served"),
            "{e}"
        );
        let e = refused(
            r#""payments""#,
            r#"{ topic = "balances", format = "avro" }"#,
        );
        assert!(
            e.contains("`outputs.balances.schema`") && e.contains(".avsc"),
            "{e}"
        );
        let e = refused(
            r#""payments""#,
            r#"{ topic = "balances", format = "json", schema = "x" }"#,
        );
        assert!(e.contains("format \"json\" has no schema"), "{e}");
        let e = refused(
            r#"{ topic = "payments", format = "avro", schema = "../../etc/passwd" }"#,
            r#""balances""#,
        );
        assert!(e.contains("inside the manifest's directory"), "{e}");
        let e = refused(
            r#"{ topic = "payments", fromat = "avro" }"#,
            r#""balances""#,
        );
        assert!(e.contains("`inputs`") && e.contains("fromat"), "{e}");
        let e = refused(r#"{ topic = "payments", format = "xml" }"#, r#""balances""#);
        assert!(e.contains("xml"), "{e}");
        let e = refused("5", r#""balances""#);
        assert!(e.contains("5 (integer) is not a topic"), "{e}");
    }
}
