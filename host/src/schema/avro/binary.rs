//! Avro's binary encoding, straight between datums and JSON text: the
//! per-record path (a value read with its writer's schema, an emitted value
//! written), without apache-avro's generic `Value` trees on the way in and
//! its per-call name resolution and validation on the way out. What it
//! reads and writes is the Avro specification's binary encoding; the tests
//! check it against apache-avro's.
//!
//! Reading is bounded: every length is checked against the bytes left
//! before anything is allocated, every collection's count too (each item
//! takes at least one byte: [`super::AvroSchema::parse`] refuses arrays of
//! items that take none), and nesting stops at [`MAX_DEPTH`].

use std::collections::BTreeMap;

use apache_avro::Schema;
use apache_avro::schema::{InnerDecimalSchema, UuidSchema};
use apache_avro::types::Value;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use num_bigint::BigInt;

use super::{AvroSchema, decimal_text, write_float};

/// Deepest nesting of records, arrays and maps a value may have
/// (a recursive type read without a bound would take the stack).
pub const MAX_DEPTH: usize = 128;

/// The bytes of a datum still to read.
struct Input<'a> {
    bytes: &'a [u8],
}

impl Input<'_> {
    fn eof(what: &str) -> String {
        format!("the datum ends inside {what}")
    }

    fn byte(&mut self, what: &str) -> Result<u8, String> {
        let (&b, rest) = self.bytes.split_first().ok_or_else(|| Self::eof(what))?;
        self.bytes = rest;
        Ok(b)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], String> {
        if n > self.bytes.len() {
            return Err(format!(
                "{what} claims {n} bytes, {} are left",
                self.bytes.len()
            ));
        }
        let (taken, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(taken)
    }

    /// A zigzag varint (Avro's int and long).
    fn long(&mut self, what: &str) -> Result<i64, String> {
        let mut z: u64 = 0;
        for shift in (0..70).step_by(7) {
            let b = self.byte(what)?;
            if shift == 63 && b > 1 {
                return Err(format!("{what}: a varint longer than 64 bits"));
            }
            z |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok((z >> 1) as i64 ^ -((z & 1) as i64));
            }
        }
        Err(format!("{what}: a varint longer than 64 bits"))
    }

    fn int(&mut self, what: &str) -> Result<i32, String> {
        i32::try_from(self.long(what)?).map_err(|_| format!("{what}: an int out of 32 bits"))
    }

    fn length(&mut self, what: &str) -> Result<usize, String> {
        let n = self.long(what)?;
        usize::try_from(n).map_err(|_| format!("{what}: a negative length {n}"))
    }

    fn bytes(&mut self, what: &str) -> Result<&[u8], String> {
        let n = self.length(what)?;
        self.take(n, what)
    }

    fn string(&mut self, what: &str) -> Result<&str, String> {
        std::str::from_utf8(self.bytes(what)?).map_err(|_| format!("{what}: not UTF-8"))
    }

    /// The count of the next block of an array or map (0: the end); a
    /// negative count is followed by the block's size in bytes.
    fn block(&mut self, what: &str) -> Result<usize, String> {
        let n = self.long(what)?;
        let count = if n < 0 {
            let _size = self.long(what)?;
            n.unsigned_abs()
        } else {
            n as u64
        };
        // Every item takes a byte at least: more than there are is a lie.
        match usize::try_from(count) {
            Ok(c) if c <= self.bytes.len() => Ok(c),
            _ => Err(format!(
                "{what}: a block of {count} items, with {} bytes left",
                self.bytes.len()
            )),
        }
    }
}

fn json_string(out: &mut Vec<u8>, s: &str) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn uuid_text(bytes: &[u8]) -> Result<String, String> {
    let array: [u8; 16] = bytes
        .try_into()
        .map_err(|_| format!("a uuid of {} bytes, not 16", bytes.len()))?;
    Ok(apache_avro::Uuid::from_bytes(array).to_string())
}

impl AvroSchema {
    /// Reads one datum of `self` as JSON text (docs/formats.md, "Avro as
    /// JSON"): every byte of `datum` must belong to it.
    pub(super) fn read_json(&self, datum: &[u8]) -> Result<Vec<u8>, String> {
        let mut input = Input { bytes: datum };
        let mut out = Vec::with_capacity(datum.len() * 2 + 16);
        self.read(&self.schema, &mut input, &mut out, 0)?;
        if !input.bytes.is_empty() {
            return Err(format!(
                "{} bytes left after the Avro datum: the value was not written with this schema",
                input.bytes.len()
            ));
        }
        Ok(out)
    }

    fn read(
        &self,
        schema: &Schema,
        input: &mut Input<'_>,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH} levels"));
        }
        match self.resolve(schema)? {
            Schema::Null => out.extend_from_slice(b"null"),
            Schema::Boolean => match input.byte("a boolean")? {
                0 => out.extend_from_slice(b"false"),
                1 => out.extend_from_slice(b"true"),
                b => return Err(format!("a boolean of byte {b}")),
            },
            Schema::Int | Schema::Date | Schema::TimeMillis => {
                out.extend_from_slice(input.int("an int")?.to_string().as_bytes())
            }
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => {
                out.extend_from_slice(input.long("a long")?.to_string().as_bytes())
            }
            Schema::Float => {
                let b = input.take(4, "a float")?;
                write_float(out, f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))?;
            }
            Schema::Double => {
                let b = input.take(8, "a double")?;
                let mut a = [0; 8];
                a.copy_from_slice(b);
                write_float(out, f64::from_le_bytes(a))?;
            }
            Schema::Bytes => json_string(out, &BASE64.encode(input.bytes("bytes")?)),
            Schema::String => json_string(out, input.string("a string")?),
            Schema::Fixed(f) => json_string(out, &BASE64.encode(input.take(f.size, "a fixed")?)),
            Schema::Enum(e) => {
                let i = input.long("an enum")?;
                let symbol = usize::try_from(i)
                    .ok()
                    .and_then(|i| e.symbols.get(i))
                    .ok_or_else(|| format!("enum {} has no symbol {i}", e.name))?;
                json_string(out, symbol);
            }
            Schema::Uuid(UuidSchema::String) => json_string(out, input.string("a uuid")?),
            Schema::Uuid(UuidSchema::Bytes) => {
                json_string(out, &uuid_text(input.bytes("a uuid")?)?)
            }
            Schema::Uuid(UuidSchema::Fixed(_)) => {
                json_string(out, &uuid_text(input.take(16, "a uuid")?)?)
            }
            Schema::Decimal(d) => {
                let bytes = match &d.inner {
                    InnerDecimalSchema::Bytes => input.bytes("a decimal")?,
                    InnerDecimalSchema::Fixed(f) => input.take(f.size, "a decimal")?,
                };
                json_string(
                    out,
                    &decimal_text(&BigInt::from_signed_bytes_be(bytes), d.scale),
                );
            }
            Schema::Duration(_) => {
                let b = input.take(12, "a duration")?;
                let part = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
                out.extend_from_slice(
                    format!(
                        r#"{{"months":{},"days":{},"millis":{}}}"#,
                        part(0),
                        part(4),
                        part(8)
                    )
                    .as_bytes(),
                );
            }
            Schema::BigDecimal => {
                return Err("big-decimal is read by the generic path".to_owned());
            }
            Schema::Union(u) => {
                let i = input.long("a union's branch")?;
                let branch = usize::try_from(i)
                    .ok()
                    .and_then(|i| u.variants().get(i))
                    .ok_or_else(|| format!("a union has no branch {i}"))?;
                self.read(branch, input, out, depth)?;
            }
            Schema::Array(a) => {
                out.push(b'[');
                let mut first = true;
                loop {
                    let n = input.block("an array")?;
                    if n == 0 {
                        break;
                    }
                    for _ in 0..n {
                        if !first {
                            out.push(b',');
                        }
                        first = false;
                        self.read(&a.items, input, out, depth + 1)?;
                    }
                }
                out.push(b']');
            }
            Schema::Map(m) => {
                // Keys sorted, the last of a repeated key kept: one JSON
                // object per datum, whatever order the writer used.
                let mut entries: BTreeMap<String, Vec<u8>> = BTreeMap::new();
                loop {
                    let n = input.block("a map")?;
                    if n == 0 {
                        break;
                    }
                    for _ in 0..n {
                        let key = input.string("a map's key")?.to_owned();
                        let mut value = Vec::new();
                        self.read(&m.types, input, &mut value, depth + 1)?;
                        entries.insert(key, value);
                    }
                }
                out.push(b'{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    json_string(out, k);
                    out.push(b':');
                    out.extend_from_slice(v);
                }
                out.push(b'}');
            }
            Schema::Record(r) => {
                out.push(b'{');
                for (i, f) in r.fields.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    json_string(out, &f.name);
                    out.push(b':');
                    self.read(&f.schema, input, out, depth + 1)?;
                }
                out.push(b'}');
            }
            Schema::Ref { .. } => unreachable!("resolved above"),
        }
        Ok(())
    }

    /// Appends `value` as a datum of `schema`: `value` was made for it by
    /// `value_of`, so it fits.
    pub(super) fn write(
        &self,
        value: &Value,
        schema: &Schema,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        let schema = self.resolve(schema)?;
        match (value, schema) {
            (Value::Null, _) => {}
            (Value::Boolean(b), _) => out.push(u8::from(*b)),
            (Value::Int(n) | Value::Date(n) | Value::TimeMillis(n), _) => long(out, i64::from(*n)),
            (
                Value::Long(n)
                | Value::TimeMicros(n)
                | Value::TimestampMillis(n)
                | Value::TimestampMicros(n)
                | Value::TimestampNanos(n)
                | Value::LocalTimestampMillis(n)
                | Value::LocalTimestampMicros(n)
                | Value::LocalTimestampNanos(n),
                _,
            ) => long(out, *n),
            (Value::Float(f), _) => out.extend_from_slice(&f.to_le_bytes()),
            (Value::Double(f), _) => out.extend_from_slice(&f.to_le_bytes()),
            (Value::Bytes(b), _) => {
                long(out, b.len() as i64);
                out.extend_from_slice(b);
            }
            (Value::String(s), _) => {
                long(out, s.len() as i64);
                out.extend_from_slice(s.as_bytes());
            }
            (Value::Fixed(_, b), _) => out.extend_from_slice(b),
            (Value::Enum(i, _), _) => long(out, i64::from(*i)),
            (Value::Uuid(u), Schema::Uuid(kind)) => match kind {
                UuidSchema::String => {
                    let text = u.to_string();
                    long(out, text.len() as i64);
                    out.extend_from_slice(text.as_bytes());
                }
                UuidSchema::Bytes => {
                    long(out, 16);
                    out.extend_from_slice(u.as_bytes());
                }
                UuidSchema::Fixed(_) => out.extend_from_slice(u.as_bytes()),
            },
            (Value::Decimal(d), Schema::Decimal(s)) => {
                let bytes = Vec::<u8>::try_from(d).map_err(|e| e.to_string())?;
                if let InnerDecimalSchema::Bytes = s.inner {
                    long(out, bytes.len() as i64);
                }
                out.extend_from_slice(&bytes);
            }
            (Value::Duration(d), _) => out.extend_from_slice(&<[u8; 12]>::from(*d)),
            (Value::Union(i, v), Schema::Union(u)) => {
                let branch = u
                    .variants()
                    .get(*i as usize)
                    .ok_or_else(|| format!("a union has no branch {i}"))?;
                long(out, i64::from(*i));
                self.write(v, branch, out)?;
            }
            (Value::Array(items), Schema::Array(a)) => {
                if !items.is_empty() {
                    long(out, items.len() as i64);
                    for v in items {
                        self.write(v, &a.items, out)?;
                    }
                }
                out.push(0);
            }
            (Value::Map(entries), Schema::Map(m)) => {
                if !entries.is_empty() {
                    long(out, entries.len() as i64);
                    // Sorted: the same JSON always makes the same bytes.
                    let mut keys: Vec<&String> = entries.keys().collect();
                    keys.sort();
                    for k in keys {
                        long(out, k.len() as i64);
                        out.extend_from_slice(k.as_bytes());
                        self.write(&entries[k], &m.types, out)?;
                    }
                }
                out.push(0);
            }
            (Value::Record(fields), Schema::Record(r)) => {
                for ((_, v), f) in fields.iter().zip(&r.fields) {
                    self.write(v, &f.schema, out)?;
                }
            }
            (v, s) => {
                return Err(format!("cannot write {v:?} as {}", super::short(s)));
            }
        }
        Ok(())
    }
}

/// A zigzag varint.
fn long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}
