//! The brokers' side of TLS and SASL (issue 15, item 4): a broker with a
//! SASL_SSL listener (SCRAM-SHA-512, a certificate this test makes, ACLs
//! enforced) runs the wallet exactly once for a tenant principal that holds
//! only its prefixed ACLs (docs/security.md), `onceflow verify` included,
//! and principals without them are refused with an error that says so;
//! then a fleet host through the same listener, with the host ACLs of
//! docs/kafka-security.md, and one without the internal prefix's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::c_control_plane::{ACME, Fleet as HostFleet, path};
use crate::common::cluster::{Cluster, OwnCluster, serial};
use crate::common::wallet::{Produced, Wallet};

/// A CA and a broker certificate it signed, for 127.0.0.1 (librdkafka
/// checks the broker's name), made with the openssl CLI.
struct Certificates {
    /// The CA's certificate: the clients' `ssl.ca.location`.
    ca: PathBuf,
    /// The broker's key (PKCS#8), certificate and chain in one PEM file.
    broker: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (the openssl CLI is needed)");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn make_certificates(dir: &Path) -> Certificates {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=onceflow-test-ca",
    ];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem"]);
    openssl(dir, &ca);
    let mut csr = vec!["req", "-subj", "/CN=localhost"];
    csr.extend(ec);
    csr.extend(["-keyout", "broker.key", "-out", "broker.csr"]);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("san.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("write san.cnf");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "broker.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "1",
            "-days",
            "2",
            "-extfile",
            "san.cnf",
            "-out",
            "broker.crt",
        ],
    );
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("read a PEM file");
    let broker = dir.join("broker.pem");
    std::fs::write(
        &broker,
        read("broker.key") + &read("broker.crt") + &read("ca.pem"),
    )
    .expect("write broker.pem");
    Certificates {
        ca: dir.join("ca.pem"),
        broker,
    }
}

/// `scripts/kafka acls --add ...` on the cluster (through its PLAINTEXT
/// listener, whose principal is a super user).
fn grant(cluster: &Cluster, args: &[&str]) {
    let mut all = vec!["acls", "--add", "--resource-pattern-type", "prefixed"];
    all.extend(args);
    let out = cluster.script(&all);
    assert!(
        out.status.success(),
        "scripts/kafka {}: {}{}",
        all.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `-X` settings of a client that authenticates as `user`.
fn sasl_settings(ca: &Path, user: &str) -> Vec<String> {
    [
        "security.protocol=SASL_SSL".to_owned(),
        "sasl.mechanisms=SCRAM-SHA-512".to_owned(),
        format!("sasl.username={user}"),
        format!("sasl.password={user}-secret"),
        format!("ssl.ca.location={}", ca.display()),
    ]
    .into_iter()
    .flat_map(|kv| ["-X".to_owned(), kv])
    .collect()
}

/// The same, with the password in a file in `dir` (`-X
/// sasl.password.file=`), out of the process list.
fn sasl_file_settings(ca: &Path, dir: &Path, user: &str) -> Vec<String> {
    let file = dir.join(format!("{user}.password"));
    std::fs::write(&file, format!("{user}-secret\n")).expect("write the password file");
    let literal = format!("sasl.password={user}-secret");
    sasl_settings(ca, user)
        .into_iter()
        .map(|kv| {
            if kv == literal {
                format!("sasl.password.file={}", file.display())
            } else {
                kv
            }
        })
        .collect()
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `onceflow run` of the wallet as `user`, which must stop by itself within
/// 60 s (refused); returns its log.
fn refused_run(w: &Wallet, ca: &Path, user: &str) -> String {
    let settings = sasl_settings(ca, user);
    let mut host = w.start(user, &as_strs(&settings));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = host.exited() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "onceflow run as {user} (missing ACLs) still runs after 60 s; log:\n{}",
            host.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = host.log_text();
    assert_eq!(status.code(), Some(1), "onceflow run as {user}:\n{log}");
    log
}

/// Asserts `onceflow verify`'s output says the wallet `w` ran exactly once
/// on what was `produced`, with no warning or error on its stderr.
fn assert_verified(w: &Wallet, produced: &Produced, checked: &Output) {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr),
    );
    let keys = produced.totals.len();
    let expected = format!(
        "input {payments}: {all} records, {valid} valid, {invalid} invalid, {keys} keys\n\
         echo {audit}: {valid} records, 0 missing, 0 duplicates, 0 unexpected\n\
         totals {balances}: {valid} records, 0 of {keys} keys wrong\n\
         dead letters {dlq}: {invalid} records\n\
         verdict: exact: no gap, no duplicate, every total right, no open transaction\n",
        payments = w.payments,
        audit = w.audit,
        balances = w.balances,
        dlq = w.dlq,
        all = produced.valid + produced.invalid,
        valid = produced.valid,
        invalid = produced.invalid,
    );
    assert!(checked.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout, expected, "stderr:\n{stderr}");
    // Its reader's group is under the tenant's prefix: no refusal logged.
    let alarming: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    assert!(
        alarming.is_empty(),
        "a healthy verify through SASL_SSL printed warnings:\n{stderr}"
    );
}

#[test]
fn a_wallet_through_sasl_ssl_exactly_once_and_principals_without_acls_are_refused() {
    let _g = serial();
    let started = Instant::now();
    let certs_dir = tempfile::tempdir().expect("temp dir");
    let certs = make_certificates(certs_dir.path());
    // Tenant `acme` holds the prefixed ACLs; `partial` those on the topics
    // and groups but not the transactional ids; `nogroup` those on the topics
    // and transactional ids but not the groups; `intruder` none. `onceflow` is a fleet host's principal with
    // the host ACLs; `bare` holds acme's prefix but not the internal one.
    let own = OwnCluster::new(Cluster::start_with_sasl(
        "sasl",
        19792,
        &certs.broker,
        "admin=admin-secret",
        &[
            "acme=acme-secret",
            "partial=partial-secret",
            "nogroup=nogroup-secret",
            "intruder=intruder-secret",
            "onceflow=onceflow-secret",
            "bare=bare-secret",
        ],
    ));
    let cluster = own.0;
    let up = started.elapsed();

    // The ACLs of docs/security.md, for tenant `acme` (prefix `acme.`).
    grant(
        cluster,
        &[
            "--allow-principal",
            "User:acme",
            "--allow-principal",
            "User:partial",
            "--allow-principal",
            "User:nogroup",
            "--topic",
            "acme.",
            "--operation",
            "Read",
            "--operation",
            "Write",
            "--operation",
            "Create",
            "--operation",
            "DescribeConfigs",
        ],
    );
    grant(
        cluster,
        &[
            "--allow-principal",
            "User:acme",
            "--allow-principal",
            "User:partial",
            "--group",
            "acme.",
            "--operation",
            "Read",
        ],
    );
    grant(
        cluster,
        &[
            "--allow-principal",
            "User:acme",
            "--allow-principal",
            "User:nogroup",
            "--transactional-id",
            "acme.",
            "--operation",
            "Write",
        ],
    );
    let granted = started.elapsed();

    // The wallet of tenant acme on acme.* topics (created and fed by the
    // rig through PLAINTEXT), run and verified through SASL_SSL as acme.
    let w = Wallet::in_tenant(cluster, "acme", "acme.", "sasl", "exactly_once_v2", 3);
    let produced = w.produce(0, 2_000, 50, Some(100));
    // acme's password from a file (issue 45, item 7): `run` and `verify`
    // authenticate with it, and verify prints no warning.
    let acme = sasl_file_settings(&certs.ca, certs_dir.path(), "acme");
    let host = w.start("a", &as_strs(&acme));
    w.wait_done(Duration::from_secs(90));
    assert!(host.stop().success(), "onceflow run exits 0 on SIGTERM");
    let checked = w.verify_cli_at(&cluster.host_bootstrap, &as_strs(&acme));
    println!(
        "$ onceflow verify --bootstrap-servers {} -X security.protocol=SASL_SSL \
         -X sasl.mechanisms=SCRAM-SHA-512 -X sasl.username=acme -X sasl.password.file=... \
         -X ssl.ca.location=ca.pem --input {} --echo {} --totals {} --dead-letter {}\n{}",
        cluster.host_bootstrap,
        w.payments,
        w.audit,
        w.balances,
        w.dlq,
        String::from_utf8_lossy(&checked.stdout)
    );
    assert_verified(&w, &produced, &checked);
    let ran = started.elapsed();

    // No ACL at all: the first thing asked, the input's metadata, is
    // refused; the error says so and names the topic (it said "does not
    // exist" before).
    let log = refused_run(&w, &certs.ca, "intruder");
    // A password given literally still works, with a warning naming the
    // alternatives.
    assert!(
        log.contains("-X sasl.password=...: the value is visible")
            && log.contains("-X sasl.password.file=PATH"),
        "{log}"
    );
    let topic_refused = format!(
        "error: topic {:?}: not authorized: the brokers refused Describe on it",
        w.payments
    );
    assert!(log.contains(&topic_refused), "{log}");
    let intruder = sasl_settings(&certs.ca, "intruder");
    let checked = w.verify_cli_at(&cluster.host_bootstrap, &as_strs(&intruder));
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert!(!checked.status.success(), "verify as intruder succeeded");
    assert!(stderr.contains(&topic_refused), "{stderr}");
    println!("$ onceflow run ... -X sasl.username=intruder ...\n{topic_refused} ...");

    // One kind of ACL missing each: `partial` lacks the transactional ids'
    // (the producer's is refused), `nogroup` the groups' (the consumer
    // group is refused); the deployment stops either way (it retried
    // forever before). Each lacks one kind only: the producer fences while
    // the consumer joins, so with both missing either refusal may come
    // first (CI of 8c287dd).
    let one_missing = [
        (
            "partial",
            format!(
                "error: transactional id \"{}-partial-0\": not authorized: the brokers refused Write on it",
                w.app
            ),
        ),
        (
            "nogroup",
            format!(
                "error: consumer group {:?}: not authorized: the brokers refused Read on it",
                w.app
            ),
        ),
    ];
    for (user, refusal) in one_missing {
        let log = refused_run(&w, &certs.ca, user);
        assert!(log.contains(&refusal), "{log}");
        println!("$ onceflow run ... -X sasl.username={user} ...\n{refusal} ...");
    }

    let refusals = started.elapsed();

    // A fleet host through SASL_SSL as `onceflow`, with the host ACLs of
    // docs/kafka-security.md: a deploy through it runs exactly once, and
    // `query` and `delete --purge-state` work under them.
    // As kafka-security.md grants them: the internal prefix's topics and
    // groups, and the tenant's topics, groups and transactional ids (`bare`
    // gets only the tenant's, and so is refused at start).
    let internal: &[&str] = &["--topic", "_onceflow.", "--group", "_onceflow."];
    let tenant: &[&str] = &[
        "--topic",
        "acme.",
        "--group",
        "acme.",
        "--transactional-id",
        "acme.",
    ];
    for (principal, resources) in [
        ("onceflow", internal),
        ("onceflow", tenant),
        ("bare", tenant),
    ] {
        let user = format!("User:{principal}");
        let mut args = vec!["--allow-principal", &user, "--operation", "All"];
        args.extend_from_slice(resources);
        grant(cluster, &args);
    }
    let fleet = HostFleet::new();
    let host_settings = sasl_settings(&certs.ca, "onceflow");
    let mut extra = vec!["--host-id", "sasl-host"];
    extra.extend(as_strs(&host_settings));
    let mut host = fleet.spawn_host("sasl-host", &cluster.host_bootstrap, &extra);
    host.wait_healthy("sasl-host", Duration::from_secs(90));
    let w2 = Wallet::in_tenant(cluster, "acme", "acme.", "saslhost", "exactly_once_v2", 3);
    let produced2 = w2.produce(0, 2_000, 50, Some(100));
    let deployed = host.json(ACME, &["deploy", path(&w2.manifest)]);
    assert_eq!(deployed["version"], 1, "{deployed}");
    w2.wait_done(Duration::from_secs(120));
    // This time acme's password from the environment.
    let no_password: Vec<String> = sasl_settings(&certs.ca, "acme")
        .chunks(2)
        .filter(|x_kv| !x_kv[1].starts_with("sasl.password="))
        .flatten()
        .cloned()
        .collect();
    let checked = crate::common::onceflow()
        .env("ONCEFLOW_KAFKA_PASSWORD", "acme-secret")
        .args(["verify", "--bootstrap-servers", &cluster.host_bootstrap])
        .args(&no_password)
        .args(["--input", &w2.payments, "--echo", &w2.audit])
        .args(["--totals", &w2.balances, "--dead-letter", &w2.dlq])
        .output()
        .expect("run onceflow verify");
    println!(
        "$ onceflow deploy (through a host as User:onceflow over SASL_SSL), then verify\n{}",
        String::from_utf8_lossy(&checked.stdout)
    );
    assert_verified(&w2, &produced2, &checked);
    let (account, balance) = produced2.totals.iter().next().expect("an account");
    let q = host.json(ACME, &["query", &w2.name, "balances", account]);
    assert_eq!(
        q["values"][0]["value"].as_str().unwrap_or_default().trim(),
        balance.to_string(),
        "query {account}: {q}"
    );
    host.json(ACME, &["delete", &w2.name, "--purge-state"]);
    let log = host.log_text();
    host.stop();
    assert!(
        !log.contains("not authorized"),
        "the host with the documented ACLs was refused something:\n{log}"
    );
    let hosted = started.elapsed();

    // A host principal without the internal prefix's ACLs is refused at
    // start, with the ACL named, at once: not after --kafka-wait-secs (it
    // waited for the refused topics as for a cluster still starting).
    let bare_settings = sasl_settings(&certs.ca, "bare");
    let mut extra = vec!["--host-id", "bare-host", "--kafka-wait-secs", "120"];
    extra.extend(as_strs(&bare_settings));
    let mut bare = fleet.spawn_host("bare-host", &cluster.host_bootstrap, &extra);
    let status = bare.wait_exit(Duration::from_secs(30));
    let log = bare.log_text();
    assert!(
        status.is_some_and(|s| !s.success()),
        "a host as User:bare (no _onceflow. ACLs) did not stop with an error within 30 s \
         ({status:?}):\n{log}"
    );
    let refused_line = log
        .lines()
        .rfind(|l| l.contains("not authorized"))
        .unwrap_or_else(|| panic!("a host as User:bare: no \"not authorized\" in its log:\n{log}"));
    assert!(refused_line.contains("_onceflow."), "{refused_line}");
    println!("$ onceflow host ... -X sasl.username=bare ...\n{refused_line}");

    println!(
        "FIGURE sasl_test_seconds {:.1} (broker up {:.1}, ACLs {:.1}, wallet and verify {:.1}, \
         refusals {:.1}, a host through SASL_SSL {:.1})",
        started.elapsed().as_secs_f64(),
        up.as_secs_f64(),
        (granted - up).as_secs_f64(),
        (ran - granted).as_secs_f64(),
        (refusals - ran).as_secs_f64(),
        (hosted - refusals).as_secs_f64()
    );
}
