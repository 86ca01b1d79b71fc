//! A guest that tries what WASI offers and reports what happened, for the
//! host's sandbox tests. Built for `wasm32-wasip2`, so it imports WASI. The
//! record's value names the probe; the result is emitted to alias `out` with
//! the probe name as key and one line of text as value. Probes never panic:
//! a denied capability is reported, not raised.
//!
//! | probe       | tries                                                        |
//! |-------------|--------------------------------------------------------------|
//! | `tcp`       | connect to 127.0.0.1:<port in the record key>                |
//! | `udp`       | bind 127.0.0.1:0 and send a datagram to itself               |
//! | `dns`       | resolve `localhost`                                          |
//! | `file`      | read `/etc/passwd`                                           |
//! | `dir`       | list `/` and `.`                                             |
//! | `env`       | count environment variables and arguments (`env=N args=M`)   |
//! | `clock`     | wall clock, in milliseconds since the Unix epoch             |
//! | `monotonic` | nanoseconds between two monotonic clock reads                |
//! | `random`    | 16 bytes from the OS random source, in hex                   |
//! | `stdout`    | print `probe stdout line` to stdout and `probe stderr line` to stderr; emits `printed` |

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use onceflow_sdk::{Context, Error, Processor, Record};

/// The probe processor.
pub struct Probe;

impl Processor for Probe {
    fn process(ctx: &mut Context, record: &Record) -> Result<(), Error> {
        let probe = record.value.as_deref().unwrap_or_default();
        let probe = String::from_utf8_lossy(probe);
        let key = record.key.as_deref().unwrap_or_default();
        let result = match probe.as_ref() {
            "tcp" => tcp(&String::from_utf8_lossy(key)),
            "udp" => udp(),
            "dns" => dns(),
            "file" => file(),
            "dir" => format!("/: {}; .: {}", list("/"), list(".")),
            "env" => format!(
                "env={} args={}",
                std::env::vars_os().count(),
                std::env::args_os().count()
            ),
            "clock" => clock(),
            "monotonic" => monotonic(),
            "random" => random(),
            "stdout" => stdout(),
            _ => "unknown probe".to_owned(),
        };
        ctx.emit("out", probe.as_bytes(), result)
    }
}

onceflow_sdk::export_processor!(Probe);

fn tcp(port: &str) -> String {
    let Ok(port) = port.trim().parse::<u16>() else {
        return format!("error: record key {port:?} is not a port number");
    };
    let address = ([127, 0, 0, 1], port).into();
    match TcpStream::connect_timeout(&address, Duration::from_secs(1)) {
        Ok(stream) => format!(
            "connected to {address} from {}",
            stream
                .local_addr()
                .map_or_else(|e| format!("? ({e})"), |a| a.to_string())
        ),
        Err(e) => format!("error: connect to {address}: {e}"),
    }
}

fn udp() -> String {
    let socket = match UdpSocket::bind("127.0.0.1:0") {
        Ok(socket) => socket,
        Err(e) => return format!("error: bind: {e}"),
    };
    let local = match socket.local_addr() {
        Ok(local) => local,
        Err(e) => return format!("error: local address: {e}"),
    };
    match socket.send_to(b"probe", local) {
        Ok(sent) => format!("bound {local}, sent {sent} bytes"),
        Err(e) => format!("error: send to {local}: {e}"),
    }
}

fn dns() -> String {
    match ("localhost", 80).to_socket_addrs() {
        Ok(addresses) => {
            let addresses: Vec<String> = addresses.map(|a| a.ip().to_string()).collect();
            format!("resolved localhost to [{}]", addresses.join(", "))
        }
        Err(e) => format!("error: resolve localhost: {e}"),
    }
}

fn file() -> String {
    match std::fs::read("/etc/passwd") {
        Ok(bytes) => format!("read {} bytes from /etc/passwd", bytes.len()),
        Err(e) => format!("error: read /etc/passwd: {e}"),
    }
}

fn list(dir: &str) -> String {
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            let names: Vec<String> = entries
                .map(|entry| match entry {
                    Ok(entry) => entry.file_name().to_string_lossy().into_owned(),
                    Err(e) => format!("<error: {e}>"),
                })
                .collect();
            format!("{} entries [{}]", names.len(), names.join(", "))
        }
        Err(e) => format!("error: {e}"),
    }
}

fn clock() -> String {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => since.as_millis().to_string(),
        Err(e) => format!("error: clock before the epoch: {e}"),
    }
}

fn monotonic() -> String {
    let first = Instant::now();
    let second = Instant::now();
    second.duration_since(first).as_nanos().to_string()
}

fn random() -> String {
    let mut bytes = [0u8; 16];
    match getrandom::fill(&mut bytes) {
        Ok(()) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
        Err(e) => format!("error: {e}"),
    }
}

fn stdout() -> String {
    // Not println!/eprintln!, which panic when the stream cannot be written.
    let out = writeln!(std::io::stdout(), "wasi-probe: probe stdout line");
    let err = writeln!(std::io::stderr(), "wasi-probe: probe stderr line");
    match (out, err) {
        (Ok(()), Ok(())) => "printed".to_owned(),
        (out, err) => format!("printed with errors: stdout {out:?}, stderr {err:?}"),
    }
}
