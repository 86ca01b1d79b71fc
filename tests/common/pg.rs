//! A real PostgreSQL for the sink's tests, started through scripts/postgres
//! on its own port (25440 + `ONCEFLOW_TEST_PORT_OFFSET`: below Linux's ephemeral
//! ports, 32768-60999, where a client connection's local port can hold it;
//! CI of 8c287dd), and a client on it.

use std::path::PathBuf;
use std::process::Command;

use super::repo;

/// The test's PostgreSQL (scripts/stop-test-clusters stops it).
pub struct Postgres {
    pub port: u16,
    /// The connection string, without the password.
    pub url: String,
    pub password_file: PathBuf,
}

impl Postgres {
    /// Starts it (or finds it running).
    pub fn up() -> Postgres {
        let offset: u16 = std::env::var("ONCEFLOW_TEST_PORT_OFFSET")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let port = 25440 + offset;
        let pg = Postgres {
            port,
            url: String::new(),
            password_file: PathBuf::new(),
        };
        let out = pg.script(&["up"]);
        assert!(
            out.status.success(),
            "scripts/postgres up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let url = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let file = pg.script(&["password-file"]);
        Postgres {
            url,
            password_file: PathBuf::from(String::from_utf8_lossy(&file.stdout).trim()),
            ..pg
        }
    }

    pub fn script(&self, args: &[&str]) -> std::process::Output {
        Command::new(repo().join("scripts/postgres"))
            .args(args)
            .env("ONCEFLOW_POSTGRES_PORT", self.port.to_string())
            .output()
            .expect("run scripts/postgres")
    }

    /// Stops the server at once (in-flight transactions are cut) and starts
    /// it again.
    pub fn restart(&self) {
        let out = self.script(&["restart"]);
        assert!(
            out.status.success(),
            "scripts/postgres restart: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops the server at once and starts it again after `down`.
    pub fn restart_after(&self, down: std::time::Duration) {
        let secs = down.as_secs().to_string();
        let out = self.script(&["restart", "--down-for", &secs]);
        assert!(
            out.status.success(),
            "scripts/postgres restart --down-for {secs}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn down(&self) {
        let _ = self.script(&["down", "--purge"]);
    }

    /// The operator's setup for tenant `name` (docs/sink.md): its role and
    /// its schema (`scripts/postgres tenant NAME`).
    pub fn tenant(&self, name: &str) {
        let out = self.script(&["tenant", name]);
        assert!(
            out.status.success(),
            "scripts/postgres tenant {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The superuser, for the operator's setup (never a sink's): the
    /// `admin-password` file beside the sink's password file, else (a
    /// cluster of an older scripts/postgres) the password file itself.
    pub fn admin(&self) -> postgres::Client {
        let dir = self
            .password_file
            .parent()
            .expect("the password file's directory");
        let password = std::fs::read_to_string(dir.join("admin-password"))
            .or_else(|_| std::fs::read_to_string(&self.password_file))
            .expect("a password file");
        let mut config: postgres::Config = self.url.parse().expect("connection string");
        config.user("onceflow").password(password.trim());
        config
            .connect(postgres::NoTls)
            .expect("connect as the superuser")
    }

    /// The server's log (`scripts/postgres log-file`).
    pub fn server_log(&self) -> PathBuf {
        let out = self.script(&["log-file"]);
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    }

    /// A client.
    pub fn client(&self) -> postgres::Client {
        let password = std::fs::read_to_string(&self.password_file).expect("password file");
        let mut config: postgres::Config = self.url.parse().expect("connection string");
        config.password(password.trim());
        config
            .connect(postgres::NoTls)
            .expect("connect to the test PostgreSQL")
    }
}
