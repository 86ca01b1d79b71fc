//! `onceflow build` + `onceflow test` on the examples, with outputs checked
//! against an independent model of what each example must do.

use crate::common::{build_guest, input_line, json_lines, offline_test, onceflow};
use serde_json::{Value, json};

/// A tiny deterministic generator (no test may depend on luck).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Generates payments and, independently of the processor, the exact output
/// lines the wallet must print and the final balances.
fn wallet_case(
    n: usize,
    seed: u64,
) -> (String, Vec<Value>, std::collections::BTreeMap<String, i64>) {
    let mut rng = Lcg(seed);
    let mut input = String::new();
    let mut expected = Vec::new();
    let mut balances = std::collections::BTreeMap::new();
    for i in 0..n {
        let account = format!("acct-{}", rng.next() % 20);
        let pid = format!("p-{i}");
        let amount = (rng.next() % 2001) as i64 - 1000;
        let kind = rng.next() % 20;
        let (value, error) = match kind {
            0 => (
                format!(r#"{{"payment_id":"{pid}","account":"#),
                Some("invalid payment: not valid JSON".to_owned()),
            ),
            1 => (
                format!(r#"{{"payment_id":"{pid}","amount":{amount}}}"#),
                Some(r#"invalid payment: missing field "account""#.to_owned()),
            ),
            2 => (
                format!(r#"{{"payment_id":"{pid}","account":"{account}","amount":"N/A"}}"#),
                Some(r#"invalid payment: field "amount" must be an integer"#.to_owned()),
            ),
            3 => (
                format!(r#"{{"payment_id":"{pid}","account":"{account}","amount":1.5}}"#),
                Some(r#"invalid payment: field "amount" must be an integer"#.to_owned()),
            ),
            4 => (
                "[1,2,3]".to_owned(),
                Some("invalid payment: not a JSON object".to_owned()),
            ),
            5 => (
                format!(r#"{{"payment_id":"{pid}","account":7,"amount":{amount}}}"#),
                Some(r#"invalid payment: field "account" must be a string"#.to_owned()),
            ),
            // Extra fields and any key order are fine.
            6 => (
                format!(
                    r#"{{"amount":{amount},"note":"x","account":"{account}","payment_id":"{pid}"}}"#
                ),
                None,
            ),
            _ => (
                format!(r#"{{"payment_id":"{pid}","account":"{account}","amount":{amount}}}"#),
                None,
            ),
        };
        input.push_str(&input_line("payments", &account, &value));
        input.push('\n');
        match error {
            Some(error) => expected.push(json!({
                "topic": "payments.dlq", "key": account, "value": value, "error": error
            })),
            None => {
                let balance = balances.entry(account.clone()).or_insert(0i64);
                *balance += amount;
                expected.push(json!({
                    "topic": "balances",
                    "key": account,
                    "value": format!(r#"{{"account":"{account}","balance":{balance},"payment_id":"{pid}"}}"#),
                }));
                expected.push(json!({"topic": "audit", "key": pid, "value": value}));
            }
        }
    }
    (input, expected, balances)
}

#[test]
fn wallet_prints_running_balances_audit_and_dead_letters() {
    let manifest = build_guest("examples/wallet/onceflow.toml");
    let (input, expected, balances) = wallet_case(2_000, 42);
    // Batch size and partitioning must not change a single output line.
    for args in [
        &["--batch-size", "1"][..],
        &["--batch-size", "7"],
        &["--batch-size", "500", "--partitions", "4"],
    ] {
        let out = offline_test(&manifest, &input, args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = json_lines(&out.stdout);
        assert_eq!(got.len(), expected.len(), "{args:?}: output count");
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g, e, "{args:?}: output line {i}");
        }
    }

    let out = offline_test(&manifest, &input, &["--dump-state", "--partitions", "3"]);
    assert!(out.status.success());
    let state: std::collections::BTreeMap<String, i64> = json_lines(&out.stdout)
        .into_iter()
        .filter(|l| l["store"] == "balances")
        .map(|l| {
            (
                l["key"].as_str().unwrap().to_owned(),
                l["value"].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        state, balances,
        "final balances equal the sums of valid payments"
    );
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(summary.contains("processed 2000 records"), "{summary}");
}

#[test]
fn wallet_fail_policy_stops_with_the_record_named() {
    let manifest = build_guest("examples/wallet/onceflow.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let text = text
        .replace("policy = \"dead-letter\"", "policy = \"fail\"")
        .replace("dead-letter-topic = \"payments.dlq\"", "");
    let dir = tempfile::tempdir().unwrap();
    let fail_manifest = dir.path().join("onceflow.toml");
    std::fs::write(&fail_manifest, text).unwrap();
    let component = manifest
        .parent()
        .unwrap()
        .join("target/onceflow/wallet.wasm");

    let input = [
        input_line(
            "payments",
            "a",
            r#"{"payment_id":"p1","account":"a","amount":5}"#,
        ),
        input_line(
            "payments",
            "a",
            r#"{"payment_id":"p2","account":"a","amount":"N/A"}"#,
        ),
        input_line(
            "payments",
            "a",
            r#"{"payment_id":"p3","account":"a","amount":1}"#,
        ),
    ]
    .join("\n");
    let out = offline_test(
        &fail_manifest,
        &input,
        &["--component", component.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("payments/0@1"), "{stderr}");
    assert!(
        stderr.contains(r#"field "amount" must be an integer"#),
        "{stderr}"
    );
    let got = json_lines(&out.stdout);
    assert_eq!(got.len(), 2, "only the first payment's outputs: {got:?}");
    assert_eq!(got[0]["topic"], "balances");
}

#[test]
fn word_count_counts_words_across_lines() {
    let manifest = build_guest("examples/word-count/onceflow.toml");
    let input = [
        input_line("lines", "1", "The cat saw the dog."),
        input_line("lines", "2", "the END, the end"),
    ]
    .join("\n");
    let out = offline_test(&manifest, &input, &["--dump-state"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(&out.stdout);
    let outputs: Vec<(String, String)> = lines
        .iter()
        .filter(|l| l.get("topic").is_some())
        .map(|l| {
            assert_eq!(l["topic"], "word-counts");
            (
                l["key"].as_str().unwrap().to_owned(),
                l["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("the", "1"),
        ("cat", "1"),
        ("saw", "1"),
        ("the", "2"),
        ("dog", "1"),
        ("the", "3"),
        ("end", "1"),
        ("the", "4"),
        ("end", "2"),
    ]
    .iter()
    .map(|(w, c)| (w.to_string(), c.to_string()))
    .collect();
    assert_eq!(outputs, expected);
    let state: Vec<_> = lines.iter().filter(|l| l["store"] == "counts").collect();
    assert_eq!(
        state.len(),
        5,
        "five distinct words in the store: {state:?}"
    );
}

#[test]
fn enrich_routes_filters_and_dead_letters() {
    let manifest = build_guest("examples/enrich/onceflow.toml");
    let input = [
        input_line(
            "orders",
            "o1",
            r#"{"order_id":"o1","customer":"c","amount":1500,"country":"DE"}"#,
        ),
        input_line(
            "orders",
            "o2",
            r#"{"order_id":"o2","customer":"c","amount":20,"country":"JP"}"#,
        ),
        input_line(
            "orders",
            "o3",
            r#"{"order_id":"o3","customer":"c","amount":0,"country":"US"}"#,
        ),
        input_line(
            "orders",
            "o4",
            r#"{"order_id":"o4","customer":"c","amount":999,"country":"BR"}"#,
        ),
        input_line("orders", "o5", "not json"),
    ]
    .join("\n");
    let out = offline_test(&manifest, &input, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = json_lines(&out.stdout);
    let summary: Vec<(String, String)> = got
        .iter()
        .map(|l| {
            (
                l["topic"].as_str().unwrap().to_owned(),
                l["key"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("orders.large", "o1"),
            ("orders.standard", "o2"),
            ("orders.standard", "o4"),
            ("orders.dlq", "o5"),
        ]
        .map(|(t, k)| (t.to_owned(), k.to_owned()))
    );
    assert_eq!(
        got[0]["value"],
        r#"{"order_id":"o1","customer":"c","amount":1500,"country":"DE","region":"EU"}"#
    );
    assert_eq!(
        got[2]["value"],
        r#"{"order_id":"o4","customer":"c","amount":999,"country":"BR","region":"OTHER"}"#
    );
    assert!(got[3]["error"].as_str().is_some_and(|e| !e.is_empty()));
}

#[test]
fn bad_input_and_manifest_are_named() {
    let manifest = build_guest("examples/wallet/onceflow.toml");
    let out = offline_test(
        &manifest,
        "{\"topic\":\"payments\",\"value\":\"x\"}\n{\"topic\":\"nope\"}",
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("input.jsonl:2:"), "{stderr}");
    assert!(stderr.contains("\"nope\" is not an input"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("onceflow.toml");
    std::fs::write(&bad, "name = \"x\"\ntenant = \"t\"\ninputs = [\"a\"]\ncolour = 1\n[build]\nlanguage = \"rust\"\n").unwrap();
    let out = onceflow().arg("validate").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("colour") && stderr.contains(bad.to_str().unwrap()),
        "{stderr}"
    );
}

#[test]
fn validate_refuses_a_manifest_whose_derived_names_collide() {
    let manifest = build_guest("examples/wallet/onceflow.toml");
    let component = manifest
        .parent()
        .unwrap()
        .join("target/onceflow/wallet.wasm");
    let text = std::fs::read_to_string(&manifest).unwrap().replace(
        "component = \"target/onceflow/wallet.wasm\"",
        &format!("component = \"{}\"", component.display()),
    );
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        // An output written by the processor is its own store's changelog.
        (
            text.replace(
                "audit = \"audit\"",
                "audit = \"demo.wallet-balances-changelog\"",
            ),
            "demo.wallet-balances-changelog",
        ),
        // Two stores whose changelogs Kafka takes for one ('.' and '_').
        (
            text.replace(
                "stores = [\"balances\"]",
                "stores = [\"balances\", \"by.day\", \"by_day\"]",
            ),
            "demo.wallet-by_day-changelog",
        ),
    ];
    for (i, (manifest, topic)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("case{i}.toml"));
        std::fs::write(&path, manifest).unwrap();
        let out = onceflow().arg("validate").arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "case {i} accepted: {stderr}");
        assert!(stderr.contains(topic), "case {i}: {stderr}");
    }
}

/// `-X` reaches the Kafka clients of every command that makes them (issue
/// 15 said `verify` ignored it; issue 10 had fixed that, and this keeps
/// it so): an unknown librdkafka property fails each at once, named, with
/// no broker needed; and TLS settings reach an OpenSSL build of librdkafka
/// (a CA file that does not exist is refused as such, not as "OpenSSL not
/// available at build time").
#[test]
fn kafka_commands_give_x_properties_to_their_clients() {
    let manifest = build_guest("examples/wallet/onceflow.toml");
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        format!(
            "[[tenant]]\nname = \"t\"\ntoken-sha256 = \"{}\"\n",
            onceflow::fleet::tenancy::hash_token("x")
        ),
    )
    .unwrap();
    let state = dir.path().join("state");
    let (manifest, tenants, state) = (
        manifest.to_str().unwrap(),
        tenants.to_str().unwrap(),
        state.to_str().unwrap(),
    );
    let commands: [&[&str]; 3] = [
        &["verify", "--input", "payments"],
        // Told to wait an hour for the brokers: a refusal that came only
        // after waiting would blow the bound below by far, on any machine.
        &[
            "run",
            manifest,
            "--state-dir",
            state,
            "--kafka-wait-secs",
            "3600",
        ],
        &[
            "host",
            "--tenants",
            tenants,
            "--listen",
            "127.0.0.1:0",
            "--kafka-wait-secs",
            "3600",
        ],
    ];
    let cases: [(&[&str], &str); 2] = [
        (
            &["-X", "no.such.property=1"],
            "No such configuration property: \"no.such.property\"",
        ),
        (
            &[
                "-X",
                "security.protocol=SSL",
                "-X",
                "ssl.ca.location=/nonexistent/ca.pem",
            ],
            "ssl.ca.location failed",
        ),
    ];
    for args in commands {
        for (x, refused) in cases {
            let started = std::time::Instant::now();
            let out = onceflow()
                .args(args)
                .args(["--bootstrap-servers", "127.0.0.1:9"])
                .args(x)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && stderr.contains(refused),
                "onceflow {args:?} {x:?}: {stderr}"
            );
            assert!(
                // A hang guard: a debug build may compile the wallet
                // first on a slow or busy machine.
                started.elapsed() < std::time::Duration::from_secs(120),
                "onceflow {args:?} {x:?} took {:?}",
                started.elapsed()
            );
        }
    }
}
