//! Formats offline (`onceflow test`, docs/formats.md): the wallet on Avro
//! payments, in Rust and in JavaScript, against the JSON wallet on the same
//! payments; values that are not Avro and outputs that do not fit their
//! schema go to the error policy with the reason.

use std::path::Path;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::common::{build_guest, json_lines, offline_test, repo};

/// `n` payments over 12 accounts as `onceflow test` input lines (JSON
/// values), keyed by account, deterministic.
fn payments(n: u64) -> Vec<String> {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    (0..n)
        .map(|i| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let account = format!("acct-{:02}", rng % 12);
            let amount = (rng >> 20) as i64 % 1000 - 300;
            let value =
                format!(r#"{{"payment_id":"p{i}","account":"{account}","amount":{amount}}}"#);
            json!({"topic": "payments", "key": account, "value": value}).to_string()
        })
        .collect()
}

fn run(manifest: &Path, input: &str, batch: &str) -> Vec<Value> {
    let out = offline_test(manifest, input, &["--batch-size", batch]);
    assert!(
        out.status.success(),
        "onceflow test {}: {}",
        manifest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    json_lines(&out.stdout)
}

/// An output line with its value parsed (field order aside).
fn parsed(line: &Value) -> (String, String, Value) {
    let value = line["value"].as_str().unwrap_or_default();
    (
        line["topic"].as_str().unwrap_or_default().to_owned(),
        line["key"].as_str().unwrap_or_default().to_owned(),
        serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned())),
    )
}

#[test]
fn the_avro_wallet_in_rust_and_js_and_on_protobuf_emits_what_the_json_wallet_does() {
    let json_wallet = build_guest("examples/wallet/onceflow.toml");
    let avro_rust = build_guest("examples/wallet-avro/onceflow.toml");
    let avro_js = build_guest("examples/wallet-avro/js.toml");
    let protobuf = build_guest("examples/wallet-avro/protobuf.toml");
    let mut lines = payments(400);
    let input = lines.join("\n");
    let expected: Vec<_> = run(&json_wallet, &input, "64").iter().map(parsed).collect();
    assert_eq!(
        expected.len(),
        800,
        "a balance and an audit copy per payment"
    );

    // Two values the host cannot read as Avro, dead-lettered before the
    // wallet sees them; the payments around them are processed as before.
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    lines.insert(
        100,
        json!({"topic": "payments", "key": "x", "value_base64": b64(br#"{"payment_id":"j"}"#)})
            .to_string(),
    );
    lines.insert(
        300,
        json!({"topic": "payments", "key": "y", "value_base64": b64(b"\x00\x00\x00\x00\x07\x02")})
            .to_string(),
    );
    let input = lines.join("\n");
    for (manifest, language) in [
        (&avro_rust, "rust"),
        (&avro_js, "js"),
        (&protobuf, "rust on protobuf"),
    ] {
        for batch in ["1", "64"] {
            let got = run(manifest, &input, batch);
            let (letters, outputs): (Vec<&Value>, Vec<&Value>) =
                got.iter().partition(|l| l["topic"] == "payments.dlq");
            let outputs: Vec<_> = outputs.into_iter().map(parsed).collect();
            assert_eq!(
                outputs, expected,
                "{language}, batches of {batch}: the Avro wallet's outputs, read back as JSON, \
                 are the JSON wallet's"
            );
            assert_eq!(letters.len(), 2, "{language}: {letters:?}");
            assert_eq!(letters[0]["key"], "x");
            assert!(
                letters[0]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("the first byte is 0x7b, not 0")),
                "{language}: {}",
                letters[0]
            );
            assert_eq!(letters[1]["key"], "y");
            assert!(
                letters[1]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("schema id 7 is unknown")),
                "{language}: {}",
                letters[1]
            );
        }
    }
}

/// A copy of the Avro wallet's manifest and schemas in a directory of its
/// own, with `edit` applied to the balance schema.
fn avro_wallet_with(dir: &Path, balance_schema: &str) -> std::path::PathBuf {
    let example = repo().join("examples/wallet-avro");
    build_guest("examples/wallet-avro/onceflow.toml");
    std::fs::create_dir_all(dir.join("schemas")).expect("schemas dir");
    std::fs::copy(
        example.join("schemas/payment.avsc"),
        dir.join("schemas/payment.avsc"),
    )
    .expect("copy payment.avsc");
    std::fs::write(dir.join("schemas/balance.avsc"), balance_schema).expect("balance.avsc");
    let component = repo().join("examples/wallet/target/onceflow/wallet.wasm");
    let manifest = std::fs::read_to_string(example.join("onceflow.toml"))
        .expect("the example's manifest")
        .replace(
            "component = \"../wallet/target/onceflow/wallet.wasm\"",
            &format!("component = \"{}\"", component.display()),
        );
    let path = dir.join("onceflow.toml");
    std::fs::write(&path, manifest).expect("write manifest");
    path
}

#[test]
fn an_output_that_does_not_fit_its_schema_dead_letters_its_record_whole() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The wallet emits no `currency`, which this schema requires: every
    // balance fails to encode, so each payment goes to the dead-letter
    // topic, its audit copy taken back with it.
    let manifest = avro_wallet_with(
        dir.path(),
        r#"{"type":"record","name":"Balance","fields":[
            {"name":"account","type":"string"},{"name":"balance","type":"long"},
            {"name":"payment_id","type":"string"},{"name":"currency","type":"string"}]}"#,
    );
    let got = run(&manifest, &payments(5).join("\n"), "64");
    assert_eq!(
        got.len(),
        5,
        "one dead letter per payment, nothing else: {got:?}"
    );
    for line in &got {
        assert_eq!(line["topic"], "payments.dlq", "{line}");
        let error = line["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("an output to `balances` (balances) does not fit its format")
                && error.contains("\"currency\" of record Balance is missing and has no default"),
            "{error}"
        );
    }

    // With a default the same output fits: the field is filled in.
    let manifest = avro_wallet_with(
        dir.path(),
        r#"{"type":"record","name":"Balance","fields":[
            {"name":"account","type":"string"},{"name":"balance","type":"long"},
            {"name":"payment_id","type":"string"},
            {"name":"currency","type":"string","default":"EUR"}]}"#,
    );
    let got = run(&manifest, &payments(5).join("\n"), "64");
    let balance = got
        .iter()
        .find(|l| l["topic"] == "balances")
        .expect("a balance");
    let value: Value = serde_json::from_str(balance["value"].as_str().unwrap_or_default())
        .expect("a balance is JSON again");
    assert_eq!(value["currency"], "EUR", "{balance}");
}

#[test]
fn an_input_line_that_does_not_fit_its_schema_is_refused_with_its_line() {
    let manifest = build_guest("examples/wallet-avro/onceflow.toml");
    let lines = [
        payments(1)[0].clone(),
        json!({"topic": "payments", "key": "a",
               "value": r#"{"payment_id":"p","account":"a","amount":"N/A"}"#})
        .to_string(),
    ];
    let out = offline_test(&manifest, &lines.join("\n"), &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("input.jsonl:2:")
            && stderr.contains("`amount`: expected a 64-bit integer, got the string \"N/A\"")
            && stderr.contains("value_base64"),
        "{stderr}"
    );

    // An Avro input without a schema cannot be written from JSON offline.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = avro_wallet_with(dir.path(), "\"string\"");
    let text = std::fs::read_to_string(&path).expect("manifest").replace(
        r#"{ topic = "payments", format = "avro", schema = "schemas/payment.avsc" }"#,
        r#"{ topic = "payments", format = "avro" }"#,
    );
    std::fs::write(&path, text).expect("write manifest");
    let out = offline_test(&path, &lines[0], &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("inputs.payments") && stderr.contains("give it one"),
        "{stderr}"
    );
}

const PAYMENT_JSON_SCHEMA: &str = r#"{"type":"object","required":["payment_id","account","amount"],
  "properties":{"payment_id":{"type":"string"},"account":{"type":"string"},"amount":{"type":"integer"}},
  "additionalProperties":false}"#;
const BALANCE_JSON_SCHEMA: &str = r#"{"type":"object","required":["account","balance","payment_id"],
  "properties":{"account":{"type":"string"},"balance":{"type":"integer"},"payment_id":{"type":"string"}}}"#;

#[test]
fn the_json_schema_wallet_checks_every_value_and_emits_what_the_json_wallet_does() {
    let json_wallet = build_guest("examples/wallet/onceflow.toml");
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("schemas")).expect("schemas dir");
    std::fs::write(dir.path().join("schemas/payment.json"), PAYMENT_JSON_SCHEMA).expect("write");
    std::fs::write(dir.path().join("schemas/balance.json"), BALANCE_JSON_SCHEMA).expect("write");
    let component = repo().join("examples/wallet/target/onceflow/wallet.wasm");
    let manifest = dir.path().join("onceflow.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"name = "wallet-json-schema"
tenant = "demo"
inputs = [{{ topic = "payments", format = "json-schema", schema = "schemas/payment.json" }}]
stores = ["balances"]

[build]
language = "rust"
component = "{}"

[outputs]
balances = {{ topic = "balances", format = "json-schema", schema = "schemas/balance.json" }}
audit = {{ topic = "audit", format = "json-schema", schema = "schemas/payment.json" }}

[errors]
policy = "dead-letter"
dead-letter-topic = "payments.dlq"
"#,
            component.display()
        ),
    )
    .expect("write manifest");
    let mut lines = payments(200);
    let expected: Vec<_> = run(&json_wallet, &lines.join("\n"), "64")
        .iter()
        .map(parsed)
        .collect();
    // In the wire format with the payments' schema id (1: the first schema
    // `onceflow test` numbers), but not fitting it.
    let mut framed = b"\x00\x00\x00\x00\x01".to_vec();
    framed.extend_from_slice(br#"{"payment_id":"q","account":"a","amount":"N/A"}"#);
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    lines.insert(
        50,
        json!({"topic": "payments", "key": "q", "value_base64": b64(&framed)}).to_string(),
    );
    let got = run(&manifest, &lines.join("\n"), "64");
    let (letters, outputs): (Vec<&Value>, Vec<&Value>) =
        got.iter().partition(|l| l["topic"] == "payments.dlq");
    let outputs: Vec<_> = outputs.into_iter().map(parsed).collect();
    assert_eq!(outputs, expected);
    assert_eq!(letters.len(), 1, "{letters:?}");
    let error = letters[0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("schema id 1") && error.contains("`/amount` does not fit its JSON Schema"),
        "{error}"
    );
}

/// A manifest for the hostile guest (it echoes a record's value and
/// headers to `out`) with `input` and `output` as its formats, in a
/// directory with the wallet's schemas.
fn echo_with(dir: &Path, input: &str, output: &str) -> std::path::PathBuf {
    build_guest("tests/guests/hostile/onceflow.toml");
    let schemas = repo().join("examples/wallet-avro/schemas");
    std::fs::create_dir_all(dir.join("schemas")).expect("schemas dir");
    for f in ["payment.proto", "payment.avsc"] {
        std::fs::copy(schemas.join(f), dir.join("schemas").join(f)).expect("copy schema");
    }
    let component = repo().join("tests/guests/hostile/target/onceflow/hostile.wasm");
    let manifest = dir.join("onceflow.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"name = "echo"
tenant = "test"
inputs = [{input}]
stores = ["seen"]

[build]
language = "rust"
component = "{}"

[outputs]
out = {output}

[errors]
policy = "dead-letter"
dead-letter-topic = "in.dlq"
"#,
            component.display()
        ),
    )
    .expect("write manifest");
    manifest
}

#[test]
fn as_payload_a_processor_gets_and_emits_the_values_own_bytes_with_the_schema_id() {
    let payments = payments(20)
        .into_iter()
        .map(|l| l.replace(r#""topic":"payments""#, r#""topic":"in""#))
        .collect::<Vec<_>>()
        .join("\n");
    let dir = tempfile::tempdir().expect("temp dir");
    // Protobuf: the guest sees the message's bytes (no framing, no message
    // indexes) and the schema id and message in headers; what it emits as
    // they are is framed by the host, and reads back as the same payment.
    let manifest = echo_with(
        dir.path(),
        r#"{ topic = "in", format = "protobuf", schema = "schemas/payment.proto", as = "payload" }"#,
        r#"{ topic = "out", format = "protobuf", schema = "schemas/payment.proto", as = "payload" }"#,
    );
    let expected: Vec<Value> = json_lines(payments.as_bytes())
        .iter()
        .map(|l| serde_json::from_str(l["value"].as_str().unwrap_or_default()).expect("json"))
        .collect();
    let got = run(&manifest, &payments, "8");
    assert_eq!(got.len(), 20, "{got:?}");
    for (line, payment) in got.iter().zip(&expected) {
        assert_eq!(line["topic"], "out", "{line}");
        assert_eq!(parsed(line).2, *payment, "{line}");
        assert_eq!(line["headers"]["onceflow.schema-id"], "1", "{line}");
        assert_eq!(
            line["headers"]["onceflow.message"], "onceflow.examples.wallet.Payment",
            "{line}"
        );
    }
    // Avro: a datum of the input's schema, handed back as it is.
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = echo_with(
        dir.path(),
        r#"{ topic = "in", format = "avro", schema = "schemas/payment.avsc", as = "payload" }"#,
        r#"{ topic = "out", format = "avro", schema = "schemas/payment.avsc", as = "payload" }"#,
    );
    let got = run(&manifest, &payments, "8");
    assert_eq!(got.len(), 20, "{got:?}");
    for (line, payment) in got.iter().zip(&expected) {
        assert_eq!(parsed(line).2, *payment, "{line}");
        assert_eq!(line["headers"]["onceflow.schema-id"], "1", "{line}");
    }
    // The same datum emitted to an output that takes JSON is not JSON:
    // refused, the record dead-lettered whole.
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = echo_with(
        dir.path(),
        r#"{ topic = "in", format = "avro", schema = "schemas/payment.avsc", as = "payload" }"#,
        r#"{ topic = "out", format = "avro", schema = "schemas/payment.avsc" }"#,
    );
    let got = run(&manifest, &payments, "8");
    assert_eq!(got.len(), 20, "{got:?}");
    for line in &got {
        assert_eq!(line["topic"], "in.dlq", "{line}");
        let error = line["error"].as_str().unwrap_or_default();
        assert!(error.contains("not JSON"), "{error}");
    }
}
