//! `[processing]`: the guarantee, how often and in what batches a worker
//! commits, how many workers, standby copies, and how long transactions
//! stay replayable; each key's range.

use serde::Deserialize;

/// The processing guarantee, as Kafka Streams' `processing.guarantee`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Guarantee {
    /// Every batch's outputs, state changes and input offsets commit in one
    /// Kafka transaction.
    #[default]
    ExactlyOnceV2,
    /// Outputs are produced and offsets committed afterwards; a crash can
    /// duplicate outputs.
    AtLeastOnce,
}

/// `[processing]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ProcessingSection {
    /// `exactly_once_v2` (default) or `at_least_once`.
    #[serde(default)]
    pub guarantee: Guarantee,
    /// How often a worker commits its transaction, in milliseconds.
    #[serde(default = "default_commit_interval_ms")]
    pub commit_interval_ms: u64,
    /// Worker threads per host instance (each with its own consumer and
    /// transactional producer).
    #[serde(default = "default_worker_threads")]
    pub worker_threads: u32,
    /// Most records handed to one `process` call.
    #[serde(default = "default_max_batch")]
    pub max_batch_records: u32,
    /// Warm copies of each task's stores kept on other host instances
    /// (Kafka Streams' `num.standby.replicas`), by tailing its changelogs.
    #[serde(default)]
    pub standby_replicas: u32,
    /// How long each committed transaction stays replayable
    /// (`onceflow replay`, docs/replay.md), in hours: the replay topic's
    /// retention and the changelogs' `min.compaction.lag.ms`. 0: no replay
    /// records are written.
    #[serde(default = "default_replay_window_hours")]
    pub replay_window_hours: u32,
}

/// Most hours a manifest may keep transactions replayable (90 days).
pub const MAX_REPLAY_WINDOW_HOURS: u32 = 90 * 24;

fn default_replay_window_hours() -> u32 {
    7 * 24
}

impl Default for ProcessingSection {
    fn default() -> Self {
        Self {
            guarantee: Guarantee::default(),
            commit_interval_ms: default_commit_interval_ms(),
            worker_threads: default_worker_threads(),
            max_batch_records: default_max_batch(),
            standby_replicas: 0,
            replay_window_hours: default_replay_window_hours(),
        }
    }
}

/// Most standby copies of a task's stores a manifest may ask for.
pub const MAX_STANDBY_REPLICAS: u32 = 8;

fn default_commit_interval_ms() -> u64 {
    100
}
fn default_worker_threads() -> u32 {
    1
}
fn default_max_batch() -> u32 {
    500
}

impl ProcessingSection {
    /// Checks each key's range: the first key out of it, and why.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        let in_range = |key: &'static str, value: u64, max: u64| {
            if (1..=max).contains(&value) {
                Ok(())
            } else {
                Err((key, format!("{value} is out of range 1..={max}")))
            }
        };
        in_range(
            "processing.commit-interval-ms",
            self.commit_interval_ms,
            600_000,
        )?;
        in_range("processing.worker-threads", self.worker_threads.into(), 64)?;
        in_range(
            "processing.max-batch-records",
            self.max_batch_records.into(),
            100_000,
        )?;
        if self.standby_replicas > MAX_STANDBY_REPLICAS {
            return Err((
                "processing.standby-replicas",
                format!(
                    "{} is out of range 0..={MAX_STANDBY_REPLICAS} (each standby is a full copy \
                     of every store, on another host)",
                    self.standby_replicas
                ),
            ));
        }
        if self.replay_window_hours > MAX_REPLAY_WINDOW_HOURS {
            return Err((
                "processing.replay-window-hours",
                format!(
                    "{} is out of range 0..={MAX_REPLAY_WINDOW_HOURS} (0 writes no replay records)",
                    self.replay_window_hours
                ),
            ));
        }
        Ok(())
    }
}
