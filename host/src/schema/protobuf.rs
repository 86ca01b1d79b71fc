//! Protobuf schemas: a `.proto` file compiled in the host (protox, no
//! `protoc`), its messages' values read to JSON and written from JSON
//! (prost-reflect, proto3's JSON mapping with two choices made for
//! processors: fields under their `.proto` names, and 64-bit integers as
//! JSON numbers; docs/formats.md, "Protobuf as JSON").
//!
//! A value in the Confluent wire format names its message by *message
//! indexes* between the schema id and the payload: how many, then each
//! one (zig-zag varints), the path from the file's top-level messages down
//! through nested ones; the common `[0]` (the file's first message) is the
//! single byte 0.

use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, FileDescriptor, MessageDescriptor,
    SerializeOptions,
};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

/// The name a schema's text is compiled under.
const FILE_NAME: &str = "schema.proto";

/// Most message indexes a value may carry (nesting of messages in a file).
const MAX_INDEXES: usize = 32;

/// A `.proto` file, compiled: its messages by their place in the file.
#[derive(Debug, Clone)]
pub struct ProtoSchema {
    file: FileDescriptor,
}

/// A message of a [`ProtoSchema`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoMessage(MessageDescriptor);

impl ProtoMessage {
    /// Its full name (`acme.wallet.Payment`).
    pub fn full_name(&self) -> &str {
        self.0.full_name()
    }
}

/// The schema's own text as the only file, beside Google's well-known
/// types (`google/protobuf/timestamp.proto` and the others).
struct OneFile(String);

impl FileResolver for OneFile {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        if name == FILE_NAME {
            File::from_source(name, &self.0)
        } else {
            Err(protox::Error::file_not_found(name))
        }
    }
}

impl ProtoSchema {
    /// Compiles `text`, a `.proto` file that imports nothing but Google's
    /// well-known types.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut resolver = ChainFileResolver::new();
        resolver.add(OneFile(text.to_owned()));
        resolver.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler.include_imports(true);
        compiler.open_file(FILE_NAME).map_err(|e| {
            let e = e.to_string();
            if e.contains("not found") {
                format!(
                    "{e}: a schema may import only Google's well-known types \
                     (google/protobuf/*.proto); put the messages it needs in the same file"
                )
            } else {
                format!("not a valid .proto file: {e}")
            }
        })?;
        let pool = DescriptorPool::from_file_descriptor_set(compiler.file_descriptor_set())
            .map_err(|e| format!("not a valid .proto file: {e}"))?;
        let file = pool
            .get_file_by_name(FILE_NAME)
            .ok_or_else(|| "the .proto file did not compile to a file".to_owned())?;
        if file.messages().len() == 0 {
            return Err("the .proto file declares no message".to_owned());
        }
        Ok(Self { file })
    }

    /// The message `name` (its full name, `pkg.Payment`, or its name in
    /// the file, `Payment` or `Outer.Inner`), or the file's first message.
    pub fn message(&self, name: Option<&str>) -> Result<ProtoMessage, String> {
        self.descriptor(name).map(ProtoMessage)
    }

    fn descriptor(&self, name: Option<&str>) -> Result<MessageDescriptor, String> {
        let Some(name) = name else {
            return self
                .file
                .messages()
                .next()
                .ok_or_else(|| "the .proto file declares no message".to_owned());
        };
        let package = self.file.package_name();
        let full = if package.is_empty() || name.starts_with(&format!("{package}.")) {
            name.to_owned()
        } else {
            format!("{package}.{name}")
        };
        self.file
            .parent_pool()
            .get_message_by_name(&full)
            .filter(|m| m.parent_file() == self.file)
            .ok_or_else(|| {
                format!(
                    "the .proto file has no message {name:?} (its messages: {})",
                    self.file
                        .messages()
                        .map(|m| m.name().to_owned())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }

    /// The message at `indexes` (top-level index, then nested ones).
    fn message_at(&self, indexes: &[i64]) -> Result<MessageDescriptor, String> {
        let missing = || {
            format!(
                "message indexes {indexes:?} name no message of the schema (its first \
                 message is [0])"
            )
        };
        let (first, rest) = indexes.split_first().ok_or_else(missing)?;
        let mut message = usize::try_from(*first)
            .ok()
            .and_then(|i| self.file.messages().nth(i))
            .ok_or_else(missing)?;
        for i in rest {
            message = usize::try_from(*i)
                .ok()
                .and_then(|i| message.child_messages().nth(i))
                .ok_or_else(missing)?;
        }
        Ok(message)
    }

    /// The message indexes of `message`, as the wire format writes them.
    pub fn indexes_of(&self, message: &ProtoMessage) -> Vec<u8> {
        let mut path = Vec::new();
        let mut at = message.0.clone();
        loop {
            let siblings: Vec<MessageDescriptor> = match at.parent_message() {
                Some(parent) => parent.child_messages().collect(),
                None => self.file.messages().collect(),
            };
            path.push(siblings.iter().position(|m| *m == at).unwrap_or(0) as i64);
            match at.parent_message() {
                Some(parent) => at = parent,
                None => break,
            }
        }
        path.reverse();
        let mut out = Vec::new();
        if path == [0] {
            out.push(0);
        } else {
            write_zigzag(path.len() as i64, &mut out);
            for i in path {
                write_zigzag(i, &mut out);
            }
        }
        out
    }

    /// Reads a payload written with `self` (the writer's schema: message
    /// indexes, then the message) as JSON text, read with `reader`'s
    /// message of the same full name when given (else its `message`, or
    /// its first).
    pub fn decode(
        &self,
        payload: &[u8],
        reader: Option<(&ProtoSchema, Option<&str>)>,
    ) -> Result<Vec<u8>, String> {
        let (ProtoMessage(message), bytes) = self.read(payload)?;
        let message = match reader {
            None => message,
            Some((reader, name)) => reader
                .file
                .parent_pool()
                .get_message_by_name(message.full_name())
                .map_or_else(|| reader.descriptor(name), Ok)?,
        };
        to_json(&message, bytes)
    }

    /// The message a payload names and its bytes (checked to decode).
    pub fn read<'a>(&self, payload: &'a [u8]) -> Result<(ProtoMessage, &'a [u8]), String> {
        let (indexes, bytes) = read_indexes(payload)?;
        Ok((ProtoMessage(self.message_at(&indexes)?), bytes))
    }

    /// Writes JSON text as `message`: the message indexes, then the
    /// message's bytes.
    pub fn encode(&self, message: &ProtoMessage, json: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = self.indexes_of(message);
        self.encode_after(message, json, &mut out)?;
        Ok(out)
    }

    /// Writes JSON text as `message`'s bytes after `out` (which holds its
    /// indexes: an output's are worked out once, not once a value).
    pub fn encode_after(
        &self,
        message: &ProtoMessage,
        json: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        let mut de = serde_json::Deserializer::from_slice(json);
        let value = DynamicMessage::deserialize_with_options(
            message.0.clone(),
            &mut de,
            &DeserializeOptions::new(),
        )
        .and_then(|m| de.end().map(|()| m))
        .map_err(|e| format!("not a {} message as JSON: {e}", message.full_name()))?;
        value
            .encode(out)
            .map_err(|e| format!("cannot write a {}: {e}", message.full_name()))
    }
}

impl ProtoSchema {
    /// Checks that `bytes` are a `message`.
    pub fn check(&self, message: &ProtoMessage, bytes: &[u8]) -> Result<(), String> {
        DynamicMessage::decode(message.0.clone(), bytes)
            .map(|_| ())
            .map_err(|e| format!("not a {} message: {e}", message.full_name()))
    }
}

/// A message's bytes as JSON text: fields under their `.proto` names,
/// every field present (a zero value too), 64-bit integers as numbers.
fn to_json(message: &MessageDescriptor, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let value = DynamicMessage::decode(message.clone(), bytes)
        .map_err(|e| format!("not a {} message: {e}", message.full_name()))?;
    let mut out = serde_json::Serializer::new(Vec::with_capacity(bytes.len() * 2 + 16));
    value
        .serialize_with_options(
            &mut out,
            &SerializeOptions::new()
                .stringify_64_bit_integers(false)
                .use_proto_field_name(true)
                .skip_default_fields(false),
        )
        .map_err(|e| format!("a {} cannot be written as JSON: {e}", message.full_name()))?;
    Ok(out.into_inner())
}

/// The message indexes at the start of `payload`, and the bytes after.
fn read_indexes(payload: &[u8]) -> Result<(Vec<i64>, &[u8]), String> {
    let mut at = payload;
    let count = read_zigzag(&mut at)?;
    if count == 0 {
        return Ok((vec![0], at));
    }
    let count = usize::try_from(count)
        .ok()
        .filter(|c| *c <= MAX_INDEXES && *c <= at.len())
        .ok_or_else(|| {
            format!(
                "the value claims {count} message indexes: not a Protobuf value in the schema \
                 registry's wire format (at most {MAX_INDEXES})"
            )
        })?;
    let mut indexes = Vec::with_capacity(count);
    for _ in 0..count {
        indexes.push(read_zigzag(&mut at)?);
    }
    Ok((indexes, at))
}

fn read_zigzag(at: &mut &[u8]) -> Result<i64, String> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = at
            .split_first()
            .ok_or_else(|| "the value ends inside its message indexes".to_owned())?;
        *at = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    Err("a message index is not a varint".to_owned())
}

fn write_zigzag(value: i64, out: &mut Vec<u8>) {
    let mut v = ((value << 1) ^ (value >> 63)) as u64;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAYMENTS: &str = r#"
        syntax = "proto3";
        package wallet;
        import "google/protobuf/timestamp.proto";
        message Payment {
          string account = 1;
          int64 amount = 2;
          google.protobuf.Timestamp at = 3;
          message Note { string text = 1; }
          Note note = 4;
          map<string, int32> tags = 5;
        }
        message Refund { string account = 1; int64 amount = 2; }
    "#;

    #[test]
    fn values_round_trip_through_json_with_their_message_indexes() {
        let schema = ProtoSchema::parse(PAYMENTS).unwrap();
        let payment = schema.message(None).unwrap();
        assert_eq!(payment.full_name(), "wallet.Payment");
        let bytes = schema
            .encode(
                &payment,
                br#"{"account":"a-1","amount":9007199254740993,"at":"2026-12-07T00:00:00Z","tags":{"x":1}}"#,
            )
            .unwrap();
        assert_eq!(bytes[0], 0, "[0] is the single byte 0");
        let json = String::from_utf8(schema.decode(&bytes, None).unwrap()).unwrap();
        assert_eq!(
            json,
            r#"{"account":"a-1","amount":9007199254740993,"at":"2026-12-07T00:00:00Z","tags":{"x":1}}"#
        );
        // A zero value is there too: every field of the message.
        let bytes = schema.encode(&payment, br#"{"account":"b"}"#).unwrap();
        let json = String::from_utf8(schema.decode(&bytes, None).unwrap()).unwrap();
        assert_eq!(json, r#"{"account":"b","amount":0,"tags":{}}"#);

        let refund = schema.message(Some("Refund")).unwrap();
        let bytes = schema
            .encode(&refund, br#"{"account":"c","amount":-5}"#)
            .unwrap();
        assert_eq!(&bytes[..2], &[2, 2], "one index, 1, zig-zagged");
        let json = String::from_utf8(schema.decode(&bytes, None).unwrap()).unwrap();
        assert_eq!(json, r#"{"account":"c","amount":-5}"#);

        let note = schema.message(Some("wallet.Payment.Note")).unwrap();
        let bytes = schema.encode(&note, br#"{"text":"t"}"#).unwrap();
        assert_eq!(&bytes[..3], &[4, 0, 0], "two indexes, [0, 0]");
        assert_eq!(schema.decode(&bytes, None).unwrap(), br#"{"text":"t"}"#);
    }

    #[test]
    fn what_does_not_fit_says_what_is_wrong() {
        let schema = ProtoSchema::parse(PAYMENTS).unwrap();
        let payment = schema.message(None).unwrap();
        let e = schema
            .encode(&payment, br#"{"account":"a","amount":"x"}"#)
            .unwrap_err();
        assert!(e.contains("not a wallet.Payment message as JSON"), "{e}");
        let e = schema.encode(&payment, br#"{"acount":"a"}"#).unwrap_err();
        assert!(e.contains("acount"), "{e}");
        let e = schema.message(Some("Balance")).unwrap_err();
        assert!(e.contains("its messages: Payment, Refund"), "{e}");
        let e = schema.decode(&[6, 2, 2, 2, 1], None).unwrap_err();
        assert!(e.contains("name no message"), "{e}");
        let e = schema.decode(&[0, 0x0a, 0x50, b'a'], None).unwrap_err();
        assert!(e.contains("not a wallet.Payment message"), "{e}");
        let e = schema.decode(&[0x80], None).unwrap_err();
        assert!(e.contains("ends inside its message indexes"), "{e}");
        let e = ProtoSchema::parse("syntax = \"proto3\"; import \"other.proto\"; message A {}")
            .unwrap_err();
        assert!(e.contains("well-known types"), "{e}");
        let e = ProtoSchema::parse("message {").unwrap_err();
        assert!(e.contains("not a valid .proto file"), "{e}");
    }

    #[test]
    fn a_reader_reads_a_writers_message_by_its_name() {
        let writer = ProtoSchema::parse(
            "syntax = \"proto3\"; package w; message B { string account = 1; int64 balance = 2; }",
        )
        .unwrap();
        let reader = ProtoSchema::parse(
            "syntax = \"proto3\"; package w; message B { string account = 1; int64 balance = 2; \
             string currency = 3; }",
        )
        .unwrap();
        let bytes = writer
            .encode(
                &writer.message(None).unwrap(),
                br#"{"account":"a","balance":3}"#,
            )
            .unwrap();
        let json = writer.decode(&bytes, Some((&reader, None))).unwrap();
        assert_eq!(json, br#"{"account":"a","balance":3,"currency":""}"#);
    }

    #[test]
    fn random_payloads_never_panic() {
        let schema = ProtoSchema::parse(PAYMENTS).unwrap();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for n in 0..2000 {
            let mut payload = Vec::new();
            for _ in 0..(n % 64) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                payload.push(seed as u8);
            }
            let _ = schema.decode(&payload, None);
        }
    }
}
