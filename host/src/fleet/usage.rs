//! Billing-grade usage: what each deployment's committed work used, read
//! back from `_onceflow.usage`.
//!
//! Every committed transaction of a fleet host's worker writes one
//! [`UsageRecord`] into that same transaction (`stream/worker/commit.rs`, step 1b
//! of the commit): input records and bytes, outputs and bytes, changelog
//! bytes, dead letters, fuel and log lines. An aborted transaction's record
//! is never read (read_committed), a committed one is read once: the sums
//! count committed work exactly once, whatever crashed meanwhile. The topic
//! is the record of truth; `/metrics` shows the same counters per host
//! process (they restart at 0 with it).
//!
//! A tenant's PostgreSQL sink commits in its database, not in Kafka: its
//! batch transaction records the batch's usage in a table of its own, and
//! the sink forwards those rows here afterwards (`sink/committer.rs`), at
//! least once, each with its row's id; an id read twice counts once.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use super::ControlPlane;
use super::registry::USAGE_TOPIC;
use crate::kafka::{self, KafkaError};
use crate::types::{Usage, UsageRecord};

/// How far before `since` a usage read starts, by the records' timestamps.
const SEEK_SLACK_MS: i64 = 10 * 60 * 1000;
/// How long reading the usage topic to its end may take.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

impl ControlPlane {
    /// Sums the usage records of `tenant` (`None`: every tenant) written at
    /// or after `since_ms`, per `(tenant, deployment)`.
    pub fn read_usage(
        &self,
        tenant: Option<&str>,
        since_ms: i64,
    ) -> Result<BTreeMap<(String, String), Usage>, KafkaError> {
        // From where the records of `since_ms` begin, not the topic's
        // start (400 days of it: a fleet's commits write hundreds of
        // records a second). A record's timestamp is stamped when it is
        // sent, after its `ts_ms`; `SEEK_SLACK_MS` covers hosts' clocks that
        // disagree.
        let (consumer, (low, end)) =
            self.read_since(USAGE_TOPIC, since_ms.saturating_sub(SEEK_SLACK_MS))?;
        let mut totals: BTreeMap<(String, String), Usage> = BTreeMap::new();
        if end <= low {
            return Ok(totals);
        }
        let prefix = tenant.map(|t| format!("{t}/"));
        // Sinks' records forwarded twice (a crash between the send and
        // the database's note that it was sent).
        let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
        kafka::read_to_end(
            &consumer,
            1,
            USAGE_TOPIC,
            Instant::now() + READ_TIMEOUT,
            |m| {
                let key_matches = m
                    .key()
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .is_some_and(|k| prefix.as_ref().is_none_or(|p| k.starts_with(p)));
                if !key_matches {
                    return ControlFlow::Continue(());
                }
                let Some(record) = m
                    .payload()
                    .and_then(|p| serde_json::from_slice::<UsageRecord>(p).ok())
                else {
                    return ControlFlow::Continue(());
                };
                if let Some(id) = &record.id
                    && !seen.insert(id.clone())
                {
                    return ControlFlow::Continue(());
                }
                if record.ts_ms >= since_ms && tenant.is_none_or(|t| t == record.tenant) {
                    *totals
                        .entry((record.tenant, record.deployment))
                        .or_default() += record.usage;
                }
                ControlFlow::Continue(())
            },
        )?;
        Ok(totals)
    }
}
