//! `onceflow init <dir> --lang <language>`: scaffolds a processor that
//! `onceflow build` can build at once: the manifest, the source (a counter:
//! counts records per key in the store `counts`, emits each new count to
//! alias `counts`, and rejects records without a key, which go to the
//! dead-letter topic), and a sample input for `onceflow test`.
//!
//! Every language uses its onceflow SDK layer (guest-sdk/), which
//! `onceflow build` adds to the sources, so the processor is as short as in
//! Rust.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use onceflow::manifest::Language;

/// `onceflow init`: writes the scaffold and says what to do next.
pub(super) fn cmd_init(
    dir: &Path,
    language: Language,
    name: Option<&str>,
) -> anyhow::Result<std::process::ExitCode> {
    let written = init(dir, language, name)?;
    for path in &written {
        println!("created {}", path.display());
    }
    println!(
        "next: onceflow build {dir} && onceflow test {dir} --input {sample}",
        dir = dir.display(),
        sample = dir.join("sample.jsonl").display()
    );
    Ok(std::process::ExitCode::SUCCESS)
}

/// `--lang`: a language as the manifest names it.
pub(super) fn parse_language(text: &str) -> Result<Language, String> {
    Language::ALL
        .into_iter()
        .find(|l| l.name() == text)
        .ok_or_else(|| {
            let names: Vec<&str> = Language::ALL.iter().map(|l| l.name()).collect();
            format!("unknown language {text:?}: use one of {}", names.join(", "))
        })
}

/// The files `init` writes for `language`, as (relative path, contents).
fn files(language: Language, name: &str) -> Vec<(String, String)> {
    let (source, limits, extra): (&str, &str, Vec<(String, String)>) = match language {
        Language::Rust => (".", RUST_LIMITS, rust_files(name)),
        Language::Js => (
            "index.js",
            INTERPRETER_LIMITS_JS,
            vec![("index.js".into(), JS.into())],
        ),
        Language::Ts => (
            "index.ts",
            INTERPRETER_LIMITS_JS,
            vec![("index.ts".into(), TS.into())],
        ),
        Language::Python => (
            "app.py",
            INTERPRETER_LIMITS_PYTHON,
            vec![("app.py".into(), PYTHON.into())],
        ),
        Language::Go => (".", RUST_LIMITS, vec![("main.go".into(), GO.into())]),
        Language::C => (".", RUST_LIMITS, vec![("processor.c".into(), C.into())]),
    };
    let manifest = format!(
        r#"# Onceflow manifest (scaffolded by `onceflow init --lang {lang}`).
# Build: onceflow build .        Try: onceflow test . --input sample.jsonl
name = "{name}"
tenant = "demo"
inputs = ["events"]                   # records keyed by what you count
stores = ["counts"]                   # key -> count in decimal text

[build]
language = "{lang}"
source = "{source}"
component = "target/onceflow/{name}.wasm"

[outputs]            # alias = topic
counts = "counts"                     # key = the record's key, value = its new count

[processing]
guarantee = "exactly_once_v2"
commit-interval-ms = 100

[errors]
policy = "dead-letter"                # fail | skip | dead-letter
dead-letter-topic = "events.dlq"

[limits]
{limits}timeout-ms = 5000
"#,
        lang = language.name(),
    );
    let mut files = vec![
        ("onceflow.toml".to_owned(), manifest),
        ("sample.jsonl".to_owned(), SAMPLE.to_owned()),
    ];
    files.extend(extra);
    files
}

/// Writes the scaffold into `dir` (created; it must not hold an
/// onceflow.toml already) and returns the files written.
pub fn init(dir: &Path, language: Language, name: Option<&str>) -> anyhow::Result<Vec<PathBuf>> {
    let name = match name {
        Some(name) => name.to_owned(),
        None => default_name(dir),
    };
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        || name.starts_with('-')
    {
        bail!(
            "{name:?} is not a usable processor name: use lowercase letters, digits and '-' \
             (pass --name)"
        );
    }
    if dir.join("onceflow.toml").exists() {
        bail!(
            "{} already holds an onceflow.toml: init writes only into a new or empty project",
            dir.display()
        );
    }
    let mut written = Vec::new();
    for (relative, contents) in files(language, &name) {
        let path = dir.join(&relative);
        if path.exists() {
            bail!("{} exists: init does not overwrite files", path.display());
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// The directory's name, made a valid processor name.
fn default_name(dir: &Path) -> String {
    let base = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let mut name: String = base
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    while name.starts_with('-') {
        name.remove(0);
    }
    name.truncate(64);
    if name.is_empty() {
        "processor".to_owned()
    } else {
        name
    }
}

const RUST_LIMITS: &str = "memory-mb = 64\nfuel-per-record = 10000000\n";
// Interpreters spend 15-60x the fuel of compiled code (docs/languages.md).
const INTERPRETER_LIMITS_JS: &str = "memory-mb = 128\nfuel-per-record = 200000000\n";
const INTERPRETER_LIMITS_PYTHON: &str = "memory-mb = 64\nfuel-per-record = 200000000\n";

const SAMPLE: &str = r#"{"topic": "events", "key": "a", "value": "first"}
{"topic": "events", "key": "b", "value": "second"}
{"topic": "events", "key": "a", "value": "third"}
{"topic": "events", "value": "no key: dead-lettered"}
"#;

fn rust_files(name: &str) -> Vec<(String, String)> {
    // The SDK is not on crates.io: depend on the checkout this binary was
    // built from.
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(|repo| repo.join("guest-sdk"))
        .unwrap_or_default();
    let crate_name = name.replace('-', "_");
    vec![
        (
            "Cargo.toml".into(),
            format!(
                r#"[package]
name = "{crate_name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
onceflow-sdk = {{ path = "{sdk}" }}

# A project of its own, not a member of an enclosing workspace.
[workspace]
"#,
                sdk = sdk.display()
            ),
        ),
        ("src/lib.rs".into(), RUST.into()),
    ]
}

const RUST: &str = r#"//! Counts records per key in the store `counts` and emits each new count.

use onceflow_sdk::{Context, Error, Processor, Record};

pub struct Counter;

impl Processor for Counter {
    fn process(ctx: &mut Context, record: &Record) -> Result<(), Error> {
        let key = record
            .key
            .as_deref()
            .ok_or_else(|| Error::new("record has no key"))?;
        let counts = ctx.store("counts");
        let count = counts.get_i64(key)?.unwrap_or(0) + 1;
        counts.put_i64(key, count)?;
        ctx.emit("counts", key, count.to_string())
    }
}

onceflow_sdk::export_processor!(Counter);
"#;

const JS: &str = r#"// Counts records per key in the store `counts` and emits each new count.
// `onceflow build` adds the SDK layer ./onceflow.js (guest-sdk/js).
import { exportProcessor, RecordError } from './onceflow.js';

function count(ctx, record) {
  if (record.key === undefined) {
    throw new RecordError('record has no key');
  }
  const counts = ctx.store('counts');
  const count = (counts.getI64(record.key) ?? 0n) + 1n;
  counts.putI64(record.key, count);
  ctx.emit('counts', record.key, count.toString());
}

export const { init, process, punctuate } = exportProcessor(count);
"#;

const TS: &str = r#"// Counts records per key in the store `counts` and emits each new count.
// `onceflow build` adds the SDK layer ./onceflow.js with its types
// (guest-sdk/js) and the WIT's types (module 'onceflow:processor/...').
import { exportProcessor, RecordError, type Context, type Record } from './onceflow.js';

function count(ctx: Context, record: Record): void {
  if (record.key === undefined) {
    throw new RecordError('record has no key');
  }
  const counts = ctx.store('counts');
  const count: bigint = (counts.getI64(record.key) ?? 0n) + 1n;
  counts.putI64(record.key, count);
  ctx.emit('counts', record.key, count.toString());
}

export const { init, process, punctuate } = exportProcessor(count);
"#;

const PYTHON: &str = r#""""Counts records per key in the store `counts` and emits each new count.
`onceflow build` adds the SDK layer onceflow.py (guest-sdk/python)."""

import onceflow


def process(ctx: onceflow.Context, record: onceflow.Record) -> None:
    if record.key is None:
        raise onceflow.Error("record has no key")
    counts = ctx.store("counts")
    count = (counts.get_i64(record.key) or 0) + 1
    counts.put_i64(record.key, count)
    ctx.emit("counts", record.key, str(count))


WitWorld = onceflow.export(process)
"#;

const GO: &str = r#"// Counts records per key in the store `counts` and emits each new count.
// `onceflow build` adds the SDK layer (package wit_component/onceflow,
// guest-sdk/go) and the bindings generated from the WIT.
package main

import (
	"strconv"

	"wit_component/onceflow"
)

type counter struct{}

func init() { onceflow.Register(counter{}) }

func (counter) Process(ctx *onceflow.Context, record *onceflow.Record) error {
	if record.Key == nil {
		return onceflow.Errorf("record has no key")
	}
	counts := ctx.Store("counts")
	count, _, err := counts.GetI64(record.Key)
	if err != nil {
		return err
	}
	count++
	if err := counts.PutI64(record.Key, count); err != nil {
		return err
	}
	return ctx.Emit("counts", record.Key, []byte(strconv.FormatInt(count, 10)))
}
"#;

const C: &str = r#"// Counts records per key in the store `counts` and emits each new count.
// `onceflow build` adds the SDK layer onceflow.h (guest-sdk/c) and the
// bindings generated from the WIT.
#include <stdio.h>

#include "onceflow.h"

onceflow_error *onceflow_process(const onceflow_record *record) {
    if (!record->key.present) return onceflow_error_new("record has no key");
    int64_t count = 0;
    bool found;
    onceflow_error *error = onceflow_get_i64("counts", record->key.bytes, &count, &found);
    if (error) return error;
    count++;
    if ((error = onceflow_put_i64("counts", record->key.bytes, count))) return error;
    char text[24];
    int len = snprintf(text, sizeof text, "%lld", (long long)count);
    onceflow_bytes value = {(const uint8_t *)text, (size_t)len};
    return onceflow_emit("counts", &record->key.bytes, &value);
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_directory() {
        assert_eq!(default_name(Path::new("/tmp/My Counter_1")), "my-counter-1");
        assert_eq!(default_name(Path::new("/tmp/__x")), "x");
    }

    #[test]
    fn every_language_gets_a_manifest_naming_it_and_a_sample() {
        for language in Language::ALL {
            let files = files(language, "demo");
            let manifest = &files[0].1;
            assert!(
                manifest.contains(&format!("language = \"{}\"", language.name())),
                "{manifest}"
            );
            assert!(files.iter().any(|(p, _)| p == "sample.jsonl"));
            assert!(files.len() >= 3, "{language:?}: a source file");
        }
    }
}
