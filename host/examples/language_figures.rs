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

use onceflow::deploy::Manifest;
use onceflow::guestbench;
use onceflow::sandbox::{ProcessorPolicy, Sandbox, SandboxConfig};

fn main() -> anyhow::Result<()> {
    let records: usize = std::env::var("RECORDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20_000);
    println!(
        "| processor | component | cold compile | instantiate (median of 5) | records/s, batch 100, fuel on |"
    );
    println!("|---|---:|---:|---:|---:|");
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
        let processor = cold.load(&bytes, ProcessorPolicy::from_manifest(&manifest))?;
        let compile = started.elapsed();

        let mut instantiate = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            let guest = processor.instantiate(0)?;
            instantiate.push(started.elapsed());
            drop(guest);
        }
        instantiate.sort();

        let payments = guestbench::synthetic_payments(&manifest, records);
        let rows = guestbench::run(&manifest, &bytes, &payments, &[100], |_| {})?;
        let fuel_on = rows
            .iter()
            .find(|r| r.fuel)
            .map(|r| r.records_per_second())
            .unwrap_or(0.0);
        println!(
            "| {} | {:.1} MiB ({} B) | {:.2} s | {:.2} ms | {:.0} |",
            manifest.name,
            bytes.len() as f64 / (1 << 20) as f64,
            bytes.len(),
            compile.as_secs_f64(),
            instantiate[2].as_secs_f64() * 1000.0,
            fuel_on
        );
    }
    Ok(())
}
