//! `onceflow bench-guest`: records per second through `process` for one
//! component, at several batch sizes, with fuel metering on and off. Runs the
//! real task path (state layers, outputs, error isolation) with in-memory
//! stores; no Kafka. Figures are for comparing builds on one machine.

use std::time::{Duration, Instant};

use crate::manifest::Manifest;
use crate::sandbox::{Sandbox, SandboxConfig, SandboxError};
use crate::state::MemoryPartition;
use crate::task::{BatchOutcome, Task, TaskConfig, TaskError};
use crate::types::InputRecord;

/// One measurement.
#[derive(Debug, Clone)]
pub struct BenchRow {
    /// Records per `process` call.
    pub batch_size: usize,
    /// Fuel metering on.
    pub fuel: bool,
    /// Records processed.
    pub records: u64,
    /// Wall time.
    pub elapsed: Duration,
}

impl BenchRow {
    /// Records per second.
    pub fn records_per_second(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Loading the component failed.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// Processing failed.
    #[error(transparent)]
    Task(#[from] TaskError),
}

/// Synthetic wallet payments: `count` records over 1,000 accounts, keyed by
/// account, all in partition 0 of the manifest's first input.
pub fn synthetic_payments(manifest: &Manifest, count: usize) -> Vec<InputRecord> {
    let topic: std::sync::Arc<str> = manifest.inputs[0].as_str().into();
    (0..count)
        .map(|i| {
            let account = format!("acct-{:04}", i % 1000);
            let value = format!(
                r#"{{"payment_id":"p-{i}","account":"{account}","amount":{}}}"#,
                (i % 200) as i64 - 50
            );
            InputRecord {
                topic: topic.clone(),
                partition: 0,
                offset: i as i64,
                timestamp: 1_700_000_000_000 + i as i64,
                key: Some(account.into_bytes()),
                value: Some(value.into_bytes()),
                headers: Vec::new(),
            }
        })
        .collect()
}

/// Measures `records` through the component at each batch size, fuel on and
/// off. Each measurement uses a fresh task and first warms up on one batch.
pub fn run(
    manifest: &Manifest,
    component: &[u8],
    records: &[InputRecord],
    batch_sizes: &[usize],
    mut progress: impl FnMut(&BenchRow),
) -> Result<Vec<BenchRow>, BenchError> {
    let mut rows = Vec::new();
    for fuel in [true, false] {
        let sandbox = Sandbox::new(SandboxConfig {
            fuel,
            ..SandboxConfig::default()
        })?;
        let processor = sandbox.load(component, crate::task::processor_policy(manifest))?;
        for &batch_size in batch_sizes {
            let mut task = Task::new(
                0,
                processor.clone(),
                TaskConfig::from_manifest(manifest),
                Box::new(MemoryPartition::default()),
            );
            let warmup = batch_size.min(records.len());
            task.process_batch(&records[..warmup], &mut BatchOutcome::default())?;
            let started = Instant::now();
            let mut outputs = 0usize;
            for (n, batch) in records.chunks(batch_size.max(1)).enumerate() {
                let mut outcome = BatchOutcome::default();
                task.process_batch(batch, &mut outcome)?;
                outputs += outcome.outputs.len();
                // Commit as the EOS loop would at its interval (every
                // ~1000 records here), so the overlay stays small.
                if (n + 1) * batch_size % 1000 < batch_size {
                    task.apply_committed(Vec::new(), None)?;
                }
            }
            task.apply_committed(Vec::new(), None)?;
            std::hint::black_box(outputs);
            let row = BenchRow {
                batch_size,
                fuel,
                records: records.len() as u64,
                elapsed: started.elapsed(),
            };
            progress(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}
