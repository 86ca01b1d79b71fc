//! `onceflow host`: a long-running member of the fleet with the admin API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;

use super::{KafkaArgs, usage};
use crate::fleet::Fleet;
use crate::sandbox::{Sandbox, SandboxConfig};
use crate::stream::control::ControlPlane;
use crate::tenancy::Tenants;

/// `onceflow host` arguments.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// Where the admin API and /metrics listen.
    #[arg(long, default_value = "127.0.0.1:8750")]
    pub listen: SocketAddr,
    /// The tenants file (names, token hashes, topic prefixes, quotas).
    #[arg(long)]
    pub tenants: PathBuf,
    /// Kafka and state settings.
    #[command(flatten)]
    pub kafka: KafkaArgs,
}

/// Runs a host until SIGTERM/SIGINT.
pub fn run(a: HostArgs) -> anyhow::Result<ExitCode> {
    let tenants = Tenants::load(&a.tenants).map_err(|e| usage(e.to_string()))?;
    if tenants.iter().next().is_none() {
        return Err(usage(format!(
            "{}: no [[tenant]] entries: nobody could deploy",
            a.tenants.display()
        )));
    }
    let options = a.kafka.run_options()?;
    let shutdown = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register_conditional_shutdown(signal, 1, shutdown.clone())?;
        signal_hook::flag::register(signal, shutdown.clone())?;
    }
    tracing::info!(
        host = %options.instance_id,
        state_dir = %options.state_dir.display(),
        tenants = tenants.iter().count(),
        "onceflow host starting"
    );
    let artifacts = options.state_dir.join("artifacts");
    let control = ControlPlane::connect(options.clone(), artifacts)
        .context("cannot open the control-plane topics")?;
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let fleet = Fleet::new(control.clone(), tenants, sandbox, options, shutdown.clone());

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the admin API runtime")?;
    let stop = shutdown.clone();
    let server = runtime.spawn(crate::admin::serve(fleet.clone(), a.listen, async move {
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }));
    // The reconciler runs on this thread until shutdown.
    let reconciler = {
        let fleet = fleet.clone();
        std::thread::Builder::new()
            .name("reconciler".into())
            .spawn(move || fleet.run())?
    };
    // A bind failure ends the server task at once: report it and stop.
    while !shutdown.load(Ordering::Relaxed) {
        if server.is_finished() {
            shutdown.store(true, Ordering::Relaxed);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let served = runtime.block_on(server);
    let _ = reconciler.join();
    control.close();
    match served {
        Ok(Ok(())) => Ok(ExitCode::SUCCESS),
        Ok(Err(e)) => Err(usage(format!(
            "cannot serve the admin API on {}: {e}",
            a.listen
        ))),
        Err(e) => Err(anyhow::anyhow!("admin API task failed: {e}")),
    }
}
