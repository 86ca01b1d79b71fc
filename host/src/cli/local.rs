//! The commands that need no Kafka: `build`, `validate`, `test`,
//! `bench-guest`, `hash-token`.

use std::io::{BufReader, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use onceflow::manifest::Manifest;
use onceflow::offline::{self, OfflineRunner, RunError, RunOptions};
use onceflow::sandbox::{self, Sandbox, SandboxConfig, SandboxError};
use onceflow::task::processor_policy;
use onceflow::{build, guestbench};

use super::{OutputFormat, check_derived_names, load_manifest, read_component, usage};

/// `onceflow build`.
pub fn cmd_build(manifest: &Path) -> anyhow::Result<ExitCode> {
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

/// `onceflow validate`.
pub fn cmd_validate(target: &Path, output: OutputFormat) -> anyhow::Result<ExitCode> {
    let is_wasm = target.extension().is_some_and(|e| e == "wasm");
    let manifest = if is_wasm {
        None
    } else {
        let manifest = load_manifest(target)?;
        check_derived_names(&manifest)?;
        Some(manifest)
    };
    let path = match &manifest {
        Some(m) => m.component_path(),
        None => target.to_path_buf(),
    };
    let bytes = read_component(&path, manifest.as_ref())?;
    let policy = manifest.as_ref().map(processor_policy).unwrap_or_default();

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

/// Loads a component into the sandbox, saying so while it compiles (the
/// first load of a component; an interpreter's takes half a minute).
pub(super) fn load_processor(
    sandbox: &Sandbox,
    bytes: &[u8],
    manifest: &Manifest,
    component_path: &Path,
) -> anyhow::Result<onceflow::sandbox::Processor> {
    let load = || sandbox.load(bytes, processor_policy(manifest));
    // Compiled code's components (tens of KiB) compile in well under a
    // second; an interpreter's (10-20 MiB) in 10-30 s.
    let loaded = if bytes.len() < 1 << 20 || sandbox.is_compiled(bytes) {
        load()
    } else {
        super::progress::during(
            false,
            format!(
                "compiling {} ({:.1} MiB) to native code, once per component (then cached)",
                component_path.display(),
                bytes.len() as f64 / (1 << 20) as f64
            ),
            load,
        )
    };
    loaded.with_context(|| format!("cannot load {}", component_path.display()))
}

/// `onceflow test`.
pub fn cmd_test(
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

    let formats = offline::OfflineFormats::for_manifest(&manifest)
        .map_err(|e| usage(onceflow::types::error_chain(&e)))?;
    let records = read_input_file(
        input,
        &manifest,
        &|_| partitions,
        formats.as_ref().map(|f| f.inputs()),
    )?;

    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let processor = load_processor(&sandbox, &bytes, &manifest, &component_path)?;
    let mut runner = OfflineRunner::with_formats(processor, &manifest, formats.as_ref());
    let dlq = manifest.errors.dead_letter_topic().map(str::to_owned);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = runner.run(&records, &RunOptions { batch_size }, |o| match &formats {
        Some(f) => offline::write_output(&mut out, &f.readable(o), dlq.as_deref()),
        None => offline::write_output(&mut out, o, dlq.as_deref()),
    });
    let code = match result {
        Ok(summary) => {
            if dump_state {
                for entry in runner.dump_state()? {
                    offline::write_state_entry(&mut out, &entry)?;
                }
            }
            out.flush()?;
            let mut time = String::new();
            if summary.punctuations > 0 {
                time.push_str(&format!(", {} punctuations", summary.punctuations));
            }
            if summary.late_dropped > 0 {
                time.push_str(&format!(", {} late records dropped", summary.late_dropped));
            }
            eprintln!(
                "processed {} records in {} calls: {} outputs, {} dead-lettered, {} skipped{time}",
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

/// `onceflow bench-guest`.
pub fn cmd_bench_guest(
    manifest_path: &Path,
    records: usize,
    batch_sizes: &[usize],
    malformed_every: Option<usize>,
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let manifest = load_manifest(manifest_path)?;
    if records == 0 || batch_sizes.contains(&0) || malformed_every == Some(0) {
        bail!(usage(
            "--records, --malformed-every and every --batch-sizes value must be at least 1"
        ));
    }
    let bytes = read_component(&manifest.component_path(), Some(&manifest))?;
    let mut input = guestbench::synthetic_payments(&manifest, records);
    if let Some(every) = malformed_every {
        for record in input.iter_mut().skip(every - 1).step_by(every) {
            record.value = Some(b"{\"payment_id\": not json".to_vec());
        }
    }
    eprintln!(
        "{}: {records} synthetic payments per run{}, batch sizes {batch_sizes:?}, fuel on and off",
        manifest.name,
        malformed_every.map_or(String::new(), |n| format!(", every {n}th malformed"))
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

/// `onceflow hash-token`: the sha256 of a token from stdin.
pub fn cmd_hash_token() -> anyhow::Result<ExitCode> {
    let mut token = String::new();
    std::io::stdin()
        .read_line(&mut token)
        .context("reading the token from stdin")?;
    if token.trim().is_empty() {
        return Err(usage(
            "no token on stdin: echo -n \"$TOKEN\" | onceflow hash-token",
        ));
    }
    println!("{}", onceflow::fleet::tenancy::hash_token(&token));
    Ok(ExitCode::SUCCESS)
}

/// The records of an input file (`-`: stdin) for `manifest`
/// (`onceflow test`, `onceflow produce`).
pub(super) fn read_input_file(
    input: &Path,
    manifest: &onceflow::manifest::Manifest,
    partitions: &dyn Fn(&str) -> i32,
    writer: Option<&offline::InputWriter>,
) -> anyhow::Result<Vec<onceflow::types::InputRecord>> {
    let file_name = input.display().to_string();
    if input == Path::new("-") {
        offline::read_input_as(
            std::io::stdin().lock(),
            "<stdin>",
            manifest,
            partitions,
            writer,
        )
    } else {
        let file = std::fs::File::open(input)
            .map_err(|e| usage(format!("cannot open input {file_name}: {e}")))?;
        offline::read_input_as(
            BufReader::new(file),
            &file_name,
            manifest,
            partitions,
            writer,
        )
    }
    .map_err(|e| usage(e.to_string()))
}
