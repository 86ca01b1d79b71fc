//! Formats on a real Kafka with a real schema registry (docs/formats.md):
//! the wallet on Avro payments with Avro outputs, then on JSON Schema and
//! Protobuf topics, through the fleet, with the registry behind TLS and basic
//! authentication (scripts/registry: Apicurio Registry's Confluent API,
//! compatibility BACKWARD).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

use super::{ACME, Fleet, TestTls, cluster, figure, path, produce_paced, wait_for};
use crate::common::cluster::serial;
use crate::common::kstreams::read_committed;
use crate::common::registry::TestRegistry;
use crate::common::wallet::{Produced, Wallet, assert_exact};
use onceflow::schema::{
    AvroSchema, ProtoSchema, Registry, RegistryConfig, SchemaKind, frame, unframe,
};

const PAYMENT: &str = r#"{"type":"record","name":"Payment","namespace":"acme.wallet",
  "fields":[{"name":"payment_id","type":"string"},{"name":"account","type":"string"},
            {"name":"amount","type":"long"}]}"#;
const BALANCE_V1: &str = r#"{"type":"record","name":"Balance","namespace":"acme.wallet",
  "fields":[{"name":"account","type":"string"},{"name":"balance","type":"long"},
            {"name":"payment_id","type":"string"}]}"#;
/// Version 2: a field added with a default (BACKWARD compatible).
const BALANCE_V2: &str = r#"{"type":"record","name":"Balance","namespace":"acme.wallet",
  "fields":[{"name":"account","type":"string"},{"name":"balance","type":"long"},
            {"name":"payment_id","type":"string"},
            {"name":"currency","type":"string","default":"EUR"}]}"#;
/// Incompatible: `balance` changes type.
const BALANCE_BAD: &str = r#"{"type":"record","name":"Balance","namespace":"acme.wallet",
  "fields":[{"name":"account","type":"string"},{"name":"balance","type":"string"},
            {"name":"payment_id","type":"string"},
            {"name":"currency","type":"string","default":"EUR"}]}"#;

/// Points the wallet's manifest at Avro topics with `balance` as the
/// balances' schema file.
fn avro_manifest(w: &Wallet, balance: &str) {
    let schemas = w.dir.path().join("schemas");
    std::fs::create_dir_all(&schemas).expect("schemas dir");
    std::fs::write(schemas.join("payment.avsc"), PAYMENT).expect("payment.avsc");
    std::fs::write(schemas.join("balance.avsc"), balance).expect("balance.avsc");
    let text = std::fs::read_to_string(&w.manifest).expect("manifest");
    let text = text
        .replace(
            &format!("inputs = [\"{}\"]", w.payments),
            &format!(
                "inputs = [{{ topic = \"{}\", format = \"avro\", schema = \"schemas/payment.avsc\" }}]",
                w.payments
            ),
        )
        .replace(
            &format!("balances = \"{}\"", w.balances),
            &format!(
                "balances = {{ topic = \"{}\", format = \"avro\", schema = \"schemas/balance.avsc\" }}",
                w.balances
            ),
        )
        .replace(
            &format!("audit = \"{}\"", w.audit),
            &format!(
                "audit = {{ topic = \"{}\", format = \"avro\", schema = \"schemas/payment.avsc\" }}",
                w.audit
            ),
        );
    assert!(text.contains("format = \"avro\""), "{text}");
    std::fs::write(&w.manifest, text).expect("write manifest");
}

const PAYMENT_JSON_SCHEMA: &str = r#"{"type":"object","required":["payment_id","account","amount"],
  "properties":{"payment_id":{"type":"string"},"account":{"type":"string"},"amount":{"type":"integer"}}}"#;
const BALANCE_JSON_SCHEMA: &str = r#"{"type":"object","required":["account","balance","payment_id"],
  "properties":{"account":{"type":"string"},"balance":{"type":"integer"},"payment_id":{"type":"string"}}}"#;

const PAYMENT_PROTO: &str = "syntax = \"proto3\";\npackage acme.wallet;\n\
    message Payment { string payment_id = 1; string account = 2; int64 amount = 3; }\n";
const BALANCE_PROTO: &str = "syntax = \"proto3\";\npackage acme.wallet;\n\
    message Balance { string account = 1; int64 balance = 2; string payment_id = 3; }\n";

/// Points the wallet's manifest at Protobuf topics.
fn protobuf_manifest(w: &Wallet) {
    let schemas = w.dir.path().join("schemas");
    std::fs::create_dir_all(&schemas).expect("schemas dir");
    std::fs::write(schemas.join("payment.proto"), PAYMENT_PROTO).expect("payment.proto");
    std::fs::write(schemas.join("balance.proto"), BALANCE_PROTO).expect("balance.proto");
    formatted_manifest(w, "protobuf", "proto");
}

/// Points the wallet's manifest at JSON Schema topics.
fn json_schema_manifest(w: &Wallet) {
    let schemas = w.dir.path().join("schemas");
    std::fs::create_dir_all(&schemas).expect("schemas dir");
    std::fs::write(schemas.join("payment.json"), PAYMENT_JSON_SCHEMA).expect("payment.json");
    std::fs::write(schemas.join("balance.json"), BALANCE_JSON_SCHEMA).expect("balance.json");
    formatted_manifest(w, "json-schema", "json");
}

/// Points the wallet's topics at `format`, with the schema files
/// `schemas/{payment,balance}.{ext}`.
fn formatted_manifest(w: &Wallet, format: &str, ext: &str) {
    let text = std::fs::read_to_string(&w.manifest).expect("manifest");
    let formatted = |topic: &str, schema: &str| {
        format!(
            "{{ topic = \"{topic}\", format = \"{format}\", schema = \"schemas/{schema}.{ext}\" }}"
        )
    };
    let text = text
        .replace(
            &format!("inputs = [\"{}\"]", w.payments),
            &format!("inputs = [{}]", formatted(&w.payments, "payment")),
        )
        .replace(
            &format!("balances = \"{}\"", w.balances),
            &format!("balances = {}", formatted(&w.balances, "balance")),
        )
        .replace(
            &format!("audit = \"{}\"", w.audit),
            &format!("audit = {}", formatted(&w.audit, "payment")),
        );
    assert!(text.contains(&format!("format = \"{format}\"")), "{text}");
    std::fs::write(&w.manifest, text).expect("write manifest");
}

/// 300 payments (ids `{prefix}0`...) over 7 accounts, each JSON value
/// written by `write`, then one `poison` value: what the wallet must show.
fn produce_framed(
    w: &Wallet,
    prefix: &str,
    write: impl Fn(&[u8]) -> Vec<u8>,
    poison: Vec<u8>,
) -> Produced {
    let producer = w.producer();
    let mut valid = Produced::default();
    for i in 0..300_i64 {
        let account = format!("acct-{}", i % 7);
        let value = format!(r#"{{"payment_id":"{prefix}{i}","account":"{account}","amount":{i}}}"#);
        producer
            .send(
                BaseRecord::to(&w.payments)
                    .key(&account)
                    .payload(&write(value.as_bytes())),
            )
            .expect("send");
        valid.valid += 1;
        *valid.totals.entry(account).or_insert(0) += i;
    }
    producer
        .send(BaseRecord::to(&w.payments).key("bad").payload(&poison))
        .expect("send");
    valid.invalid += 1;
    producer.flush(Duration::from_secs(30)).expect("flush");
    valid
}

/// Every committed value of `topic`, as bytes.
fn committed_values(topic: &str) -> Vec<Vec<u8>> {
    let c: BaseConsumer = cluster().committed_reader("formats-reader");
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let mut tpl = TopicPartitionList::new();
    let mut remaining = 0;
    for p in md.topics()[0].partitions() {
        let (low, high) = c
            .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
            .expect("watermarks");
        if high > low {
            tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
                .expect("offset");
            remaining += 1;
        }
    }
    let mut out = Vec::new();
    if remaining == 0 {
        return out;
    }
    c.assign(&tpl).expect("assign");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut idle = 0;
    // Until 2 s pass without a record (the test's input is all committed).
    while idle < 10 {
        assert!(std::time::Instant::now() < deadline, "reading {topic}");
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                idle = 0;
                out.push(m.payload().unwrap_or_default().to_vec());
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => idle += 1,
        }
    }
    out
}

#[test]
fn s_avro_wallet_exactly_once_through_kills_an_upgrade_and_refusals() {
    let _g = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let tls = TestTls::make(dir.path());
    let registry = TestRegistry::up(&[
        "--tls-cert",
        path(&tls.cert),
        "--tls-key",
        path(&tls.key),
        "--basic-user",
        "onceflow=host-s3cret",
        "--basic-user",
        "producer=producer-s3cret",
    ]);
    assert!(registry.url.starts_with("https://"), "{}", registry.url);
    let host_credentials = dir.path().join("registry.credentials");
    std::fs::write(&host_credentials, "onceflow:host-s3cret\n").expect("credentials");
    let producer_credentials = dir.path().join("producer.credentials");
    std::fs::write(&producer_credentials, "producer:producer-s3cret\n").expect("credentials");
    // What producers use: their own registry user.
    let client = Arc::new(
        Registry::new(RegistryConfig {
            url: registry.url.clone(),
            credentials: Some(producer_credentials),
            ca_cert: Some(tls.ca.clone()),
        })
        .expect("a registry client"),
    );
    let registry_args = [
        "--schema-registry",
        &registry.url,
        "--schema-registry-credentials",
        path(&host_credentials),
        "--schema-registry-ca",
        path(&tls.ca),
    ];

    let fleet = Fleet::new();
    let start = |label: &str| {
        let mut args = vec!["--host-id", label];
        args.extend_from_slice(&registry_args);
        let mut h = fleet.spawn_host(label, &cluster().bootstrap, &args);
        h.wait_healthy(label, Duration::from_secs(90));
        h
    };
    let h1 = start("s1");
    let h2 = start("s2");
    let mut w = Wallet::in_tenant(cluster(), "acme", "acme.", "avro", "exactly_once_v2", 4);
    avro_manifest(&w, BALANCE_V1);
    let payment_id = client
        .register(&format!("{}-value", w.payments), PAYMENT)
        .expect("register the payments' schema");
    w.avro = Some((
        payment_id,
        Arc::new(AvroSchema::parse(PAYMENT).expect("payment")),
    ));
    w.schema_registry = Some(client.clone());

    let deployed = h1.json(ACME, &["deploy", path(&w.manifest)]);
    assert_eq!(deployed["version"], 1, "{deployed}");
    let balances_subject = format!("{}-value", w.balances);
    let v1_id = client
        .register(&balances_subject, BALANCE_V1)
        .expect("the deploy registered balance v1: the same id again");

    // Poison payloads, each dead-lettered with its reason: a schema id of
    // another tenant's subject (whose record would decode, but is not
    // acme's to read), and a payload that is no datum of its schema.
    let spy_id = client
        .register(
            "globex.secrets-value",
            r#"{"type":"record","name":"Secret","fields":[{"name":"secret","type":"string"}]}"#,
        )
        .expect("register globex's schema");
    let spy = AvroSchema::parse(
        r#"{"type":"record","name":"Secret","fields":[{"name":"secret","type":"string"}]}"#,
    )
    .expect("schema");
    let producer = w.producer();
    let poison = [
        (
            "spy",
            frame(spy_id, &spy.encode(br#"{"secret":"s"}"#).expect("datum")),
        ),
        ("torn", frame(payment_id, b"\x02")),
    ];
    for (key, value) in &poison {
        producer
            .send(BaseRecord::to(&w.payments).key(*key).payload(value))
            .expect("send poison");
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
    let mut produced = Produced {
        invalid: poison.len() as u64,
        ..Produced::default()
    };

    // Load, with a SIGKILL of each host in turn (each started again).
    std::thread::scope(|scope| {
        let load = scope.spawn(|| produce_paced(&w, 0, 12_000, Duration::from_secs(12)));
        std::thread::sleep(Duration::from_secs(3));
        h1.kill();
        let h1 = start("s1");
        std::thread::sleep(Duration::from_secs(3));
        h2.kill();
        let h2 = start("s2");
        produced.absorb(load.join().expect("producer"));
        w.wait_done(Duration::from_secs(180));
        assert_exact(
            &w.verify(false),
            &produced,
            "Avro, each host SIGKILLed once",
        );
        figure(
            "avro_wallet_payments_exact",
            produced.valid + produced.invalid,
        );

        let letters = read_committed(cluster(), &w.dlq);
        let reason = |key: &str| {
            letters
                .iter()
                .find(|(_, k, _, _)| k == key)
                .and_then(|(_, _, _, e)| e.clone())
                .unwrap_or_else(|| panic!("no dead letter for {key}: {letters:?}"))
        };
        assert!(
            reason("spy").contains(&format!(
                "schema id {spy_id} belongs to no subject of this tenant"
            )),
            "{}",
            reason("spy")
        );
        assert!(
            reason("torn").contains("not an Avro datum"),
            "{}",
            reason("torn")
        );

        // Every balance is Avro under the registered id.
        let ids: std::collections::BTreeSet<u32> = committed_values(&w.balances)
            .iter()
            .map(|v| unframe(v).expect("wire format").0)
            .collect();
        assert_eq!(ids, [v1_id].into(), "balances' schema ids");

        // Version 2 adds a field with a default: registered as the
        // subject's second version, deployed as an upgrade.
        avro_manifest(&w, BALANCE_V2);
        let upgraded = h2.json(ACME, &["deploy", path(&w.manifest)]);
        assert_eq!(upgraded["version"], 2, "{upgraded}");
        wait_for("every host runs version 2", Duration::from_secs(90), || {
            let d = h1.json(ACME, &["describe", &w.name]);
            d["status"] == "running" && d["running_versions"] == serde_json::json!([2])
        });
        produced.absorb(w.produce(20_000, 2_000, 500, Some(97)));
        w.wait_done(Duration::from_secs(120));
        assert_exact(&w.verify(false), &produced, "after the schema's upgrade");
        let v2_id = client
            .register(&balances_subject, BALANCE_V2)
            .expect("v2 is registered: the same id again");
        assert_ne!(v1_id, v2_id);
        let v2 = AvroSchema::parse(BALANCE_V2).expect("v2");
        let newest: Vec<serde_json::Value> = committed_values(&w.balances)
            .iter()
            .filter_map(|v| {
                let (id, datum) = unframe(v).ok()?;
                (id == v2_id).then(|| serde_json::from_slice(&v2.decode(datum, None).ok()?).ok())?
            })
            .collect();
        assert!(!newest.is_empty(), "no balance written with version 2");
        assert!(
            newest.iter().all(|b| b["currency"] == "EUR"),
            "{:?}",
            &newest[..3.min(newest.len())]
        );

        // A registry that stops answering is nobody's fault: payments
        // written with a schema the hosts have not seen yet wait (the
        // batch aborted, the worker's session started again after a
        // backoff), and none is dead-lettered.
        const PAYMENT_V2: &str = r#"{"type":"record","name":"Payment","namespace":"acme.wallet",
          "fields":[{"name":"payment_id","type":"string"},{"name":"account","type":"string"},
                    {"name":"amount","type":"long"},
                    {"name":"note","type":["null","string"],"default":null}]}"#;
        let v2_payment_id = client
            .register(&format!("{}-value", w.payments), PAYMENT_V2)
            .expect("register payment v2");
        let dead_before = read_committed(cluster(), &w.dlq).len();
        let before = w.committed();
        let v2 = (
            v2_payment_id,
            Arc::new(AvroSchema::parse(PAYMENT_V2).expect("v2")),
        );
        registry.pause();
        produced.absorb(w.produce_avro(&w.producer(), 30_000, 500, 500, None, Some(&v2)));
        std::thread::sleep(Duration::from_secs(15));
        let waiting = w.committed();
        registry.resume();
        let resumed = std::time::Instant::now();
        w.wait_done(Duration::from_secs(120));
        figure(
            "avro_registry_paused_15s_drained_after_resume_s",
            format!("{:.1}", resumed.elapsed().as_secs_f64()),
        );
        assert_eq!(
            waiting, before,
            "payments of an unseen schema were committed while the registry did not answer"
        );
        assert_eq!(
            read_committed(cluster(), &w.dlq).len(),
            dead_before,
            "a registry that did not answer dead-lettered payments"
        );
        let logs = [&h1, &h2]
            .iter()
            .map(|h| std::fs::read_to_string(&h.log).unwrap_or_default())
            .collect::<String>();
        assert!(
            logs.contains("the schema registry could not be asked")
                && logs.contains("re-creating the producer and rejoining the group"),
            "no host reported the registry's silence: {}",
            logs.lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("registry"))
                .take(40)
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert_exact(
            &w.verify(false),
            &produced,
            "after the registry stopped answering",
        );

        // The last transactions of each partition, replayed by a host of
        // the fleet for the tenant (the component it holds, the Avro
        // values through the registry): identical (docs/replay.md).
        let mut replayed = 0;
        for p in 0..4 {
            let partition = p.to_string();
            let answer = h2.json(
                ACME,
                &[
                    "replay",
                    &w.name,
                    "--partition",
                    &partition,
                    "--last",
                    "2",
                    "--quiet",
                ],
            );
            let transactions = answer["transactions"].as_array().expect("transactions");
            assert!(!transactions.is_empty(), "{answer}");
            assert_eq!(answer["identical"], transactions.len(), "{answer}");
            replayed += transactions.len();
        }
        figure("avro_fleet_replayed_transactions_identical", replayed);
        // Another tenant's deployment is not there for it.
        let other = h1.refused(super::GLOBEX, &["replay", &w.name, "--partition", "0"]);
        assert!(other.contains("no deployment named"), "{other}");

        // An incompatible schema is refused with the registry's message;
        // version 2 goes on.
        avro_manifest(&w, BALANCE_BAD);
        let refused = h1.refused(ACME, &["deploy", path(&w.manifest)]);
        assert!(
            refused.contains("incompatible") && refused.contains(&balances_subject),
            "{refused}"
        );
        let d = h1.json(ACME, &["describe", &w.name]);
        assert_eq!(d["version"], 2, "{d}");
        h1.json(ACME, &["delete", &w.name, "--purge-state"]);

        // The same wallet on JSON Schema topics: JSON text in the wire
        // format, checked against the registry's schema.
        let j = Wallet::in_tenant(
            cluster(),
            "acme",
            "acme.",
            "jsonschema",
            "exactly_once_v2",
            2,
        );
        json_schema_manifest(&j);
        let id = client
            .register_kind(
                &format!("{}-value", j.payments),
                PAYMENT_JSON_SCHEMA,
                SchemaKind::Json,
            )
            .expect("register the payments' JSON Schema");
        let deployed = h2.json(ACME, &["deploy", path(&j.manifest)]);
        assert_eq!(deployed["version"], 1, "{deployed}");
        // The last fits no JSON Schema of its subject: dead-lettered.
        let valid = produce_framed(
            &j,
            "j",
            |value| frame(id, value),
            frame(id, br#"{"payment_id":"b","account":"a","amount":"x"}"#),
        );
        let mut jv = j;
        jv.schema_registry = Some(client.clone());
        jv.wait_done(Duration::from_secs(120));
        assert_exact(&jv.verify(false), &valid, "JSON Schema");
        h2.json(ACME, &["delete", &jv.name, "--purge-state"]);

        // And on Protobuf topics: the message indexes after the id, proto3
        // JSON for the wallet, its balances written as Balance messages.
        let p = Wallet::in_tenant(cluster(), "acme", "acme.", "protobuf", "exactly_once_v2", 2);
        protobuf_manifest(&p);
        let id = client
            .register_kind(
                &format!("{}-value", p.payments),
                PAYMENT_PROTO,
                SchemaKind::Protobuf,
            )
            .expect("register the payments' .proto");
        let deployed = h1.json(ACME, &["deploy", path(&p.manifest)]);
        assert_eq!(deployed["version"], 1, "{deployed}");
        let proto = ProtoSchema::parse(PAYMENT_PROTO).expect("payment.proto");
        let payment = proto.message(None).expect("Payment");
        // Message indexes naming no message of the schema: dead-lettered.
        let valid = produce_framed(
            &p,
            "q",
            |value| frame(id, &proto.encode(&payment, value).expect("encode")),
            frame(id, b"\x02\x0a\x0a\x01b"),
        );
        let mut pv = p;
        pv.schema_registry = Some(client.clone());
        pv.wait_done(Duration::from_secs(120));
        assert_exact(&pv.verify(false), &valid, "Protobuf");
        let balances = committed_values(&pv.balances);
        assert!(!balances.is_empty());
        for value in &balances {
            let (balance_id, message) = unframe(value).expect("the wire format");
            assert_ne!(
                balance_id, id,
                "balances are Balance messages, not payments"
            );
            assert_eq!(message[0], 0, "Balance is the file's first message: [0]");
        }
        h1.json(ACME, &["delete", &pv.name, "--purge-state"]);
        h1.stop();
        h2.stop();
    });
    drop(registry);
}
