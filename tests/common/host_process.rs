//! `onceflow run` as a child process of the test, on a wallet's manifest.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::wallet::Wallet;

/// A running `onceflow run`, killed on drop.
pub struct Host {
    pub child: Child,
    pub log: PathBuf,
    pub instance: String,
}

impl Host {
    pub(super) fn start(w: &Wallet, instance: &str, extra: &[&str]) -> Host {
        Self::run(
            &w.manifest,
            &w.cluster.host_bootstrap,
            w.dir.path(),
            instance,
            extra,
        )
    }

    /// `onceflow run <manifest>` as instance `instance`, with its state and
    /// log (`<instance>.log`) in `dir`.
    pub fn run(
        manifest: &std::path::Path,
        bootstrap: &str,
        dir: &std::path::Path,
        instance: &str,
        extra: &[&str],
    ) -> Host {
        let mut cmd = Command::new(crate::common::onceflow_bin());
        cmd.arg("run")
            .arg(manifest)
            .args(["--bootstrap-servers", bootstrap])
            .arg("--state-dir")
            .arg(dir.join(format!("state-{instance}")))
            .args(["--instance-id", instance])
            .args(["--report-interval-ms", "1000"])
            .args(extra)
            .env("ONCEFLOW_LOG", "info,onceflow::stream=info");
        Self::spawn(cmd, &dir.join(format!("{instance}.log")), instance)
    }

    /// Any `onceflow` command as a child process, its output appended to
    /// `log`.
    pub fn spawn(mut cmd: Command, log: &std::path::Path, instance: &str) -> Host {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let child = cmd
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file)
            .spawn()
            .expect("start onceflow");
        Host {
            child,
            log: log.to_owned(),
            instance: instance.to_owned(),
        }
    }

    /// Waits until the log has `n` lines containing `text` (panics if the
    /// process exits first, or after `timeout`).
    pub fn wait_for(&mut self, text: &str, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.log_text();
            if log.matches(text).count() >= n {
                return;
            }
            if let Some(status) = self.exited() {
                panic!(
                    "{} exited ({status}) before {text:?}; log:\n{log}",
                    self.instance
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {text:?} after {timeout:?}; log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process has exited (and how).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("wait")
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child's PID.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    /// SIGKILL and reap.
    pub fn kill(mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                if !status.success() {
                    // The callers assert success; leave them the reason.
                    let log = self.log_text();
                    let tail: Vec<&str> = log.lines().rev().take(60).collect();
                    eprintln!(
                        "onceflow run exited with {status} after SIGTERM; last log lines:\n{}",
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    );
                }
                return status;
            }
            if Instant::now() > deadline {
                self.signal(libc::SIGKILL);
                panic!(
                    "onceflow run did not stop within 60 s of SIGTERM; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sums `restored N changelog records` over a log.
pub fn restored_records(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| {
            let i = l.find("restored ")?;
            l[i + 9..].split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Every `partitions assigned` line of a host's log: each topic's
/// partitions (`… partitions assigned worker=0 assigned={0, 1}
/// topics=in-a[0,1] in-b[0,1]`).
pub fn assignments(log: &str) -> Vec<BTreeMap<String, BTreeSet<i32>>> {
    log.lines()
        .filter(|l| l.contains("partitions assigned"))
        .map(|l| {
            let (_, topics) = l
                .split_once(" topics=")
                .unwrap_or_else(|| panic!("an assignment names its topics: {l}"));
            topics
                .split_whitespace()
                .take_while(|t| t.ends_with(']'))
                .map(|t| {
                    let (topic, parts) = t
                        .split_once('[')
                        .unwrap_or_else(|| panic!("topic[partitions]: {l}"));
                    let parts = parts
                        .trim_end_matches(']')
                        .split(',')
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            p.parse()
                                .unwrap_or_else(|e| panic!("a partition ({e}): {l}"))
                        })
                        .collect();
                    (topic.to_owned(), parts)
                })
                .collect()
        })
        .collect()
}
