//! `onceflow replay`: committed transactions run again and compared with
//! what they committed (docs/replay.md).

use std::io::Write;
use std::process::ExitCode;

use onceflow::kafka::Connection;
use onceflow::offline::{self, write_output, write_state_change, write_state_entry};
use onceflow::sandbox::{Sandbox, SandboxConfig};
use onceflow::state::StoreChanges;
use onceflow::stream::replay::{self, ReplayRequest, ReplaySource, Replayed, Selection, Verdict};
use onceflow::task::TaskConfig;
use onceflow::types::{OutputRecord, error_chain};

use super::args::{ReplayArgs, kafka_config};
use super::{load_manifest, read_component, usage};

/// `onceflow replay`.
pub fn cmd_replay(a: ReplayArgs) -> anyhow::Result<ExitCode> {
    let manifest = load_manifest(&a.manifest)?;
    let select = selection(&a)?;
    let conn = Connection {
        bootstrap_servers: a.bootstrap_servers.clone(),
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
    let source = ReplaySource {
        manifest: &manifest,
        processor,
        config: TaskConfig::from_manifest(&manifest).with_codecs(codecs),
        kafka: &conn,
    };
    if a.list {
        return list(&source, a.partition);
    }
    let request = ReplayRequest {
        partition: a.partition,
        select,
        candidate,
        dump_state: a.dump_state,
    };
    let dlq = manifest.errors.dead_letter_topic();
    let windows = &source.config.window_stores;
    let mut out = std::io::stdout().lock();
    let mut failed_write = None;
    let summary = replay::replay(&source, &request, |r| {
        if let Err(e) = print(&mut out, r, a.quiet, dlq, windows) {
            failed_write.get_or_insert(e);
        }
    });
    if let Some(e) = failed_write {
        return Err(anyhow::Error::new(e).context("cannot write the replay"));
    }
    let summary = match summary {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            return Ok(ExitCode::from(2));
        }
    };
    // The records line first: it says the same whatever the commits' timing.
    println!(
        "{} records of {} partition {} replayed: {}",
        summary.records,
        manifest.application_id(),
        a.partition,
        if summary.identical == summary.transactions {
            "identical".to_owned()
        } else {
            format!(
                "{} of {} transactions differ",
                summary.transactions - summary.identical,
                summary.transactions
            )
        }
    );
    println!(
        "in {} transaction{}",
        summary.transactions,
        if summary.transactions == 1 { "" } else { "s" }
    );
    Ok(if summary.identical == summary.transactions {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Which transactions the arguments name (the last one by default).
fn selection(a: &ReplayArgs) -> anyhow::Result<Selection> {
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
        return Ok(Selection::Offsets { from, to });
    }
    if let Some(at) = &a.at {
        return Ok(Selection::At(parse_time(at)?));
    }
    if let Some(t) = a.transaction {
        return Ok(Selection::Transaction(t));
    }
    if a.all {
        return Ok(Selection::All);
    }
    Ok(Selection::Last(a.last.unwrap_or(1).max(1)))
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
fn show_time(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// `--list`: the partition's transactions, one line each.
fn list(source: &ReplaySource<'_>, partition: i32) -> anyhow::Result<ExitCode> {
    let all = match replay::transactions(source, partition) {
        Ok(all) => all,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            return Ok(ExitCode::from(2));
        }
    };
    for c in &all {
        let r = &c.record;
        let sources: Vec<String> = r
            .sources
            .iter()
            .enumerate()
            .map(|(i, (t, from))| format!("{t}@{from}+{}", r.records_of(i)))
            .collect();
        println!(
            "transaction {}: committed {}, {} records ({}), {} batches, {} bytes, component {}",
            c.id,
            c.at.map_or("at an unknown time".to_owned(), show_time),
            r.records(),
            sources.join(", "),
            r.batches.len(),
            c.bytes,
            &r.component[..r.component.len().min(12)]
        );
    }
    println!(
        "{} replayable transaction{} of {} partition {partition}",
        all.len(),
        if all.len() == 1 { "" } else { "s" },
        source.manifest.application_id()
    );
    Ok(ExitCode::SUCCESS)
}

/// One transaction's replay: what it read, its outputs, its state changes,
/// its verdict; the candidate's differences.
fn print(
    out: &mut impl Write,
    r: &Replayed,
    quiet: bool,
    dlq: Option<&str>,
    windows: &[(String, u64)],
) -> std::io::Result<()> {
    let span = match (r.inputs.first(), r.inputs.last()) {
        (Some(a), Some(b)) => format!(", offsets {}..{} of {}", a.offset, b.offset, a.topic),
        _ => String::new(),
    };
    writeln!(
        out,
        "transaction {} of partition {}, committed {}: {} records{span}, {} batch{}",
        r.transaction,
        r.inputs.first().map_or(0, |i| i.partition),
        r.committed_at
            .map_or("at an unknown time".to_owned(), show_time),
        r.inputs.len(),
        r.record.batches.len(),
        if r.record.batches.len() == 1 {
            ""
        } else {
            "es"
        },
    )?;
    let partition = r.inputs.first().map_or(0, |i| i.partition);
    if let Some((before, _)) = &r.state {
        writeln!(out, "state before:")?;
        for e in offline::state_entries(partition, before.clone(), windows) {
            write_state_entry(out, &e)?;
        }
    }
    if !quiet {
        writeln!(out, "outputs:")?;
        for o in r.outputs.iter().flatten() {
            write_output(out, o, dlq)?;
        }
        writeln!(out, "state changes:")?;
        write_changes(out, &r.changes, partition, windows)?;
    }
    if let Some((_, after)) = &r.state {
        writeln!(out, "state after:")?;
        for e in offline::state_entries(partition, after.clone(), windows) {
            write_state_entry(out, &e)?;
        }
    }
    match &r.verdict {
        Verdict::Identical => writeln!(out, "identical")?,
        Verdict::Differs(why) => writeln!(out, "differs: {why}")?,
    }
    if let Some(c) = &r.candidate {
        if let Some(why) = &c.failed {
            writeln!(out, "candidate failed: {why}")?;
        }
        let ours: Vec<&OutputRecord> = r.outputs.iter().flatten().collect();
        let theirs: Vec<&OutputRecord> = c.outputs.iter().flatten().collect();
        let mut differences = 0;
        for i in 0..ours.len().max(theirs.len()) {
            let (a, b) = (ours.get(i), theirs.get(i));
            if a.map(|o| (&o.topic, &o.key, &o.value, &o.headers))
                == b.map(|o| (&o.topic, &o.key, &o.value, &o.headers))
            {
                continue;
            }
            differences += 1;
            writeln!(out, "candidate output {i}:")?;
            match a {
                Some(o) => {
                    write!(out, "- ")?;
                    write_output(out, o, dlq)?
                }
                None => writeln!(out, "- (none)")?,
            }
            match b {
                Some(o) => {
                    write!(out, "+ ")?;
                    write_output(out, o, dlq)?
                }
                None => writeln!(out, "+ (none)")?,
            }
        }
        let state = replay::compare_changes("the candidate", &c.changes, &r.committed_changes);
        if let Verdict::Differs(why) = &state {
            differences += 1;
            writeln!(out, "candidate state: {why}")?;
            writeln!(out, "candidate state changes:")?;
            write_changes(out, &c.changes, partition, windows)?;
        }
        if differences == 0 && c.failed.is_none() {
            writeln!(out, "candidate: the same outputs and state changes")?;
        }
    }
    Ok(())
}

/// State changes, one line each (`--dump-state`'s form, `"value": null`
/// for a delete).
fn write_changes(
    out: &mut impl Write,
    all: &[StoreChanges],
    partition: i32,
    windows: &[(String, u64)],
) -> std::io::Result<()> {
    for s in all {
        let windowed = windows.iter().any(|(w, _)| *w == s.store);
        for c in &s.changes {
            write_state_change(out, &s.store, partition, windowed, c)?;
        }
    }
    Ok(())
}
