//! A TCP fault proxy between the hosts and the brokers: toxiproxy, driven
//! through its HTTP API, in front of a cluster started with
//! `Cluster::start_behind_proxy` (whose brokers advertise the proxy's
//! ports to the hosts, so every connection a host makes crosses it).
//!
//! toxiproxy-server is installed by scripts/setup into
//! `$ONCEFLOW_CACHE/toolchains/toxiproxy-<TOXIPROXY_VERSION>`; it runs bound
//! to 127.0.0.1, one proxy `kafka-<i>` per broker, and is killed by PID when
//! the `FaultProxy` is dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::cluster::{Cluster, cache};

/// The toxiproxy release scripts/setup installs (keep the two in step).
pub const TOXIPROXY_VERSION: &str = "v2.12.0";

/// The API's port is this far above the first proxy port.
const API_PORT_DISTANCE: u16 = 100;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(
        "toxiproxy-server not found at {0}: run scripts/setup (it installs toxiproxy {TOXIPROXY_VERSION} there), \
         or point ONCEFLOW_TOXIPROXY_SERVER at one"
    )]
    NotInstalled(PathBuf),
    #[error("the cluster was started without a proxy: use Cluster::start_behind_proxy")]
    NotBehindProxy,
    #[error("could not start {path}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "toxiproxy-server did not answer on 127.0.0.1:{port} within 10 s (port taken by another process?); \
         its log {log}:\n{text}"
    )]
    NotReady {
        port: u16,
        log: PathBuf,
        text: String,
    },
    #[error("toxiproxy API {request}")]
    Io {
        request: String,
        #[source]
        source: std::io::Error,
    },
    #[error("toxiproxy API {request} answered {status}: {body}")]
    Status {
        request: String,
        status: String,
        body: String,
    },
}

/// Which way a toxic acts: on what the hosts send (requests) or on what
/// the brokers answer (responses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Host to broker: requests.
    Upstream,
    /// Broker to host: responses. A fault here means the broker did the
    /// work but the host does not learn it, so it retries.
    Downstream,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::Upstream => "upstream",
            Direction::Downstream => "downstream",
        }
    }
}

/// A fault on the connections through one broker's proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toxic {
    /// Every piece of data is held `ms` before it is passed on.
    Latency { ms: u64 },
    /// A connection is reset (RST) `after_ms` after data arrives on it.
    ResetPeer { after_ms: u64 },
    /// Data stops; the connection is closed after `ms` (0: held open,
    /// data dropped, until the toxic is removed).
    Timeout { ms: u64 },
}

impl Toxic {
    fn kind(self) -> &'static str {
        match self {
            Toxic::Latency { .. } => "latency",
            Toxic::ResetPeer { .. } => "reset_peer",
            Toxic::Timeout { .. } => "timeout",
        }
    }

    fn attributes(self) -> String {
        match self {
            Toxic::Latency { ms } => format!(r#"{{"latency":{ms},"jitter":0}}"#),
            Toxic::ResetPeer { after_ms } => format!(r#"{{"timeout":{after_ms}}}"#),
            Toxic::Timeout { ms } => format!(r#"{{"timeout":{ms}}}"#),
        }
    }
}

/// A running toxiproxy-server with one proxy per broker of a cluster.
pub struct FaultProxy {
    child: Child,
    api_port: u16,
    pid_file: PathBuf,
    pub brokers: u32,
    pub log: PathBuf,
    /// Toxics in place, as (broker, name), so they can be removed by name.
    toxics: Mutex<Vec<(u32, String)>>,
}

/// The name of broker i's proxy.
fn proxy_name(broker: u32) -> String {
    format!("kafka-{broker}")
}

impl FaultProxy {
    /// Starts toxiproxy-server on 127.0.0.1 (API on the cluster's proxy
    /// port + 100) and creates proxy `kafka-<i>` listening on the port node
    /// i advertises, forwarding to its client port. A server left running
    /// by an earlier run that was killed is stopped first (by the PID it
    /// recorded).
    pub fn start(cluster: &Cluster) -> Result<FaultProxy, ProxyError> {
        let first = cluster.proxy_port.ok_or(ProxyError::NotBehindProxy)?;
        let server = std::env::var_os("ONCEFLOW_TOXIPROXY_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                cache()
                    .join("toolchains")
                    .join(format!("toxiproxy-{TOXIPROXY_VERSION}"))
                    .join("toxiproxy-server")
            });
        if !server.is_file() {
            return Err(ProxyError::NotInstalled(server));
        }
        let api_port = first + API_PORT_DISTANCE;
        let pid_file = cluster.dir.with_extension("toxiproxy.pid");
        stop_leftover(&pid_file);
        let log = cluster.dir.with_extension("toxiproxy.log");
        let log_file = std::fs::File::create(&log).map_err(|source| ProxyError::Spawn {
            path: log.clone(),
            source,
        })?;
        let child = Command::new(&server)
            .args(["-host", "127.0.0.1", "-port", &api_port.to_string()])
            // Its connection-level chatter (debug, trace) would bury what
            // matters: errors on links.
            .env("LOG_LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log file handle"))
            .stderr(log_file)
            .spawn()
            .map_err(|source| ProxyError::Spawn {
                path: server.clone(),
                source,
            })?;
        let _ = std::fs::write(&pid_file, child.id().to_string());
        let proxy = FaultProxy {
            child,
            api_port,
            pid_file,
            brokers: cluster.brokers,
            log,
            toxics: Mutex::new(Vec::new()),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while proxy.call("GET", "/version", "").is_err() {
            if Instant::now() > deadline {
                return Err(ProxyError::NotReady {
                    port: api_port,
                    log: proxy.log.clone(),
                    text: std::fs::read_to_string(&proxy.log).unwrap_or_default(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for i in 1..=cluster.brokers {
            let body = format!(
                r#"{{"name":"{}","listen":"127.0.0.1:{}","upstream":"127.0.0.1:{}","enabled":true}}"#,
                proxy_name(i),
                first + i as u16 - 1,
                cluster.broker_port(i)
            );
            proxy.call("POST", "/proxies", &body)?;
        }
        Ok(proxy)
    }

    /// Adds `toxic` on `direction` of broker `broker`'s connections (all of
    /// them, open and new, until removed).
    pub fn add(&self, broker: u32, direction: Direction, toxic: Toxic) -> Result<(), ProxyError> {
        let name = format!("{}_{}", toxic.kind(), direction.name());
        let body = format!(
            r#"{{"name":"{name}","type":"{}","stream":"{}","toxicity":1.0,"attributes":{}}}"#,
            toxic.kind(),
            direction.name(),
            toxic.attributes()
        );
        self.call(
            "POST",
            &format!("/proxies/{}/toxics", proxy_name(broker)),
            &body,
        )?;
        self.toxics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((broker, name));
        Ok(())
    }

    /// Latency spike: requests and responses to and from each of `brokers`
    /// held `ms` each way.
    pub fn latency(&self, brokers: &[u32], ms: u64) -> Result<(), ProxyError> {
        for &b in brokers {
            self.add(b, Direction::Upstream, Toxic::Latency { ms })?;
            self.add(b, Direction::Downstream, Toxic::Latency { ms })?;
        }
        Ok(())
    }

    /// Connection resets: the brokers' answers never arrive, the connection
    /// is reset `after_ms` after the broker starts answering (the request
    /// was done; the host learns nothing and retries).
    pub fn reset_peer(&self, brokers: &[u32], after_ms: u64) -> Result<(), ProxyError> {
        for &b in brokers {
            self.add(b, Direction::Downstream, Toxic::ResetPeer { after_ms })?;
        }
        Ok(())
    }

    /// A black hole: requests to `brokers` are dropped and each connection
    /// closed after `ms` (0: held open until the toxic is removed).
    pub fn timeout(&self, brokers: &[u32], ms: u64) -> Result<(), ProxyError> {
        for &b in brokers {
            self.add(b, Direction::Upstream, Toxic::Timeout { ms })?;
        }
        Ok(())
    }

    /// Removes every toxic on broker `broker`'s proxy.
    pub fn remove_toxics(&self, broker: u32) -> Result<(), ProxyError> {
        let mut toxics = self.toxics.lock().unwrap_or_else(|e| e.into_inner());
        let (these, others): (Vec<_>, Vec<_>) = toxics.drain(..).partition(|(b, _)| *b == broker);
        *toxics = others;
        drop(toxics);
        for (b, name) in these {
            self.call(
                "DELETE",
                &format!("/proxies/{}/toxics/{name}", proxy_name(b)),
                "",
            )?;
        }
        Ok(())
    }

    /// A partition: broker `broker`'s proxy stops listening and closes its
    /// connections (the host gets "connection refused") until `enable`.
    pub fn disable(&self, broker: u32) -> Result<(), ProxyError> {
        self.set_enabled(broker, false)
    }

    pub fn enable(&self, broker: u32) -> Result<(), ProxyError> {
        self.set_enabled(broker, true)
    }

    fn set_enabled(&self, broker: u32, enabled: bool) -> Result<(), ProxyError> {
        self.call(
            "POST",
            &format!("/proxies/{}", proxy_name(broker)),
            &format!(r#"{{"enabled":{enabled}}}"#),
        )
        .map(drop)
    }

    /// Ends every fault: all toxics removed, all proxies enabled.
    pub fn clear(&self) -> Result<(), ProxyError> {
        self.toxics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.call("POST", "/reset", "").map(drop)
    }

    /// One HTTP/1.1 request to the API (`Connection: close`: the answer is
    /// everything up to EOF). Returns the body of a 2xx answer.
    fn call(&self, method: &str, path: &str, body: &str) -> Result<String, ProxyError> {
        let request = format!("{method} {path} {body}");
        let io = |source| ProxyError::Io {
            request: request.clone(),
            source,
        };
        let mut stream = TcpStream::connect(("127.0.0.1", self.api_port)).map_err(io)?;
        // Removing a latency toxic waits for the data it holds back (up to
        // the spike, tens of seconds): seen taking over 10 s.
        stream
            .set_read_timeout(Some(Duration::from_secs(90)))
            .map_err(io)?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.api_port,
            body.len()
        )
        .map_err(io)?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).map_err(io)?;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let status = head.lines().next().unwrap_or("").to_owned();
        if status
            .split_whitespace()
            .nth(1)
            .is_some_and(|code| code.starts_with('2'))
        {
            Ok(body.to_owned())
        } else {
            Err(ProxyError::Status {
                request,
                status,
                body: body.to_owned(),
            })
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

/// Kills the toxiproxy-server whose PID an earlier run recorded in
/// `pid_file`, if that process is still a toxiproxy-server.
fn stop_leftover(pid_file: &PathBuf) {
    let Some(pid) = std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok())
    else {
        return;
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if String::from_utf8_lossy(&cmdline).contains("toxiproxy-server") {
        eprintln!("stopping toxiproxy-server pid {pid} left by an earlier run ({pid_file:?})");
        // SAFETY: a signal to a PID we recorded and just checked.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = std::fs::remove_file(pid_file);
}
