//! The `onceflow` command line. Arguments are parsed and checked here, then
//! turned into the library's own values; `main` only prints the error chain.
//!
//! Exit codes: 0 success; 1 the processor failed (a record under the `fail`
//! policy) or the component was refused; 2 bad arguments, manifest or input.

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand, ValueEnum};

mod init;

use crate::deploy::{Manifest, build};
use crate::guestbench;
use crate::offline::{self, OfflineRunner, RunError, RunOptions};
use crate::sandbox::{self, ProcessorPolicy, Sandbox, SandboxConfig, SandboxError};
use crate::stream::verify::VerifyOptions;

mod host;
pub mod remote;

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
        lang: crate::deploy::manifest::Language,
        /// The processor's name (default: the directory's).
        #[arg(long)]
        name: Option<String>,
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
    Verify {
        /// Kafka bootstrap servers.
        #[arg(long, env = "ONCEFLOW_BOOTSTRAP")]
        bootstrap_servers: String,
        /// Input topic (JSON values).
        #[arg(long)]
        input: String,
        /// JSON field holding each input's unique id.
        #[arg(long, default_value = "payment_id")]
        id: String,
        /// JSON field holding the grouping key.
        #[arg(long, default_value = "account")]
        key: String,
        /// JSON field holding the integer amount.
        #[arg(long, default_value = "amount")]
        sum: String,
        /// Topic that must hold each valid input's id exactly once, as key.
        #[arg(long)]
        echo: Option<String>,
        /// Topic keyed by group key holding the running totals.
        #[arg(long)]
        totals: Option<String>,
        /// JSON field of the running total in --totals.
        #[arg(long, default_value = "balance")]
        total_field: String,
        /// Dead-letter topic that must hold each invalid input exactly once.
        #[arg(long)]
        dead_letter: Option<String>,
        /// Read uncommitted data as well (shows what aborted transactions
        /// wrote).
        #[arg(long)]
        read_uncommitted: bool,
        /// Longest the reads may take (s).
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
        /// Also print the verified totals of the first N keys.
        #[arg(long, default_value_t = 0)]
        show_totals: usize,
        /// Output format.
        #[arg(long, value_enum, default_value = "text")]
        output: OutputFormat,
    },
    /// Run a fleet host: the admin API and /metrics, and every deployment
    /// of the registry (in Kafka), until SIGTERM/SIGINT.
    Host(host::HostArgs),
    /// Upload a processor (its built component and manifest) to the fleet;
    /// deploying an existing name upgrades it in place.
    Deploy {
        /// The manifest, or the directory holding onceflow.toml.
        manifest: PathBuf,
        /// Use this component instead of the manifest's.
        #[arg(long)]
        component: Option<PathBuf>,
        /// Admin API and token.
        #[command(flatten)]
        remote: remote::RemoteArgs,
    },
    /// List your deployments.
    List {
        /// Admin API and token.
        #[command(flatten)]
        remote: remote::RemoteArgs,
    },
    /// Show a deployment: status, version, partitions per host, lag,
    /// commit rate, last errors.
    Describe {
        /// Processor name.
        name: String,
        /// Admin API and token.
        #[command(flatten)]
        remote: remote::RemoteArgs,
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
        remote: remote::RemoteArgs,
    },
    /// Stop a deployment's workers at a commit boundary, keeping its state
    /// and offsets.
    Pause {
        /// Processor name.
        name: String,
        /// Admin API and token.
        #[command(flatten)]
        remote: remote::RemoteArgs,
    },
    /// Start a paused (or failed) deployment again.
    Resume {
        /// Processor name.
        name: String,
        /// Admin API and token.
        #[command(flatten)]
        remote: remote::RemoteArgs,
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
        remote: remote::RemoteArgs,
    },
    /// Read the committed value of a key in a deployment's store.
    Query {
        /// Processor name.
        name: String,
        /// Store name.
        store: String,
        /// Key (text).
        key: String,
        /// Admin API and token.
        #[command(flatten)]
        remote: remote::RemoteArgs,
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
    /// Local state directory (RocksDB per task); one per instance.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Instance (host) id, part of the transactional ids: keep it stable
    /// across restarts of one instance and unique among instances. Default:
    /// a hash of the state directory.
    #[arg(long, visible_alias = "host-id")]
    pub instance_id: Option<String>,
    /// Consumer group session timeout (ms).
    #[arg(long, default_value_t = 10_000)]
    pub session_timeout_ms: u64,
    /// Transaction timeout (ms).
    #[arg(long, default_value_t = 10_000)]
    pub transaction_timeout_ms: u64,
    /// Extra librdkafka property for every client, `key=value`
    /// (repeatable).
    #[arg(short = 'X', long = "kafka-config")]
    pub kafka_config: Vec<String>,
    /// How often to log throughput, commit latency and failures (ms).
    #[arg(long, default_value_t = 5_000)]
    pub report_interval_ms: u64,
}

impl KafkaArgs {
    /// Checks the arguments and creates the state directory.
    pub fn run_options(&self) -> anyhow::Result<crate::stream::RunOptions> {
        let mut extra_config = Vec::new();
        for kv in &self.kafka_config {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| usage(format!("-X {kv:?}: expected key=value")))?;
            extra_config.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        let state_dir = self.state_dir.clone().unwrap_or_else(default_state_dir);
        std::fs::create_dir_all(&state_dir).map_err(|e| {
            usage(format!(
                "cannot create --state-dir {}: {e}",
                state_dir.display()
            ))
        })?;
        let state_dir = state_dir.canonicalize().unwrap_or(state_dir);
        let instance_id = match &self.instance_id {
            Some(id)
                if !id.is_empty()
                    && id
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) =>
            {
                id.clone()
            }
            Some(id) => {
                return Err(usage(format!(
                    "--instance-id {id:?}: use letters, digits, '-', '_' or '.'"
                )));
            }
            None => {
                use sha2::Digest;
                let digest = sha2::Sha256::digest(state_dir.to_string_lossy().as_bytes());
                format!("i{}", hex::encode(&digest[..6]))
            }
        };
        Ok(crate::stream::RunOptions {
            bootstrap_servers: self.bootstrap_servers.clone(),
            state_dir,
            instance_id,
            session_timeout: Duration::from_millis(self.session_timeout_ms),
            transaction_timeout: Duration::from_millis(self.transaction_timeout_ms),
            extra_config,
            report_interval: Duration::from_millis(self.report_interval_ms.max(100)),
        })
    }
}

/// An error that maps to a specific exit code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Exit {
    /// The code.
    pub code: u8,
    /// The message.
    pub message: String,
}

fn usage(message: impl Into<String>) -> anyhow::Error {
    Exit {
        code: 2,
        message: message.into(),
    }
    .into()
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Init { dir, lang, name } => init::cmd_init(&dir, lang, name.as_deref()),
        Command::Build { manifest } => cmd_build(&manifest),
        Command::Validate { target, output } => cmd_validate(&target, output),
        Command::Test {
            manifest,
            input,
            dump_state,
            batch_size,
            partitions,
            component,
        } => cmd_test(
            &manifest,
            &input,
            dump_state,
            batch_size as usize,
            partitions,
            component.as_deref(),
        ),
        Command::Run(args) => cmd_run(args),
        Command::Host(args) => host::run(args),
        Command::Deploy {
            manifest,
            component,
            remote,
        } => remote::deploy(&manifest, component, &remote),
        Command::List { remote } => remote::list(&remote),
        Command::Describe { name, remote } => remote::describe(&name, &remote),
        Command::Logs {
            name,
            follow,
            tail,
            remote,
        } => remote::logs(&name, follow, tail, &remote),
        Command::Pause { name, remote } => remote::set_running(&name, false, &remote),
        Command::Resume { name, remote } => remote::set_running(&name, true, &remote),
        Command::Delete {
            name,
            purge_state,
            remote,
        } => remote::delete(&name, purge_state, &remote),
        Command::Query {
            name,
            store,
            key,
            remote,
        } => remote::query(&name, &store, &key, &remote),
        Command::HashToken => {
            let mut token = String::new();
            std::io::stdin()
                .read_line(&mut token)
                .context("reading the token from stdin")?;
            if token.trim().is_empty() {
                return Err(usage(
                    "no token on stdin: echo -n \"$TOKEN\" | onceflow hash-token",
                ));
            }
            println!("{}", crate::tenancy::hash_token(&token));
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify {
            bootstrap_servers,
            input,
            id,
            key,
            sum,
            echo,
            totals,
            total_field,
            dead_letter,
            read_uncommitted,
            timeout_secs,
            show_totals,
            output,
        } => cmd_verify(
            &VerifyOptions {
                bootstrap_servers,
                input,
                id_field: id,
                key_field: key,
                sum_field: sum,
                echo,
                totals,
                total_field,
                dead_letter,
                read_uncommitted,
                timeout: Duration::from_secs(timeout_secs),
            },
            show_totals,
            output,
        ),
        Command::BenchGuest {
            manifest,
            records,
            batch_sizes,
            output,
        } => cmd_bench_guest(&manifest, records, &batch_sizes, output),
    }
}

fn load_manifest(path: &Path) -> anyhow::Result<Manifest> {
    Manifest::load(path).map_err(|e| usage(e.to_string()))
}

fn read_component(path: &Path, manifest: Option<&Manifest>) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        let hint = match manifest {
            Some(m) if e.kind() == std::io::ErrorKind::NotFound => {
                format!(": run `onceflow build {}` first", m.path.display())
            }
            _ => String::new(),
        };
        usage(format!(
            "cannot read component {}: {e}{hint}",
            path.display()
        ))
    })
}

fn cmd_build(manifest: &Path) -> anyhow::Result<ExitCode> {
    let manifest = load_manifest(manifest)?;
    let out = build::build(&manifest)?;
    println!(
        "built {} ({} KiB); imports: {}",
        out.component.display(),
        out.bytes.div_ceil(1024),
        if out.imports.is_empty() {
            "none".to_owned()
        } else {
            out.imports.join(", ")
        }
    );
    Ok(ExitCode::SUCCESS)
}

fn cmd_validate(target: &Path, output: OutputFormat) -> anyhow::Result<ExitCode> {
    let is_wasm = target.extension().is_some_and(|e| e == "wasm");
    let manifest = if is_wasm {
        None
    } else {
        Some(load_manifest(target)?)
    };
    let path = match &manifest {
        Some(m) => m.component_path(),
        None => target.to_path_buf(),
    };
    let bytes = read_component(&path, manifest.as_ref())?;
    let policy = manifest
        .as_ref()
        .map(ProcessorPolicy::from_manifest)
        .unwrap_or_default();

    let interface = sandbox::policy::inspect(&bytes);
    let verdicts: Vec<(String, Result<sandbox::Grant, String>)> = match &interface {
        Ok(i) => i
            .imports
            .iter()
            .map(|name| (name.clone(), sandbox::policy::classify_import(name)))
            .collect(),
        Err(_) => Vec::new(),
    };
    // The full check: policy, compile, link, instantiate, init.
    let verdict: Result<(), SandboxError> = Sandbox::new(SandboxConfig::default())
        .and_then(|s| s.load(&bytes, policy))
        .and_then(|p| p.instantiate(0).map(drop));

    match output {
        OutputFormat::Json => {
            let json = serde_json::json!({
                "component": path,
                "bytes": bytes.len(),
                "exports": interface.as_ref().map(|i| i.exports.clone()).unwrap_or_default(),
                "imports": verdicts.iter().map(|(name, v)| serde_json::json!({
                    "name": name,
                    "allowed": v.is_ok(),
                    "grant": v.as_ref().map(|g| g.describe()).ok(),
                    "reason": v.as_ref().err(),
                })).collect::<Vec<_>>(),
                "accepted": verdict.is_ok(),
                "error": verdict.as_ref().err().map(|e| e.to_string()),
            });
            println!("{}", serde_json::to_string_pretty(&json)?);
        }
        OutputFormat::Text => {
            println!(
                "component: {} ({} KiB)",
                path.display(),
                bytes.len().div_ceil(1024)
            );
            if let Ok(i) = &interface {
                println!("exports:   {}", i.exports.join(", "));
                println!(
                    "imports:   {}",
                    if i.imports.is_empty() { "none" } else { "" }
                );
                for (name, v) in &verdicts {
                    match v {
                        Ok(g) => println!("  allowed  {name}  ({})", g.describe()),
                        Err(reason) => println!("  REFUSED  {name}  ({reason})"),
                    }
                }
            }
            match &verdict {
                Ok(()) => println!("verdict:   accepted"),
                Err(e) => println!("verdict:   refused: {e}"),
            }
        }
    }
    Ok(if verdict.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn cmd_test(
    manifest_path: &Path,
    input: &Path,
    dump_state: bool,
    batch_size: usize,
    partitions: i32,
    component: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let manifest = load_manifest(manifest_path)?;
    let component_path = component.map_or_else(|| manifest.component_path(), Path::to_path_buf);
    let bytes = read_component(&component_path, Some(&manifest))?;

    let file_name = input.display().to_string();
    let records = if input == Path::new("-") {
        offline::read_input(std::io::stdin().lock(), "<stdin>", &manifest, partitions)
    } else {
        let file = std::fs::File::open(input)
            .map_err(|e| usage(format!("cannot open input {file_name}: {e}")))?;
        offline::read_input(BufReader::new(file), &file_name, &manifest, partitions)
    }
    .map_err(|e| usage(e.to_string()))?;

    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let processor = sandbox
        .load(&bytes, ProcessorPolicy::from_manifest(&manifest))
        .with_context(|| format!("cannot load {}", component_path.display()))?;
    let mut runner = OfflineRunner::new(processor, &manifest);
    let dlq = manifest.errors.dead_letter_topic.clone();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = runner.run(&records, &RunOptions { batch_size }, |o| {
        offline::write_output(&mut out, o, dlq.as_deref())
    });
    let code = match result {
        Ok(summary) => {
            if dump_state {
                for (partition, store, entries) in runner.dump_state()? {
                    for (k, v) in entries {
                        offline::write_state_entry(&mut out, partition, &store, &k, &v)?;
                    }
                }
            }
            out.flush()?;
            eprintln!(
                "processed {} records in {} calls: {} outputs, {} dead-lettered, {} skipped",
                summary.records,
                summary.calls,
                summary.outputs,
                summary.dead_lettered,
                summary.skipped
            );
            ExitCode::SUCCESS
        }
        Err(RunError::Task(e)) => {
            out.flush()?;
            eprintln!("error: {e}");
            eprintln!("(processing stopped; outputs above are from the records before it)");
            ExitCode::from(1)
        }
        Err(e) => return Err(e.into()),
    };
    Ok(code)
}

fn cmd_bench_guest(
    manifest_path: &Path,
    records: usize,
    batch_sizes: &[usize],
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let manifest = load_manifest(manifest_path)?;
    if records == 0 || batch_sizes.iter().any(|&b| b == 0) {
        bail!(usage(
            "--records and every --batch-sizes value must be at least 1"
        ));
    }
    let bytes = read_component(&manifest.component_path(), Some(&manifest))?;
    let input = guestbench::synthetic_payments(&manifest, records);
    eprintln!(
        "{}: {records} synthetic payments per run, batch sizes {batch_sizes:?}, fuel on and off",
        manifest.name
    );
    let rows = guestbench::run(&manifest, &bytes, &input, batch_sizes, |row| {
        eprintln!(
            "  batch {:>5}  fuel {:<3}  {:>12.0} records/s",
            row.batch_size,
            if row.fuel { "on" } else { "off" },
            row.records_per_second()
        );
    })?;
    match output {
        OutputFormat::Json => {
            let json: Vec<_> = rows
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "processor": manifest.name,
                        "batch_size": r.batch_size,
                        "fuel": r.fuel,
                        "records": r.records,
                        "seconds": r.elapsed.as_secs_f64(),
                        "records_per_second": r.records_per_second(),
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&json)?);
        }
        OutputFormat::Text => {
            println!("| processor | batch | fuel | records/s |");
            println!("|---|---:|---|---:|");
            for r in &rows {
                println!(
                    "| {} | {} | {} | {:.0} |",
                    manifest.name,
                    r.batch_size,
                    if r.fuel { "on" } else { "off" },
                    r.records_per_second()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `$XDG_DATA_HOME/onceflow/state`, else `~/.local/share/onceflow/state`.
fn default_state_dir() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."))
        .join("onceflow/state")
}

fn cmd_run(a: RunArgs) -> anyhow::Result<ExitCode> {
    let manifest = load_manifest(&a.manifest)?;
    let component_path = a
        .component
        .clone()
        .unwrap_or_else(|| manifest.component_path());
    let bytes = read_component(&component_path, Some(&manifest))?;
    let options = a.kafka.run_options()?;
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let processor = sandbox
        .load(&bytes, ProcessorPolicy::from_manifest(&manifest))
        .with_context(|| format!("cannot load {}", component_path.display()))?;

    let shutdown = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // A second signal exits at once.
        signal_hook::flag::register_conditional_shutdown(signal, 1, shutdown.clone())?;
        signal_hook::flag::register(signal, shutdown.clone())?;
    }
    tracing::info!(
        instance = %options.instance_id,
        state_dir = %options.state_dir.display(),
        "onceflow run {}",
        manifest.application_id()
    );
    match crate::stream::run(manifest, processor, options, shutdown) {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(1))
        }
    }
}

fn cmd_verify(
    options: &VerifyOptions,
    show_totals: usize,
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let report = crate::stream::verify::verify(options)?;
    match output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        OutputFormat::Text => {
            println!(
                "input {}: {} records, {} valid, {} invalid, {} keys",
                options.input, report.inputs, report.valid, report.invalid, report.keys
            );
            if let Some(t) = &options.echo {
                println!(
                    "echo {t}: {} records, {} missing, {} duplicates, {} unexpected",
                    report.echo_records, report.missing, report.duplicates, report.unexpected
                );
            }
            if let Some(t) = &options.totals {
                println!(
                    "totals {t}: {} records, {} of {} keys wrong",
                    report.totals_records, report.keys_wrong, report.keys
                );
            }
            if let Some(t) = &options.dead_letter {
                println!("dead letters {t}: {} records", report.dead_letters);
            }
            if show_totals > 0 {
                println!("totals computed from the input (first {show_totals} keys):");
                for (key, total) in report.key_totals.iter().take(show_totals) {
                    println!("  {key:<20} {total:>12}");
                }
            }
            if report.is_exact() {
                println!(
                    "verdict: exact (no gap, no duplicate, every total right, no open transaction)"
                );
            } else {
                println!("verdict: {} findings", report.findings.len());
                for f in &report.findings {
                    println!("  - {f}");
                }
            }
        }
    }
    Ok(if report.is_exact() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
