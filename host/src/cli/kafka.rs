//! The commands that run on a cluster: `run`, `verify`, `host`.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use onceflow::admin::TlsFiles;
use onceflow::fleet::TenantsFile;
use onceflow::host::{self, HostConfig, HostError};
use onceflow::kafka::Connection;
use onceflow::sandbox::{Sandbox, SandboxConfig};
use onceflow::stream::verify::{VerifyOptions, verify};
use onceflow::types::error_chain;

use onceflow::sink::{Connections, SinkConfig, SinkOptions};

use super::args::{HostArgs, ProduceArgs, RunArgs, SinkArgs, VerifyArgs, kafka_config};
use super::{OutputFormat, check_derived_names, load_manifest, read_component, usage};

/// A flag set by SIGTERM or SIGINT; a second signal exits at once.
fn on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    let shutdown = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register_conditional_shutdown(signal, 1, shutdown.clone())?;
        signal_hook::flag::register(signal, shutdown.clone())?;
    }
    Ok(shutdown)
}

/// `onceflow produce`: an input file's records to the manifest's input
/// topics, each value in its topic's format.
pub fn cmd_produce(a: ProduceArgs) -> anyhow::Result<ExitCode> {
    use onceflow::schema::{SchemaFiles, registry::RegistrySource};
    let manifest = load_manifest(&a.manifest)?;
    let conn = Connection {
        bootstrap_servers: a.bootstrap_servers,
        extra_config: kafka_config(&a.kafka_config)?,
    };
    let timeout = Duration::from_secs(a.timeout_secs);
    let writer = if manifest
        .input_formats
        .values()
        .any(|f| f.format.uses_registry())
    {
        let registry = a.registry.registry()?.ok_or_else(|| {
            usage(format!(
                "{}'s inputs are in a schema registry's format: give --schema-registry URL \
                 (docs/formats.md)",
                manifest.name
            ))
        })?;
        let files = SchemaFiles::read(&manifest).map_err(|e| usage(error_chain(&e)))?;
        let source = RegistrySource::new(registry, None);
        Some(
            onceflow::offline::InputWriter::new(&manifest, &files, &source)
                .map_err(|e| usage(error_chain(&e)))?,
        )
    } else {
        None
    };
    let sources = manifest.sources();
    let counts = onceflow::kafka::partition_counts(&conn, &sources, timeout)
        .map_err(|e| usage(error_chain(&e)))?;
    let records = super::local::read_input_file(
        &a.input,
        &manifest,
        &|topic| counts.get(topic).copied().unwrap_or(1),
        writer.as_ref(),
    )?;
    onceflow::kafka::produce_records(&conn, &records, timeout)?;
    let mut per_topic: std::collections::BTreeMap<&str, usize> = Default::default();
    for r in &records {
        *per_topic.entry(&r.topic).or_default() += 1;
    }
    for (topic, n) in per_topic {
        let id = writer
            .as_ref()
            .and_then(|w| w.schema_id(topic))
            .map(|id| format!(", schema id {id}"))
            .unwrap_or_default();
        let format = manifest
            .input_formats
            .get(topic)
            .map_or("bytes", |f| f.format.name());
        println!("{topic}: {n} records ({format}{id})");
    }
    Ok(ExitCode::SUCCESS)
}

/// `onceflow host`: runs a fleet host until SIGTERM/SIGINT, then drains
/// ([`host::Host::wait`]).
pub fn cmd_host(a: HostArgs) -> anyhow::Result<ExitCode> {
    let (tenants_file, tenants) =
        TenantsFile::open(&a.tenants).map_err(|e| usage(error_chain(&e)))?;
    let tls = match (a.tls_cert, a.tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
        (None, None) => None,
        _ => {
            return Err(usage(
                "--tls-cert and --tls-key go together: give both to serve HTTPS, or neither",
            ));
        }
    };
    let mut run = a.kafka.run_options()?;
    run.hibernation = a
        .kafka
        .hibernation(&run.kafka, Some(super::args::HOST_HIBERNATE_AFTER_SECS));
    let sink_connections = match &a.sink_connections {
        Some(path) => Connections::load(path).map_err(|e| usage(error_chain(&e)))?,
        None => Connections::default(),
    };
    let shutdown = on_signals()?;
    let config = HostConfig {
        listen: a.listen,
        tenants,
        tenants_file: Some(tenants_file),
        tls,
        run,
        kafka_wait: Duration::from_secs(a.kafka.kafka_wait_secs),
        artifact_grace: Duration::from_secs(a.artifact_grace_secs),
        sink_connections,
        advertise_url: a.advertise_url,
        peer_ca: a.peer_ca,
        drain_timeout: Duration::from_secs(a.drain_timeout_secs),
        drain_hold: Duration::from_millis(a.fault_drain_hold_ms),
    };
    let running = host::start(config, shutdown).map_err(|e| match e {
        e @ (HostError::Bind { .. } | HostError::Tls(_) | HostError::PeerCa(_)) => {
            usage(error_chain(&e))
        }
        other => anyhow::Error::new(other),
    })?;
    running.wait()?;
    Ok(ExitCode::SUCCESS)
}

/// `onceflow run`.
pub fn cmd_run(a: RunArgs) -> anyhow::Result<ExitCode> {
    let manifest = load_manifest(&a.manifest)?;
    check_derived_names(&manifest)?;
    let component_path = a
        .component
        .clone()
        .unwrap_or_else(|| manifest.component_path());
    let bytes = read_component(&component_path, Some(&manifest))?;
    let mut options = a.kafka.run_options()?;
    options.hibernation = a.kafka.hibernation(&options.kafka, None);
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let processor = super::local::load_processor(&sandbox, &bytes, &manifest, &component_path)?;

    let shutdown = on_signals()?;
    // The brokers first: a wrong address is named within seconds.
    onceflow::kafka::wait_for_brokers(
        &options.kafka,
        std::time::Instant::now() + Duration::from_secs(a.kafka.kafka_wait_secs),
    )?;
    tracing::info!(
        instance = %options.instance_id,
        state_dir = %options.state_dir.display(),
        "onceflow run {}",
        manifest.application_id()
    );
    match onceflow::stream::run(manifest, processor, options, shutdown) {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            Ok(ExitCode::from(1))
        }
    }
}

/// `onceflow sink postgres`.
pub fn cmd_sink_postgres(a: SinkArgs) -> anyhow::Result<ExitCode> {
    let config = SinkConfig::load(&a.config).map_err(|e| usage(error_chain(&e)))?;
    if a.session_timeout_ms < 1000 {
        return Err(usage("--session-timeout-ms: at least 1000"));
    }
    let instance_id = a.instance_id.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "sink".to_owned());
        format!("{host}-{}", std::process::id())
    });
    let options = SinkOptions {
        kafka: Connection {
            bootstrap_servers: a.bootstrap_servers,
            extra_config: kafka_config(&a.kafka_config)?,
        },
        instance_id,
        session_timeout: Duration::from_millis(a.session_timeout_ms),
        report_interval: Duration::from_millis(a.report_interval_ms.max(100)),
        pause_before_begin: Duration::from_millis(a.fault_pause_before_begin_ms),
        pause_before_commit: Duration::from_millis(a.fault_pause_before_commit_ms),
        pause_between_markers: Duration::from_millis(a.fault_pause_between_markers_ms),
        pause_after_commit: Duration::from_millis(a.fault_pause_after_commit_ms),
        lose_commit_answers: a.fault_lose_commit_answers,
        metrics: Default::default(),
        // A sink of its own is not billed: no fleet.
        usage: None,
        memory: Default::default(),
    };
    let shutdown = on_signals()?;
    onceflow::kafka::wait_for_brokers(
        &options.kafka,
        std::time::Instant::now() + Duration::from_secs(60),
    )?;
    match onceflow::sink::run_postgres(config, options, shutdown) {
        Ok(report) => {
            tracing::info!(?report, "sink finished");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            Ok(ExitCode::from(1))
        }
    }
}

/// `onceflow verify`.
pub fn cmd_verify(a: VerifyArgs) -> anyhow::Result<ExitCode> {
    let options = &VerifyOptions {
        kafka: Connection {
            bootstrap_servers: a.bootstrap_servers,
            extra_config: kafka_config(&a.kafka_config)?,
        },
        input: a.input,
        id_field: a.id,
        key_field: a.key,
        sum_field: a.sum,
        echo: a.echo,
        totals: a.totals,
        total_field: a.total_field,
        dead_letter: a.dead_letter,
        read_uncommitted: a.read_uncommitted,
        timeout: Duration::from_secs(a.timeout_secs),
        schema_registry: a.registry.registry()?,
    };
    let (show_totals, output) = (a.show_totals, a.output);
    let report = verify(options)?;
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
                    "verdict: exact: no gap, no duplicate, every total right, no open transaction"
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
