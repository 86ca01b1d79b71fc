//! A real schema registry for the formats' tests (Apicurio Registry, its
//! Confluent API), started through scripts/registry on its own port
//! (25480 + `ONCEFLOW_TEST_PORT_OFFSET`) and run dir; scripts/stop-test-clusters
//! stops it.

use std::path::PathBuf;
use std::process::Command;

use super::{cluster::cache, repo};

/// The test's registry.
pub struct TestRegistry {
    /// Its Confluent API's base URL.
    pub url: String,
    port: u16,
    dir: PathBuf,
}

impl TestRegistry {
    /// Starts it, fresh (empty storage), with `args` for `scripts/registry
    /// up` (TLS, users).
    pub fn up(args: &[&str]) -> TestRegistry {
        let offset: u16 = std::env::var("ONCEFLOW_TEST_PORT_OFFSET")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut r = TestRegistry {
            url: String::new(),
            port: 25480 + offset,
            dir: cache().join("registry-test"),
        };
        // A registry left by an earlier test has schemas: start afresh.
        r.script(&["down"]);
        let mut up = vec!["up"];
        up.extend_from_slice(args);
        let out = r.script(&up);
        assert!(
            out.status.success(),
            "scripts/registry up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        r.url = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        r
    }

    /// Stops the registry process (SIGSTOP): requests hang until
    /// [`TestRegistry::resume`], as on a registry that stopped answering.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused registry go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = std::fs::read_to_string(self.dir.join("pid")).expect("the registry's pid file");
        let status = Command::new("kill")
            .args([sig, pid.trim()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {}", pid.trim());
    }

    pub fn script(&self, args: &[&str]) -> std::process::Output {
        Command::new(repo().join("scripts/registry"))
            .args(args)
            .env("ONCEFLOW_REGISTRY_PORT", self.port.to_string())
            .env("ONCEFLOW_REGISTRY_DIR", &self.dir)
            .output()
            .expect("run scripts/registry")
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.script(&["down", "--purge"]);
    }
}
