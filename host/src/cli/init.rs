//! `onceflow init <dir> --lang <language>`: scaffolds a processor that
//! `onceflow build` can build at once: the manifest, the source (a counter:
//! counts records per key in the store `counts`, emits each new count to
//! alias `counts`, and rejects records without a key, which go to the
//! dead-letter topic), and a sample input for `onceflow test`.
//!
//! Every language uses its onceflow SDK layer (guest-sdk/), which
//! `onceflow build` adds to the sources, so the processor is as short as in
//! Rust. The Rust SDK is not on crates.io: `init` writes the copy this
//! binary carries into the project (`onceflow-sdk/`, with the WIT), so the
//! project builds wherever it is, with nothing else checked out.
//!
//! The scaffold belongs to a tenant (`--tenant`, default `demo`, the
//! README's): its topics are under the tenant's prefix and its limits within
//! the default quotas, so it deploys to a fleet as written.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use onceflow::manifest::Language;

/// What `init` is asked for.
#[derive(Debug, Clone)]
pub struct Scaffold<'a> {
    /// The language.
    pub language: Language,
    /// The processor's name (default: the directory's).
    pub name: Option<&'a str>,
    /// The tenant it deploys under.
    pub tenant: &'a str,
    /// The tenant's topic prefix (default `<tenant>.`).
    pub topic_prefix: Option<&'a str>,
}

/// `onceflow init`: writes the scaffold and says what to do next.
pub(super) fn cmd_init(dir: &Path, scaffold: &Scaffold) -> anyhow::Result<std::process::ExitCode> {
    let written = init(dir, scaffold)?;
    for path in &written {
        println!("created {}", path.display());
    }
    let prefix = topic_prefix(scaffold)?;
    println!(
        "next: onceflow build {dir} && onceflow test {dir} --input {sample}\n\
         deploy (tenant {tenant:?}): create the topics {prefix}events, {prefix}counts and \
         {prefix}events.dlq, then `onceflow deploy {dir}`",
        dir = dir.display(),
        sample = dir.join("sample.jsonl").display(),
        tenant = scaffold.tenant,
    );
    Ok(std::process::ExitCode::SUCCESS)
}

/// The topic prefix: given, or `<tenant>.`; checked as tenants.toml
/// checks it.
fn topic_prefix(scaffold: &Scaffold) -> anyhow::Result<String> {
    onceflow::manifest::check_name(scaffold.tenant)
        .map_err(|m| anyhow::anyhow!("--tenant: {m}"))?;
    let own = format!("{}.", scaffold.tenant);
    match scaffold.topic_prefix {
        None => Ok(own),
        Some(p) if p.starts_with(&own) => Ok(p.to_owned()),
        Some(p) => bail!(
            "--topic-prefix {p:?} must start with {own:?}: a tenant's topics start with its name \
             and a dot (see the tenant's topic-prefix in tenants.toml)"
        ),
    }
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
fn files(language: Language, name: &str, tenant: &str, prefix: &str) -> Vec<(String, String)> {
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
# Deploy: create the topics below, then onceflow deploy .
name = "{name}"
tenant = "{tenant}"                     # topics must start with its prefix, "{prefix}"
inputs = ["{prefix}events"]                   # records keyed by what you count
stores = ["counts"]                   # key -> count in decimal text

[build]
language = "{lang}"
source = "{source}"
component = "target/onceflow/{name}.wasm"

[outputs]            # alias = topic
counts = "{prefix}counts"                     # key = the record's key, value = its new count

[processing]
guarantee = "exactly_once_v2"
commit-interval-ms = 100

[errors]
policy = "dead-letter"                # fail | skip | dead-letter
dead-letter-topic = "{prefix}events.dlq"

[limits]                              # within a tenant's default quotas
{limits}timeout-ms = 5000
"#,
        lang = language.name(),
    );
    let sample = SAMPLE.replace("\"events\"", &format!("\"{prefix}events\""));
    let mut files = vec![
        ("onceflow.toml".to_owned(), manifest),
        ("sample.jsonl".to_owned(), sample),
    ];
    files.extend(extra);
    files
}

/// Writes the scaffold into `dir` (created; it must not hold an
/// onceflow.toml already) and returns the files written.
pub fn init(dir: &Path, scaffold: &Scaffold) -> anyhow::Result<Vec<PathBuf>> {
    let prefix = topic_prefix(scaffold)?;
    let name = match scaffold.name {
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
    for (relative, contents) in files(scaffold.language, &name, scaffold.tenant, &prefix) {
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
// Interpreters spend 15-75x the fuel of compiled code (docs/languages.md):
// ~0.2-1 M on a small record. 50 M leaves room for large ones and is half
// a tenant's default quota (100 M).
const INTERPRETER_LIMITS_JS: &str = "memory-mb = 128\nfuel-per-record = 50000000\n";
const INTERPRETER_LIMITS_PYTHON: &str = "memory-mb = 64\nfuel-per-record = 50000000\n";

const SAMPLE: &str = r#"{"topic": "events", "key": "a", "value": "first"}
{"topic": "events", "key": "b", "value": "second"}
{"topic": "events", "key": "a", "value": "third"}
{"topic": "events", "value": "no key: dead-lettered"}
"#;

/// The Rust SDK this binary carries, as (path under `onceflow-sdk/`,
/// contents); `lib.rs` finds the WIT in its own directory.
const RUST_SDK: &[(&str, &str)] = &[
    (
        "src/context.rs",
        include_str!("../../../guest-sdk/src/context.rs"),
    ),
    (
        "src/error.rs",
        include_str!("../../../guest-sdk/src/error.rs"),
    ),
    (
        "src/export.rs",
        include_str!("../../../guest-sdk/src/export.rs"),
    ),
    (
        "src/host.rs",
        include_str!("../../../guest-sdk/src/host.rs"),
    ),
    ("src/lib.rs", include_str!("../../../guest-sdk/src/lib.rs")),
    ("src/log.rs", include_str!("../../../guest-sdk/src/log.rs")),
    (
        "src/record.rs",
        include_str!("../../../guest-sdk/src/record.rs"),
    ),
    (
        "src/testing.rs",
        include_str!("../../../guest-sdk/src/testing.rs"),
    ),
    (
        "src/windows.rs",
        include_str!("../../../guest-sdk/src/windows.rs"),
    ),
    (
        "wit/processor.wit",
        include_str!("../../../wit/processor.wit"),
    ),
];

/// The SDK's manifest outside the repository's workspace: the versions
/// are the workspace's (a unit test keeps them equal).
const RUST_SDK_MANIFEST: &str = r#"# The Onceflow Rust SDK, written by `onceflow init` (onceflow VERSION).
# To take a newer SDK, replace this directory with the one a newer
# `onceflow init --lang rust` writes.
[package]
name = "onceflow-sdk"
description = "Write Onceflow stream processors in Rust, compiled to WebAssembly components."
version = "VERSION"
edition = "2024"
license = "Apache-2.0"
publish = false

[features]
default = ["json"]
# `Record::value_json`, deserialising a record value with serde_json.
json = ["dep:serde", "dep:serde_json"]

[dependencies]
wit-bindgen = "0.63"
serde = { version = "1", features = ["derive"], optional = true }
serde_json = { version = "1", optional = true }
"#;

fn rust_files(name: &str) -> Vec<(String, String)> {
    let crate_name = name.replace('-', "_");
    let mut files = vec![
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
# The SDK is not on crates.io: `onceflow init` wrote a copy here.
onceflow-sdk = {{ path = "onceflow-sdk" }}

# A project of its own, not a member of an enclosing workspace.
[workspace]
"#
            ),
        ),
        ("src/lib.rs".into(), RUST.into()),
        (
            "onceflow-sdk/Cargo.toml".into(),
            RUST_SDK_MANIFEST.replace("VERSION", env!("CARGO_PKG_VERSION")),
        ),
    ];
    for (path, contents) in RUST_SDK {
        let contents = if *path == "src/lib.rs" {
            // In the repository the WIT is beside the SDK; here, inside it.
            contents.replace(r#"path: "../wit","#, r#"path: "wit","#)
        } else {
            (*contents).to_owned()
        };
        files.push((format!("onceflow-sdk/{path}"), contents));
    }
    files
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
            let files = files(language, "demo", "acme", "acme.");
            let manifest = &files[0].1;
            assert!(
                manifest.contains(&format!("language = \"{}\"", language.name())),
                "{manifest}"
            );
            // Under the tenant's prefix, in the manifest and the sample.
            let m = onceflow::manifest::Manifest::parse(manifest, PathBuf::from("onceflow.toml"))
                .expect("the scaffold's manifest");
            assert_eq!(m.tenant, "acme");
            assert!(
                m.inputs.iter().all(|t| t.starts_with("acme.")),
                "{manifest}"
            );
            let (_, sample) = files
                .iter()
                .find(|(p, _)| p == "sample.jsonl")
                .expect("sample");
            assert!(sample.contains(r#""topic": "acme.events""#), "{sample}");
            // Within the default quotas: deployable to a fleet as written.
            let quotas = onceflow::fleet::tenancy::Quotas::default();
            assert!(
                m.limits.fuel_per_record <= quotas.fuel_per_record,
                "{language:?}"
            );
            assert!(m.limits.memory_mb <= quotas.memory_mb, "{language:?}");
            assert!(files.len() >= 3, "{language:?}: a source file");
        }
    }

    #[test]
    fn the_rust_sdk_travels_with_the_project() {
        let files = rust_files("demo");
        let get = |p: &str| &files.iter().find(|(path, _)| path == p).expect(p).1;
        assert!(get("Cargo.toml").contains(r#"onceflow-sdk = { path = "onceflow-sdk" }"#));
        assert!(get("onceflow-sdk/src/lib.rs").contains(r#"path: "wit","#));
        assert!(!get("onceflow-sdk/src/lib.rs").contains("../wit"));
        // The SDK's own modules, all of them.
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk/src");
        for entry in std::fs::read_dir(&sdk).expect("guest-sdk/src") {
            let name = entry.expect("entry").file_name();
            let path = format!("onceflow-sdk/src/{}", name.to_string_lossy());
            assert!(
                files.iter().any(|(p, _)| *p == path),
                "{path} is not vendored"
            );
        }
        // The dependency versions are the workspace's.
        let workspace: toml::Table =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"))
                .expect("Cargo.toml")
                .parse()
                .expect("toml");
        let vendored: toml::Table = get("onceflow-sdk/Cargo.toml").parse().expect("toml");
        let version = |t: &toml::Value| -> String {
            t.as_str()
                .map(str::to_owned)
                .or_else(|| t.get("version").and_then(|v| v.as_str()).map(str::to_owned))
                .expect("a version")
        };
        for dep in ["wit-bindgen", "serde", "serde_json"] {
            assert_eq!(
                version(&workspace["workspace"]["dependencies"][dep]),
                version(&vendored["dependencies"][dep]),
                "{dep}"
            );
        }
    }

    #[test]
    fn a_prefix_outside_the_tenant_is_refused() {
        let s = Scaffold {
            language: Language::Rust,
            name: None,
            tenant: "acme",
            topic_prefix: Some("globex."),
        };
        let e = topic_prefix(&s).expect_err("refused").to_string();
        assert!(e.contains("must start with \"acme.\""), "{e}");
        let s = Scaffold {
            topic_prefix: Some("acme.team-a."),
            ..s
        };
        assert_eq!(topic_prefix(&s).expect("ok"), "acme.team-a.");
    }
}
