//! Admission across hosts: a tenant's quota check and its deployment
//! record's write are one compare-and-set on the registry, whichever hosts
//! take the tenant's deploys at the same time.
//!
//! Each admission is one Kafka transaction of a producer whose
//! transactional id belongs to the tenant (`<tenant>.onceflow-admission`,
//! under the prefix a host's principal already holds for the tenant):
//!
//! 1. the producer's `init_transactions` fences any other host's producer
//!    of this tenant (an admission of its still in flight fails at its
//!    commit), and waits for one that is committing to finish;
//! 2. the registry is read to its end (its high watermark, read_committed,
//!    by this host's registry view): every admission committed before
//!    step 1 is in it;
//! 3. the caller decides on those records (quotas, version);
//! 4. its record is written and the transaction committed. If another host
//!    initialised a producer of the tenant after step 1, this commit fails
//!    as fenced, and the whole admission runs again on what that one wrote.
//!
//! A host keeps its producer of a tenant between admissions
//! ([`Admitters`]): step 1 then happened at some earlier admission, and the
//! argument holds as it is. A commit succeeds only if no other host
//! initialised a producer of the tenant since this one's
//! `init_transactions`; every admission initialises before it commits, so
//! none committed in between, and the registry read after it (step 2)
//! holds every admission that could have. A producer that another host
//! fenced fails its next admission as fenced, and a new one is made. Kept
//! producers are closed after [`ADMITTER_IDLE`] without a deploy.
//! (Before, each admission made and initialised a new producer and read the
//! registry with a new reader: about 0.9 s of a 1.2 s `onceflow deploy`.)
//!
//! Each host also admits one deploy per tenant at a time (`Fleet::deploy`'s
//! lock), so the fencing is only between hosts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::FleetError;
use super::control::{ControlPlane, PUBLISH_TIMEOUT};
use super::registry::{DEPLOYMENTS_TOPIC, DeploymentRecord};
use crate::kafka::{self, KafkaError};

/// Admissions of one tenant tried before giving up (each lost only to
/// another host's admission of the same tenant, which then succeeded).
const ATTEMPTS: u32 = 8;

/// How long a host keeps a tenant's admission producer without a deploy of
/// the tenant (a producer is a few librdkafka threads and a connection).
pub(super) const ADMITTER_IDLE: Duration = Duration::from_secs(60);

/// The admission producers this host keeps, one per tenant that deployed
/// in the last [`ADMITTER_IDLE`].
#[derive(Default)]
pub(super) struct Admitters {
    by_tenant: Mutex<HashMap<String, (kafka::Publisher, Instant)>>,
}

impl Admitters {
    /// The tenant's kept producer, taken out while it admits.
    fn take(&self, tenant: &str) -> Option<kafka::Publisher> {
        self.lock().remove(tenant).map(|(p, _)| p)
    }

    /// Keeps `producer` for the tenant's next admission.
    fn keep(&self, tenant: &str, producer: kafka::Publisher) {
        self.lock()
            .insert(tenant.to_owned(), (producer, Instant::now()));
    }

    /// Closes the producers unused for [`ADMITTER_IDLE`], on a thread of
    /// their own (closing a producer takes a few hundred milliseconds).
    pub(super) fn close_idle(&self) {
        let idle: Vec<kafka::Publisher> = {
            let mut by_tenant = self.lock();
            let tenants: Vec<String> = by_tenant
                .iter()
                .filter(|(_, (_, used))| used.elapsed() >= ADMITTER_IDLE)
                .map(|(t, _)| t.clone())
                .collect();
            tenants
                .iter()
                .filter_map(|t| by_tenant.remove(t))
                .map(|(p, _)| p)
                .collect()
        };
        if idle.is_empty() {
            return;
        }
        let closing = std::thread::Builder::new()
            .name("admitters-close".to_owned())
            .spawn(move || drop(idle));
        if let Err(e) = closing {
            tracing::debug!("closing idle admission producers on this thread: {e}");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (kafka::Publisher, Instant)>> {
        self.by_tenant.lock().unwrap_or_else(|e| e.into_inner())
    }
}

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

fn failed(e: kafka::TxnCall) -> Attempt {
    match e {
        kafka::TxnCall::Raced(e) => Attempt::Fenced(e),
        kafka::TxnCall::Failed(e) => Attempt::Failed(FleetError::Kafka(e)),
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
        let producer = match self.admitters.take(tenant) {
            Some(p) => p,
            None => self.admission_producer(tenant)?,
        };
        let admitted = self.admit_with(&producer, tenant, decide);
        // A producer whose admission went through keeps its epoch: it is
        // kept for the next one. One that failed may be fenced or in an
        // abortable state: dropped (its open transaction, if any, is
        // aborted by the next producer's `init_transactions`).
        if admitted.is_ok() {
            self.admitters.keep(tenant, producer);
        }
        admitted
    }

    /// A new admission producer of `tenant`, initialised (step 1).
    fn admission_producer(&self, tenant: &str) -> Result<kafka::Publisher, Attempt> {
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
        producer
            .init_transactions(DEPLOYMENTS_TOPIC, PUBLISH_TIMEOUT)
            .map_err(failed)?;
        Ok(producer)
    }

    /// Steps 2 to 4 with an initialised producer.
    fn admit_with(
        &self,
        producer: &kafka::Publisher,
        tenant: &str,
        decide: &mut impl FnMut(
            &BTreeMap<String, DeploymentRecord>,
        ) -> Result<DeploymentRecord, FleetError>,
    ) -> Result<(DeploymentRecord, i64), Attempt> {
        producer.begin_transaction().map_err(failed)?;
        let records = match self.tenant_records(tenant) {
            Ok(r) => r,
            Err(e) => {
                producer.abort_transaction(PUBLISH_TIMEOUT);
                return Err(Attempt::Failed(e));
            }
        };
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
        // Acknowledged before the commit: `commit_transaction` flushes
        // first, and a flush that finds a record in flight waits in steps
        // of 100 ms (rust-rdkafka's), while this producer's own thread
        // serves the acknowledgement.
        let offset = match acked.wait(PUBLISH_TIMEOUT) {
            Ok(offset) => offset,
            Err(KafkaError::Timeout { .. }) => {
                return Err(Attempt::Failed(FleetError::Unavailable(
                    "the deployment record was never acknowledged: is the cluster reachable?"
                        .to_owned(),
                )));
            }
            Err(e) => return Err(Attempt::Fenced(e)),
        };
        producer
            .commit_transaction(PUBLISH_TIMEOUT)
            .map_err(failed)?;
        Ok((record, offset))
    }

    /// `tenant`'s records in the deployments topic as committed now (the
    /// latest per key; a tombstone removes): this host's registry view once
    /// it has read up to the topic's high watermark (past the last stable
    /// offset, which another tenant's admission may hold back while this
    /// tenant's records committed after it).
    fn tenant_records(
        &self,
        tenant: &str,
    ) -> Result<BTreeMap<String, DeploymentRecord>, FleetError> {
        let (_, high) = kafka::watermarks(&*self.metadata()?, DEPLOYMENTS_TOPIC, 0)?;
        if !self.deployments.wait_past(high - 1, PUBLISH_TIMEOUT) {
            return Err(FleetError::Unavailable(format!(
                "could not read {DEPLOYMENTS_TOPIC} up to offset {high} within 30 s (a \
                 transaction of another admission may be open: they time out after 15 s)"
            )));
        }
        Ok(self
            .deployments
            .entries_with_prefix(&format!("{tenant}/"))
            .into_iter()
            .collect())
    }
}
