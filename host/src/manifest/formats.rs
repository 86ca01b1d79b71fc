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
    /// Protobuf in the Confluent wire format (magic byte, schema id,
    /// message indexes, message), schemas in a schema registry: the
    /// processor sees the value as JSON.
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
    /// Protobuf: the message of the schema file values are written as (an
    /// output) or read as (an input whose writer's message is not in its
    /// schema file); the file's first message when not given.
    pub message: Option<String>,
    /// What the processor sees of a registry format's values.
    pub deliver: Deliver,
}

/// What the processor reads of an input of a registry format, and emits
/// to such an output (`as` in the manifest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Deliver {
    /// The value as JSON text (the default).
    #[default]
    Json,
    /// The value's own bytes, for a processor that decodes natively: an
    /// Avro datum of the entry's schema (an input's values resolved to
    /// it), a Protobuf message's bytes; the schema registry's framing taken
    /// off (an input) or put on (an output) by the host.
    Payload,
}

/// `{ topic = "...", format = "avro", schema = "schemas/x.avsc" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawFormatted {
    topic: String,
    #[serde(default)]
    format: Format,
    schema: Option<PathBuf>,
    message: Option<String>,
    #[serde(rename = "as", default)]
    deliver: Deliver,
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
                    message: f.message,
                    deliver: f.deliver,
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
        Format::Avro | Format::JsonSchema | Format::Protobuf if output && f.schema.is_none() => {
            return Err((
                ".schema",
                format!(
                    "{} {} output needs the schema its values are written with: \
                     schema = \"schemas/<name>.{}\", relative to the manifest",
                    if f.format == Format::Avro { "an" } else { "a" },
                    f.format.name(),
                    match f.format {
                        Format::Avro => "avsc",
                        Format::Protobuf => "proto",
                        _ => "json",
                    }
                ),
            ));
        }
        Format::Bytes | Format::Json if f.schema.is_some() => {
            return Err((
                ".schema",
                format!(
                    "format {:?} has no schema: remove `schema`, or use format \"avro\", \
                     \"protobuf\" or \"json-schema\"",
                    f.format.name()
                ),
            ));
        }
        _ => {}
    }
    if f.message.is_some() && f.format != Format::Protobuf {
        return Err((
            ".message",
            format!(
                "`message` names a Protobuf message, but the format is {:?}: remove it",
                f.format.name()
            ),
        ));
    }
    if f.deliver == Deliver::Payload {
        match f.format {
            Format::Avro if f.schema.is_none() => {
                return Err((
                    ".schema",
                    "as = \"payload\" hands the processor Avro datums of the schema it was \
                     built with: name that schema (schema = \"schemas/<name>.avsc\"), and \
                     the host resolves each value to it"
                        .to_owned(),
                ));
            }
            Format::Avro | Format::Protobuf => {}
            other => {
                return Err((
                    ".as",
                    format!(
                        "as = \"payload\" is for formats a processor may decode itself \
                         (\"avro\", \"protobuf\"); {:?} values are {}: remove `as`",
                        other.name(),
                        if other == Format::JsonSchema || other == Format::Json {
                            "JSON already"
                        } else {
                            "bytes already"
                        }
                    ),
                ));
            }
        }
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
                schema: Some(PathBuf::from("s/p.avsc")),
                message: None,
                deliver: Deliver::Json,
            }
        );
        assert!(
            !m.input_formats.contains_key("refunds"),
            "a name alone is bytes"
        );
        assert!(!m.output_formats.contains_key("raw"), "no format is bytes");
        assert_eq!(m.output_formats["notes"].format, Format::Json);
        let m = parse(&WALLET.replace(
            "inputs = [\"payments\"]",
            "inputs = [{ topic = \"payments\", format = \"protobuf\", message = \"w.Payment\", as = \"payload\" }]",
        ))
        .unwrap();
        let p = &m.input_formats["payments"];
        assert_eq!(
            (p.format, p.message.as_deref(), p.deliver),
            (Format::Protobuf, Some("w.Payment"), Deliver::Payload)
        );
        // Every manifest of before is unchanged.
        let old = parse(WALLET).unwrap();
        assert!(old.input_formats.is_empty() && old.output_formats.is_empty());
    }

    #[test]
    fn a_bad_format_names_the_key_and_what_to_do() {
        const P: &str = r#""payments""#;
        const B: &str = r#""balances""#;
        // (input entry, balances entry, what the message must say)
        let cases: &[(&str, &str, &[&str])] = &[
            (
                P,
                r#"{ topic = "balances", format = "json-schema" }"#,
                &["`outputs.balances.schema`", ".json"],
            ),
            (
                P,
                r#"{ topic = "balances", format = "protobuf" }"#,
                &["`outputs.balances.schema`", ".proto"],
            ),
            (
                P,
                r#"{ topic = "balances", format = "avro" }"#,
                &["`outputs.balances.schema`", ".avsc"],
            ),
            (
                r#"{ topic = "payments", format = "avro", message = "P" }"#,
                B,
                &["`inputs.payments.message`", "remove it"],
            ),
            (
                r#"{ topic = "payments", format = "avro", as = "payload" }"#,
                B,
                &["`inputs.payments.schema`", "resolves each value"],
            ),
            (
                r#"{ topic = "payments", format = "json", as = "payload" }"#,
                B,
                &["`inputs.payments.as`", "JSON already"],
            ),
            (
                P,
                r#"{ topic = "balances", format = "json", schema = "x" }"#,
                &["format \"json\" has no schema"],
            ),
            (
                r#"{ topic = "payments", format = "avro", schema = "../../etc/passwd" }"#,
                B,
                &["inside the manifest's directory"],
            ),
            (
                r#"{ topic = "payments", fromat = "avro" }"#,
                B,
                &["`inputs`", "fromat"],
            ),
            (r#"{ topic = "payments", format = "xml" }"#, B, &["xml"]),
            ("5", B, &["5 (integer) is not a topic"]),
        ];
        for (input, output, says) in cases {
            let text = WALLET
                .replace("inputs = [\"payments\"]", &format!("inputs = [{input}]"))
                .replace("balances = \"balances\"", &format!("balances = {output}"));
            let e = parse(&text).unwrap_err().to_string();
            for part in *says {
                assert!(e.contains(part), "{input} / {output}: {e:?} lacks {part:?}");
            }
        }
    }
}
