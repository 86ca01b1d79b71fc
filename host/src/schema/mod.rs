//! Record formats: what the host decodes before a processor sees a value,
//! and encodes after it emits one (docs/formats.md).
//!
//! A deployment's [`Codecs`] hold, for each input topic and output alias
//! the manifest gives a format, how to turn the topic's bytes into the JSON
//! the processor reads, and its JSON back into the topic's bytes:
//!
//! - `json`: checked, passed as it is;
//! - `avro`: the Confluent wire format (byte 0, then the schema id as 4
//!   bytes big-endian, then the Avro datum). An input's writer schema is
//!   fetched from the schema registry by its id, once: an id never changes
//!   its schema, so a retried batch decodes the same (`registry.rs` keeps
//!   it for good). An output is written with the schema its manifest names,
//!   registered at deploy under `<topic>-value`.
//! - `protobuf`: the same framing, with the message's indexes in the
//!   schema's file after the id (`protobuf.rs`);
//! - `json-schema`: the same framing around JSON text, checked against the
//!   writer's schema.
//!
//! With `as = "payload"` the processor gets an Avro datum of the input's
//! own schema (resolved from the writer's) or a Protobuf message's bytes,
//! and the schema id in a header, instead of JSON; it emits the same.
//!
//! A value that does not decode or encode is the record's fault
//! ([`FormatError::Invalid`]: the error policy, a dead letter with the
//! reason); a registry that cannot answer is nobody's
//! ([`FormatError::Unavailable`]: the batch is retried, never dead-lettered).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::manifest::{Deliver, Format, Manifest, ValueFormat};

pub mod avro;
pub mod json_schema;
pub mod protobuf;
pub mod registry;

pub use avro::AvroSchema;
pub use json_schema::JsonSchema;
pub use protobuf::ProtoSchema;

/// The kinds of schema a registry holds that the host reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaKind {
    /// Avro.
    Avro,
    /// JSON Schema.
    Json,
    /// Protobuf (a `.proto` file).
    Protobuf,
}

impl SchemaKind {
    /// Its name in the registry's API (`schemaType`).
    pub fn api_name(self) -> &'static str {
        match self {
            SchemaKind::Avro => "AVRO",
            SchemaKind::Json => "JSON",
            SchemaKind::Protobuf => "PROTOBUF",
        }
    }

    /// The kind a manifest format's schemas are.
    pub fn of(format: Format) -> Option<Self> {
        match format {
            Format::Avro => Some(SchemaKind::Avro),
            Format::JsonSchema => Some(SchemaKind::Json),
            Format::Protobuf => Some(SchemaKind::Protobuf),
            _ => None,
        }
    }
}

/// A schema, parsed for its kind.
#[derive(Debug)]
pub enum Parsed {
    /// Avro.
    Avro(AvroSchema),
    /// JSON Schema.
    Json(JsonSchema),
    /// Protobuf.
    Protobuf(ProtoSchema),
}

impl Parsed {
    /// Parses `text` as a schema of `kind`.
    pub fn parse(kind: SchemaKind, text: &str) -> Result<Self, String> {
        Ok(match kind {
            SchemaKind::Avro => Parsed::Avro(AvroSchema::parse(text)?),
            SchemaKind::Json => Parsed::Json(JsonSchema::parse(text)?),
            SchemaKind::Protobuf => Parsed::Protobuf(ProtoSchema::parse(text)?),
        })
    }

    /// Its kind.
    pub fn kind(&self) -> SchemaKind {
        match self {
            Parsed::Avro(_) => SchemaKind::Avro,
            Parsed::Json(_) => SchemaKind::Json,
            Parsed::Protobuf(_) => SchemaKind::Protobuf,
        }
    }

    /// A payload written with this schema (what follows the schema id) as
    /// JSON text, read with the writer's schema alone.
    pub fn payload_to_json(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            Parsed::Avro(s) => s.decode(payload, None),
            Parsed::Json(_) => check_json(payload)
                .map(|()| payload.to_vec())
                .map_err(|e| e.to_string()),
            Parsed::Protobuf(s) => s.decode(payload, None),
        }
    }
}
pub use registry::{Registry, RegistryConfig, RegistryError};

/// The first byte of a value in the Confluent wire format.
pub const MAGIC: u8 = 0;

/// Most bytes of one schema file.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;

/// Why a value could not be decoded or encoded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FormatError {
    /// The value is not what its format says: the record's fault, for the
    /// error policy.
    #[error("{0}")]
    Invalid(String),
    /// The schema registry could not answer: retry later.
    #[error("the schema registry could not be asked: {0}")]
    Unavailable(String),
}

/// Why a deployment's formats cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A schema file cannot be read.
    #[error("cannot read schema file {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A schema file is not a valid schema.
    #[error("schema file {path} ({key}): {message}")]
    Schema {
        /// The file.
        path: PathBuf,
        /// The manifest key that names it.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// The manifest uses the registry but the host was started without one.
    #[error(
        "{key} is format \"{format}\", whose schemas live in a schema registry, but this host has \
         none: start it with --schema-registry URL (docs/formats.md)"
    )]
    NoRegistry {
        /// The manifest key.
        key: String,
        /// The format.
        format: &'static str,
    },
    /// The registry refused or could not take an output's schema.
    #[error("{key}: {source}")]
    Registry {
        /// The manifest key.
        key: String,
        /// The registry's answer.
        #[source]
        source: RegistryError,
    },
}

/// Where schemas come from for a deployment: the registry (on a broker)
/// or the schema files themselves (`onceflow test`, which numbers them).
pub trait SchemaSource: Send + Sync {
    /// The schema with this id, or why not.
    fn schema(&self, id: u32) -> Result<Arc<Parsed>, FormatError>;
    /// The id of `schema` (its text, of `kind`) under `subject`,
    /// registering it if the subject does not have it yet (the registry
    /// checks compatibility).
    fn id_of(&self, subject: &str, text: &str, kind: SchemaKind) -> Result<u32, SetupError>;
}

/// The schema files a manifest names, by their path as written (relative
/// to the manifest): read from disk, or sent with a deploy.
#[derive(Debug, Clone, Default)]
pub struct SchemaFiles(pub BTreeMap<String, String>);

impl SchemaFiles {
    /// Reads every schema file `manifest` names from beside it.
    pub fn read(manifest: &Manifest) -> Result<Self, SetupError> {
        let mut files = BTreeMap::new();
        for path in schema_paths(manifest) {
            let full = manifest.dir().join(&path);
            let text = std::fs::read(&full).map_err(|e| SetupError::File {
                path: full.clone(),
                message: e.to_string(),
            })?;
            if text.len() > MAX_SCHEMA_BYTES {
                return Err(SetupError::File {
                    path: full,
                    message: format!(
                        "{} bytes, more than the {} a schema may have",
                        text.len(),
                        MAX_SCHEMA_BYTES
                    ),
                });
            }
            let text = String::from_utf8(text).map_err(|_| SetupError::File {
                path: full.clone(),
                message: "not UTF-8 text".to_owned(),
            })?;
            files.insert(path_key(&path), text);
        }
        Ok(Self(files))
    }

    fn get(&self, manifest: &Manifest, path: &Path) -> Result<&str, SetupError> {
        self.0
            .get(&path_key(path))
            .map(String::as_str)
            .ok_or_else(|| SetupError::File {
                path: manifest.dir().join(path),
                message: "not sent with the deployment (`onceflow deploy` sends the schema \
                          files its manifest names)"
                    .to_owned(),
            })
    }
}

/// Every schema file the manifest names, each once.
pub fn schema_paths(manifest: &Manifest) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = manifest
        .input_formats
        .values()
        .chain(manifest.output_formats.values())
        .filter_map(|f| f.schema.clone())
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

fn path_key(path: &Path) -> String {
    path.to_string_lossy().replace('\\', "/")
}

/// The registry subject of a topic's values (Confluent's
/// TopicNameStrategy).
pub fn value_subject(topic: &str) -> String {
    format!("{topic}-value")
}

/// How one input's values are read.
enum Decoder {
    Json,
    Avro {
        reader: Option<Arc<AvroSchema>>,
        payload: bool,
    },
    JsonSchema {
        reader: Option<Arc<JsonSchema>>,
    },
    Protobuf {
        reader: Option<Arc<ProtoSchema>>,
        message: Option<String>,
        payload: bool,
    },
}

/// How one output's values are written.
enum Encoder {
    Json,
    Avro {
        id: u32,
        schema: Arc<AvroSchema>,
        payload: bool,
    },
    JsonSchema {
        id: u32,
        schema: Arc<JsonSchema>,
    },
    Protobuf {
        id: u32,
        schema: Arc<ProtoSchema>,
        message: protobuf::ProtoMessage,
        /// The message's indexes, as written after the id.
        indexes: Vec<u8>,
        payload: bool,
    },
}

/// The header an input's value of `as = "payload"` carries its writer's
/// schema id in (decimal text).
pub const SCHEMA_ID_HEADER: &str = "onceflow.schema-id";

/// The header a Protobuf input's value of `as = "payload"` carries its
/// message's full name in.
pub const MESSAGE_HEADER: &str = "onceflow.message";

/// A value as the processor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The value: JSON text, or the payload for `as = "payload"`.
    pub value: Vec<u8>,
    /// Headers the host adds to the record's (`as = "payload"`: the schema
    /// id, the Protobuf message).
    pub headers: Vec<(&'static str, Vec<u8>)>,
}

impl Decoded {
    fn json(value: Vec<u8>) -> Self {
        Self {
            value,
            headers: Vec::new(),
        }
    }
}

/// A deployment's formats: its inputs' decoders and its outputs' encoders.
pub struct Codecs {
    inputs: Vec<(String, Decoder)>,
    /// (alias, topic, encoder).
    outputs: Vec<(String, String, Encoder)>,
    source: Option<Arc<dyn SchemaSource>>,
    /// Writer schemas by id, as fetched (ids are immutable).
    seen: Mutex<HashMap<u32, Arc<Parsed>>>,
    /// Ids refused lately (unknown, another tenant's, not Avro), with why
    /// and when: a run of poison values naming one asks the registry once
    /// a minute, not once a value.
    refused: Mutex<HashMap<u32, (std::time::Instant, String)>>,
}

/// How long a refused schema id is not asked about again.
const REFUSAL_TTL: std::time::Duration = std::time::Duration::from_secs(60);

impl std::fmt::Debug for Codecs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codecs")
            .field(
                "inputs",
                &self.inputs.iter().map(|(t, _)| t).collect::<Vec<_>>(),
            )
            .field(
                "outputs",
                &self.outputs.iter().map(|(a, _, _)| a).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Codecs {
    /// The codecs of `manifest`, or `None` when every value is plain
    /// bytes. Output schemas are parsed and given their ids under
    /// `<topic>-value` (registered if new: the registry checks them
    /// against the subject's earlier versions).
    pub fn for_manifest(
        manifest: &Manifest,
        files: &SchemaFiles,
        source: Option<Arc<dyn SchemaSource>>,
    ) -> Result<Option<Arc<Self>>, SetupError> {
        if manifest.input_formats.is_empty() && manifest.output_formats.is_empty() {
            return Ok(None);
        }
        let parse =
            |key: &str, path: &Path, kind: SchemaKind| -> Result<(String, Parsed), SetupError> {
                let text = files.get(manifest, path)?;
                let schema = Parsed::parse(kind, text).map_err(|message| SetupError::Schema {
                    path: path.to_path_buf(),
                    key: key.to_owned(),
                    message,
                })?;
                Ok((text.to_owned(), schema))
            };
        let need_source =
            |key: &str, f: &ValueFormat| -> Result<Arc<dyn SchemaSource>, SetupError> {
                source.clone().ok_or(SetupError::NoRegistry {
                    key: key.to_owned(),
                    format: f.format.name(),
                })
            };
        let message_of = |key: &str, f: &ValueFormat, schema: &ProtoSchema| {
            schema
                .message(f.message.as_deref())
                .map_err(|message| SetupError::Schema {
                    path: f.schema.clone().unwrap_or_default(),
                    key: format!("{key}.message"),
                    message,
                })
        };
        let mut inputs = Vec::new();
        for (topic, f) in &manifest.input_formats {
            let key = format!("inputs.{topic}");
            let payload = f.deliver == Deliver::Payload;
            let reader = |kind| -> Result<Option<Parsed>, SetupError> {
                need_source(&key, f)?;
                f.schema
                    .as_ref()
                    .map(|path| parse(&key, path, kind).map(|(_, p)| p))
                    .transpose()
            };
            let decoder = match f.format {
                Format::Json => Decoder::Json,
                Format::Avro => Decoder::Avro {
                    reader: match reader(SchemaKind::Avro)? {
                        Some(Parsed::Avro(s)) => Some(Arc::new(s)),
                        _ => None,
                    },
                    payload,
                },
                Format::JsonSchema => Decoder::JsonSchema {
                    reader: match reader(SchemaKind::Json)? {
                        Some(Parsed::Json(s)) => Some(Arc::new(s)),
                        _ => None,
                    },
                },
                Format::Protobuf => {
                    let reader = match reader(SchemaKind::Protobuf)? {
                        Some(Parsed::Protobuf(s)) => {
                            message_of(&key, f, &s)?;
                            Some(Arc::new(s))
                        }
                        _ => None,
                    };
                    Decoder::Protobuf {
                        reader,
                        message: f.message.clone(),
                        payload,
                    }
                }
                Format::Bytes => continue,
            };
            inputs.push((topic.clone(), decoder));
        }
        let mut outputs = Vec::new();
        for (alias, f) in &manifest.output_formats {
            let key = format!("outputs.{alias}");
            let payload = f.deliver == Deliver::Payload;
            let encoder = match (f.format, SchemaKind::of(f.format), &f.schema) {
                (Format::Json, _, _) => Encoder::Json,
                (_, Some(kind), Some(path)) => {
                    let source = need_source(&key, f)?;
                    let (text, schema) = parse(&key, path, kind)?;
                    let topic = &manifest.outputs[alias];
                    let message = match &schema {
                        Parsed::Protobuf(s) => Some(message_of(&key, f, s)?),
                        _ => None,
                    };
                    let id = source.id_of(&value_subject(topic), &text, kind)?;
                    match (schema, message) {
                        (Parsed::Avro(schema), _) => Encoder::Avro {
                            id,
                            schema: Arc::new(schema),
                            payload,
                        },
                        (Parsed::Json(schema), _) => Encoder::JsonSchema {
                            id,
                            schema: Arc::new(schema),
                        },
                        (Parsed::Protobuf(schema), Some(message)) => Encoder::Protobuf {
                            id,
                            indexes: schema.indexes_of(&message),
                            schema: Arc::new(schema),
                            message,
                            payload,
                        },
                        (Parsed::Protobuf(_), None) => continue,
                    }
                }
                _ => continue,
            };
            outputs.push((alias.clone(), manifest.outputs[alias].clone(), encoder));
        }
        Ok(Some(Arc::new(Self {
            inputs,
            outputs,
            source,
            seen: Mutex::default(),
            refused: Mutex::default(),
        })))
    }

    /// The format of `topic`'s values, for messages.
    pub fn format_name(&self, topic: &str) -> &'static str {
        match self.inputs.iter().find(|(t, _)| t == topic) {
            Some((_, Decoder::Json)) => "JSON",
            Some((_, Decoder::Avro { .. })) => "Avro",
            Some((_, Decoder::JsonSchema { .. })) => "JSON of its JSON Schema",
            Some((_, Decoder::Protobuf { .. })) => "Protobuf",
            None => "bytes",
        }
    }

    /// Whether values of `topic` are decoded.
    pub fn decodes(&self, topic: &str) -> bool {
        self.inputs.iter().any(|(t, _)| t == topic)
    }

    /// The value of a record of `topic` as the processor sees it: `None`
    /// when the topic's values are bytes as they are.
    pub fn decode(&self, topic: &str, value: &[u8]) -> Option<Result<Decoded, FormatError>> {
        let (_, decoder) = self.inputs.iter().find(|(t, _)| t == topic)?;
        Some(match decoder {
            Decoder::Json => check_json(value).map(|()| Decoded::json(value.to_vec())),
            Decoder::Avro { reader, payload } => {
                self.decode_avro(value, reader.as_deref(), *payload)
            }
            Decoder::JsonSchema { reader } => self
                .decode_json_schema(value, reader.as_deref())
                .map(Decoded::json),
            Decoder::Protobuf {
                reader,
                message,
                payload,
            } => self.decode_protobuf(value, reader.as_deref(), message.as_deref(), *payload),
        })
    }

    fn decode_json_schema(
        &self,
        value: &[u8],
        reader: Option<&JsonSchema>,
    ) -> Result<Vec<u8>, FormatError> {
        let (id, payload) = unframe(value)?;
        let writer = self.writer(id)?;
        let Parsed::Json(writer) = &*writer else {
            return Err(wrong_kind(id, &writer, "json-schema"));
        };
        let json: serde_json::Value = serde_json::from_slice(payload)
            .map_err(|e| FormatError::Invalid(format!("schema id {id}: not JSON: {e}")))?;
        writer
            .check(&json)
            .map_err(|e| FormatError::Invalid(format!("schema id {id}: {e}")))?;
        if let Some(reader) = reader {
            reader.check(&json).map_err(|e| {
                FormatError::Invalid(format!("against the input's own schema: {e}"))
            })?;
        }
        Ok(payload.to_vec())
    }

    fn decode_avro(
        &self,
        value: &[u8],
        reader: Option<&AvroSchema>,
        payload: bool,
    ) -> Result<Decoded, FormatError> {
        let (id, datum) = unframe(value)?;
        let writer = self.writer(id)?;
        let Parsed::Avro(writer) = &*writer else {
            return Err(wrong_kind(id, &writer, "avro"));
        };
        let invalid = |e| FormatError::Invalid(format!("schema id {id}: {e}"));
        match (payload, reader) {
            (true, Some(reader)) => Ok(Decoded {
                value: writer.to_reader_datum(datum, reader).map_err(invalid)?,
                headers: vec![(SCHEMA_ID_HEADER, id.to_string().into_bytes())],
            }),
            _ => writer
                .decode(datum, reader)
                .map(Decoded::json)
                .map_err(invalid),
        }
    }

    fn decode_protobuf(
        &self,
        value: &[u8],
        reader: Option<&ProtoSchema>,
        message: Option<&str>,
        payload: bool,
    ) -> Result<Decoded, FormatError> {
        let (id, framed) = unframe(value)?;
        let writer = self.writer(id)?;
        let Parsed::Protobuf(writer) = &*writer else {
            return Err(wrong_kind(id, &writer, "protobuf"));
        };
        let invalid = |e| FormatError::Invalid(format!("schema id {id}: {e}"));
        if payload {
            let (message, bytes) = writer.read(framed).map_err(invalid)?;
            writer.check(&message, bytes).map_err(invalid)?;
            return Ok(Decoded {
                value: bytes.to_vec(),
                headers: vec![
                    (SCHEMA_ID_HEADER, id.to_string().into_bytes()),
                    (MESSAGE_HEADER, message.full_name().as_bytes().to_vec()),
                ],
            });
        }
        writer
            .decode(framed, reader.map(|r| (r, message)))
            .map(Decoded::json)
            .map_err(invalid)
    }

    fn writer(&self, id: u32) -> Result<Arc<Parsed>, FormatError> {
        if let Some(s) = self.seen.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
            return Ok(s.clone());
        }
        if let Some((at, why)) = self
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            && at.elapsed() < REFUSAL_TTL
        {
            return Err(FormatError::Invalid(why.clone()));
        }
        let source = self
            .source
            .as_ref()
            .ok_or_else(|| FormatError::Unavailable("no schema registry".to_owned()))?;
        let schema = match source.schema(id) {
            Ok(s) => s,
            Err(FormatError::Invalid(why)) => {
                let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
                if refused.len() >= 4096 {
                    refused.retain(|_, (at, _)| at.elapsed() < REFUSAL_TTL);
                }
                refused.insert(id, (std::time::Instant::now(), why.clone()));
                return Err(FormatError::Invalid(why));
            }
            Err(e) => return Err(e),
        };
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, schema.clone());
        Ok(schema)
    }

    /// An emitted value of `alias` as written to its topic: `None` when the
    /// alias's values are bytes as they are.
    pub fn encode(&self, alias: &str, value: &[u8]) -> Option<Result<Vec<u8>, String>> {
        let (_, _, encoder) = self.outputs.iter().find(|(a, _, _)| a == alias)?;
        Some(match encoder {
            Encoder::Json => check_json(value)
                .map(|()| value.to_vec())
                .map_err(|e| e.to_string()),
            Encoder::Avro {
                id,
                schema,
                payload: false,
            } => schema.encode(value).map(|datum| frame(*id, &datum)),
            Encoder::Avro {
                id,
                schema,
                payload: true,
            } => schema.check_datum(value).map(|()| frame(*id, value)),
            Encoder::JsonSchema { id, schema } => serde_json::from_slice(value)
                .map_err(|e| format!("the value is not JSON: {e}"))
                .and_then(|json| schema.check(&json))
                .map(|()| frame(*id, value)),
            Encoder::Protobuf {
                id,
                schema,
                message,
                indexes,
                payload: false,
            } => {
                let mut framed = frame(*id, indexes);
                schema
                    .encode_after(message, value, &mut framed)
                    .map(|()| framed)
            }
            Encoder::Protobuf {
                id,
                schema,
                message,
                indexes,
                payload: true,
            } => schema.check(message, value).map(|()| {
                let mut framed = frame(*id, indexes);
                framed.extend_from_slice(value);
                framed
            }),
        })
    }
}

fn wrong_kind(id: u32, writer: &Parsed, format: &str) -> FormatError {
    FormatError::Invalid(format!(
        "schema id {id} is a {} schema, but the topic's format is {format}",
        writer.kind().api_name()
    ))
}

impl Codecs {
    /// A value written to output `topic` as JSON again (for people:
    /// `onceflow test` prints outputs so); `None` when the topic's values
    /// are not encoded.
    pub fn output_as_json(
        &self,
        topic: &str,
        value: &[u8],
    ) -> Option<Result<Vec<u8>, FormatError>> {
        let (_, _, encoder) = self.outputs.iter().find(|(_, t, _)| t == topic)?;
        Some(match encoder {
            Encoder::Json => Ok(value.to_vec()),
            Encoder::Avro { .. } => self.decode_avro(value, None, false).map(|d| d.value),
            Encoder::JsonSchema { .. } => unframe(value).map(|(_, payload)| payload.to_vec()),
            Encoder::Protobuf { .. } => self
                .decode_protobuf(value, None, None, false)
                .map(|d| d.value),
        })
    }
}

fn check_json(value: &[u8]) -> Result<(), FormatError> {
    serde_json::from_slice::<serde::de::IgnoredAny>(value)
        .map(|_| ())
        .map_err(|e| FormatError::Invalid(format!("the value is not JSON: {e}")))
}

/// A value in the Confluent wire format: byte 0, the id, the payload.
pub fn frame(id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(MAGIC);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The schema id and payload of a value in the Confluent wire format.
pub fn unframe(value: &[u8]) -> Result<(u32, &[u8]), FormatError> {
    match value {
        [MAGIC, a, b, c, d, payload @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), payload)),
        [first, ..] if *first != MAGIC => Err(FormatError::Invalid(format!(
            "not in the schema registry's wire format: the first byte is {first:#04x}, not 0 \
             (was it written by a serializer that uses a schema registry?)"
        ))),
        _ => Err(FormatError::Invalid(format!(
            "{} bytes: too short for the schema registry's wire format (a 0 byte, a 4-byte \
             schema id, then the payload)",
            value.len()
        ))),
    }
}

/// Schemas from the schema files themselves, for `onceflow test`: each
/// distinct schema text gets an id, from 1 in the order first asked for.
#[derive(Default)]
pub struct LocalSchemas {
    by_id: Mutex<Vec<(SchemaKind, String, Arc<Parsed>)>>,
}

impl LocalSchemas {
    /// The id of `text` (of `kind`), given one if new.
    pub fn add(&self, kind: SchemaKind, text: &str) -> Result<u32, String> {
        let mut by_id = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = by_id.iter().position(|(k, t, _)| *k == kind && t == text) {
            return Ok(i as u32 + 1);
        }
        let schema = Parsed::parse(kind, text)?;
        by_id.push((kind, text.to_owned(), Arc::new(schema)));
        Ok(by_id.len() as u32)
    }
}

impl SchemaSource for LocalSchemas {
    fn schema(&self, id: u32) -> Result<Arc<Parsed>, FormatError> {
        let by_id = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        by_id
            .get((id as usize).wrapping_sub(1))
            .map(|(_, _, s)| s.clone())
            .ok_or_else(|| FormatError::Invalid(format!("schema id {id} is unknown")))
    }

    fn id_of(&self, _subject: &str, text: &str, kind: SchemaKind) -> Result<u32, SetupError> {
        self.add(kind, text).map_err(|message| SetupError::Schema {
            path: PathBuf::new(),
            key: "schema".to_owned(),
            message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_format_round_trips_and_names_what_is_wrong() {
        let framed = frame(258, b"abc");
        assert_eq!(framed, b"\x00\x00\x00\x01\x02abc");
        let (id, payload) = unframe(&framed).unwrap();
        assert_eq!((id, payload), (258, &b"abc"[..]));
        let e = unframe(br#"{"a":1}"#).unwrap_err().to_string();
        assert!(e.contains("first byte is 0x7b"), "{e}");
        let e = unframe(b"\x00\x00").unwrap_err().to_string();
        assert!(e.contains("2 bytes: too short"), "{e}");
    }

    /// Refuses every id, counting the questions.
    struct Refusing(std::sync::atomic::AtomicU32);

    impl SchemaSource for Refusing {
        fn schema(&self, id: u32) -> Result<Arc<Parsed>, FormatError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(FormatError::Invalid(format!("schema id {id} is unknown")))
        }
        fn id_of(&self, _: &str, _: &str, _: SchemaKind) -> Result<u32, SetupError> {
            Ok(1)
        }
    }

    #[test]
    fn a_refused_id_is_asked_about_once_a_minute_not_once_a_value() {
        let manifest = crate::manifest::Manifest::parse(
            "name = \"p\"\ntenant = \"t\"\ninputs = [{ topic = \"in\", format = \"avro\" }]\n\
             [build]\nlanguage = \"rust\"\n",
            "/x/onceflow.toml".into(),
        )
        .unwrap();
        let source = Arc::new(Refusing(0.into()));
        let codecs = Codecs::for_manifest(&manifest, &SchemaFiles::default(), Some(source.clone()))
            .unwrap()
            .expect("an avro input");
        for _ in 0..100 {
            let e = codecs
                .decode("in", &frame(7, b"x"))
                .expect("decoded topic")
                .unwrap_err();
            assert!(e.to_string().contains("schema id 7 is unknown"), "{e}");
        }
        assert_eq!(source.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert!(
            codecs.decode("other", b"x").is_none(),
            "a topic without a format"
        );
    }

    #[test]
    fn as_payload_values_are_resolved_to_the_readers_schema_and_outputs_checked() {
        let v1 = r#"{"type":"record","name":"P","fields":[{"name":"a","type":"string"}]}"#;
        let v2 = r#"{"type":"record","name":"P","fields":[{"name":"a","type":"string"},
            {"name":"n","type":"long","default":7}]}"#;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("v2.avsc"), v2).unwrap();
        std::fs::write(
            dir.path().join("m.proto"),
            "syntax = \"proto3\"; message M { string a = 1; }",
        )
        .unwrap();
        let manifest = crate::manifest::Manifest::parse(
            "name = \"p\"\ntenant = \"t\"\n\
             inputs = [{ topic = \"in\", format = \"avro\", schema = \"v2.avsc\", as = \"payload\" }]\n\
             [build]\nlanguage = \"rust\"\n\
             [outputs]\n\
             a = { topic = \"a\", format = \"avro\", schema = \"v2.avsc\", as = \"payload\" }\n\
             m = { topic = \"m\", format = \"protobuf\", schema = \"m.proto\", as = \"payload\" }\n",
            dir.path().join("onceflow.toml"),
        )
        .unwrap();
        let local = Arc::new(LocalSchemas::default());
        let v1_id = local.add(SchemaKind::Avro, v1).unwrap();
        let files = SchemaFiles::read(&manifest).unwrap();
        let codecs = Codecs::for_manifest(&manifest, &files, Some(local.clone()))
            .unwrap()
            .unwrap();
        // A v1 datum ("x") reaches the processor as a v2 datum: the default
        // filled in, the writer's id in a header.
        let Parsed::Avro(s1) = Parsed::parse(SchemaKind::Avro, v1).unwrap() else {
            unreachable!()
        };
        let datum = s1.encode(br#"{"a":"x"}"#).unwrap();
        let decoded = codecs.decode("in", &frame(v1_id, &datum)).unwrap().unwrap();
        assert_eq!(decoded.value, b"\x02x\x0e", "\"x\", then 7 zig-zagged");
        assert_eq!(decoded.headers, [(SCHEMA_ID_HEADER, b"1".to_vec())]);
        // Emitted as it is: framed with v2's id; what is not a v2 datum is
        // refused.
        let out = codecs.encode("a", &decoded.value).unwrap().unwrap();
        assert_eq!(&out[5..], &decoded.value[..]);
        let e = codecs.encode("a", b"\x02x").unwrap().unwrap_err();
        assert!(e.contains("not an Avro datum"), "{e}");
        // A Protobuf message's bytes: framed with its indexes ([0]: 0).
        let out = codecs.encode("m", b"\x0a\x01z").unwrap().unwrap();
        assert_eq!(
            &out[4..],
            b"\x03\x00\x0a\x01z",
            "id 3, then [0], then the bytes"
        );
        let e = codecs.encode("m", b"\x0a\x09z").unwrap().unwrap_err();
        assert!(e.contains("not a M message"), "{e}");
    }
}
