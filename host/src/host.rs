//! Starting a fleet host: the control topics, the sandbox, the admin API
//! on its own small runtime, and the reconciler on its own thread.
//! `onceflow host` calls [`start`] and then [`Host::wait`]; a test can do
//! the same in-process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::admin::{ServerTls, TlsError, TlsFiles};
use crate::fleet::{ControlPlane, Fleet, FleetError, Tenants, TenantsFile};
use crate::sandbox::{Sandbox, SandboxConfig, SandboxError};
use crate::sink::Connections;
use crate::stream::RunOptions;

/// What a host needs.
#[derive(Debug)]
pub struct HostConfig {
    /// Where the admin API and `/metrics` listen (port 0: any free port).
    pub listen: SocketAddr,
    /// Who may do what.
    pub tenants: Tenants,
    /// The file `tenants` came from, watched: its changes are put in force
    /// without a restart (`None`: the tenants never change).
    pub tenants_file: Option<TenantsFile>,
    /// Serve the admin API over HTTPS with this certificate (`None`: http).
    pub tls: Option<TlsFiles>,
    /// The cluster, the state directory and this host's id (its
    /// `instance_id`), for every deployment it runs.
    pub run: RunOptions,
    /// How long to wait at start for the brokers and the control topics
    /// (a cluster that is starting, or topics just created).
    pub kafka_wait: Duration,
    /// How long an uploaded component no deployment runs is kept before it
    /// may be collected (`fleet/artifacts.rs`).
    pub artifact_grace: Duration,
    /// The database connections offered to tenants' sinks.
    pub sink_connections: Connections,
    /// Where other hosts reach this one's admin API (`None`: from
    /// `listen`).
    pub advertise_url: Option<String>,
    /// The CA that signed the other hosts' certificates, when private.
    pub peer_ca: Option<std::path::PathBuf>,
}

/// Why a host could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The control-plane topics could not be created or read.
    #[error("cannot open the control-plane topics")]
    Control(#[source] FleetError),
    /// Another live host process uses this host's id (or the check could
    /// not be made).
    #[error("refusing to start")]
    Identity(#[source] FleetError),
    /// The Wasm engine could not be set up.
    #[error("cannot start the sandbox")]
    Sandbox(#[source] SandboxError),
    /// A database connection offered to tenants' sinks may not be used (a
    /// superuser, or a tenant's role that reaches more than its tables).
    #[error("refusing to offer the sink connections (--sink-connections)")]
    SinkConnections(#[source] crate::sink::SinkError),
    /// The other hosts' CA (`--peer-ca`) cannot be used.
    #[error("--peer-ca: {0}")]
    PeerCa(String),
    /// The admin API's certificate cannot be used.
    #[error("cannot serve the admin API over HTTPS")]
    Tls(#[source] TlsError),
    /// The admin API's address could not be bound.
    #[error("cannot serve the admin API on {listen}")]
    Bind {
        /// The address.
        listen: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A runtime or thread could not be started, or the server failed.
    #[error("{what}")]
    Io {
        /// What failed.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// A running host.
pub struct Host {
    /// The fleet it serves.
    pub fleet: Arc<Fleet>,
    listen: SocketAddr,
    control: Arc<ControlPlane>,
    shutdown: Arc<AtomicBool>,
    runtime: tokio::runtime::Runtime,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    reconciler: JoinHandle<()>,
}

/// Opens the control topics (creating them if needed), binds the admin
/// API and starts reconciling. The host runs until `shutdown` is set.
pub fn start(config: HostConfig, shutdown: Arc<AtomicBool>) -> Result<Host, HostError> {
    let HostConfig {
        listen,
        tenants,
        tenants_file,
        tls,
        run,
        kafka_wait,
        artifact_grace,
        sink_connections,
        advertise_url,
        peer_ca,
    } = config;
    // The certificate first: a bad file is refused before any Kafka work.
    let tls = tls
        .as_ref()
        .map(ServerTls::load)
        .transpose()
        .map_err(HostError::Tls)?;
    let peers = {
        let ca = peer_ca
            .as_ref()
            .map(|path| {
                std::fs::read(path)
                    .map_err(|e| HostError::PeerCa(format!("cannot read {}: {e}", path.display())))
            })
            .transpose()?;
        Arc::new(crate::admin::Peers::new(ca.as_deref()).map_err(HostError::PeerCa)?)
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    // Then the sink connections, before any Kafka work.
    crate::sink::check_connections(&sink_connections).map_err(HostError::SinkConnections)?;
    tracing::info!(
        host = %run.instance_id,
        state_dir = %run.state_dir.display(),
        tenants = tenants.iter().count(),
        "onceflow host starting"
    );
    let artifacts = run.state_dir.join("artifacts");
    // Every committed transaction records what it used (`fleet/usage.rs`).
    let run = RunOptions {
        usage_topic: Some(crate::fleet::registry::USAGE_TOPIC.to_owned()),
        queries: Some(Default::default()),
        ..run
    };
    let control = ControlPlane::connect(run.kafka.clone(), artifacts, kafka_wait)
        .map_err(HostError::Control)?;
    let sandbox = Sandbox::new(SandboxConfig::default()).map_err(HostError::Sandbox)?;
    let fleet = Fleet::new(
        control.clone(),
        tenants,
        sandbox,
        run,
        shutdown.clone(),
        artifact_grace,
    );
    fleet.set_sink_connections(sink_connections);
    if let Err(e) = fleet.check_unique_host_id() {
        control.close();
        return Err(HostError::Identity(e));
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| HostError::Io {
            what: "cannot start the admin API's runtime",
            source,
        })?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(listen))
        .map_err(|source| HostError::Bind { listen, source })?;
    let listen = listener.local_addr().unwrap_or(listen);
    let api_url = advertise_url.unwrap_or_else(|| advertised(scheme, listen));
    tracing::info!(url = %api_url, "other hosts reach this one at this address (--advertise-url)");
    fleet.set_api_url(api_url);
    let stop = shutdown.clone();
    let server = runtime.spawn(crate::admin::serve(
        fleet.clone(),
        listener,
        tls,
        peers,
        async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        },
    ));
    if let Some(file) = tenants_file {
        runtime.spawn(watch_tenants(fleet.clone(), file, shutdown.clone()));
    }
    let reconciler = {
        let fleet = fleet.clone();
        std::thread::Builder::new()
            .name("reconciler".into())
            .spawn(move || fleet.run())
            .map_err(|source| HostError::Io {
                what: "cannot start the reconciler thread",
                source,
            })?
    };
    Ok(Host {
        fleet,
        listen,
        control,
        shutdown,
        runtime,
        server,
        reconciler,
    })
}

/// This host's admin API as other hosts reach it, by default: the address
/// it listens on, or its hostname when it listens on every interface.
fn advertised(scheme: &str, listen: SocketAddr) -> String {
    if !listen.ip().is_unspecified() {
        return format!("{scheme}://{listen}");
    }
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{scheme}://{host}:{}", listen.port())
}

/// How often a host looks at `tenants.toml` for changes.
pub const TENANTS_POLL: Duration = Duration::from_secs(2);

/// Puts every valid change of `tenants.toml` in force; an invalid one is
/// logged (once) and the tenants in force stay.
async fn watch_tenants(fleet: Arc<Fleet>, mut file: TenantsFile, shutdown: Arc<AtomicBool>) {
    while !shutdown.load(Ordering::Relaxed) {
        tokio::time::sleep(TENANTS_POLL).await;
        match file.changed() {
            None => {}
            Some(Ok(tenants)) => {
                let before = fleet.tenants();
                let names = |t: &Tenants| t.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
                let (old, new) = (names(&before), names(&tenants));
                let added: Vec<&String> = new.iter().filter(|n| !old.contains(n)).collect();
                let removed: Vec<&String> = old.iter().filter(|n| !new.contains(n)).collect();
                fleet.replace_tenants(tenants);
                tracing::info!(
                    file = %file.path().display(),
                    tenants = new.len(),
                    ?added,
                    ?removed,
                    "tenants.toml changed: the new tenants and tokens are in force"
                );
            }
            Some(Err(e)) => tracing::error!(
                "tenants.toml changed but cannot be used, the previous tenants stay in force \
                 (fix the file; it is read again when it changes): {}",
                crate::types::error_chain(&e)
            ),
        }
    }
}

impl Host {
    /// Where the admin API listens.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// Runs until `shutdown` is set (or the admin API fails), then stops
    /// every deployment at a commit boundary and returns.
    pub fn wait(self) -> Result<(), HostError> {
        while !self.shutdown.load(Ordering::Relaxed) {
            if self.server.is_finished() {
                self.shutdown.store(true, Ordering::Relaxed);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let served = self.runtime.block_on(self.server);
        let _ = self.reconciler.join();
        self.control.close();
        match served {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(HostError::Io {
                what: "the admin API stopped",
                source,
            }),
            Err(e) => Err(HostError::Io {
                what: "the admin API task failed",
                source: std::io::Error::other(e.to_string()),
            }),
        }
    }
}
