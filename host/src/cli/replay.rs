//! `onceflow replay`: committed transactions run again and compared with
//! what they committed (docs/replay.md); of a manifest run with `onceflow
//! run` (read here), or of a fleet deployment (a host replays it).

use std::io::Write;
use std::process::ExitCode;

use onceflow::api::{ReplayAnswer, ReplayRequest, ReplaySelect, ReplayedTransaction};
use onceflow::fleet::replay::{answer, listed, render, selection as engine_selection};
use onceflow::kafka::Connection;
use onceflow::manifest::Manifest;
use onceflow::sandbox::{Processor, Sandbox, SandboxConfig};
use onceflow::stream::replay::{self, ReplaySource};
use onceflow::task::TaskConfig;
use onceflow::types::error_chain;

use super::args::{ReplayArgs, kafka_config};
use super::remote::print_json;
use super::{OutputFormat, load_manifest, read_component, usage};

/// `onceflow replay`.
pub fn cmd_replay(a: ReplayArgs) -> anyhow::Result<ExitCode> {
    let request = ReplayRequest {
        partition: a.partition,
        select: selection(&a)?,
        candidate: None,
        dump_state: a.dump_state,
        quiet: a.quiet,
    };
    let json = a.remote.output == OutputFormat::Json;
    if !a.deployment.exists() {
        // A fleet deployment, by name.
        let name = a.deployment.to_string_lossy().into_owned();
        if a.deployment.components().count() > 1 || name.ends_with(".toml") {
            return Err(usage(format!(
                "{name}: no such manifest (a fleet deployment is named by its name alone)"
            )));
        }
        let answer = super::remote::replay(&name, request, a.component.as_deref(), &a.remote)?;
        if json {
            print_json(&answer)?;
            return Ok(verdict(&answer));
        }
        let mut out = std::io::stdout().lock();
        print_list(&mut out, &answer)?;
        for t in &answer.transactions {
            print(&mut out, t)?;
        }
        if !answer.transactions.is_empty() {
            print_summary(&mut out, &answer)?;
        }
        return Ok(verdict(&answer));
    }
    local(a, request, json)
}

/// A manifest's replay, reading the cluster here.
fn local(a: ReplayArgs, request: ReplayRequest, json: bool) -> anyhow::Result<ExitCode> {
    let manifest = load_manifest(&a.deployment)?;
    let bootstrap = a.bootstrap_servers.clone().ok_or_else(|| {
        usage(format!(
            "{}: give --bootstrap-servers (or ONCEFLOW_BOOTSTRAP) to read the cluster it ran on",
            a.deployment.display()
        ))
    })?;
    let conn = Connection {
        bootstrap_servers: bootstrap,
        extra_config: kafka_config(&a.kafka_config)?,
    };
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let path = manifest.component_path();
    let bytes = read_component(&path, Some(&manifest))?;
    let processor = super::local::load_processor(&sandbox, &bytes, &manifest, &path)?;
    let candidate = match &a.component {
        Some(path) => {
            let bytes = read_component(path, None)?;
            Some(super::local::load_processor(
                &sandbox, &bytes, &manifest, path,
            )?)
        }
        None => None,
    };
    let codecs =
        onceflow::stream::deployment_codecs(&manifest, a.registry.registry()?.as_ref(), None)
            .map_err(|e| usage(error_chain(&e)))?;
    let component = |sha: &str| the_manifests(&processor, &manifest, sha);
    let source = ReplaySource {
        manifest: &manifest,
        component: &component,
        config: TaskConfig::from_manifest(&manifest).with_codecs(codecs),
        kafka: &conn,
    };
    if json {
        return match answer(&source, &request, candidate) {
            Ok(answer) => {
                print_json(&answer)?;
                Ok(verdict(&answer))
            }
            Err(e) => failed(&e),
        };
    }
    let mut out = std::io::stdout().lock();
    let Some(select) = engine_selection(&request.select) else {
        let mut answer = ReplayAnswer {
            application_id: manifest.application_id(),
            partition: a.partition,
            ..ReplayAnswer::default()
        };
        match replay::transactions(&source, a.partition) {
            Ok(all) => answer.listed = all.iter().map(listed).collect(),
            Err(e) => return failed(&e),
        }
        print_list(&mut out, &answer)?;
        return Ok(ExitCode::SUCCESS);
    };
    let engine = replay::ReplayRequest {
        partition: a.partition,
        select,
        candidate,
        dump_state: a.dump_state,
        max: None,
    };
    let dlq = manifest.errors.dead_letter_topic();
    let windows = &source.config.window_stores;
    let mut failed_write = None;
    // Each transaction printed as it is done.
    let summary = replay::replay(&source, &engine, |r| {
        if let Err(e) = print(&mut out, &render(r, a.quiet, dlq, windows)) {
            failed_write.get_or_insert(e);
        }
    });
    if let Some(e) = failed_write {
        return Err(anyhow::Error::new(e).context("cannot write the replay"));
    }
    let summary = match summary {
        Ok(s) => s,
        Err(e) => return failed(&e),
    };
    let answer = ReplayAnswer {
        application_id: manifest.application_id(),
        partition: a.partition,
        records: summary.records,
        batches: summary.batches,
        identical: summary.identical,
        transactions: Vec::new(),
        listed: Vec::new(),
    };
    print_summary_counts(&mut out, &answer, summary.transactions)?;
    Ok(if summary.identical == summary.transactions {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// A replay that could not run: its error, exit 2.
fn failed(e: &(dyn std::error::Error + 'static)) -> anyhow::Result<ExitCode> {
    eprintln!("error: {}", error_chain(e));
    Ok(ExitCode::from(2))
}

/// The manifest's component, if it is the one that committed.
fn the_manifests(
    processor: &Processor,
    manifest: &Manifest,
    sha: &str,
) -> Result<Processor, String> {
    if processor.digest() == sha {
        Ok(processor.clone())
    } else {
        Err(format!(
            "{} is sha256 {}: build the version that ran, or pass this one as --component to \
             compare it with what committed",
            manifest.component_path().display(),
            processor.digest()
        ))
    }
}

/// Exit 0 when every transaction replayed identically, 1 when one did not.
fn verdict(answer: &ReplayAnswer) -> ExitCode {
    if answer.identical == answer.transactions.len() as u64 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Which transactions the arguments name (the last one by default).
fn selection(a: &ReplayArgs) -> anyhow::Result<ReplaySelect> {
    if let Some(range) = &a.offsets {
        let parse = |s: &str| {
            s.trim().parse::<i64>().map_err(|_| {
                usage(format!(
                    "--offsets {range:?}: give input offsets as A..B (inclusive) or one offset"
                ))
            })
        };
        let (from, to) = match range.split_once("..") {
            Some((a, b)) => (parse(a)?, parse(b.trim_start_matches('='))?),
            None => {
                let o = parse(range)?;
                (o, o)
            }
        };
        if from > to {
            return Err(usage(format!("--offsets {range:?}: {from} is after {to}")));
        }
        return Ok(ReplaySelect::Offsets { from, to });
    }
    if let Some(at) = &a.at {
        return Ok(ReplaySelect::At(parse_time(at)?));
    }
    if let Some(t) = a.transaction {
        return Ok(ReplaySelect::Transaction(t));
    }
    if a.all {
        return Ok(ReplaySelect::All);
    }
    if a.list {
        return Ok(ReplaySelect::List);
    }
    Ok(ReplaySelect::Last(a.last.unwrap_or(1).max(1)))
}

/// Milliseconds since the epoch, or an RFC 3339 time.
fn parse_time(text: &str) -> anyhow::Result<i64> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| {
            usage(format!(
                "--at {text:?}: {e}; give ms since the epoch or an RFC 3339 time such as \
                 2026-12-07T21:10:00Z"
            ))
        })?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// A time in ms as RFC 3339, UTC.
fn show_time(ms: Option<i64>) -> String {
    let Some(ms) = ms else {
        return "at an unknown time".to_owned();
    };
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// `--list`: one line per transaction, then how many.
fn print_list(out: &mut impl Write, answer: &ReplayAnswer) -> std::io::Result<()> {
    if answer.listed.is_empty() && !answer.transactions.is_empty() {
        return Ok(());
    }
    for t in &answer.listed {
        let sources: Vec<String> = t
            .sources
            .iter()
            .map(|(topic, from, n)| format!("{topic}@{from}+{n}"))
            .collect();
        writeln!(
            out,
            "transaction {}: committed {}, {} records ({}), {} batches, {} bytes, component {}",
            t.id,
            show_time(t.at),
            t.records,
            sources.join(", "),
            t.batches,
            t.bytes,
            &t.component[..t.component.len().min(12)]
        )?;
    }
    writeln!(
        out,
        "{} replayable transaction{} of {} partition {}",
        answer.listed.len(),
        if answer.listed.len() == 1 { "" } else { "s" },
        answer.application_id,
        answer.partition
    )
}

/// One transaction's replay: what it read, its outputs, its state changes,
/// its verdict; the candidate's differences.
fn print(out: &mut impl Write, t: &ReplayedTransaction) -> std::io::Result<()> {
    let span = match (&t.first, &t.last) {
        (Some((topic, a)), Some((_, b))) => format!(", offsets {a}..{b} of {topic}"),
        _ => String::new(),
    };
    writeln!(
        out,
        "transaction {} of partition {}, committed {}: {} records{span}, {} batch{}",
        t.id,
        t.partition,
        show_time(t.committed_at),
        t.records,
        t.batches,
        if t.batches == 1 { "" } else { "es" },
    )?;
    let lines = |out: &mut dyn Write, title: &str, lines: &[String]| -> std::io::Result<()> {
        writeln!(out, "{title}")?;
        for l in lines {
            writeln!(out, "{l}")?;
        }
        Ok(())
    };
    if let Some(before) = &t.state_before {
        lines(out, "state before:", before)?;
    }
    if !t.outputs.is_empty() || !t.changes.is_empty() {
        lines(out, "outputs:", &t.outputs)?;
        lines(out, "state changes:", &t.changes)?;
    }
    if let Some(after) = &t.state_after {
        lines(out, "state after:", after)?;
    }
    match &t.differs {
        None => writeln!(out, "identical")?,
        Some(why) => writeln!(out, "differs: {why}")?,
    }
    if let Some(c) = &t.candidate {
        if let Some(why) = &c.failed {
            writeln!(out, "candidate failed: {why}")?;
        }
        for (i, ours, theirs) in &c.outputs {
            writeln!(out, "candidate output {i}:")?;
            writeln!(out, "- {}", ours.as_deref().unwrap_or("(none)"))?;
            writeln!(out, "+ {}", theirs.as_deref().unwrap_or("(none)"))?;
        }
        if let Some(why) = &c.state {
            writeln!(out, "candidate state: {why}")?;
            lines(out, "candidate state changes:", &c.changes)?;
        }
        if c.outputs.is_empty() && c.state.is_none() && c.failed.is_none() {
            writeln!(out, "candidate: the same outputs and state changes")?;
        }
    }
    Ok(())
}

fn print_summary(out: &mut impl Write, answer: &ReplayAnswer) -> std::io::Result<()> {
    print_summary_counts(out, answer, answer.transactions.len() as u64)
}

/// The totals: the records line first, which says the same whatever the
/// commits' timing.
fn print_summary_counts(
    out: &mut impl Write,
    answer: &ReplayAnswer,
    transactions: u64,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{} record{} of {} partition {} replayed: {}",
        answer.records,
        if answer.records == 1 { "" } else { "s" },
        answer.application_id,
        answer.partition,
        if answer.identical == transactions {
            "identical".to_owned()
        } else {
            format!(
                "{} of {} transactions differ",
                transactions - answer.identical,
                transactions
            )
        }
    )?;
    writeln!(
        out,
        "in {} transaction{}, {} batch{}",
        transactions,
        if transactions == 1 { "" } else { "s" },
        answer.batches,
        if answer.batches == 1 { "" } else { "es" }
    )
}
