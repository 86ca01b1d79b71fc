//! Admission across hosts: a tenant's quota check and its deployment
//! record's write are one compare-and-set on the registry, whichever hosts
//! take the tenant's deploys at the same time.
//!
//! Each admission is one Kafka transaction of a producer whose
//! transactional id belongs to the tenant (`<tenant>.onceflow-admission`,
//! under the prefix a host's principal already holds for the tenant):
//!
//! 1. `init_transactions` fences any other host's admission of this tenant
//!    still in flight (its commit will fail), and waits for one that is
//!    committing to finish;
//! 2. the registry is read to its end, read_committed, with a fresh reader:
//!    every admission committed before step 1 is in it;
//! 3. the caller decides on those records (quotas, version);
//! 4. its record is written and the transaction committed. If another host
//!    began an admission of the tenant after step 1, this commit fails as
//!    fenced, and the whole admission runs again on what that one wrote.
//!
//! Each host also admits one deploy per tenant at a time (`Fleet::deploy`'s
//! lock), so the fencing is only between hosts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::FleetError;
use super::control::{ControlPlane, PUBLISH_TIMEOUT, apply_record};
use super::registry::{DEPLOYMENTS_TOPIC, DeploymentRecord};
use crate::kafka::{self, KafkaError};

/// Admissions of one tenant tried before giving up (each lost only to
/// another host's admission of the same tenant, which then succeeded).
const ATTEMPTS: u32 = 8;

/// Why one attempt did not commit.
enum Attempt {
    /// Another host's admission fenced this one: read again and retry.
    Fenced(KafkaError),
    /// Anything else: give up.
    Failed(FleetError),
}

impl From<FleetError> for Attempt {
    fn from(e: FleetError) -> Self {
        Self::Failed(e)
    }
}

impl ControlPlane {
    /// Reads `tenant`'s deployment records (deleted ones too) as committed
    /// now, hands them to `decide`, and writes the record it returns, all
    /// as one compare-and-set across hosts (see the module's doc). Returns
    /// once this host's registry view has the record.
    pub fn admit(
        &self,
        tenant: &str,
        mut decide: impl FnMut(
            &BTreeMap<String, DeploymentRecord>,
        ) -> Result<DeploymentRecord, FleetError>,
    ) -> Result<DeploymentRecord, FleetError> {
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                // Jittered, so that two hosts do not fence each other in step.
                let jitter = u64::from(std::process::id() % 7) * 15;
                std::thread::sleep(Duration::from_millis(50 * u64::from(attempt) + jitter));
            }
            match self.admit_once(tenant, &mut decide) {
                Ok((record, offset)) => {
                    if self.deployments.wait_past(offset, PUBLISH_TIMEOUT) {
                        return Ok(record);
                    }
                    return Err(FleetError::Unavailable(
                        "the registry did not read back its own write within 30 s".to_owned(),
                    ));
                }
                Err(Attempt::Fenced(e)) => {
                    tracing::debug!(tenant, attempt, "admission fenced by another host's: {e}");
                    last = Some(e);
                }
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
        Err(FleetError::Unavailable(format!(
            "could not admit a deploy of tenant {tenant:?}: other hosts admitted deploys of this \
             tenant at the same time {ATTEMPTS} times in a row ({}); try again",
            last.map_or_else(String::new, |e| e.to_string())
        )))
    }

    fn admit_once(
        &self,
        tenant: &str,
        decide: &mut impl FnMut(
            &BTreeMap<String, DeploymentRecord>,
        ) -> Result<DeploymentRecord, FleetError>,
    ) -> Result<(DeploymentRecord, i64), Attempt> {
        let txn_id = format!("{tenant}.onceflow-admission");
        let producer = kafka::Publisher::transactional(
            self.connection(),
            "onceflow-admission",
            &txn_id,
            &format!("admission of a deploy of tenant {tenant:?}"),
            &[
                ("transaction.timeout.ms", "15000"),
                ("acks", "all"),
                ("message.max.bytes", "1048576"),
            ],
        )
        .map_err(FleetError::Kafka)?;
        let failed = |e: kafka::TxnCall| match e {
            kafka::TxnCall::Raced(e) => Attempt::Fenced(e),
            kafka::TxnCall::Failed(e) => Attempt::Failed(FleetError::Kafka(e)),
        };
        producer
            .init_transactions(PUBLISH_TIMEOUT)
            .map_err(failed)?;
        producer.begin_transaction().map_err(failed)?;
        let records = self.tenant_records(tenant)?;
        let record = match decide(&records) {
            Ok(r) => r,
            Err(e) => {
                producer.abort_transaction(PUBLISH_TIMEOUT);
                return Err(Attempt::Failed(e));
            }
        };
        // A record of strings and numbers always encodes.
        let json = serde_json::to_vec(&record).unwrap_or_default();
        let acked = producer
            .send_in_transaction(DEPLOYMENTS_TOPIC, &record.key(), Some(&json))
            .map_err(failed)?;
        producer
            .commit_transaction(PUBLISH_TIMEOUT)
            .map_err(failed)?;
        // Committed: every delivery report has been served.
        let offset = match acked.wait(Duration::from_secs(1)) {
            Ok(offset) => offset,
            Err(KafkaError::Timeout { .. }) => {
                return Err(Attempt::Failed(FleetError::Unavailable(
                    "the deployment record was committed but its offset never reported".to_owned(),
                )));
            }
            Err(e) => return Err(Attempt::Fenced(e)),
        };
        Ok((record, offset))
    }

    /// `tenant`'s records in the deployments topic as committed now (the
    /// latest per key; a tombstone removes), read with a fresh reader up to
    /// the topic's high watermark: past the last stable offset, since
    /// another tenant's admission may hold that back while this tenant's
    /// records committed after it.
    fn tenant_records(
        &self,
        tenant: &str,
    ) -> Result<BTreeMap<String, DeploymentRecord>, FleetError> {
        let prefix = format!("{tenant}/");
        let (low, high) = {
            let uncommitted = self.connection().reader(
                "_onceflow.control",
                "read_uncommitted",
                50,
                kafka::QuietContext::default(),
            )?;
            kafka::watermarks(&uncommitted, DEPLOYMENTS_TOPIC, 0)?
        };
        let mut records = BTreeMap::new();
        if high <= low {
            // Nothing written yet (a reader's position stays unset on an
            // empty partition).
            return Ok(records);
        }
        let (consumer, _) = self.read_from(DEPLOYMENTS_TOPIC, |_, _| None)?;
        let deadline = Instant::now() + PUBLISH_TIMEOUT;
        while kafka::position(&consumer, DEPLOYMENTS_TOPIC, 0) < high {
            match kafka::poll(&consumer, Duration::from_millis(100)) {
                kafka::Polled::Record(m) => {
                    let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                        continue;
                    };
                    if key.starts_with(&prefix) {
                        apply_record(&mut records, key, &m);
                    }
                }
                kafka::Polled::End | kafka::Polled::Nothing => {}
                kafka::Polled::Failed(e) => {
                    tracing::debug!("reading the registry for an admission: {e}")
                }
            }
            if Instant::now() >= deadline {
                return Err(FleetError::Unavailable(format!(
                    "could not read {DEPLOYMENTS_TOPIC} up to offset {high} within 30 s (a \
                     transaction of another admission may be open: they time out after 15 s)"
                )));
            }
        }
        Ok(records)
    }
}
