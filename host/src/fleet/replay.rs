//! Replay for a tenant (docs/replay.md): `POST
//! /v1/deployments/{name}/replay` runs committed transactions of one of its
//! deployments again on this host, reading the cluster with the host's
//! credentials for the deployment's own topics only, with the components
//! the tenant holds; and the rendering of a replay as the admin API
//! answers it, which `onceflow replay` prints for a local manifest too.

use crate::api::{
    CandidateDiff, ListedTransaction, ReplayAnswer, ReplayRequest, ReplaySelect,
    ReplayedTransaction,
};
use crate::manifest::Manifest;
use crate::offline::{self, write_output, write_state_change, write_state_entry};
use crate::sandbox::Processor;
use crate::state::StoreChanges;
use crate::stream::replay::{
    self, Committed, ReplayError, ReplaySource, Replayed, Selection, Verdict,
};
use crate::stream::{self, StreamError};
use crate::task::{TaskConfig, processor_policy};
use crate::types::{OutputRecord, error_chain};

use super::registry::DeploymentRecord;
use super::{Fleet, FleetError, Tenant, manifest_of};

/// Most transactions one request replays: a longer replay is asked for in
/// parts (`--offsets`, `--transaction`).
pub const MAX_REPLAY_TRANSACTIONS: usize = 1_000;

impl Fleet {
    /// Replays transactions of `tenant`'s deployment `name`.
    pub fn replay(
        &self,
        tenant: &Tenant,
        name: &str,
        req: ReplayRequest,
    ) -> Result<ReplayAnswer, FleetError> {
        let r = self.own_record(tenant, name)?;
        let manifest = manifest_of(&r).map_err(FleetError::Manifest)?;
        let conn = self.control.connection().clone();
        let candidate = match &req.candidate {
            Some(sha) => Some(self.tenant_component(tenant, &r, &manifest, sha)?),
            None => None,
        };
        let component = |sha: &str| {
            self.tenant_component(tenant, &r, &manifest, sha)
                .map_err(|e| error_chain(&e))
        };
        let namespace = Some(tenant.topic_prefix.clone());
        let codecs = stream::deployment_codecs(
            &manifest,
            self.options.schema_registry.as_ref(),
            Some((&crate::schema::SchemaFiles(r.schemas.clone()), namespace)),
        )
        .map_err(|e| match e {
            StreamError::Formats(e) => FleetError::Formats(e),
            other => FleetError::Stream(other),
        })?;
        let source = ReplaySource {
            manifest: &manifest,
            component: &component,
            config: TaskConfig::from_manifest(&manifest).with_codecs(codecs),
            kafka: &conn,
        };
        answer(&source, &req, candidate).map_err(|e| match e {
            ReplayError::Kafka(e) => FleetError::Kafka(e),
            other => FleetError::Invalid(error_chain(&other)),
        })
    }

    /// A component `tenant` holds, by its SHA-256, loaded under the
    /// deployment's limits: its current one, or one it uploaded (a
    /// candidate, or a version that ran before an upgrade, while its grant
    /// is kept).
    fn tenant_component(
        &self,
        tenant: &Tenant,
        r: &DeploymentRecord,
        manifest: &Manifest,
        sha: &str,
    ) -> Result<Processor, FleetError> {
        if sha != r.artifact && !self.control.granted(&tenant.name, sha)? {
            return Err(FleetError::Invalid(format!(
                "component sha256 {sha} is not one of tenant {}'s: upload it (`onceflow \
                 replay --component` does) or replay the transactions of the running version",
                tenant.name
            )));
        }
        let bytes = self.control.artifact(sha)?;
        self.sandbox
            .load(&bytes, processor_policy(manifest))
            .map_err(FleetError::Component)
    }
}

/// Runs a replay request over `source` and renders it.
pub fn answer(
    source: &ReplaySource<'_>,
    req: &ReplayRequest,
    candidate: Option<Processor>,
) -> Result<ReplayAnswer, ReplayError> {
    let mut out = ReplayAnswer {
        application_id: source.manifest.application_id(),
        partition: req.partition,
        ..ReplayAnswer::default()
    };
    let Some(select) = selection(&req.select) else {
        out.listed = replay::transactions(source, req.partition)?
            .iter()
            .map(listed)
            .collect();
        return Ok(out);
    };
    let request = replay::ReplayRequest {
        partition: req.partition,
        select,
        candidate,
        dump_state: req.dump_state,
        max: Some(MAX_REPLAY_TRANSACTIONS),
    };
    let dlq = source.manifest.errors.dead_letter_topic();
    let windows = &source.config.window_stores;
    let summary = replay::replay(source, &request, |r| {
        out.transactions.push(render(r, req.quiet, dlq, windows));
    })?;
    out.records = summary.records;
    out.batches = summary.batches;
    out.identical = summary.identical;
    Ok(out)
}

/// The engine's selection of an API selection (`None`: a list).
pub fn selection(select: &ReplaySelect) -> Option<Selection> {
    Some(match *select {
        ReplaySelect::Offsets { from, to } => Selection::Offsets { from, to },
        ReplaySelect::At(ms) => Selection::At(ms),
        ReplaySelect::Transaction(id) => Selection::Transaction(id),
        ReplaySelect::Last(n) => Selection::Last(n),
        ReplaySelect::All => Selection::All,
        ReplaySelect::List => return None,
    })
}

/// A transaction as `--list` shows it.
pub fn listed(c: &Committed) -> ListedTransaction {
    let r = &c.record;
    ListedTransaction {
        id: c.id,
        at: c.at,
        records: r.records() as u64,
        sources: r
            .sources
            .iter()
            .enumerate()
            .map(|(i, (t, from))| (t.clone(), *from, r.records_of(i) as u64))
            .collect(),
        batches: r.batches.len() as u64,
        bytes: c.bytes as u64,
        component: r.component.clone(),
    }
}

/// A replayed transaction as the API answers it: outputs and state
/// changes as the JSON lines `onceflow test` prints (none when `quiet`),
/// the verdict, the candidate's differences.
pub fn render(
    r: &Replayed,
    quiet: bool,
    dlq: Option<&str>,
    windows: &[(String, u64)],
) -> ReplayedTransaction {
    let partition = r.inputs.first().map_or(0, |i| i.partition);
    let at = |i: Option<&crate::types::InputRecord>| i.map(|i| (i.topic.to_string(), i.offset));
    let output = |o: &OutputRecord| line(|w| write_output(w, o, dlq));
    let changes = |all: &[StoreChanges]| -> Vec<String> {
        all.iter()
            .flat_map(|s| {
                let windowed = windows.iter().any(|(w, _)| *w == s.store);
                s.changes
                    .iter()
                    .map(move |c| line(|w| write_state_change(w, &s.store, partition, windowed, c)))
            })
            .collect()
    };
    let state = |dump: &replay::StoreDump| -> Vec<String> {
        offline::state_entries(partition, dump.clone(), windows)
            .iter()
            .map(|e| line(|w| write_state_entry(w, e)))
            .collect()
    };
    let candidate = r.candidate.as_ref().map(|c| {
        let ours: Vec<&OutputRecord> = r.outputs.iter().flatten().collect();
        let theirs: Vec<&OutputRecord> = c.outputs.iter().flatten().collect();
        let same = |a: Option<&&OutputRecord>, b: Option<&&OutputRecord>| {
            a.map(|o| (&o.topic, &o.key, &o.value, &o.headers))
                == b.map(|o| (&o.topic, &o.key, &o.value, &o.headers))
        };
        let outputs = (0..ours.len().max(theirs.len()))
            .filter(|&i| !same(ours.get(i), theirs.get(i)))
            .map(|i| {
                (
                    i,
                    ours.get(i).map(|o| output(o)),
                    theirs.get(i).map(|o| output(o)),
                )
            })
            .collect();
        let state = match replay::compare_changes("the candidate", &c.changes, &r.committed_changes)
        {
            Verdict::Identical => None,
            Verdict::Differs(why) => Some(why),
        };
        CandidateDiff {
            outputs,
            changes: if state.is_some() {
                changes(&c.changes)
            } else {
                Vec::new()
            },
            state,
            failed: c.failed.clone(),
        }
    });
    ReplayedTransaction {
        id: r.transaction,
        committed_at: r.committed_at,
        partition,
        records: r.inputs.len() as u64,
        first: at(r.inputs.first()),
        last: at(r.inputs.last()),
        batches: r.record.batches.len() as u64,
        outputs: if quiet {
            Vec::new()
        } else {
            r.outputs.iter().flatten().map(&output).collect()
        },
        changes: if quiet {
            Vec::new()
        } else {
            changes(&r.changes)
        },
        differs: match &r.verdict {
            Verdict::Identical => None,
            Verdict::Differs(why) => Some(why.clone()),
        },
        candidate,
        state_before: r.state.as_ref().map(|(before, _)| state(before)),
        state_after: r.state.as_ref().map(|(_, after)| state(after)),
    }
}

/// What a writer of one JSON line wrote, without its newline.
fn line(write: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut buf = Vec::new();
    // Writing to memory does not fail.
    let _ = write(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    text.trim_end_matches('\n').to_owned()
}
