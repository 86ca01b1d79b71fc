//! Issue 45, item 5: isolation measured so that the machine's drift
//! cancels. Beside a victim wallet (acme, 800 records/s), each kind of
//! neighbour runs in phases interleaved with solo ones (A B A B … A, the
//! neighbours paused in the solo ones); each neighbour phase's victim p99
//! is taken as a ratio to the mean of the solo phases on either side, and
//! the ratios' median and bootstrap 90% interval are reported.
//!
//! The victim's latency is end to end: from the moment a payment's 250 ms
//! chunk was sent to the moment its audit copy became visible to a
//! read_committed consumer (about 8,000 payments per 10 s phase). Its
//! commit p99 (from the host's histogram, whose buckets quantise it) is
//! reported beside it.
//!
//! Beside the latency, each neighbour's CPU in each of its phases: as the
//! host accounts it (`onceflow_guest_call_microseconds_total`) and as
//! `/proc` counts its worker threads (whose ids the host logs). A sink has
//! no share and no guest calls: for it, the host process's CPU and the
//! database server's are reported instead.
//!
//! Kinds (`ONCEFLOW_ISOLATION_NEIGHBOURS`): `burn64`, `burn1` (heavy valid
//! records in 64- and 1-record calls), `loop`, `alloc`, `panic`, `outputs`
//! (10,000 outputs per record), `logs`, each of globex at `cpu-share = 10`;
//! `split` (globex at 10 and initech at 30, both burning more than their
//! shares); `sink` (a flood of JSON rows into a sink of globex's on the
//! host, writing to PostgreSQL). In CI, one pair beside `burn64` (a short
//! round: the figures are reported, not judged); `scripts/isolation` runs
//! six pairs of every kind and checks the targets
//! (`ONCEFLOW_ISOLATION_PAIRS`, `ONCEFLOW_ISOLATION_PHASE_SECS`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::BaseProducer;

use super::*;
use crate::common::pg::Postgres;

/// globex's share; initech's in the `split` kind is [`SPLIT_SHARE`].
const SHARE: u32 = 10;
const SPLIT_SHARE: u32 = 30;
/// The victim's offered load, records/s.
const RATE: u64 = 800;

/// The median of `values` (not empty).
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A bootstrap 90% interval of the median of `values`: 2,000 resamples
/// with replacement (a fixed-seed xorshift, so a run's figures can be
/// recomputed), their medians' 5th and 95th percentiles.
fn bootstrap_90(values: &[f64]) -> (f64, f64) {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let n = values.len();
    let mut medians: Vec<f64> = (0..2_000)
        .map(|_| {
            let sample: Vec<f64> = (0..n)
                .map(|_| values[(next() % n as u64) as usize])
                .collect();
            median(&sample)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    (medians[100], medians[1_899])
}

/// The 99th percentile of `values` (not empty), nearest rank.
fn p99(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((values.len() as f64) * 0.99).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// The worker threads of deployment `name` on host `h`, from its log
/// (`worker thread … thread=<pid>/task/<tid>`).
fn worker_tids(h: &HostProc, name: &str) -> Vec<u32> {
    h.log_text()
        .lines()
        .filter(|l| l.contains("worker thread") && l.contains(name))
        .filter_map(|l| {
            let at = l.find("/task/")? + "/task/".len();
            l[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect::<std::collections::BTreeSet<u32>>()
        .into_iter()
        .collect()
}

/// CPU seconds used so far by the database server's processes (the
/// postmaster and its backends, whose command lines start `postgres`).
fn postgres_cpu_seconds() -> f64 {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"postgres"))
        })
        .filter_map(common::cpu_seconds_if_running)
        .sum()
}

/// When each of the victim's payments became visible downstream: a
/// read_committed consumer of its audit topic (one record per valid
/// payment, keyed `p<i>`), polling every few milliseconds, notes the
/// moment each key arrives.
struct Visible {
    seen: Arc<Mutex<HashMap<u64, Instant>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Visible {
    fn start(w: &Wallet, partitions: i32) -> Visible {
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &w.cluster.bootstrap)
            .set("group.id", format!("iso-visible-{}", std::process::id()))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "5")
            .create()
            .expect("consumer");
        let mut assignment = rdkafka::TopicPartitionList::new();
        for p in 0..partitions {
            assignment
                .add_partition_offset(&w.audit, p, rdkafka::Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&assignment).expect("assign");
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) else {
                        continue;
                    };
                    let at = Instant::now();
                    let id = m
                        .key()
                        .and_then(|k| std::str::from_utf8(k).ok())
                        .and_then(|k| k.strip_prefix('p'))
                        .and_then(|k| k.parse::<u64>().ok());
                    if let Some(id) = id {
                        seen.lock().expect("seen").entry(id).or_insert(at);
                    }
                }
            })
        };
        Visible {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// The p99 (ms) of the latencies of payments `first..first + n`, sent
    /// in the chunks `sent` (each chunk's first id and when it was sent),
    /// once `valid` of them are visible.
    fn p99_ms(&self, sent: &[(u64, Instant)], first: u64, n: u64, valid: u64) -> f64 {
        let range = first..first + n;
        wait_for(
            "the victim's audit copies of the phase",
            Duration::from_secs(120),
            || {
                let seen = self.seen.lock().expect("seen");
                range.clone().filter(|i| seen.contains_key(i)).count() as u64 >= valid
            },
        );
        let seen = self.seen.lock().expect("seen");
        let mut latencies: Vec<f64> = range
            .filter_map(|i| {
                let at = seen.get(&i)?;
                let chunk = sent
                    .partition_point(|(start, _)| *start <= i)
                    .checked_sub(1)?;
                Some(at.duration_since(sent[chunk].1).as_secs_f64() * 1e3)
            })
            .collect();
        assert!(
            !latencies.is_empty(),
            "no latencies for {first}..{}",
            first + n
        );
        p99(&mut latencies)
    }
}

impl Drop for Visible {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What one feed (every [`FEED_EVERY`]) sends a neighbour.
enum Feed {
    /// `n` heavy valid records ([`BURN`]).
    Burn(u64),
    /// These values, once each.
    Values(Vec<String>),
    /// `n` JSON rows for a sink's insert route.
    Rows(u64),
}

/// One neighbour in a kind's phases: another tenant's deployment or sink.
struct Neighbour {
    tenant: &'static str,
    token: &'static str,
    /// Its tenant's `cpu-share` (none for a sink: no guest calls).
    share: Option<u32>,
    name: String,
    input: String,
    feed: Feed,
}

impl Neighbour {
    fn send(&self, producer: &BaseProducer) {
        match &self.feed {
            Feed::Burn(n) => send_many(producer, &self.input, *n, |_| BURN.into()),
            Feed::Values(values) => {
                for v in values {
                    common::cluster::send(producer, &self.input, "k", v);
                }
            }
            Feed::Rows(n) => send_many(producer, &self.input, *n, |i| {
                format!(r#"{{"n":{i},"s":"{}"}}"#, "x".repeat(200))
            }),
        }
    }
}

/// The sink kind's database: globex's role and schema (`scripts/postgres
/// tenant globex`), its table, and the connections file that offers the
/// connection to globex.
struct SinkDb {
    _pg: Postgres,
    admin: Mutex<::postgres::Client>,
    connections: PathBuf,
}

impl SinkDb {
    fn new(dir: &Path) -> SinkDb {
        let pg = Postgres::up();
        pg.tenant("globex");
        let mut admin = pg.admin();
        admin
            .batch_execute(
                "DROP TABLE IF EXISTS globex.flood; CREATE TABLE globex.flood (n bigint, s text)",
            )
            .expect("globex.flood");
        let connections = dir.join("connections.toml");
        std::fs::write(
            &connections,
            format!(
                "[[postgres]]\nname = \"analytics\"\nconnection = \"{}\"\npassword-file = \"{}\"\ntenants = [\"globex\"]\n",
                pg.url,
                pg.password_file.display()
            ),
        )
        .expect("write connections.toml");
        SinkDb {
            _pg: pg,
            admin: Mutex::new(admin),
            connections,
        }
    }

    /// Rows the sink has written so far.
    fn rows(&self) -> i64 {
        self.admin
            .lock()
            .expect("admin")
            .query_one("SELECT count(*) FROM globex.flood", &[])
            .expect("count globex.flood")
            .get(0)
    }
}

#[test]
fn n_isolation_interleaved() {
    let _g = serial();
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let pairs: usize = env("ONCEFLOW_ISOLATION_PAIRS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let kinds: Vec<String> = env("ONCEFLOW_ISOLATION_NEIGHBOURS")
        .unwrap_or_else(|| "burn64".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    let phase = Duration::from_secs(
        env("ONCEFLOW_ISOLATION_PHASE_SECS")
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    );
    let fleet = Fleet::new();
    let acme = format!("\"{}\"", onceflow::fleet::tenancy::hash_token(ACME));
    fleet.write_tenants(&tenants_toml_with(&acme, SHARE).replace(
        "artifact-mb = 4\n",
        &format!("artifact-mb = 4\nworker-threads = 4\ncpu-share = {SPLIT_SHARE}\n"),
    ));
    let db = kinds
        .iter()
        .any(|k| k == "sink")
        .then(|| SinkDb::new(fleet.dir.path()));
    let mut h = fleet.spawn_host(
        "iso",
        &cluster().bootstrap,
        &match &db {
            Some(db) => vec![
                "--host-id",
                "iso",
                "--sink-connections",
                path(&db.connections),
            ],
            None => vec!["--host-id", "iso"],
        },
    );
    h.wait_healthy("iso", Duration::from_secs(90));
    let pid = h.child.id();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    figure("iso_cores", cores);
    let w = Wallet::in_tenant(
        cluster(),
        "acme",
        "acme.",
        "iso-victim",
        "exactly_once_v2",
        2,
    );
    let cleanup = DeleteOnPanic::new(&h);
    h.json(ACME, &["deploy", path(&w.manifest)]);
    cleanup.deployed(ACME, &w.name);
    let visible = Visible::start(&w, 2);
    // The victim's producer, used once here so that no phase's latencies
    // include its start.
    let payments = w.producer();
    let mut produced = w.produce_with(&payments, 0, 100, 100, None);
    w.wait_done(Duration::from_secs(120));
    let mut next = 100u64;
    let producer = common::cluster::plain_producer(cluster());
    let mut burn_feed: Option<u64> = None;
    for kind in &kinds {
        // Deployed, and fed by `feed` while they run.
        let mut neighbours = Vec::new();
        let mut deploy_hostile = |tenant: &'static str, token: &'static str, share: u32| {
            let (guest_kind, batch) = match kind.as_str() {
                "burn64" | "split" => ("burn", 1000),
                "burn1" => ("burn", 1),
                other => (other, 10),
            };
            let evil = hostile(fleet.dir.path(), tenant, &format!("iso-{kind}-{tenant}"));
            let text = std::fs::read_to_string(&evil.manifest).expect("manifest");
            std::fs::write(
                &evil.manifest,
                text.replace(
                    "max-batch-records = 10\n",
                    &format!("max-batch-records = {batch}\n"),
                ),
            )
            .expect("manifest");
            h.json(token, &["deploy", path(&evil.manifest)]);
            cleanup.deployed(token, &evil.name);
            let feed = match guest_kind {
                "burn" => Feed::Burn(
                    *burn_feed.get_or_insert_with(|| burn_records_per_feed(&h, &producer, &evil)),
                ),
                "outputs" => Feed::Values(vec!["outputs:10000".into()]),
                "logs" => Feed::Values(vec!["logs:2000".into()]),
                other => Feed::Values(vec![other.into(), "ordinary".into()]),
            };
            wait_for(
                "the neighbour's first worker thread",
                Duration::from_secs(60),
                || !worker_tids(&h, &evil.name).is_empty(),
            );
            Neighbour {
                tenant,
                token,
                share: Some(share),
                name: evil.name,
                input: evil.input,
                feed,
            }
        };
        match kind.as_str() {
            "split" => {
                neighbours.push(deploy_hostile("globex", GLOBEX, SHARE));
                neighbours.push(deploy_hostile("initech", INITECH, SPLIT_SHARE));
            }
            "sink" => {
                let suffix = std::process::id();
                let (name, input, dlq) = (
                    format!("iso-sink-{suffix}"),
                    format!("globex.iso-sink-in-{suffix}"),
                    format!("globex.iso-sink-dlq-{suffix}"),
                );
                cluster().create_topics(&[(&input, 2), (&dlq, 1)]);
                let toml = fleet.dir.path().join("iso-sink.toml");
                std::fs::write(
                    &toml,
                    format!(
                        "name = \"{name}\"\ndead-letter-topic = \"{dlq}\"\n[postgres]\nconnection = \"analytics\"\n\
                         [[routes]]\ntopic = \"{input}\"\nmode = \"insert\"\ntable = \"flood\"\ncolumns = [\"n\", \"s\"]\n"
                    ),
                )
                .expect("write iso-sink.toml");
                h.json(GLOBEX, &["deploy", path(&toml)]);
                cleanup.deployed(GLOBEX, &name);
                neighbours.push(Neighbour {
                    tenant: "globex",
                    token: GLOBEX,
                    share: None,
                    name,
                    input,
                    // 10,000 rows of ~220 bytes a second: more than the
                    // sink writes.
                    feed: Feed::Rows(2_000),
                });
            }
            _ => neighbours.push(deploy_hostile("globex", GLOBEX, SHARE)),
        }
        let running = |n: &Neighbour| {
            !h.json(n.token, &["describe", &n.name])["hosts"]
                .as_array()
                .is_some_and(|h| h.is_empty())
        };
        // Paused during the solo phases (a neighbour at its share would
        // still burn its backlog in them), resumed for its own.
        let pause = || {
            for n in &neighbours {
                h.json(n.token, &["pause", &n.name]);
            }
            wait_for("the neighbours paused", Duration::from_secs(60), || {
                !neighbours.iter().any(running)
            });
        };
        // Resumes them; each one's worker threads started since (a resumed
        // deployment starts new ones; a sink logs none).
        let resume = || -> Vec<Vec<u32>> {
            let before: Vec<usize> = neighbours
                .iter()
                .map(|n| worker_tids(&h, &n.name).len())
                .collect();
            for n in &neighbours {
                h.json(n.token, &["resume", &n.name]);
            }
            neighbours
                .iter()
                .zip(before)
                .map(|(n, before)| {
                    if n.share.is_none() {
                        wait_for("the sink running", Duration::from_secs(60), || running(n));
                        return Vec::new();
                    }
                    wait_for(
                        "the neighbour's new worker threads",
                        Duration::from_secs(60),
                        || worker_tids(&h, &n.name).len() > before,
                    );
                    worker_tids(&h, &n.name).split_off(before)
                })
                .collect()
        };
        let proc_cpu = |tids: &[u32]| {
            tids.iter()
                .filter(|t| std::path::Path::new(&format!("/proc/{pid}/task/{t}")).exists())
                .map(|&t| common::thread_cpu_seconds(pid, t))
                .sum::<f64>()
        };
        // One phase: the victim's end-to-end p99 and commit p99 (ms), and
        // per neighbour its CPU seconds (host accounting, /proc; for a
        // sink, the host process's and the database's).
        let mut run = |fed: bool| -> (f64, f64, Vec<(f64, f64)>, i64) {
            // The neighbours' inputs as their groups committed them.
            let committed = || -> Vec<i64> {
                neighbours
                    .iter()
                    .map(|nb| {
                        cluster()
                            .progress(&format!("{}.{}", nb.tenant, nb.name), &nb.input)
                            .0
                    })
                    .collect()
            };
            let committed0 = if fed { committed() } else { Vec::new() };
            let tids = if fed { resume() } else { Vec::new() };
            let before = h.metrics(OPERATOR);
            let cpu0: Vec<f64> = tids.iter().map(|t| proc_cpu(t)).collect();
            let (host0, db0) = (h.cpu_seconds(), postgres_cpu_seconds());
            let rows0 = db.as_ref().map_or(0, SinkDb::rows);
            let (first, n) = (next, RATE * phase.as_secs());
            let (sent, valid) = std::thread::scope(|scope| {
                let load = scope.spawn(|| produce_paced_noting(&w, &payments, first, n, phase));
                let stop_at = Instant::now() + phase;
                while Instant::now() < stop_at {
                    if fed {
                        for n in &neighbours {
                            n.send(&producer);
                        }
                    }
                    std::thread::sleep(FEED_EVERY);
                }
                let (p, sent) = load.join().expect("producer");
                let valid = p.valid;
                produced.absorb(p);
                (sent, valid)
            });
            let (host1, db1) = (h.cpu_seconds(), postgres_cpu_seconds());
            let rows = db.as_ref().map_or(0, SinkDb::rows) - rows0;
            let after_phase = h.metrics(OPERATOR);
            let cpu: Vec<(f64, f64)> = neighbours
                .iter()
                .zip(tids.iter().chain(std::iter::repeat(&Vec::new())))
                .zip(cpu0.iter().chain(std::iter::repeat(&0.0)))
                .map(|((nb, tids), cpu0)| {
                    let delta = |name: &str| {
                        series_of(&after_phase, name, &nb.name) - series_of(&before, name, &nb.name)
                    };
                    match nb.share {
                        Some(_) => (
                            delta("onceflow_guest_call_microseconds_total{") / 1e6,
                            proc_cpu(tids) - cpu0,
                        ),
                        None => (host1 - host0, db1 - db0),
                    }
                })
                .collect();
            if fed {
                pause();
                // Held back, never starved: its records go on (committed at
                // the latest when it pauses).
                for ((nb, now), then) in neighbours.iter().zip(committed()).zip(committed0) {
                    assert!(
                        now > then,
                        "the neighbour ({kind}, {}) made no progress in its phase",
                        nb.tenant
                    );
                }
            }
            next += n;
            w.wait_done(Duration::from_secs(120));
            let after = h.metrics(OPERATOR);
            let commit_p99 = p99_between(&before, &after, &w.name, 10.0)
                .unwrap_or_else(|| panic!("the victim committed fewer than 10 transactions"))
                * 1e3;
            (
                visible.p99_ms(&sent, first, n, valid),
                commit_p99,
                cpu,
                rows,
            )
        };
        pause();
        let mut solos = vec![run(false)];
        let mut beside = Vec::new();
        for _ in 0..pairs {
            beside.push(run(true));
            solos.push(run(false));
        }
        let ratios: Vec<f64> = beside
            .iter()
            .enumerate()
            .map(|(i, b)| b.0 / ((solos[i].0 + solos[i + 1].0) / 2.0))
            .collect();
        let (lo, hi) = bootstrap_90(&ratios);
        let pct = |cpu: f64| 100.0 * cpu / (phase.as_secs_f64() * cores);
        // Per phase, `/`-separated, `digits` after the point.
        let each = |values: &mut dyn Iterator<Item = f64>, digits: usize| {
            values
                .map(|v| format!("{v:.digits$}"))
                .collect::<Vec<_>>()
                .join("/")
        };
        let fig = |what: &str, value: String| figure(&format!("iso_{kind}_{what}"), value);
        fig("solo_p99_ms", each(&mut solos.iter().map(|s| s.0), 1));
        fig("beside_p99_ms", each(&mut beside.iter().map(|b| b.0), 1));
        fig(
            "solo_commit_p99_ms",
            each(&mut solos.iter().map(|s| s.1), 1),
        );
        fig(
            "beside_commit_p99_ms",
            each(&mut beside.iter().map(|b| b.1), 1),
        );
        fig("ratios", each(&mut ratios.iter().copied(), 2));
        fig("ratio_median", format!("{:.2}", median(&ratios)));
        fig("ratio_ci90", format!("{lo:.2}-{hi:.2}"));
        for (j, nb) in neighbours.iter().enumerate() {
            let share = nb.share.map_or("none".to_owned(), |s| s.to_string());
            fig(&format!("{}_share", nb.tenant), share);
            let (a, b) = if nb.share.is_some() {
                ("host_cpu_pct_accounted", "host_cpu_pct_proc")
            } else {
                ("host_process_cpu_pct", "database_cpu_pct")
            };
            fig(
                &format!("{}_{a}", nb.tenant),
                each(&mut beside.iter().map(|b| pct(b.2[j].0)), 1),
            );
            fig(
                &format!("{}_{b}", nb.tenant),
                each(&mut beside.iter().map(|b| pct(b.2[j].1)), 1),
            );
        }
        if kind == "sink" {
            fig(
                "rows_per_s",
                each(
                    &mut beside.iter().map(|b| b.3 as f64 / phase.as_secs_f64()),
                    0,
                ),
            );
        }
        for nb in &neighbours {
            h.json(nb.token, &["delete", &nb.name, "--purge-state"]);
        }
    }
    drop(visible);
    assert_exact(
        &w.verify(false),
        &produced,
        "victim beside interleaved neighbours",
    );
    h.json(ACME, &["delete", &w.name, "--purge-state"]);
    drop(cleanup);
    h.stop();
}
