//! The `onceflow` command line. Arguments are parsed and checked here, then
//! turned into the library's own values; `main` only prints the error chain.
//!
//! | file | commands |
//! |---|---|
//! | `args.rs` | every command's arguments |
//! | `local.rs` | `build`, `validate`, `test`, `bench-guest`, `hash-token` (no Kafka) |
//! | `init.rs` | `init` (scaffolds) |
//! | `kafka.rs` | `run`, `verify`, `produce`, `host` (on a cluster) |
//! | `replay.rs` | `replay` (committed transactions run again) |
//! | `remote.rs` | `deploy`, `list`, `describe`, `logs`, `pause`, `resume`, `delete`, `query` (the admin API's client) |
//! | `progress.rs` | a spinner for slow steps |
//!
//! Exit codes: 0 success; 1 the processor failed (a record under the `fail`
//! policy) or the component was refused; 2 bad arguments, manifest or input;
//! 3 the fleet is unavailable.

use std::path::Path;
use std::process::ExitCode;

use onceflow::manifest::Manifest;

mod args;
mod init;
mod kafka;
mod local;
mod progress;
mod remote;
mod replay;

pub use args::Cli;
use args::Command;
pub use args::OutputFormat;

/// An error that maps to a specific exit code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Exit {
    /// The code.
    pub code: u8,
    /// The message.
    pub message: String,
}

pub fn usage(message: impl Into<String>) -> anyhow::Error {
    Exit {
        code: 2,
        message: message.into(),
    }
    .into()
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Init {
            dir,
            lang,
            name,
            tenant,
            topic_prefix,
        } => init::cmd_init(
            &dir,
            &init::Scaffold {
                language: lang,
                name: name.as_deref(),
                tenant: &tenant,
                topic_prefix: topic_prefix.as_deref(),
            },
        ),
        Command::Build { manifest } => local::cmd_build(&manifest),
        Command::Validate { target, output } => local::cmd_validate(&target, output),
        Command::Test {
            manifest,
            input,
            dump_state,
            batch_size,
            partitions,
            component,
        } => local::cmd_test(
            &manifest,
            &input,
            dump_state,
            batch_size as usize,
            partitions,
            component.as_deref(),
        ),
        Command::Run(args) => kafka::cmd_run(args),
        Command::Host(args) => kafka::cmd_host(args),
        Command::Sink(args::SinkCommand::Postgres(args)) => kafka::cmd_sink_postgres(args),
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
        Command::Usage { since, remote } => remote::show_usage(since.as_deref(), &remote),
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
            query,
            remote,
        } => remote::query(&name, &store, key, query, &remote),
        Command::HashToken => local::cmd_hash_token(),
        Command::Verify(args) => kafka::cmd_verify(args),
        Command::Produce(args) => kafka::cmd_produce(args),
        Command::Replay(args) => replay::cmd_replay(args),
        Command::BenchGuest {
            manifest,
            records,
            batch_sizes,
            malformed_every,
            output,
        } => local::cmd_bench_guest(&manifest, records, &batch_sizes, malformed_every, output),
    }
}

pub fn load_manifest(path: &Path) -> anyhow::Result<Manifest> {
    Manifest::load(path).map_err(|e| usage(e.to_string()))
}

/// Refuses a manifest whose derived Kafka names (changelog topics) collide
/// with each other or with its own topics.
pub fn check_derived_names(manifest: &Manifest) -> anyhow::Result<()> {
    let found = onceflow::stream::names::own_conflicts(manifest);
    if found.is_empty() {
        Ok(())
    } else {
        Err(usage(format!(
            "{}: {}",
            manifest.path.display(),
            found.join("; ")
        )))
    }
}

pub fn read_component(path: &Path, manifest: Option<&Manifest>) -> anyhow::Result<Vec<u8>> {
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
