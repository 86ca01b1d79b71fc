//! A guest that misbehaves on demand, for the host's sandbox tests. The
//! record's value picks what it does:
//!
//! - `loop`: spins forever (the host must stop it with fuel or a timeout);
//! - `refuel`: spins forever, calling the host's `begin-record` for the
//!   record it is on again and again (which once refilled its fuel);
//! - `alloc`: leaks 1 MiB blocks (reserved, so linear memory grows) until allocation
//!   fails, then panics (the host's memory limit must hold);
//! - `panic`: panics with "hostile guest panicked on purpose";
//! - `fail`: returns the error "hostile guest failed on purpose";
//! - `stack`: recurses without bound (the host must trap, not crash);
//! - `meta`: emits `topic/partition/offset/timestamp` as the value, with the
//!   record's key and headers, to alias `out` (the host's lowering, field by
//!   field);
//! - `output:N`: emits one output of N bytes (value) to alias `out`;
//! - `outputs:N`: emits N small outputs to alias `out` (heavy but valid);
//! - `logs:N`: writes N log lines (the host's rate limit drops the excess);
//! - `flood:N`: emits N outputs of 999,000 bytes each to alias `out`,
//!   ignoring refusals (the host's memory, not the guest's, fills up);
//! - `global`: increments a counter in the instance's memory (not in a
//!   store) and emits its value: what a re-run record would see of memory
//!   that already saw it;
//! - `state:N`: puts an N-byte value under key `big` of store `seen`;
//! - `keep:N`: puts an N-byte value under the record's key in store `seen`
//!   (state that grows with the keys: `limits.state-mb` must hold);
//! - `forget`: deletes the record's key from store `seen`;
//! - `forgets:N`: deletes N distinct absent keys of 1 MiB each from store
//!   `seen`, ignoring refusals (the host holds each deleted key until the
//!   commit: its memory must stay bounded);
//! - `late:N`: reports itself late with an N-byte message (the host must
//!   cap what it keeps of it, as it caps a log line);
//! - with `fail-init` set in its `[config]`, `init` fails (every instance:
//!   a deployment that can never start);
//! - with `burn-init = N` in its `[config]`, `init` spins N iterations first
//!   (init's fuel must be billed, and bounded, on every new instance);
//! - anything else: increments key `count` of store `seen` and emits the
//!   record's key, value and headers unchanged to alias `out`.

use std::hint::black_box;

use onceflow_sdk::{Config, Context, Error, Processor, Record};

/// The hostile processor.
pub struct Hostile;

const MIB: usize = 1 << 20;

/// Records seen by `global` in this instance.
static SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Processor for Hostile {
    fn init(config: &Config) -> Result<(), Error> {
        if let Some(n) = config.get("burn-init") {
            let n: u64 = n
                .parse()
                .map_err(|_| Error::new("burn-init: expected a number of iterations"))?;
            let mut counter: u64 = 0;
            for _ in 0..n {
                counter = black_box(counter.wrapping_add(1));
            }
        }
        match config.get("fail-init") {
            Some(why) => Err(Error::new(format!(
                "hostile guest init failed on purpose: {why}"
            ))),
            None => Ok(()),
        }
    }

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Error> {
        match record.value.as_deref() {
            Some(b"loop") => spin(),
            Some(b"refuel") => refuel(),
            Some(b"alloc") => exhaust_memory(),
            Some(b"panic") => panic!("hostile guest panicked on purpose"),
            Some(b"fail") => Err(Error::new("hostile guest failed on purpose")),
            Some(b"stack") => {
                black_box(recurse(0));
                Ok(())
            }
            Some(b"meta") => {
                let meta = format!(
                    "{}/{}/{}/{}",
                    record.topic, record.partition, record.offset, record.timestamp
                );
                ctx.emit_with(
                    "out",
                    record.key.as_deref(),
                    Some(meta.as_bytes()),
                    &headers_of(record),
                )
            }
            Some(b"global") => {
                let n = SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                ctx.emit_with(
                    "out",
                    record.key.as_deref(),
                    Some(n.to_string().as_bytes()),
                    &[],
                )
            }
            Some(v) if v.starts_with(b"burn:") => {
                // Legitimate but heavy: N iterations, then an output.
                let n = size_of(&v[b"burn:".len()..])?;
                let mut counter: u64 = 0;
                for _ in 0..n {
                    counter = black_box(counter.wrapping_add(1));
                }
                ctx.emit_with("out", record.key.as_deref(), Some(b"burnt"), &[])
            }
            Some(v) if v.starts_with(b"flood:") => {
                let n = size_of(&v[b"flood:".len()..])?;
                let value = vec![b'f'; 999_000];
                for _ in 0..n {
                    let _ = ctx.emit_with("out", record.key.as_deref(), Some(&value), &[]);
                }
                Ok(())
            }
            Some(v) if v.starts_with(b"outputs:") => {
                // Legitimate but heavy: N small outputs for one record.
                let n = size_of(&v[b"outputs:".len()..])?;
                for i in 0..n {
                    ctx.emit_with(
                        "out",
                        record.key.as_deref(),
                        Some(i.to_string().as_bytes()),
                        &[],
                    )?;
                }
                Ok(())
            }
            Some(v) if v.starts_with(b"logs:") => {
                // N log lines for one record (the host's rate limit drops
                // the excess).
                let n = size_of(&v[b"logs:".len()..])?;
                for i in 0..n {
                    onceflow_sdk::log::write(
                        onceflow_sdk::Level::Info,
                        format!("hostile log line {i} of {n}"),
                    );
                }
                Ok(())
            }
            Some(v) if v.starts_with(b"output:") => {
                let n = size_of(&v[7..])?;
                ctx.emit_with("out", record.key.as_deref(), Some(&vec![b'o'; n]), &[])
            }
            Some(v) if v.starts_with(b"keep:") => {
                let n = size_of(&v[5..])?;
                let key = record.key.as_deref().unwrap_or_default();
                ctx.store("seen").put(key, vec![b'k'; n])
            }
            Some(v) if v.starts_with(b"late:") => {
                let n = size_of(&v[b"late:".len()..])?;
                ctx.report_late("l".repeat(n));
                Ok(())
            }
            Some(v) if v.starts_with(b"forgets:") => {
                let n = size_of(&v[b"forgets:".len()..])?;
                let mut key = vec![b'k'; 1 << 20];
                for i in 0..n {
                    key[..8].copy_from_slice(&(i as u64).to_be_bytes());
                    // Refusals ignored: a hostile guest goes on.
                    let _ = ctx.store("seen").delete(&key);
                }
                Ok(())
            }
            Some(b"forget") => {
                let key = record.key.as_deref().unwrap_or_default();
                ctx.store("seen").delete(key)
            }
            Some(v) if v.starts_with(b"state:") => {
                let n = size_of(&v[6..])?;
                ctx.store("seen").put("big", vec![b's'; n])
            }
            _ => {
                let seen = ctx.store("seen");
                let count = seen.get_i64("count")?.unwrap_or(0) + 1;
                seen.put_i64("count", count)?;
                ctx.emit_with(
                    "out",
                    record.key.as_deref(),
                    record.value.as_deref(),
                    &headers_of(record),
                )
            }
        }
    }
}

onceflow_sdk::export_processor!(Hostile);

fn size_of(digits: &[u8]) -> Result<usize, Error> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| Error::new("expected a size in bytes"))
}

fn headers_of(record: &Record) -> Vec<(&str, &[u8])> {
    record
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect()
}

/// Loops forever; `black_box` keeps the optimiser from removing the loop.
fn spin() -> ! {
    let mut counter: u64 = 0;
    loop {
        counter = black_box(counter.wrapping_add(1));
    }
}

/// Spins while telling the host, over and over, that it begins the first
/// record of the batch, hoping each call refills its fuel.
fn refuel() -> ! {
    let mut counter: u64 = 0;
    loop {
        onceflow_sdk::bindings::onceflow::processor::context::begin_record(0);
        for _ in 0..1_000 {
            counter = black_box(counter.wrapping_add(1));
        }
    }
}

/// Leaks 1 MiB blocks until the allocator says no, then panics, so that the
/// trap and the log line say how far it got.
fn exhaust_memory() -> ! {
    let mut leaked: usize = 0;
    loop {
        let mut block: Vec<u8> = Vec::new();
        if block.try_reserve_exact(MIB).is_err() {
            panic!("hostile guest could not allocate after leaking {leaked} MiB");
        }
        // Reserving is enough: in WebAssembly the reservation grows linear
        // memory, which is what the host limits. (Filling each block would
        // spend the fuel budget before the memory limit is reached.)
        block.push(0xa5);
        black_box(&mut block);
        std::mem::forget(block);
        leaked += 1;
    }
}

/// Recurses until the stack runs out. The depth stays in WebAssembly locals
/// (no shadow-stack frame), so the engine's call stack is what overflows;
/// the volatile read keeps the optimiser from proving the recursion endless
/// and the call is not in tail position.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    // SAFETY: reading a static through a valid reference.
    if depth == unsafe { std::ptr::read_volatile(&STOP_AT) } {
        return depth;
    }
    recurse(depth + 1).wrapping_mul(3).wrapping_add(depth)
}

/// Never reached: `u64::MAX` calls deep.
static STOP_AT: u64 = u64::MAX;
