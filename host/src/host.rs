//! Starting a fleet host: the control topics, the sandbox, the admin API
//! on its own small runtime, and the reconciler on its own thread.
//! `onceflow host` calls [`start`] and then [`Host::wait`]; a test can do
//! the same in-process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// How long a drain may take ([`Host::wait`]): past it the host exits
    /// with the deployments that have not stopped yet.
    pub drain_timeout: Duration,
    /// Tests only: how long a draining host refuses new work before it
    /// stops its deployments (a window wide enough to see the refusal).
    pub drain_hold: Duration,
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
    /// The drain did not finish within `--drain-timeout-secs`.
    #[error(
        "the drain did not finish within --drain-timeout-secs {timeout_s}: {} deployment(s) had \
         not stopped ({}). Nothing is lost: their open transactions are aborted when the other \
         hosts fence them or at the transaction timeout (--transaction-timeout-ms). If a drain \
         needs longer (large stores, slow commits), raise --drain-timeout-secs and the \
         orchestrator's grace period with it",
        still.len(),
        still.join(", ")
    )]
    DrainTimeout {
        /// The timeout, in seconds.
        timeout_s: u64,
        /// The deployments still stopping.
        still: Vec<String>,
    },
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
    /// Set by SIGTERM/SIGINT: the host drains.
    shutdown: Arc<AtomicBool>,
    /// Set when the drain stops the deployments: the reconciler stops them,
    /// and their workers hand their partitions over.
    stop: Arc<AtomicBool>,
    /// Set when the deployments stopped (or the drain timed out): the
    /// admin API stops.
    api_stop: Arc<AtomicBool>,
    drain_timeout: Duration,
    drain_hold: Duration,
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
        drain_timeout,
        drain_hold,
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
    // The drain's second step: the reconciler stops every deployment, and
    // their workers leave their groups (`fleet/reconciler.rs`).
    let stop = Arc::new(AtomicBool::new(false));
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
        stop.clone(),
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
    let api_stop = Arc::new(AtomicBool::new(false));
    let server = {
        let api_stop = api_stop.clone();
        runtime.spawn(crate::admin::serve(
            fleet.clone(),
            listener,
            tls,
            peers,
            async move {
                while !api_stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        ))
    };
    if let Some(file) = tenants_file {
        runtime.spawn(watch_tenants(fleet.clone(), file, stop.clone()));
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
        stop,
        api_stop,
        drain_timeout,
        drain_hold,
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

    /// Runs until `shutdown` is set (or the admin API fails), then drains
    /// and returns.
    ///
    /// The drain (docs/operations.md, "Rolling upgrades"): the host takes
    /// no new work (the API refuses writes with 503 and `/healthz` says
    /// `draining`; the reconciler starts nothing), while it still answers
    /// reads and queries. Every deployment then stops at once, in parallel:
    /// its workers commit what they processed and leave their groups, so
    /// that the other hosts take the partitions without waiting a session
    /// (a worker keeps its static membership on any other stop). The API
    /// stops last. A drain longer than `drain_timeout` ends with
    /// [`HostError::DrainTimeout`]: the process exits, and what had not
    /// stopped is fenced by the partitions' next owners, as after a crash.
    pub fn wait(self) -> Result<(), HostError> {
        while !self.shutdown.load(Ordering::Relaxed) {
            if self.server.is_finished() {
                self.shutdown.store(true, Ordering::Relaxed);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let began = Instant::now();
        let deployments = self.fleet.start_draining();
        tracing::info!(
            deployments,
            drain_timeout_s = self.drain_timeout.as_secs(),
            "host draining: it takes no new work; committing and handing every deployment's \
             partitions over to the other hosts"
        );
        if !self.drain_hold.is_zero() {
            std::thread::sleep(self.drain_hold);
        }
        self.stop.store(true, Ordering::Relaxed);
        let deadline = began + self.drain_timeout;
        while !self.reconciler.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let drained = self.reconciler.is_finished();
        let still = if drained {
            let _ = self.reconciler.join();
            tracing::info!(
                deployments,
                ms = began.elapsed().as_millis() as u64,
                "host drained: every deployment committed and handed its partitions over"
            );
            Vec::new()
        } else {
            self.fleet.still_running()
        };
        self.api_stop.store(true, Ordering::Relaxed);
        let served = self
            .runtime
            .block_on(async { tokio::time::timeout(API_STOP_WAIT, self.server).await });
        if !drained {
            // Not draining any more: what takes its partitions from now on
            // fences what is left of it.
            self.fleet.drain_abandoned();
            return Err(HostError::DrainTimeout {
                timeout_s: self.drain_timeout.as_secs(),
                still,
            });
        }
        self.control.close();
        match served {
            Err(_elapsed) => Ok(()),
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(source))) => Err(HostError::Io {
                what: "the admin API stopped",
                source,
            }),
            Ok(Err(e)) => Err(HostError::Io {
                what: "the admin API task failed",
                source: std::io::Error::other(e.to_string()),
            }),
        }
    }
}

/// How long the admin API's open requests may take once the deployments
/// stopped.
const API_STOP_WAIT: Duration = Duration::from_secs(10);
