//! `onceflow sink postgres` on a real Kafka and a real PostgreSQL
//! (scripts/postgres): the wallet's balances topic into a `balances` table
//! (upsert by account) and its audit topic into an `audit` table (one row
//! per payment, identity `payment_id`), through SIGKILLs in the middle of a
//! batch's transaction and between its COMMIT and the Kafka offset commit,
//! a SIGSTOPped zombie whose partitions moved to another instance, and a
//! PostgreSQL restart. The tables are then compared with what was produced:
//! every payment exactly once (the audit table has no unique constraint, so
//! a duplicate would be a second row), every final balance right. The same
//! topics through a naive at-least-once sink (insert, commit, then commit
//! the offsets) crashed once between its two commits show duplicates: the
//! instrument sees the failure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Headers, Message};

use crate::common::cluster::{Cluster, plain_producer, send, serial};
use crate::common::host_process::Host;
use crate::common::pg::Postgres;
use crate::common::wallet::{Produced, Wallet, assert_exact};

fn figure(name: &str, value: impl std::fmt::Display) {
    println!("FIGURE {name} {value}");
}

/// `onceflow sink postgres` as a child process, its log in `dir`.
fn start_sink(config: &Path, bootstrap: &str, dir: &Path, instance: &str, extra: &[&str]) -> Host {
    let mut cmd = Command::new(crate::common::onceflow_bin());
    cmd.args(["sink", "postgres"])
        .arg(config)
        .args(["--bootstrap-servers", bootstrap])
        .args(["--instance-id", instance])
        .args(["--report-interval-ms", "1000"])
        .args(extra)
        .env("ONCEFLOW_LOG", "info");
    // A short session unless the test sets one.
    if !extra.contains(&"--session-timeout-ms") {
        cmd.args(["--session-timeout-ms", "3000"]);
    }
    Host::spawn(cmd, &dir.join(format!("sink-{instance}.log")), instance)
}

/// SIGTERM: the batch in hand is committed, the exit is clean, and nothing
/// was logged as an error.
fn stop_sink(sink: Host) {
    let log = sink.log.clone();
    assert!(sink.stop().success(), "the sink's exit after SIGTERM");
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        !text.contains(" ERROR "),
        "a clean run logged errors:\n{text}"
    );
}

/// The wallet's two routes into `balances` and `audit`: `sink.toml` of
/// sink `name`, with `postgres` (the `[postgres]` table's lines) and
/// `extra` (more tables) as given.
struct Routes<'a> {
    name: &'a str,
    dlq: &'a str,
    balances_topic: &'a str,
    balances: &'a str,
    audit_topic: &'a str,
    audit: &'a str,
}

impl Routes<'_> {
    fn toml(&self, postgres: &str, extra: &str) -> String {
        let Routes {
            name,
            dlq,
            balances_topic,
            balances,
            audit_topic,
            audit,
        } = self;
        format!(
            r#"name = "{name}"
dead-letter-topic = "{dlq}"
[postgres]
{postgres}
{extra}
[[routes]]
topic = "{balances_topic}"
mode = "upsert"
table = "{balances}"
columns = ["account", "balance", "payment_id"]
key = ["account"]
[[routes]]
topic = "{audit_topic}"
mode = "insert"
table = "{audit}"
columns = ["payment_id", "account", "amount"]
identity = "payment_id"
"#
        )
    }
}

/// The audit table (no unique constraint: a duplicate would be a second
/// row) and the balances table of wallet `tag`; returns their names.
fn create_tables(db: &mut ::postgres::Client, tag: &str) -> (String, String) {
    let (audit, balances) = (format!("audit_{tag}"), format!("balances_{tag}"));
    db.batch_execute(&format!(
        "CREATE TABLE {audit} (payment_id text NOT NULL, account text NOT NULL, amount bigint NOT NULL);
         CREATE INDEX ON {audit} (payment_id);
         CREATE TABLE {balances} (account text PRIMARY KEY, balance bigint NOT NULL, payment_id text NOT NULL);"
    ))
    .expect("create the tables");
    (audit, balances)
}

fn count(db: &mut ::postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).expect(sql).get(0)
}

/// Waits until the audit table holds `n` distinct payments.
fn wait_rows(
    db: &mut ::postgres::Client,
    audit: &str,
    n: i64,
    timeout: Duration,
    logs: &dyn Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    loop {
        let have = count(
            db,
            &format!("SELECT count(DISTINCT payment_id) FROM {audit}"),
        );
        if have >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{have} of {n} payments in {audit} after {timeout:?}; logs:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The payment ids `Wallet::produce(first, n, _, Some(every))` made valid.
fn valid_ids(ranges: &[(u64, u64)], every: u64) -> BTreeSet<String> {
    ranges
        .iter()
        .flat_map(|&(first, n)| first..first + n)
        .filter(|i| i % every != every - 1)
        .map(|i| format!("p{i}"))
        .collect()
}

#[test]
fn a_exactly_once_into_postgres_through_kills_a_zombie_and_a_restart() {
    let _g = serial();
    let cluster = Cluster::shared();
    let pg = Postgres::up();
    let mut db = pg.client();

    // The wallet runs throughout, on 3 partitions; payments come in chunks.
    let w = Wallet::new(cluster, "sink", "exactly_once_v2", 3);
    let host = w.start("a", &[]);
    let mut produced = Produced::default();
    let mut ranges = Vec::new();
    let mut next = 0u64;
    let mut feed = |n: u64| {
        produced.absorb(w.produce(next, n, 200, Some(50)));
        ranges.push((next, n));
        next += n;
    };
    feed(6_000);

    let tag = w.name.replace(['-', '.'], "_");
    let (audit, balances) = create_tables(&mut db, &tag);
    let dlq = format!("{}.sink-dlq", w.payments);
    cluster.create_topics(&[(&dlq, 1)]);
    let config = w.dir.path().join("sink.toml");
    let routes = Routes {
        name: &w.name,
        dlq: &dlq,
        balances_topic: &w.balances,
        balances: &balances,
        audit_topic: &w.audit,
        audit: &audit,
    };
    let postgres = format!(
        "connection = \"{}\"\npassword-file = \"{}\"",
        pg.url,
        pg.password_file.display()
    );
    std::fs::write(
        &config,
        routes.toml(&postgres, "[batch]\nmax-records = 500\nmax-wait-ms = 50"),
    )
    .expect("write sink.toml");
    let start = |instance: &str, extra: &[&str]| {
        start_sink(&config, &cluster.bootstrap, w.dir.path(), instance, extra)
    };
    let logs = || {
        let mut text = String::new();
        for e in std::fs::read_dir(w.dir.path()).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "log") {
                let t = std::fs::read_to_string(&p).unwrap_or_default();
                let tail: Vec<&str> = t.lines().rev().take(40).collect();
                text.push_str(&format!(
                    "\n--- {}\n{}",
                    p.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
        }
        text
    };
    let mut kills = 0;

    // 1. SIGKILL in the middle of a batch's transaction (its statements
    //    ran; COMMIT not sent), twice.
    for round in 0..2 {
        let mut s = start("s1", &["--fault-pause-before-commit-ms", "1500"]);
        s.wait_for(
            "fault window: before COMMIT",
            2 + round,
            Duration::from_secs(120),
        );
        s.kill();
        kills += 1;
    }
    feed(3_000);
    // 2. SIGKILL between the database COMMIT and the Kafka offset commit.
    {
        let mut s = start("s1", &["--fault-pause-after-commit-ms", "1500"]);
        s.wait_for("fault window: after COMMIT", 3, Duration::from_secs(120));
        s.kill();
        kills += 1;
    }
    feed(3_000);
    // 3. An ambiguous COMMIT: it went through, its answer is lost (made
    //    certain by a hidden flag), and the batch is applied again, as
    //    after a timeout: every record of the retry is found below its
    //    partition's position.
    {
        let mut s = start("s1", &["--fault-lose-commit-answers", "2"]);
        s.wait_for("the answer to COMMIT is lost", 2, Duration::from_secs(120));
        s.wait_for("sink progress", 2, Duration::from_secs(30));
        let log = s.log.clone();
        stop_sink(s);
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let behind: u64 = text
            .rsplit("behind: ")
            .next()
            .and_then(|t| t.split(',').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        assert!(
            behind > 0,
            "the retried batches found nothing applied:\n{text}"
        );
        figure("sink_retried_records_found_applied", behind);
    }
    feed(3_000);
    // 4. A zombie: s1 stops (SIGSTOP) with a batch in hand, before its
    //    transaction; its session expires, s2 claims the partitions and
    //    applies them; s1 resumes and must commit nothing of its batch.
    let mut zombie = start("s1", &["--fault-pause-before-begin-ms", "2000"]);
    zombie.wait_for("fault window: before BEGIN", 2, Duration::from_secs(120));
    zombie.signal(libc::SIGSTOP);
    let mut s2 = start("s2", &["--fault-pause-before-commit-ms", "200"]);
    s2.wait_for(
        "partitions assigned and claimed",
        1,
        Duration::from_secs(60),
    );
    feed(3_000);
    s2.wait_for("fault window: before COMMIT", 5, Duration::from_secs(60));
    zombie.signal(libc::SIGCONT);
    zombie.wait_for(
        "another instance claimed these partitions",
        1,
        Duration::from_secs(60),
    );
    stop_sink(zombie);
    // 4b. A zombie stopped inside its batch transaction (statements run,
    //     COMMIT not sent) for longer than the idle-in-transaction timeout
    //     the sink sets on its sessions (10 s): PostgreSQL ends the session,
    //     s2 claims the partitions meanwhile; resumed, the zombie must be
    //     fenced like the one above, not die (issue 48: before, it exited
    //     with "applying a batch: terminating connection due to
    //     idle-in-transaction timeout", SQLSTATE 25P03, a restart loop on
    //     the fleet).
    let mut zombie = start("s3", &["--fault-pause-before-commit-ms", "3000"]);
    zombie.wait_for(
        "partitions assigned and claimed",
        1,
        Duration::from_secs(60),
    );
    feed(3_000);
    zombie.wait_for("fault window: before COMMIT", 1, Duration::from_secs(60));
    zombie.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(14));
    zombie.signal(libc::SIGCONT);
    zombie.wait_for(
        "another instance claimed these partitions",
        1,
        Duration::from_secs(60),
    );
    assert!(
        zombie.exited().is_none(),
        "the zombie exited instead of carrying on:\n{}",
        zombie.log_text()
    );
    for line in zombie
        .log_text()
        .lines()
        .filter(|l| l.contains("transaction failed"))
    {
        println!("zombie in its transaction: {line}");
    }
    stop_sink(zombie);
    // 5. PostgreSQL restarts (immediate shutdown) under s2, with a
    //    transaction open.
    feed(3_000);
    let windows = s2.log_text().matches("fault window: before COMMIT").count();
    s2.wait_for(
        "fault window: before COMMIT",
        windows + 1,
        Duration::from_secs(60),
    );
    pg.restart();
    s2.wait_for(
        "reconnecting and applying it again",
        1,
        Duration::from_secs(60),
    );
    let mut db = pg.client();
    feed(3_000);
    w.wait_done(Duration::from_secs(300));
    assert!(host.stop().success());
    let report = w.verify(false);
    assert_exact(&report, &produced, "the wallet, before the sink is checked");
    // 6. Upstream duplicates and poison on the audit topic itself: the same
    //    event twice (applied once), a changed payload for an applied
    //    identity and a value that is not JSON (both dead letters).
    let producer = plain_producer(cluster);
    let event = r#"{"payment_id":"x1","account":"acct-x","amount":7}"#;
    send(&producer, &w.audit, "x1", event);
    send(&producer, &w.audit, "x1", event);
    send(
        &producer,
        &w.audit,
        "x1",
        r#"{"payment_id":"x1","account":"acct-x","amount":700}"#,
    );
    send(&producer, &w.audit, "x2", "not json");
    // A value that does not fit its column (the batch goes record by
    // record), then the corrected event with the same identity: applied.
    send(
        &producer,
        &w.audit,
        "x3",
        r#"{"payment_id":"x3","account":"acct-x","amount":"N/A"}"#,
    );
    send(
        &producer,
        &w.audit,
        "x3",
        r#"{"payment_id":"x3","account":"acct-x","amount":3}"#,
    );

    let expected = valid_ids(&ranges, 50);
    wait_rows(
        &mut db,
        &audit,
        expected.len() as i64 + 2,
        Duration::from_secs(180),
        &logs,
    );
    std::thread::sleep(Duration::from_millis(500));
    stop_sink(s2);

    // Every payment exactly once, and nothing else but x1.
    let rows: Vec<(String, i64)> = db
        .query(
            &format!("SELECT payment_id, count(*) FROM {audit} GROUP BY payment_id"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let duplicated: Vec<&(String, i64)> = rows.iter().filter(|(_, n)| *n > 1).collect();
    assert!(
        duplicated.is_empty(),
        "payments applied twice: {:?}",
        &duplicated[..duplicated.len().min(10)]
    );
    let mut ids: BTreeSet<String> = rows.iter().map(|(p, _)| p.clone()).collect();
    assert!(ids.remove("x1"), "the upstream event x1 is applied");
    assert!(ids.remove("x3"), "the corrected event x3 is applied");
    assert_eq!(ids.len(), expected.len(), "payments in the audit table");
    assert!(
        ids == expected,
        "the audit table's payments differ from those produced"
    );
    let x1: i64 = db
        .query_one(
            &format!("SELECT amount FROM {audit} WHERE payment_id = 'x1'"),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(x1, 7, "x1 as first applied, not the changed payload");
    let x3: i64 = db
        .query_one(
            &format!("SELECT amount FROM {audit} WHERE payment_id = 'x3'"),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(x3, 3, "x3 as corrected");
    // Every final balance right, against the inputs.
    let table: BTreeMap<String, i64> = db
        .query(&format!("SELECT account, balance FROM {balances}"), &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        table.len(),
        produced.totals.len(),
        "accounts in the balances table"
    );
    let wrong: Vec<_> = produced
        .totals
        .iter()
        .filter(|(a, t)| table.get(*a) != Some(t))
        .collect();
    assert!(
        wrong.is_empty(),
        "wrong balances: {:?}",
        &wrong[..wrong.len().min(10)]
    );
    // The three dead letters, in the topic, with their reasons and digests.
    let letters = read_all(cluster, &dlq, 3);
    assert_eq!(letters.len(), 3, "dead letters: {letters:?}");
    assert!(
        letters
            .iter()
            .any(|(k, h)| k == "x3" && h["onceflow.error"].contains("bigint")),
        "{letters:?}"
    );
    assert!(
        letters
            .iter()
            .any(|(k, h)| k == "x1" && h.contains_key("onceflow.applied-digest")),
        "the changed payload carries both digests: {letters:?}"
    );
    assert!(
        letters
            .iter()
            .any(|(k, h)| k == "x2" && h["onceflow.error"].contains("not JSON")),
        "{letters:?}"
    );
    let zombie_fenced = db
        .query_one(
            &format!(
                "SELECT max(owner_epoch) FROM onceflow_sink_progress WHERE sink = '{}'",
                w.name
            ),
            &[],
        )
        .unwrap()
        .get::<_, i64>(0);
    figure("sink_kills", kills);
    figure("sink_payments_verified", expected.len());
    figure("sink_accounts_verified", table.len());
    figure("sink_max_owner_epoch", zombie_fenced);

    // The naive sink on the same topics: insert, commit, then commit the
    // offsets; one crash between the two commits.
    let naive = format!("naive_{tag}");
    db.batch_execute(&format!(
        "CREATE TABLE {naive} (payment_id text NOT NULL, account text NOT NULL, amount bigint NOT NULL)"
    ))
    .unwrap();
    let group = format!("naive-{}", w.name);
    naive_sink(cluster, &w.audit, &group, &mut db, &naive, Some(3));
    naive_sink(cluster, &w.audit, &group, &mut db, &naive, None);
    let dups = count(
        &mut db,
        &format!(
            "SELECT count(*) - count(DISTINCT payment_id) FROM {naive} WHERE payment_id NOT IN ('x1', 'x3')"
        ),
    );
    figure("sink_naive_duplicates", dups);
    assert!(
        dups > 0,
        "the naive sink crashed between its commits and wrote no duplicate"
    );
    db.batch_execute(&format!("DROP TABLE {audit}, {balances}, {naive}"))
        .unwrap();
    pg.down();
}

/// Records of `topic` (key, headers), until `n` or 20 s.
fn read_all(cluster: &Cluster, topic: &str, n: usize) -> Vec<(String, BTreeMap<String, String>)> {
    let c = cluster.committed_reader(&format!("read-{topic}"));
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < n && Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let mut h = BTreeMap::new();
            if let Some(hs) = m.headers() {
                for x in hs.iter() {
                    h.insert(
                        x.key.to_owned(),
                        String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned(),
                    );
                }
            }
            out.push((key, h));
        }
    }
    out
}

/// A naive at-least-once sink: per batch, insert the rows (autocommit),
/// then commit the offsets. With `crash_after`, it stops after that many
/// batches between the insert and the offset commit (as a SIGKILL there
/// would); else it runs until 3 s pass without a record.
pub(crate) fn naive_sink(
    cluster: &Cluster,
    topic: &str,
    group: &str,
    db: &mut ::postgres::Client,
    table: &str,
    crash_after: Option<usize>,
) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &cluster.bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    c.subscribe(&[topic]).unwrap();
    let mut batches = 0;
    // Idle from the last record, once one came: joining the group and the
    // first fetch may take more than 3 s on a busy machine (2 minutes at most).
    let give_up = Instant::now() + Duration::from_secs(120);
    let mut last: Option<Instant> = None;
    loop {
        let mut rows: Vec<serde_json::Value> = Vec::new();
        let started = Instant::now();
        while rows.len() < 500 && started.elapsed() < Duration::from_millis(200) {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(50)) {
                last = Some(Instant::now());
                // (Poison skipped: this sink's failure is not the point.)
                if let Some(v) = m
                    .payload()
                    .and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
                    .filter(|v| v["amount"].is_i64())
                {
                    rows.push(v);
                }
            }
        }
        if !rows.is_empty() {
            db.execute(
                &format!(
                    "INSERT INTO {table} SELECT * FROM jsonb_populate_recordset(NULL::{table}, $1::text::jsonb)"
                ),
                &[&serde_json::Value::Array(rows).to_string()],
            )
            .unwrap();
            batches += 1;
            if crash_after == Some(batches) {
                return;
            }
            c.commit_consumer_state(CommitMode::Sync).unwrap();
        } else if crash_after.is_none()
            && last.map_or(Instant::now() > give_up, |t| {
                t.elapsed() > Duration::from_secs(3)
            })
        {
            return;
        }
    }
}

/// A tenant's sink deployed on the fleet (`onceflow deploy sink.toml`): it
/// names a connection the host offers the tenant (`--sink-connections`),
/// never credentials; topics outside the tenant's namespace and a
/// connection string are refused with the key to change; the deployed sink
/// writes every payment once.
#[test]
fn b_a_tenants_sink_on_the_fleet() {
    use crate::c_control_plane::{ACME, Fleet, path};
    let _g = serial();
    let cluster = Cluster::shared();
    let pg = Postgres::up();
    let w = Wallet::in_tenant(cluster, "acme", "acme.", "fleetsink", "exactly_once_v2", 3);
    let produced = w.produce(0, 3_000, 100, Some(50));
    let host = w.start("a", &[]);
    w.wait_done(Duration::from_secs(180));
    assert!(host.stop().success());

    let tag = w.name.replace(['-', '.'], "_");
    // The operator's setup (docs/sink.md): acme's role and schema, its
    // tables there, made by the superuser and granted to the role.
    pg.tenant("acme");
    let mut admin = pg.admin();
    admin
        .batch_execute("SET search_path = acme")
        .expect("search_path");
    let (audit, balances) = create_tables(&mut admin, &tag);
    admin
        .batch_execute("RESET search_path")
        .expect("search_path");
    let (audit, balances) = (format!("acme.{audit}"), format!("acme.{balances}"));
    let dlq = format!("{}.sink-dlq", w.payments);
    cluster.create_topics(&[(&dlq, 1)]);
    let connections = w.dir.path().join("connections.toml");
    std::fs::write(
        &connections,
        format!(
            "[[postgres]]\nname = \"analytics\"\nconnection = \"{}\"\npassword-file = \"{}\"\ntenants = [\"acme\"]\n",
            pg.url,
            pg.password_file.display()
        ),
    )
    .expect("write connections.toml");
    let name = format!("sink-{tag}").replace('_', "-");
    let sink_toml = |connection: &str, balances_topic: &str| {
        Routes {
            name: &name,
            dlq: &dlq,
            balances_topic,
            balances: &balances,
            audit_topic: &w.audit,
            audit: &audit,
        }
        .toml(&format!("connection = \"{connection}\""), "")
    };
    let write = |file: &str, text: String| {
        let p = w.dir.path().join(file);
        std::fs::write(&p, text).expect("write sink.toml");
        p
    };
    let good = write("sink.toml", sink_toml("analytics", &w.balances));
    let outside = write("outside.toml", sink_toml("analytics", "globex.balances"));
    let in_clear = write("in-clear.toml", sink_toml(&pg.url, &w.balances));
    let no_topic = write(
        "no-topic.toml",
        sink_toml("analytics", &w.balances).replace(&dlq, &format!("{dlq}-missing")),
    );
    // The wallet's changelog exists (it ran above): before, a sink whose
    // dead letters went into it deployed, and the wallet's next restore
    // would have taken them for balances (issue 45).
    let changelog = format!("{}-balances-changelog", w.app);
    let into_changelog = write(
        "into-changelog.toml",
        sink_toml("analytics", &w.balances).replace(&dlq, &changelog),
    );

    let fleet = Fleet::new();
    let mut h = fleet.spawn_host(
        "h1",
        &cluster.bootstrap,
        &["--host-id", "h1", "--sink-connections", path(&connections)],
    );
    h.wait_healthy("h1", Duration::from_secs(90));
    let refused = h.refused(ACME, &["deploy", path(&outside)]);
    assert!(
        refused.contains("routes[0].topic") && refused.contains("outside your namespace"),
        "{refused}"
    );
    let refused = h.refused(ACME, &["deploy", path(&in_clear)]);
    assert!(
        refused.contains("postgres.connection") && refused.contains("analytics"),
        "{refused}"
    );
    let refused = h.refused(ACME, &["deploy", path(&no_topic)]);
    assert!(
        refused.contains("dead-letter-topic: no such topic"),
        "{refused}"
    );
    let refused = h.refused(ACME, &["deploy", path(&into_changelog)]);
    assert!(
        refused.contains(&format!(
            "dead-letter-topic: topic {changelog:?} is reserved"
        )) && refused.contains("-changes"),
        "{refused}"
    );
    let deployed = h.json(ACME, &["deploy", path(&good)]);
    assert_eq!(deployed["name"], name.as_str(), "{deployed}");

    let expected = valid_ids(&[(0, 3_000)], 50);
    wait_rows(
        &mut admin,
        &audit,
        expected.len() as i64,
        Duration::from_secs(120),
        &|| h.log_text(),
    );
    let listed = h.json(ACME, &["list"]);
    assert!(
        listed["deployments"]
            .as_array()
            .is_some_and(|d| d.iter().any(|x| x["name"] == name.as_str())),
        "{listed}"
    );
    // Billed (issue 45): the sink's usage in `onceflow usage`, against the
    // topics it read, counted independently. Before: no row for the sink.
    let (audit_records, audit_bytes) = cluster.records_and_bytes(&w.audit);
    let (balance_records, balance_bytes) = cluster.records_and_bytes(&w.balances);
    let (dead, _) = cluster.records_and_bytes(&dlq);
    let (records_in, bytes_in) = (audit_records + balance_records, audit_bytes + balance_bytes);
    let deadline = Instant::now() + Duration::from_secs(60);
    let row = loop {
        let usage = h.json(ACME, &["usage"]);
        let row = usage["deployments"]
            .as_array()
            .and_then(|d| d.iter().find(|x| x["deployment"] == name.as_str()))
            .cloned();
        let counted = row
            .as_ref()
            .map_or(0, |r| r["records_in"].as_u64().unwrap_or(0));
        if counted >= records_in || Instant::now() > deadline {
            break row.unwrap_or_else(|| panic!("no usage for the sink {name}: {usage}"));
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let counted = |field: &str| row[field].as_u64().unwrap_or(0);
    for (field, independent) in [
        ("records_in", records_in),
        ("bytes_in", bytes_in),
        ("dead_letters", dead),
        // Every record read was applied: no duplicate, no dead letter.
        ("records_out", records_in - dead),
    ] {
        figure(
            &format!("fleet_sink_usage_{field}"),
            format!("{} (independently: {independent})", counted(field)),
        );
        assert_eq!(counted(field), independent, "sink usage {field}: {row}");
    }
    h.json(ACME, &["delete", &name]);
    h.stop();

    let rows = count(&mut admin, &format!("SELECT count(*) FROM {audit}"));
    let distinct = count(
        &mut admin,
        &format!("SELECT count(DISTINCT payment_id) FROM {audit}"),
    );
    assert_eq!(
        (rows, distinct),
        (expected.len() as i64, expected.len() as i64)
    );
    let table: BTreeMap<String, i64> = admin
        .query(&format!("SELECT account, balance FROM {balances}"), &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        table, produced.totals,
        "the balances table against the payments"
    );
    // Its rows in the sink's tables are the tenant's: `<tenant>.<name>`.
    let owners = count(
        &mut admin,
        &format!(
            "SELECT count(*) FROM onceflow_sink_progress WHERE sink = 'acme.{name}' AND owner = 'h1'"
        ),
    );
    assert_eq!(
        owners, 6,
        "the progress rows of both topics' 3 partitions, owned by h1"
    );
    figure("fleet_sink_payments_verified", expected.len());
    admin
        .batch_execute(&format!("DROP TABLE {audit}, {balances}"))
        .unwrap();
    pg.down();
}

/// A name no earlier run used.
pub(crate) fn unique_tag() -> String {
    format!(
        "{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() % 1_000_000)
    )
}

/// A test's sink of its own on the shared cluster: `topic` (with
/// `partitions`) and its dead-letter topic `<topic>-dlq` created, table
/// `table (id text)` filled by an insert route with identity `id`, batches
/// of up to 100 records or 500 ms; `dir` holds `sink.toml` and the logs.
struct IdSink {
    cluster: &'static Cluster,
    db: ::postgres::Client,
    tag: String,
    topic: String,
    table: String,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
}

impl IdSink {
    /// Topic `sink-<what>-<tag>` into table `<what>_<tag>`.
    fn new(what: &str, partitions: i32) -> IdSink {
        IdSink::in_schema(what, partitions, None)
    }

    /// The same, with the sink's own tables and the route's table in
    /// `schema` (given: created first, the sink's user granted CREATE on
    /// it).
    fn in_schema(what: &str, partitions: i32, schema: Option<&str>) -> IdSink {
        let cluster = Cluster::shared();
        let pg = Postgres::up();
        let mut db = pg.client();
        let tag = unique_tag();
        let topic = format!("sink-{what}-{tag}");
        let (table, schema_line) = match schema {
            Some(schema) => {
                let user = db
                    .query_one("SELECT current_user::text", &[])
                    .expect("the sink's user")
                    .get::<_, String>(0);
                pg.admin()
                    .batch_execute(&format!(
                        "CREATE SCHEMA {schema}; GRANT USAGE, CREATE ON SCHEMA {schema} TO {user}"
                    ))
                    .expect("create the schema");
                (
                    format!("{schema}.{what}_{tag}"),
                    format!("schema = \"{schema}\"\n"),
                )
            }
            None => (format!("{what}_{tag}"), String::new()),
        };
        let dlq = format!("{topic}-dlq");
        cluster.create_topics(&[(topic.as_str(), partitions), (&dlq, 1)]);
        db.batch_execute(&format!("CREATE TABLE {table} (id text NOT NULL)"))
            .expect("create the table");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = dir.path().join("sink.toml");
        std::fs::write(
            &config,
            format!(
                r#"name = "sink-{tag}"
dead-letter-topic = "{dlq}"
[postgres]
{schema_line}connection = "{url}"
password-file = "{password}"
[batch]
max-records = 100
max-wait-ms = 500
[[routes]]
topic = "{topic}"
mode = "insert"
table = "{table}"
columns = ["id"]
identity = "id"
"#,
                url = pg.url,
                password = pg.password_file.display(),
            ),
        )
        .expect("write sink.toml");
        IdSink {
            cluster,
            db,
            tag,
            topic,
            table,
            dir,
            config,
        }
    }

    /// Instance `instance` started (with `extra` flags), not waited for.
    fn spawn(&self, instance: &str, extra: &[&str]) -> Host {
        start_sink(
            &self.config,
            &self.cluster.bootstrap,
            self.dir.path(),
            instance,
            extra,
        )
    }

    /// Instance `instance` started and owning partitions.
    fn start(&self, instance: &str, extra: &[&str]) -> Host {
        let mut sink = self.spawn(instance, extra);
        sink.wait_for(
            "partitions assigned and claimed",
            1,
            Duration::from_secs(60),
        );
        sink
    }

    /// Rows in the table.
    fn rows(&mut self) -> i64 {
        count(
            &mut self.db,
            &format!("SELECT count(*) FROM {}", self.table),
        )
    }
}

/// Two instances, one partition each, the same identities on both
/// partitions in opposite orders (upstream duplicates): their batches
/// insert the same markers at once. Inserted in the batch's order they
/// deadlocked, and PostgreSQL failed one batch after its deadlock_timeout
/// (issue 48, item 3); inserted in identity order, one waits for the other
/// and finds its markers. The window is made wide on purpose: each marker
/// goes in alone, 200 ms apart (`--fault-pause-between-markers-ms`).
#[test]
fn c_markers_in_a_fixed_order() {
    const IDS: usize = 6;
    let _g = serial();
    let mut rig = IdSink::new("dups", 2);
    let fault = ["--fault-pause-between-markers-ms", "200"];
    let s1 = rig.start("s1", &fault);
    let s2 = rig.start("s2", &fault);
    // Both own a partition now (s1 gave one up to s2).
    let (cluster, topic, tag) = (rig.cluster, rig.topic.clone(), rig.tag.clone());
    let producer = plain_producer(cluster);
    for i in 0..IDS {
        for (partition, id) in [(0, i), (1, IDS - 1 - i)] {
            let value = format!(r#"{{"id": "d{id}"}}"#);
            let key = format!("d{id}");
            let record = rdkafka::producer::BaseRecord::to(&topic)
                .partition(partition)
                .key(&key)
                .payload(&value);
            producer.send(record).expect("queue a record");
        }
    }
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(30)).expect("flush");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = count(
            &mut rig.db,
            &format!(
                "SELECT count(*) FROM onceflow_sink_progress WHERE sink = 'sink-{tag}' AND next_offset = {IDS}"
            ),
        );
        if done == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every record applied after 120 s; logs:\n{}\n{}",
            s1.log_text(),
            s2.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let logs = s1.log_text() + &s2.log_text();
    let deadlocks = logs
        .lines()
        .filter(|l| l.contains("deadlock detected"))
        .count();
    let markers_at_once = logs
        .lines()
        .filter(|l| l.contains("fault window: after a marker"))
        .count();
    figure("sink_markers_inserted_one_at_a_time", markers_at_once);
    figure("sink_marker_deadlocks", deadlocks);
    assert_eq!(rig.rows(), IDS as i64, "each identity applied once");
    assert!(
        markers_at_once >= 2 * IDS,
        "the markers did not go in one at a time: the test proves nothing"
    );
    assert_eq!(
        deadlocks, 0,
        "two instances inserting the same markers deadlocked:\n{logs}"
    );
    stop_sink(s1);
    stop_sink(s2);
}

/// The dead-letter forwarder while the broker stalls (SIGSTOPped for 14 s,
/// longer than the 10 s idle-in-transaction timeout the sink sets): it
/// must give up waiting within its bound, never leaving its session idle
/// in a transaction until PostgreSQL ends it (issue 48, item 1: before, it
/// waited up to 60 s for the broker), and the dead letter must reach its
/// topic once (eos-audit-3 finding 11: before, each forward that gave up
/// rolled back and sent the letter again, 3 copies after this stall; now
/// the rows wait, claimed, unmarked and not sent again, for Kafka's
/// acknowledgement, with no transaction open).
#[test]
fn d_the_forwarder_never_idles_in_a_transaction() {
    let _g = serial();
    let rig = IdSink::new("fwd", 1);
    let (cluster, topic) = (rig.cluster, &rig.topic);
    let mut s1 = rig.start("s1", &["--fault-pause-before-commit-ms", "2000"]);
    let producer = plain_producer(cluster);
    send(&producer, topic, "bad", "not json: a dead letter");
    send(&producer, topic, "good", r#"{"id": "good"}"#);
    // The batch with the dead letter is in its transaction: the broker
    // stalls before the forward after its COMMIT.
    s1.wait_for("fault window: before COMMIT", 1, Duration::from_secs(60));
    cluster.pause_broker(1);
    std::thread::sleep(Duration::from_secs(14));
    cluster.resume_broker(1);
    let dlq = format!("{topic}-dlq");
    let letters = read_all(cluster, &dlq, 1);
    assert!(!letters.is_empty(), "no dead letter reached {dlq}");
    // A forward runs every few seconds: before, each one in the stall had
    // sent the letter again, and the copies were all in the topic within
    // seconds of the broker's return.
    std::thread::sleep(Duration::from_secs(8));
    let (copies, _) = cluster.records_and_bytes(&dlq);
    let log = s1.log_text();
    let gave_up = log
        .lines()
        .filter(|l| l.contains("until Kafka acknowledges them"))
        .count();
    let session_lost = log
        .lines()
        .filter(|l| {
            l.contains("connection closed")
                || l.contains("idle-in-transaction")
                || l.contains("terminating connection")
        })
        .count();
    figure("sink_forwards_given_up_during_the_stall", gave_up);
    figure("sink_sessions_lost_idle_in_transaction", session_lost);
    figure("sink_dead_letter_copies_in_the_topic", copies);
    assert_eq!(
        session_lost, 0,
        "the forwarder left its session idle in a transaction:\n{log}"
    );
    assert_eq!(
        copies, 1,
        "one dead letter, {copies} copies in {dlq}:\n{log}"
    );
    assert!(
        gave_up > 0,
        "the forward never met the stalled broker: the test proves nothing\n{log}"
    );
    stop_sink(s1);
}

/// A sink instance starting while another is inside a batch transaction
/// (issue 48, item 2): its start checks the schema without taking a lock,
/// so it neither waits for that transaction nor makes the running
/// instance's next batch wait behind it. Before, its `CREATE INDEX IF NOT
/// EXISTS` took a ShareLock on the markers table even with the index there,
/// which waits for every batch holding the table.
#[test]
fn e_a_start_does_not_wait_for_a_running_batch() {
    let _g = serial();
    let mut rig = IdSink::new("start", 1);
    // Held inside its transaction (markers inserted, not committed), below
    // the 10 s idle-in-transaction timeout the sink sets.
    let mut s1 = rig.start("s1", &["--fault-pause-before-commit-ms", "8000"]);
    let producer = plain_producer(rig.cluster);
    send(&producer, &rig.topic, "a", r#"{"id": "a"}"#);
    s1.wait_for("fault window: before COMMIT", 1, Duration::from_secs(60));
    let launched = Instant::now();
    let mut s2 = rig.spawn("s2", &[]);
    s2.wait_for("sink started", 1, Duration::from_secs(60));
    let took = launched.elapsed();
    // Still inside the first instance's transaction: nothing applied yet.
    let applied = rig.rows();
    figure("sink_start_beside_an_open_batch_ms", took.as_millis());
    assert_eq!(
        applied,
        0,
        "the second instance started only after the first one's batch committed ({took:?}): \
         its start waited for the running transaction\n{}",
        s2.log_text()
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while rig.rows() < 1 {
        assert!(
            Instant::now() < deadline,
            "the held batch never committed:\n{}",
            s1.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    stop_sink(s1);
    stop_sink(s2);
}

/// A first start creates the sink's tables under the schema's migration
/// lock (issue 48): with another session holding that advisory lock, the
/// start waits for it (seen in pg_locks: the sink's session waiting); the
/// holder being anyone (a tenant's role can take any advisory lock), the
/// wait is bounded: the start then goes on without the lock and names the
/// holder's key in a warning. Before, the tables were created without a
/// lock (a race between two first starts was retried): no session waited.
#[test]
fn f_tables_created_under_the_schema_lock() {
    use sha2::{Digest, Sha256};
    let _g = serial();
    let schema = format!("sk_{}", unique_tag());
    let rig = IdSink::in_schema("lock", 1, Some(&schema));
    // The key the sink derives (host/src/sink/db.rs, schema_lock_key).
    let digest = Sha256::digest(format!("onceflow sink schema {schema}").as_bytes());
    let key = i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
    let pg = Postgres::up();
    let mut holder = pg.admin();
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&key])
        .expect("take the schema's lock");
    let mut s1 = rig.spawn("s1", &[]);
    let mut watcher = pg.admin();
    let tables = |watcher: &mut ::postgres::Client| -> bool {
        watcher
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL",
                &[&format!("{schema}.onceflow_sink_progress")],
            )
            .expect("look for the table")
            .get(0)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let waiting = loop {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                 AND (classid::bigint << 32 | objid::bigint) = $1",
                &[&key],
            )
            .expect("read pg_locks")
            .get(0);
        if waiting > 0 || Instant::now() >= deadline || s1.log_text().contains("sink started") {
            break waiting;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let started_meanwhile = s1.log_text().contains("sink started");
    let tables_meanwhile = tables(&mut watcher);
    figure("sink_starts_waiting_for_the_schema_lock", waiting);
    assert_eq!(
        waiting,
        1,
        "the first start did not wait for the schema's migration lock:\n{}",
        s1.log_text()
    );
    assert!(
        !started_meanwhile && !tables_meanwhile,
        "the sink started (or created its tables) while waiting for the lock"
    );
    // Still held: the start goes on without it, and says who to look for.
    s1.wait_for(
        "partitions assigned and claimed",
        1,
        Duration::from_secs(60),
    );
    let log = s1.log_text();
    assert!(
        log.contains(&format!("advisory lock {key}")),
        "no warning names the lock's key:\n{log}"
    );
    assert!(
        tables(&mut watcher),
        "the sink's tables are not in schema {schema}"
    );
    holder
        .execute("SELECT pg_advisory_unlock($1)", &[&key])
        .expect("release the schema's lock");
    stop_sink(s1);
}

/// A claim made from an assignment the group took back does not stall the
/// partition (issue 42, item 2; eos-audit-3 finding 3). Instance A owns one
/// partition (r) and B the other (q); A's batch on r is held 30 s before
/// BEGIN (`--fault-pause-before-begin-ms`), with a 10 s poll interval. B
/// stops: the group gives q to A, whose claim waits behind the held batch,
/// so A stops polling and is expelled; B2 joins, gets both partitions and
/// claims them. When the batch ends, A's claim of q runs anyway and raises
/// q's epoch over B2's, then A is killed. Before, B2's next batch on q was
/// fenced and B2 paused q "until the group gives it back", which the group
/// never does for a partition its member keeps: q's records were never
/// applied. Now B2, still q's owner in the group, rejoins and claims it
/// again, and every record arrives.
#[test]
fn g_a_stale_claim_does_not_stall_its_partition() {
    let _g = serial();
    let mut rig = IdSink::new("stale", 2);
    let producer = plain_producer(rig.cluster);
    let topic = rig.topic.clone();
    let to = |partition: i32, id: &str| {
        let value = format!(r#"{{"id": "{id}"}}"#);
        producer
            .send(
                rdkafka::producer::BaseRecord::to(&topic)
                    .partition(partition)
                    .key(id)
                    .payload(&value),
            )
            .expect("queue a record");
        rdkafka::producer::Producer::flush(&producer, Duration::from_secs(30)).expect("flush");
    };
    // After its batch, A waits 20 s more before it polls again (`after
    // COMMIT`): it cannot rejoin the group before it is killed (rejoining,
    // it could be given q back, which would hide the stall).
    let held = [
        "--fault-pause-before-begin-ms",
        "30000",
        "--fault-pause-after-commit-ms",
        "20000",
        "-X",
        "max.poll.interval.ms=10000",
        // (librdkafka wants it at least the session, for every client.)
        "-X",
        "session.timeout.ms=3000",
    ];
    let mut a = rig.start("a", &held);
    let b = rig.start("b", &[]);
    // B took one partition from A (cooperative-sticky).
    let claimed = |log: &str| -> Vec<i32> {
        log.lines()
            .filter(|l| l.contains("partitions assigned and claimed"))
            .filter_map(|l| l.split(&format!("{topic}/")).nth(1))
            .filter_map(|rest| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let q = loop {
        if let Some(&q) = claimed(&b.log_text()).first() {
            break q;
        }
        assert!(
            Instant::now() < deadline,
            "B claimed nothing:\n{}",
            b.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let r = 1 - q;
    std::thread::sleep(Duration::from_secs(1));
    // A's batch on r, held before BEGIN; then B leaves and B2 comes.
    to(r, "r0");
    a.wait_for("fault window: before BEGIN", 1, Duration::from_secs(60));
    assert!(b.stop().success(), "B's exit");
    // The group gives q to A (B2 joining before that would get q itself).
    let group = format!("onceflow-sink-sink-{}", rig.tag);
    let deadline = Instant::now() + Duration::from_secs(60);
    while max_assigned(rig.cluster, &group) < 2 {
        assert!(
            Instant::now() < deadline,
            "A was not given B's partition:\n{}",
            a.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let b2 = rig.spawn("b2", &["--session-timeout-ms", "10000"]);
    // A's late claim of q, after its batch (A was expelled meanwhile).
    a.wait_for(
        "partitions assigned and claimed",
        2,
        Duration::from_secs(90),
    );
    let a_log = a.log_text();
    a.kill();
    for i in 0..20 {
        to(q, &format!("q{i}"));
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut rows = rig.rows();
    while rows < 21 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        rows = rig.rows();
    }
    let b2_log = b2.log_text();
    figure("sink_stale_claim_rows_of_21", rows);
    assert_eq!(
        rows, 21,
        "partition {q}'s records were not applied after A's stale claim (B2 paused it):\n--- \
         B2\n{b2_log}\n--- A\n{a_log}"
    );
    // The stale claim did fence B2 (its session never lapsed: a 10 s one,
    // so that only the fix can bring q back).
    assert!(
        b2_log.contains("another instance claimed these partitions")
            && !b2_log.contains("session timed out"),
        "A's stale claim fenced B2, whose session held:\n--- B2\n{b2_log}\n--- A\n{a_log}"
    );
    stop_sink(b2);
}

/// The most partitions one member of `group` is assigned, from the group's
/// description (the consumer protocol's assignment: version, then per
/// topic its name and partitions).
fn max_assigned(cluster: &Cluster, group: &str) -> usize {
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &cluster.bootstrap)
        .create()
        .expect("a client");
    let Ok(list) = reader.fetch_group_list(Some(group), Duration::from_secs(10)) else {
        return 0;
    };
    let partitions = |bytes: &[u8]| -> Option<usize> {
        let int = |at: usize, n: usize| -> Option<i64> {
            let b = bytes.get(at..at + n)?;
            Some(b.iter().fold(0i64, |v, x| (v << 8) | i64::from(*x)))
        };
        let mut at = 2;
        let topics = int(at, 4)?;
        at += 4;
        let mut count = 0;
        for _ in 0..topics {
            let name = int(at, 2)? as usize;
            at += 2 + name;
            let n = int(at, 4)? as usize;
            at += 4 + 4 * n;
            count += n;
        }
        Some(count)
    };
    list.groups()
        .iter()
        .flat_map(|g| g.members())
        .filter_map(|m| partitions(m.assignment()?))
        .max()
        .unwrap_or(0)
}

/// Issue 42 item 6 (eos-audit-3 finding 7): markers past the retention go
/// as fast as they come, and a position identity keeps none. A sink with
/// `markers.retention-hours = 1` finds 60,000 markers 2 hours old (what
/// 100 minutes at 10 records/s left, or 12 s at 5,000/s): they are gone
/// within about one expiry period (10 s), and the markers of the
/// records it applies meanwhile stay. Before, expiry deleted 10,000 a
/// minute, the first a minute after the start: 50,000 were left after 75 s.
/// A route whose identity is the position applies its records with no
/// marker (before: one per record; the positions already apply each
/// once).
#[test]
fn h_markers_expire_as_they_come_and_positions_keep_none() {
    const OLD: i64 = 60_000;
    const FRESH: usize = 200;
    let _g = serial();
    let mut rig = IdSink::new("expiry", 1);
    let text = std::fs::read_to_string(&rig.config).expect("sink.toml");
    std::fs::write(
        &rig.config,
        text.replace("[batch]", "[markers]\nretention-hours = 1\n[batch]"),
    )
    .expect("write sink.toml");
    let s1 = rig.start("s1", &[]);
    let sink = format!("sink-{}", rig.tag);
    let markers = |db: &mut ::postgres::Client, old: bool| {
        count(
            db,
            &format!(
                "SELECT count(*) FROM onceflow_sink_markers WHERE sink = '{sink}' AND \
                 applied_at {} now() - interval '1 hour'",
                if old { "<" } else { ">=" }
            ),
        )
    };
    rig.db
        .batch_execute(&format!(
            "INSERT INTO onceflow_sink_markers (sink, identity, digest, topic, kafka_partition, \
             kafka_offset, applied_at) SELECT '{sink}', 'old-' || g, '\\x00', 'gone', 0, g, \
             now() - interval '2 hours' FROM generate_series(1, {OLD}) g"
        ))
        .expect("insert old markers");
    let inserted = Instant::now();
    let producer = plain_producer(rig.cluster);
    for i in 0..FRESH {
        send(
            &producer,
            &rig.topic,
            "k",
            &format!(r#"{{"id": "fresh-{i}"}}"#),
        );
    }
    let mut left = OLD;
    while left > 0 && inserted.elapsed() < Duration::from_secs(75) {
        std::thread::sleep(Duration::from_millis(500));
        left = markers(&mut rig.db, true);
    }
    let took = inserted.elapsed();
    figure(
        "sink_expired_markers_left",
        format!("{left} of {OLD} after {took:.1?}"),
    );
    assert_eq!(
        left, 0,
        "{left} of {OLD} expired markers left after {took:?}"
    );
    assert_eq!(rig.rows(), FRESH as i64, "every fresh record applied once");
    assert_eq!(
        markers(&mut rig.db, false),
        FRESH as i64,
        "the fresh records' markers stay"
    );
    stop_sink(s1);

    // A position identity: no markers.
    let mut pos = IdSink::new("position", 1);
    let text = std::fs::read_to_string(&pos.config).expect("sink.toml");
    std::fs::write(&pos.config, text.replace("identity = \"id\"\n", "")).expect("sink.toml");
    let s2 = pos.start("s2", &[]);
    for i in 0..FRESH {
        send(&producer, &pos.topic, "k", &format!(r#"{{"id": "p-{i}"}}"#));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while pos.rows() < FRESH as i64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(pos.rows(), FRESH as i64, "every record applied once");
    let kept = count(
        &mut pos.db,
        &format!(
            "SELECT count(*) FROM onceflow_sink_markers WHERE sink = 'sink-{}'",
            pos.tag
        ),
    );
    figure("sink_markers_of_a_position_identity", kept);
    assert_eq!(kept, 0, "markers kept for a position identity");
    stop_sink(s2);
}

/// Issue 42 item 6 under load: a sink with an identity field applying a
/// steady stream keeps its markers within the retention window. A producer
/// sends `ONCEFLOW_MARKERS_SOAK_RATE` records/s (default 1,000: one expiry
/// statement's worth per round, so that a slower machine keeps up too) for
/// `ONCEFLOW_MARKERS_SOAK_SECS` (default 85) to a sink with
/// `markers.retention-minutes = ONCEFLOW_MARKERS_SOAK_RETENTION_MIN`
/// (default 1); every 5 s the markers older than the retention plus one
/// expiry period and a margin (17 s) are counted: none may be. Before,
/// expiry deleted 10,000 a minute and the overdue markers grew from the
/// first minute on. `scripts/drill --sink-markers` runs the long form (5,000
/// records/s for 30 minutes, 5-minute retention).
#[test]
fn i_markers_stay_within_the_retention_under_load() {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(default)
    };
    let rate = env("ONCEFLOW_MARKERS_SOAK_RATE", 1_000).max(1);
    let secs = env("ONCEFLOW_MARKERS_SOAK_SECS", 85).max(1);
    let retention_min = env("ONCEFLOW_MARKERS_SOAK_RETENTION_MIN", 1).max(1);
    let overdue_after = retention_min * 60 + 17;
    let _g = serial();
    let mut rig = IdSink::new("soak", 3);
    let text = std::fs::read_to_string(&rig.config).expect("sink.toml");
    std::fs::write(
        &rig.config,
        text.replace(
            "[batch]\nmax-records = 100\nmax-wait-ms = 500",
            &format!("[markers]\nretention-minutes = {retention_min}\n[batch]\nmax-records = 5000\nmax-wait-ms = 100"),
        ),
    )
    .expect("write sink.toml");
    assert!(
        std::fs::read_to_string(&rig.config)
            .unwrap()
            .contains("retention-minutes")
    );
    let s1 = rig.start("s1", &[]);
    let sink = format!("sink-{}", rig.tag);
    let producer = plain_producer(rig.cluster);
    let started = Instant::now();
    let (mut sent, mut next_sample) = (0u64, Duration::from_secs(5));
    let (mut max_markers, mut max_overdue, mut samples) = (0i64, 0i64, 0u32);
    while started.elapsed() < Duration::from_secs(secs) {
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            let id = format!(r#"{{"id": "soak-{sent}"}}"#);
            let key = sent.to_string();
            match producer.send(
                rdkafka::producer::BaseRecord::to(&rig.topic)
                    .key(&key)
                    .payload(&id),
            ) {
                Ok(()) => sent += 1,
                Err(_) => {
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
        producer.poll(Duration::from_millis(5));
        if started.elapsed() >= next_sample {
            next_sample += Duration::from_secs(5);
            let row = rig
                .db
                .query_one(
                    &format!(
                        "SELECT count(*), count(*) FILTER (WHERE applied_at < now() - \
                         make_interval(secs => {overdue_after})) FROM onceflow_sink_markers \
                         WHERE sink = '{sink}'"
                    ),
                    &[],
                )
                .expect("count markers");
            let (markers, overdue): (i64, i64) = (row.get(0), row.get(1));
            max_markers = max_markers.max(markers);
            max_overdue = max_overdue.max(overdue);
            samples += 1;
        }
    }
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(30)).expect("flush");
    let deadline = Instant::now() + Duration::from_secs(120);
    while rig.rows() < sent as i64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    let rows = rig.rows();
    let bound = rate as i64 * overdue_after as i64;
    figure(
        "sink_markers_soak",
        format!(
            "{sent} records at {rate}/s for {secs} s, retention {retention_min} min: \
             markers max {max_markers} (bound {bound}), overdue max {max_overdue} in {samples} samples"
        ),
    );
    assert_eq!(rows, sent as i64, "every record applied once");
    assert_eq!(
        max_overdue,
        0,
        "markers older than the retention plus {} s were left",
        overdue_after - retention_min * 60
    );
    assert!(max_markers <= bound, "{max_markers} markers, over {bound}");
    stop_sink(s1);
}

/// Issue 42 item 2 (eos-audit-3 finding 3, its second half): an instance
/// whose database is away keeps its group membership. The sink's
/// `max.poll.interval.ms` is 8 s here; PostgreSQL goes down for 20 s while
/// records keep coming, so the next batch fills while the one in flight
/// retries. The loop now pauses the partitions and polls on until the
/// batch returns; before, it waited for the committer with the consumer
/// unpolled, librdkafka left the group ("maximum poll interval exceeded")
/// and the instance's batch outlived its membership.
#[test]
fn j_a_sink_keeps_its_membership_while_its_database_is_away() {
    const N: usize = 1_500;
    let _g = serial();
    let mut rig = IdSink::new("away", 1);
    // (-X reaches every client: the session under the poll interval.)
    let s1 = rig.start(
        "s1",
        &[
            "-X",
            "session.timeout.ms=3000",
            "-X",
            "max.poll.interval.ms=8000",
        ],
    );
    let producer = plain_producer(rig.cluster);
    let pg = Postgres::up();
    let topic = rig.topic.clone();
    std::thread::scope(|scope| {
        let feed = scope.spawn(|| {
            for i in 0..N {
                let value = format!(r#"{{"id": "away-{i}"}}"#);
                loop {
                    match producer.send(
                        rdkafka::producer::BaseRecord::to(&topic)
                            .key("k")
                            .payload(&value),
                    ) {
                        Ok(()) => break,
                        Err(_) => {
                            producer.poll(Duration::from_millis(10));
                        }
                    }
                }
                producer.poll(Duration::ZERO);
                std::thread::sleep(Duration::from_millis(20));
            }
            rdkafka::producer::Producer::flush(&producer, Duration::from_secs(30)).expect("flush");
        });
        std::thread::sleep(Duration::from_secs(3));
        pg.restart_after(Duration::from_secs(20));
        feed.join().expect("the feed");
    });
    // The rig's own connection did not survive the restart.
    rig.db = pg.client();
    let deadline = Instant::now() + Duration::from_secs(120);
    while rig.rows() < N as i64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    let distinct = count(
        &mut rig.db,
        &format!("SELECT count(DISTINCT id) FROM {}", rig.table),
    );
    let log = s1.log_text();
    let expelled = log.matches("maximum poll interval").count();
    let held =
        log.matches("reconnecting and applying it again").count() + log.matches("retrying").count();
    figure("sink_expelled_while_the_database_was_away", expelled);
    figure(
        "sink_rows_after_the_database_came_back",
        format!("{} of {N}", rig.rows()),
    );
    assert!(
        held > 0,
        "the database's absence never reached the sink: the test proves nothing\n{log}"
    );
    assert_eq!(
        (rig.rows(), distinct),
        (N as i64, N as i64),
        "every record once\n{log}"
    );
    assert_eq!(
        expelled, 0,
        "the sink left its group while its database was away:\n{log}"
    );
    stop_sink(s1);
}
