//! Figures for docs/languages.md: per built processor, the component's size,
//! its cold compile (no compile cache), the time to instantiate it, and
//! records/s through the host with fuel on (the synthetic wallet payments of
//! `onceflow bench-guest`).
//!
//! ```sh
//! cargo run -p onceflow --example language_figures -- \
//!     examples/wallet examples/wallet-js examples/wallet-python examples/wallet-go examples/wallet-c
//! ```
//!
//! Build the components first (`onceflow build <dir>`). Prints one Markdown
//! table row per processor.

use std::path::PathBuf;
use std::time::Instant;

use std::collections::{BTreeMap, HashMap};

use onceflow::guestbench;
use onceflow::manifest::Manifest;
use onceflow::sandbox::{Sandbox, SandboxConfig};
use onceflow::task::processor_policy;
use onceflow::types::{AccessError, EmitError, Header};

/// State in memory; outputs counted and dropped.
#[derive(Default)]
struct Memory {
    stores: HashMap<String, BTreeMap<Vec<u8>, Vec<u8>>>,
    emitted: u64,
}

impl onceflow::types::Effects for Memory {
    fn get(&mut self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, AccessError> {
        Ok(self.stores.get(store).and_then(|s| s.get(key).cloned()))
    }
    fn put(&mut self, store: &str, key: Vec<u8>, value: Vec<u8>) -> Result<(), AccessError> {
        self.stores
            .entry(store.to_owned())
            .or_default()
            .insert(key, value);
        Ok(())
    }
    fn delete(&mut self, store: &str, key: Vec<u8>) -> Result<(), AccessError> {
        self.stores
            .entry(store.to_owned())
            .or_default()
            .remove(&key);
        Ok(())
    }
    fn scan_prefix(
        &mut self,
        _: &str,
        _: &[u8],
        _: Option<&[u8]>,
        _: usize,
    ) -> Result<Vec<onceflow::types::Entry>, AccessError> {
        Ok(Vec::new())
    }
    fn scan_range(
        &mut self,
        _: &str,
        _: Option<&[u8]>,
        _: Option<&[u8]>,
        _: usize,
    ) -> Result<Vec<onceflow::types::Entry>, AccessError> {
        Ok(Vec::new())
    }
    fn emit(
        &mut self,
        _: &str,
        _: Option<Vec<u8>>,
        _: Option<Vec<u8>>,
        _: Vec<Header>,
        _: i64,
    ) -> Result<(), EmitError> {
        self.emitted += 1;
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let records: usize = std::env::var("RECORDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20_000);
    println!(
        "| processor | component | cold compile | instantiate (median of 5) | fuel per payment | records/s, batch 100, fuel on |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for arg in std::env::args().skip(1) {
        let mut path = PathBuf::from(&arg);
        if path.is_dir() {
            path = path.join("onceflow.toml");
        }
        let manifest = Manifest::load(&path)?;
        let bytes = std::fs::read(manifest.component_path())?;

        let cold = Sandbox::new(SandboxConfig {
            fuel: true,
            cache_dir: None,
        })?;
        let started = Instant::now();
        let processor = cold.load(&bytes, processor_policy(&manifest))?;
        let compile = started.elapsed();

        let mut instantiate = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            let guest = processor.instantiate(0)?;
            instantiate.push(started.elapsed());
            drop(guest);
        }
        instantiate.sort();

        // Fuel: what the instance burned on a batch of ordinary payments
        // (after a first batch that warms it up), per payment.
        let payments = guestbench::synthetic_payments(&manifest, 1_100);
        let mut guest = processor.instantiate(0)?;
        let mut effects: Box<dyn onceflow::types::Effects> = Box::<Memory>::default();
        let (warmup, measured) = payments.split_at(100);
        guest
            .process(warmup, &vec![None; warmup.len()], &mut effects)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        guest.take_fuel_used();
        guest
            .process(measured, &vec![None; measured.len()], &mut effects)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let fuel_per_payment = guest.take_fuel_used() / measured.len() as u64;

        let payments = guestbench::synthetic_payments(&manifest, records);
        let rows = guestbench::run(&manifest, &bytes, &payments, &[100], |_| {})?;
        let fuel_on = rows
            .iter()
            .find(|r| r.fuel)
            .map(|r| r.records_per_second())
            .unwrap_or(0.0);
        println!(
            "| {} | {:.1} MiB ({} B) | {:.2} s | {:.2} ms | {} | {:.0} |",
            manifest.name,
            bytes.len() as f64 / (1 << 20) as f64,
            bytes.len(),
            compile.as_secs_f64(),
            instantiate[2].as_secs_f64() * 1000.0,
            fuel_per_payment,
            fuel_on
        );
    }
    Ok(())
}
