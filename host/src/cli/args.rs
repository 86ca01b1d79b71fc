//! The command line's arguments (clap), and their checks that turn them
//! into the library's own values.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use onceflow::kafka::Connection;
use onceflow::manifest::Language;
use onceflow::stream::{Hibernation, RunOptions};

use super::remote::RemoteArgs;
use super::{init, usage};

/// Run WebAssembly stream processors over Kafka, exactly once.
#[derive(Debug, Parser)]
#[command(name = "onceflow", version, about, long_about = None)]
pub struct Cli {
    /// Log filter (tracing syntax, e.g. `info`, `onceflow=debug,guest=trace`).
    #[arg(long, global = true, env = "ONCEFLOW_LOG", default_value = "info")]
    pub log: String,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Output format for commands that report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// For people.
    Text,
    /// For scripts.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Scaffold a processor (manifest, source, sample input) in a language.
    Init {
        /// The project directory (created).
        dir: PathBuf,
        /// rust, js, ts, python, go or c.
        #[arg(long, value_parser = init::parse_language)]
        lang: Language,
        /// The processor's name (default: the directory's).
        #[arg(long)]
        name: Option<String>,
        /// The tenant it deploys under (its topics are under the tenant's
        /// prefix).
        #[arg(long, default_value = "demo")]
        tenant: String,
        /// The tenant's topic prefix, if not `<tenant>.`.
        #[arg(long)]
        topic_prefix: Option<String>,
    },
    /// Build a processor's component from source (per its onceflow.toml).
    Build {
        /// The manifest, or the directory holding onceflow.toml.
        manifest: PathBuf,
    },
    /// Show a component's imports and exports and whether the sandbox
    /// accepts it.
    Validate {
        /// A manifest (its component is checked) or a .wasm component.
        target: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value = "text")]
        output: OutputFormat,
    },
    /// Run a processor offline on records from a JSON Lines file, with
    /// in-memory state, and print its outputs as JSON Lines.
    Test {
        /// The manifest, or the directory holding onceflow.toml.
        manifest: PathBuf,
        /// Input records, one JSON object per line ("-" for stdin).
        #[arg(long)]
        input: PathBuf,
        /// After the outputs, print every store's final entries.
        #[arg(long)]
        dump_state: bool,
        /// Most records per `process` call.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch_size: u32,
        /// Partitions of the input topics, for records without a partition.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=10_000))]
        partitions: i32,
        /// Use this component instead of the manifest's.
        #[arg(long)]
        component: Option<PathBuf>,
    },
    /// Run a processor on Kafka until SIGTERM/SIGINT, exactly once (or at
    /// least once, per its manifest). Instances with the same manifest share
    /// the work through the consumer group.
    Run(RunArgs),
    /// Check a pipeline's committed outputs against its input: gaps,
    /// duplicates, running totals, dead letters, open transactions. Exits 1
    /// on any finding.
    Verify(VerifyArgs),
    /// Write an input file's records (the JSON Lines `onceflow test`
    /// reads) to the manifest's input topics: each value in its topic's
    /// format (an Avro or Protobuf input's JSON written with its schema,
    /// registered under `<topic>-value`), keys partitioned as Java's
    /// clients do. For trying a processor on a broker (docs/formats.md).
    Produce(ProduceArgs),
    /// Run committed transactions of a deployment again, from what Kafka
    /// keeps, and compare them with what they committed: the same
    /// component on the same records from the same state, or another
    /// version (--component) to see what it would have done. Reads only
    /// (docs/replay.md). Exits 1 if a replay differs from what committed.
    Replay(ReplayArgs),
    /// Run a fleet host: the admin API and /metrics, and every deployment
    /// of the registry (in Kafka), until SIGTERM/SIGINT.
    Host(HostArgs),
    /// Write topics into a database exactly once, until SIGTERM/SIGINT
    /// (docs/sink.md).
    #[command(subcommand)]
    Sink(SinkCommand),
    /// Upload a processor (its built component and manifest) to the fleet;
    /// deploying an existing name upgrades it in place. Given a sink's
    /// configuration (a sink.toml: `[[routes]]`), deploys that sink.
    Deploy {
        /// The manifest, or the directory holding onceflow.toml, or a
        /// sink.toml.
        manifest: PathBuf,
        /// Use this component instead of the manifest's.
        #[arg(long)]
        component: Option<PathBuf>,
        /// Admin API and token.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// List your deployments.
    List {
        /// Admin API and token.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Show a deployment: status, version, partitions per host, lag,
    /// commit rate, last errors.
    Describe {
        /// Processor name.
        name: String,
        /// Admin API and token.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Print a deployment's guest log lines.
    Logs {
        /// Processor name.
        name: String,
        /// Keep printing new lines.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Look this many log records back (all deployments' lines count).
        #[arg(long, default_value_t = 10_000)]
        tail: i64,
        /// Admin API and token.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// What your deployments used (records, bytes, state, dead letters,
    /// fuel, log lines), counted from committed work exactly once; every
    /// tenant's with the operator token.
    Usage {
        /// Only usage since then: a duration back from now (`90s`, `30m`,
        /// `24h`, `7d`) or a time in ms since the epoch.
        #[arg(long)]
        since: Option<String>,
        /// Admin API and token.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Stop a deployment's workers at a commit boundary, keeping its state
    /// and offsets.
    Pause {
        /// Processor name.
        name: String,
        /// Admin API and token.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Start a paused (or failed) deployment again.
    Resume {
        /// Processor name.
        name: String,
        /// Admin API and token.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Remove a deployment.
    Delete {
        /// Processor name.
        name: String,
        /// Also drop its stores, changelog topics and consumer group.
        #[arg(long)]
        purge_state: bool,
        /// Admin API and token.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Read committed state from a deployment's store: a key's value, the
    /// keys with a prefix or in a range, or a window store key's windows.
    /// The hosts that own the store's partitions answer from their local
    /// stores (docs/operations.md, "Queries").
    Query {
        /// Processor name.
        name: String,
        /// Store name.
        store: String,
        /// Key (text); with --window-from-ms/--window-to-ms, a window
        /// store's key.
        key: Option<String>,
        /// The query's options.
        #[command(flatten)]
        query: QueryArgs,
        /// Admin API and token.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Print the sha256 of a token read from stdin, for tenants.toml.
    HashToken,
    /// Measure records/s through a processor's `process` (no Kafka).
    BenchGuest {
        /// The manifest, or the directory holding onceflow.toml.
        manifest: PathBuf,
        /// Records per measurement (synthetic wallet payments).
        #[arg(long, default_value_t = 100_000)]
        records: usize,
        /// Batch sizes to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
        batch_sizes: Vec<usize>,
        /// Make every Nth payment malformed (not JSON), as the benchmark's
        /// 1% (N = 100): measures the path that isolates a failing record.
        #[arg(long, value_name = "N")]
        malformed_every: Option<usize>,
        /// Output format.
        #[arg(long, value_enum, default_value = "text")]
        output: OutputFormat,
    },
}

/// `onceflow run` arguments.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The manifest, or the directory holding onceflow.toml.
    pub manifest: PathBuf,
    /// Use this component instead of the manifest's.
    #[arg(long)]
    pub component: Option<PathBuf>,
    /// Kafka and state settings.
    #[command(flatten)]
    pub kafka: KafkaArgs,
}

/// How `run` and `host` reach Kafka and where they keep state.
#[derive(Debug, clap::Args)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers (host:port,...).
    #[arg(long, env = "ONCEFLOW_BOOTSTRAP")]
    pub bootstrap_servers: String,
    /// How long to wait at start for the brokers (and a host's control
    /// topics), in s: what is awaited is said after the first failed try
    /// and every 10 s; then exit with an error naming it.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub kafka_wait_secs: u64,
    /// Local state directory (RocksDB per task); one per instance.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Instance (host) id, part of the transactional ids and static group
    /// memberships: keep it stable across restarts of one instance and
    /// unique among instances. Default: the id kept in
    /// `<state-dir>/instance-id`, made at random on first use.
    #[arg(long, visible_alias = "host-id")]
    pub instance_id: Option<String>,
    /// Consumer group session timeout (ms).
    #[arg(long, default_value_t = 10_000)]
    pub session_timeout_ms: u64,
    /// Transaction timeout (ms).
    #[arg(long, default_value_t = 10_000)]
    pub transaction_timeout_ms: u64,
    /// The consumer group protocol: `classic` (the default: static
    /// membership, cooperative-sticky or range assignment) or `consumer`
    /// (KIP-848: the brokers assign and time sessions out, with their
    /// `group.consumer.*` settings; --session-timeout-ms does not apply,
    /// standby replicas are not placed). See docs/operations.md.
    #[arg(long, default_value = "classic", value_parser = ["classic", "consumer"])]
    pub group_protocol: String,
    /// Extra librdkafka property for every client, `key=value`
    /// (repeatable). Secrets: `-X sasl.password.file=PATH` (the file's
    /// first line; also `ssl.key.password.file`, ...) or
    /// ONCEFLOW_KAFKA_PASSWORD, not `-X sasl.password=`, which `ps` shows.
    #[arg(short = 'X', long = "kafka-config")]
    pub kafka_config: Vec<String>,
    /// How often to log throughput, commit latency and failures (ms), while
    /// there is something to say: an idle deployment logs nothing.
    #[arg(long, default_value_t = 5_000)]
    pub report_interval_ms: u64,
    /// How long the local stores of a partition this instance no longer
    /// owns are kept before they are removed (ms; Kafka Streams'
    /// state.cleanup.delay.ms).
    #[arg(long, default_value_t = 600_000)]
    pub state_cleanup_delay_ms: u64,
    /// Most MiB the host holds for one deployment at once: outputs and
    /// state changes not yet committed. A batch that reaches it is
    /// committed in parts. A fleet host takes each tenant's `held-mb`
    /// from tenants.toml instead.
    #[arg(long, default_value_t = onceflow::memory::DEFAULT_HELD_MB,
          value_parser = clap::value_parser!(u64).range(64..))]
    pub held_mb: u64,
    /// Hibernate a deployment whose inputs got no record for this many
    /// seconds (0: never): its workers commit, leave the group and close
    /// their clients, and start again when a record arrives
    /// (docs/operations.md, "Capacity"). Default: 300 for `onceflow host`,
    /// never for `onceflow run`.
    #[arg(long)]
    pub hibernate_after_secs: Option<u64>,
    /// The schema registry, for formats.
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Tests only: treat the answers to this many successful transaction
    /// commits as lost (the outcome unknown, as after a timeout).
    #[arg(long, default_value_t = 0, hide = true)]
    pub fault_lose_commit_answers: u64,
}

/// Where the schema registry is (`run`, `host`, `verify`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RegistryArgs {
    /// The schema registry (Confluent's REST API, e.g. Apicurio's
    /// `.../apis/ccompat/v7`) for inputs and outputs of format `avro`
    /// (docs/formats.md). A tenant's deployments reach only the subjects
    /// under its topic prefix.
    #[arg(long, env = "ONCEFLOW_SCHEMA_REGISTRY", value_name = "URL")]
    pub schema_registry: Option<String>,
    /// A file whose first line is `username:password`, for the schema
    /// registry's basic authentication.
    #[arg(
        long,
        env = "ONCEFLOW_SCHEMA_REGISTRY_CREDENTIALS",
        value_name = "FILE",
        requires = "schema_registry"
    )]
    pub schema_registry_credentials: Option<PathBuf>,
    /// PEM certificates to trust for the schema registry's TLS, beside the
    /// system's.
    #[arg(
        long,
        env = "ONCEFLOW_SCHEMA_REGISTRY_CA",
        value_name = "PEM",
        requires = "schema_registry"
    )]
    pub schema_registry_ca: Option<PathBuf>,
}

impl RegistryArgs {
    /// The registry, if one was given (its credentials file read now).
    pub fn registry(&self) -> anyhow::Result<Option<std::sync::Arc<onceflow::schema::Registry>>> {
        let Some(url) = &self.schema_registry else {
            return Ok(None);
        };
        let registry = onceflow::schema::Registry::new(onceflow::schema::RegistryConfig {
            url: url.clone(),
            credentials: self.schema_registry_credentials.clone(),
            ca_cert: self.schema_registry_ca.clone(),
        })
        .map_err(|e| usage(e.to_string()))?;
        Ok(Some(std::sync::Arc::new(registry)))
    }
}

/// `onceflow host`'s default `--hibernate-after-secs`.
pub const HOST_HIBERNATE_AFTER_SECS: u64 = 300;

/// How often a process's hibernating deployments look at their inputs'
/// ends (all together, `kafka::EndWatch`): a record waits up to this long
/// before its deployment starts waking.
const HIBERNATION_WATCH_INTERVAL: Duration = Duration::from_millis(500);

/// `-X key=value` pairs, every subcommand's alike: secrets from
/// `-X <key>.file=PATH` and `ONCEFLOW_KAFKA_PASSWORD`
/// ([`onceflow::kafka::extra_config`], docs/kafka-security.md).
pub fn kafka_config(pairs: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    let env_password = std::env::var(onceflow::kafka::PASSWORD_ENV).ok();
    onceflow::kafka::extra_config(pairs, env_password)
        .map_err(|e| usage(onceflow::types::error_chain(&e)))
}

impl KafkaArgs {
    /// Checks the arguments and creates the state directory.
    pub fn run_options(&self) -> anyhow::Result<RunOptions> {
        let extra_config = kafka_config(&self.kafka_config)?;
        let state_dir = self.state_dir.clone().unwrap_or_else(default_state_dir);
        std::fs::create_dir_all(&state_dir).map_err(|e| {
            usage(format!(
                "cannot create --state-dir {}: {e}",
                state_dir.display()
            ))
        })?;
        let state_dir = state_dir.canonicalize().unwrap_or(state_dir);
        let instance_id = match &self.instance_id {
            Some(id) if valid_instance_id(id) => id.clone(),
            Some(id) => {
                return Err(usage(format!(
                    "--instance-id {id:?}: use letters, digits, '-', '_' or '.'"
                )));
            }
            None => kept_instance_id(&state_dir)?,
        };
        let kafka = Connection {
            bootstrap_servers: self.bootstrap_servers.clone(),
            extra_config,
        };
        let schema_registry = self.registry.registry()?;
        Ok(RunOptions {
            codecs: None,
            schema_registry,
            // One client describes every deployment's group.
            groups: Some(onceflow::kafka::GroupWatch::new(kafka.clone())),
            queries: None,
            kafka,
            state_dir,
            instance_id,
            session_timeout: Duration::from_millis(self.session_timeout_ms),
            transaction_timeout: Duration::from_millis(self.transaction_timeout_ms),
            group_protocol: if self.group_protocol == "consumer" {
                onceflow::stream::GroupProtocol::Consumer
            } else {
                onceflow::stream::GroupProtocol::Classic
            },
            report_interval: Duration::from_millis(self.report_interval_ms.max(100)),
            state_cleanup_delay: Duration::from_millis(self.state_cleanup_delay_ms),
            usage_topic: None,
            cpu_budget: None,
            held_mb: self.held_mb,
            tenant_memory: None,
            lose_commit_answers: (self.fault_lose_commit_answers > 0).then(|| {
                std::sync::Arc::new(std::sync::atomic::AtomicU64::new(
                    self.fault_lose_commit_answers,
                ))
            }),
            hibernation: None,
            hand_over: None,
            draining: None,
        })
    }

    /// The hibernation of `--hibernate-after-secs`, or of `default` (s)
    /// when not given; `None` for 0.
    pub fn hibernation(&self, kafka: &Connection, default: Option<u64>) -> Option<Hibernation> {
        let secs = self.hibernate_after_secs.or(default).filter(|s| *s > 0)?;
        Some(Hibernation {
            after: Duration::from_secs(secs),
            ends: onceflow::kafka::EndWatch::new(kafka.clone(), HIBERNATION_WATCH_INTERVAL),
        })
    }
}

fn valid_instance_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// The file in a state directory that names its instance.
const INSTANCE_ID_FILE: &str = "instance-id";

/// The instance id kept in `<state_dir>/instance-id`, made on first use: at
/// random (`i` and 16 hex digits: no '-', so it never makes two
/// deployments' transactional ids equal) for a new state directory; for one
/// that already holds state from a version that derived the id from the
/// path, that id, so the instance keeps its transactional ids and group
/// membership. The file is created atomically (written aside, then
/// hard-linked into place, which fails if another process was first).
///
/// A file that holds no valid id (damaged: cut short, overwritten) is moved
/// aside to `instance-id.damaged` and a new random id made, with a warning:
/// a new id is a new instance, whose previous incarnation's transactions the
/// group's new owners fence as for any departed instance.
fn kept_instance_id(state_dir: &Path) -> anyhow::Result<String> {
    let file = state_dir.join(INSTANCE_ID_FILE);
    // Some(Err(text)): the file holds no valid id.
    let read = |file: &Path| -> anyhow::Result<Option<Result<String, String>>> {
        match std::fs::read(file) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let id = text.trim();
                Ok(Some(if valid_instance_id(id) {
                    Ok(id.to_owned())
                } else {
                    Err(id.chars().take(40).collect())
                }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(usage(format!("cannot read {}: {e}", file.display()))),
        }
    };
    let mut damaged = false;
    match read(&file)? {
        Some(Ok(id)) => return Ok(id),
        Some(Err(text)) => {
            let aside = state_dir.join(format!("{INSTANCE_ID_FILE}.damaged"));
            std::fs::rename(&file, &aside).map_err(|e| {
                usage(format!(
                    "{} holds no instance id ({text:?}) and cannot be moved aside: {e}; delete \
                     it to get a new id, or pass --instance-id",
                    file.display()
                ))
            })?;
            tracing::warn!(
                "{} held no instance id ({text:?}: letters, digits, '-', '_' or '.' expected): \
                 moved to {}, and this host starts as a new instance with a new id (its group \
                 membership and transactional ids are new; its local stores are kept, checked \
                 against their changelogs as usual). To keep an id across such damage, pass \
                 --instance-id",
                file.display(),
                aside.display()
            );
            damaged = true;
        }
        None => {}
    }
    let has_state = std::fs::read_dir(state_dir)
        .map(|mut entries| entries.next().is_some())
        .unwrap_or(false);
    let id = if has_state && !damaged {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(state_dir.to_string_lossy().as_bytes());
        let id = format!("i{}", hex::encode(&digest[..6]));
        tracing::warn!(
            "{} holds state but no {INSTANCE_ID_FILE}: keeping the id {id} that earlier versions \
             derived from its path. Two machines with this same path would get the same id: give \
             each its own --instance-id (or write a unique id into {})",
            state_dir.display(),
            file.display()
        );
        id
    } else {
        format!("i{:016x}", rand::random::<u64>())
    };
    let aside = state_dir.join(format!(".{INSTANCE_ID_FILE}.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&aside)?;
        f.write_all(format!("{id}\n").as_bytes())?;
        f.sync_all()
    };
    write().map_err(|e| usage(format!("cannot write {}: {e}", aside.display())))?;
    let linked = std::fs::hard_link(&aside, &file);
    let _ = std::fs::remove_file(&aside);
    match linked {
        Ok(()) => {
            tracing::info!(instance = %id, "new instance id, kept in {}", file.display());
            Ok(id)
        }
        // Another process made it first: use its id.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match read(&file)? {
            Some(Ok(id)) => Ok(id),
            Some(Err(text)) => Err(usage(format!(
                "{}: {text:?} is not an instance id (another process wrote it meanwhile): fix \
                 it, or pass --instance-id",
                file.display()
            ))),
            None => Err(usage(format!(
                "{} vanished while being read",
                file.display()
            ))),
        },
        Err(e) => Err(usage(format!("cannot create {}: {e}", file.display()))),
    }
}

/// `onceflow sink <target>`.
#[derive(Debug, Subcommand)]
pub enum SinkCommand {
    /// Topics into PostgreSQL: each batch's rows, a marker per record and
    /// the positions in one database transaction. Instances with the same
    /// sink name share the partitions.
    Postgres(SinkArgs),
}

/// `onceflow sink postgres` arguments.
#[derive(Debug, clap::Args)]
pub struct SinkArgs {
    /// The sink's configuration (sink.toml).
    pub config: PathBuf,
    /// Kafka bootstrap servers.
    #[arg(long, env = "ONCEFLOW_BOOTSTRAP")]
    pub bootstrap_servers: String,
    /// Extra librdkafka property for every client, `key=value`
    /// (repeatable). Secrets: `-X sasl.password.file=PATH` (the file's
    /// first line; also `ssl.key.password.file`, ...) or
    /// ONCEFLOW_KAFKA_PASSWORD, not `-X sasl.password=`, which `ps` shows.
    #[arg(short = 'X', long = "kafka-config")]
    pub kafka_config: Vec<String>,
    /// This instance's name in the group and in the progress table
    /// (default: the host name and process id).
    #[arg(long)]
    pub instance_id: Option<String>,
    /// Consumer group session: how long a dead instance keeps its
    /// partitions.
    #[arg(long, default_value_t = 10_000)]
    pub session_timeout_ms: u64,
    /// How often progress is logged.
    #[arg(long, default_value_t = 10_000)]
    pub report_interval_ms: u64,
    /// Tests only: sleep this long with a batch in hand before its database
    /// transaction begins.
    #[arg(long, default_value_t = 0, hide = true)]
    pub fault_pause_before_begin_ms: u64,
    /// Tests only: sleep this long before each database COMMIT.
    #[arg(long, default_value_t = 0, hide = true)]
    pub fault_pause_before_commit_ms: u64,
    /// Tests only: insert a batch's markers one at a time, sleeping this
    /// long after each.
    #[arg(long, default_value_t = 0, hide = true)]
    pub fault_pause_between_markers_ms: u64,
    /// Tests only: sleep this long after each database COMMIT, before the
    /// Kafka offset commit.
    #[arg(long, default_value_t = 0, hide = true)]
    pub fault_pause_after_commit_ms: u64,
    /// Tests only: treat the answers to this many successful COMMITs as
    /// lost (as after a timeout) and apply those batches again.
    #[arg(long, default_value_t = 0, hide = true)]
    pub fault_lose_commit_answers: u32,
}

/// `onceflow verify` arguments.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "ONCEFLOW_BOOTSTRAP")]
    pub bootstrap_servers: String,
    /// Extra librdkafka property for every client, `key=value`
    /// (repeatable). Secrets: `-X sasl.password.file=PATH` (the file's
    /// first line; also `ssl.key.password.file`, ...) or
    /// ONCEFLOW_KAFKA_PASSWORD, not `-X sasl.password=`, which `ps` shows.
    #[arg(short = 'X', long = "kafka-config")]
    pub kafka_config: Vec<String>,
    /// Input topic (JSON values).
    #[arg(long)]
    pub input: String,
    /// JSON field holding each input's unique id.
    #[arg(long, default_value = "payment_id")]
    pub id: String,
    /// JSON field holding the grouping key.
    #[arg(long, default_value = "account")]
    pub key: String,
    /// JSON field holding the integer amount.
    #[arg(long, default_value = "amount")]
    pub sum: String,
    /// Topic that must hold each valid input's id exactly once, as key.
    #[arg(long)]
    pub echo: Option<String>,
    /// Topic keyed by group key holding the running totals.
    #[arg(long)]
    pub totals: Option<String>,
    /// JSON field of the running total in --totals.
    #[arg(long, default_value = "balance")]
    pub total_field: String,
    /// Dead-letter topic that must hold each invalid input exactly once.
    #[arg(long)]
    pub dead_letter: Option<String>,
    /// Read uncommitted data as well (shows what aborted transactions
    /// wrote).
    #[arg(long)]
    pub read_uncommitted: bool,
    /// Longest the reads may take (s).
    #[arg(long, default_value_t = 120)]
    pub timeout_secs: u64,
    /// Also print the verified totals of the first N keys.
    #[arg(long, default_value_t = 0)]
    pub show_totals: usize,
    /// Values in the schema registry's wire format are read as JSON with
    /// their schema from this registry (docs/formats.md).
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: OutputFormat,
}

/// `onceflow produce` arguments.
#[derive(Debug, clap::Args)]
pub struct ProduceArgs {
    /// The manifest, or the directory holding onceflow.toml: its inputs'
    /// formats and schema files say how each value is written.
    pub manifest: PathBuf,
    /// Records, one JSON object per line, as `onceflow test` reads them
    /// ("-" for stdin).
    #[arg(long)]
    pub input: PathBuf,
    /// Kafka bootstrap servers.
    #[arg(long, env = "ONCEFLOW_BOOTSTRAP")]
    pub bootstrap_servers: String,
    /// Extra librdkafka property, `key=value` (repeatable).
    #[arg(short = 'X', long = "kafka-config")]
    pub kafka_config: Vec<String>,
    /// Longest to wait for the brokers to acknowledge every record (s).
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
    /// The schema registry the inputs' schemas are registered in (needed
    /// for inputs of format avro, protobuf or json-schema).
    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// `onceflow replay` arguments.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("which").args(["offsets", "at", "transaction", "last", "all", "list"])))]
pub struct ReplayArgs {
    /// The deployment: a manifest, or the directory holding onceflow.toml,
    /// run with `onceflow run` (its component must be the one that ran;
    /// the cluster is read with --bootstrap-servers); or a fleet
    /// deployment's name, replayed by a host of the fleet (--server,
    /// --token).
    pub deployment: PathBuf,
    /// The task's partition (its inputs' partition).
    #[arg(long, default_value_t = 0)]
    pub partition: i32,
    /// The transactions that processed any record of the first input from
    /// offset A to B (inclusive): `A..B`, or one offset.
    #[arg(long, value_name = "A..B")]
    pub offsets: Option<String>,
    /// The first transaction committed at or after this time: ms since
    /// the epoch, or RFC 3339 (`2026-12-07T21:10:00Z`, as the logs print).
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// The transaction with this id (`--list` shows them: its replay
    /// record's offset).
    #[arg(long, value_name = "ID")]
    pub transaction: Option<i64>,
    /// The last N transactions (the default: 1).
    #[arg(long, value_name = "N")]
    pub last: Option<usize>,
    /// Every transaction the replay topic still holds.
    #[arg(long)]
    pub all: bool,
    /// List the partition's replayable transactions and replay none.
    #[arg(long)]
    pub list: bool,
    /// Also run this component on the same records from the same state,
    /// and show where its outputs and state changes differ from what
    /// committed.
    #[arg(long, value_name = "WASM")]
    pub component: Option<PathBuf>,
    /// Print each store's entries before and after each transaction.
    #[arg(long)]
    pub dump_state: bool,
    /// Print only each transaction's verdict, not its outputs and state
    /// changes.
    #[arg(long, short)]
    pub quiet: bool,
    /// Kafka bootstrap servers (a manifest's replay).
    #[arg(long, env = "ONCEFLOW_BOOTSTRAP")]
    pub bootstrap_servers: Option<String>,
    /// Extra librdkafka property, `key=value` (repeatable).
    #[arg(short = 'X', long = "kafka-config")]
    pub kafka_config: Vec<String>,
    /// The schema registry of the deployment's formats, if any.
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// The admin API (a fleet deployment's replay) and the output format.
    #[command(flatten)]
    pub remote: super::remote::RemoteArgs,
}

/// `onceflow host` arguments.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// Where the admin API and /metrics listen.
    #[arg(long, default_value = "127.0.0.1:8750")]
    pub listen: SocketAddr,
    /// The tenants file (names, token hashes, topic prefixes, quotas); read
    /// again whenever it changes.
    #[arg(long)]
    pub tenants: PathBuf,
    /// Serve the admin API over HTTPS with this certificate chain (PEM,
    /// leaf first); needs --tls-key. Clients trust its CA with --ca-cert.
    #[arg(long, env = "ONCEFLOW_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "ONCEFLOW_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Where other hosts reach this host's admin API (routed queries), e.g.
    /// `https://host-2.internal:8750`. Default: the --listen address (its
    /// hostname when it listens on every interface), over https with
    /// --tls-cert.
    #[arg(long, env = "ONCEFLOW_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// The CA (PEM) that signed the other hosts' --tls-cert, when not a
    /// public one: this host trusts it when it asks them (routed queries).
    #[arg(long, env = "ONCEFLOW_PEER_CA")]
    pub peer_ca: Option<PathBuf>,
    /// How long an uploaded component that no deployment runs is kept (s):
    /// then any host may collect it (and it stops counting against its
    /// tenant's `artifact-mb`). Every host should be given the same value.
    #[arg(long, default_value_t = 3600)]
    pub artifact_grace_secs: u64,
    /// How long the drain on SIGTERM/SIGINT may take (s): the host takes
    /// no new work, commits and hands every deployment's partitions over,
    /// then exits; past this it exits with an error naming what had not
    /// stopped (fenced by the next owners, nothing lost). Give the
    /// orchestrator a grace period above it. A second signal exits at once.
    /// See docs/operations.md, "Rolling upgrades".
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub drain_timeout_secs: u64,
    /// Tests only: how long a draining host refuses new work before it
    /// stops its deployments (ms).
    #[arg(long, default_value_t = 0, hide = true)]
    pub fault_drain_hold_ms: u64,
    /// The database connections this host offers tenants' sinks (TOML:
    /// `[[postgres]]` name, connection, password-file, tenants; see
    /// docs/sink.md). Every host should be given the same file.
    #[arg(long)]
    pub sink_connections: Option<PathBuf>,
    /// Kafka and state settings.
    #[command(flatten)]
    pub kafka: KafkaArgs,
}

/// `onceflow query`'s options beyond a key.
#[derive(Debug, Clone, clap::Args)]
pub struct QueryArgs {
    /// The keys that start with this (instead of a key).
    #[arg(long, conflicts_with_all = ["from", "to"])]
    pub prefix: Option<String>,
    /// The keys from this one (inclusive; instead of a key).
    #[arg(long)]
    pub from: Option<String>,
    /// The keys before this one (exclusive).
    #[arg(long)]
    pub to: Option<String>,
    /// With a key: its windows that start at or after this time (ms since
    /// the epoch).
    #[arg(long)]
    pub window_from_ms: Option<i64>,
    /// With a key: its windows that start at or before this time.
    #[arg(long)]
    pub window_to_ms: Option<i64>,
    /// Most entries a prefix, range or window query prints (at most 10,000).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Read a key's values from a scan of the store's changelog topic, not
    /// from the owners' stores (slow: its cost grows with the store).
    #[arg(long)]
    pub from_changelog: bool,
}

/// `$XDG_DATA_HOME/onceflow/state`, else `~/.local/share/onceflow/state`.
fn default_state_dir() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."))
        .join("onceflow/state")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(state_dir: &std::path::Path) -> KafkaArgs {
        KafkaArgs {
            bootstrap_servers: "127.0.0.1:9".into(),
            kafka_wait_secs: 60,
            state_dir: Some(state_dir.to_path_buf()),
            instance_id: None,
            session_timeout_ms: 10_000,
            transaction_timeout_ms: 10_000,
            group_protocol: "classic".into(),
            kafka_config: Vec::new(),
            report_interval_ms: 5_000,
            state_cleanup_delay_ms: 600_000,
            held_mb: 256,
            hibernate_after_secs: None,
            registry: RegistryArgs::default(),
            fault_lose_commit_answers: 0,
        }
    }

    #[test]
    fn hibernation_defaults_per_command_and_zero_is_never() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut a = args(dir.path());
        let kafka = Connection::default();
        assert!(a.hibernation(&kafka, None).is_none(), "onceflow run: never");
        let host = a.hibernation(&kafka, Some(HOST_HIBERNATE_AFTER_SECS));
        assert_eq!(host.map(|h| h.after), Some(Duration::from_secs(300)));
        a.hibernate_after_secs = Some(0);
        assert!(a.hibernation(&kafka, Some(300)).is_none());
        a.hibernate_after_secs = Some(7);
        assert_eq!(
            a.hibernation(&kafka, None).map(|h| h.after),
            Some(Duration::from_secs(7))
        );
    }

    /// Two containers that mount their own volume at the same path (here:
    /// one directory, then another at the same path) are two instances and
    /// must get two ids; each keeps its own across restarts.
    #[test]
    fn two_state_dirs_at_one_path_get_different_ids() {
        let root = tempfile::tempdir().expect("temp dir");
        let at = root.path().join("state");
        std::fs::create_dir(&at).expect("mkdir");
        let first = args(&at).run_options().expect("options").instance_id;
        // Container A's volume goes away; container B mounts a fresh one.
        std::fs::rename(&at, root.path().join("volume-a")).expect("rename");
        std::fs::create_dir(&at).expect("mkdir");
        let second = args(&at).run_options().expect("options").instance_id;
        assert_ne!(
            first, second,
            "two instances whose state directories have the same path got the same id"
        );
        // B restarts: same id. A's volume mounted again: A's id.
        assert_eq!(
            args(&at).run_options().expect("options").instance_id,
            second
        );
        std::fs::rename(&at, root.path().join("volume-b")).expect("rename");
        std::fs::rename(root.path().join("volume-a"), &at).expect("rename");
        assert_eq!(args(&at).run_options().expect("options").instance_id, first);
    }

    /// An instance-id file cut short or overwritten: moved aside, and the
    /// host starts as a new instance (with state kept), its new id kept
    /// from then on. Before, the host refused to start.
    #[test]
    fn a_damaged_instance_id_file_is_replaced_by_a_new_id() {
        let root = tempfile::tempdir().expect("temp dir");
        let at = root.path().join("state");
        std::fs::create_dir_all(at.join("demo.wallet")).expect("mkdir");
        let first = args(&at).run_options().expect("options").instance_id;
        let file = at.join(INSTANCE_ID_FILE);
        for damage in [&b""[..], b"\0\0\0\0\0\0", b"i01\xff\xfe garbage"] {
            std::fs::write(&file, damage).expect("damage");
            let id = args(&at).run_options().expect("a new id").instance_id;
            assert!(valid_instance_id(&id) && id != first, "{id}");
            assert_eq!(
                std::fs::read(at.join(format!("{INSTANCE_ID_FILE}.damaged"))).expect("kept aside"),
                damage
            );
            assert_eq!(args(&at).run_options().expect("options").instance_id, id);
        }
    }
}
