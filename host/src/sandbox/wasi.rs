//! The WASI context a processor gets: nothing granted, and nothing that
//! would make a retried record compute something different.
//!
//! - no arguments, no environment, stdin closed;
//! - stdout and stderr become log lines (see [`GuestLog`]);
//! - no preopened directory, so no file can be opened;
//! - sockets: TCP and UDP off, every address check fails, name lookup off;
//! - the wall clock reads the current record's timestamp; the monotonic clock
//!   advances 1 µs per read and measures nothing real;
//! - random bytes come from a generator seeded by the current record's topic,
//!   partition and offset.
//!
//! "Current record" is the one the processor named with
//! `context.begin-record` (the SDKs call it), or the batch's first record.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_core::TryRng;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::clocks::{HostMonotonicClock, HostWallClock};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder};

use super::log::{GuestLog, LogSource};

/// The record the determinism is derived from.
#[derive(Debug)]
struct Current {
    timestamp_ms: i64,
    seed: u64,
    rng: Option<StdRng>,
    monotonic_ns: u64,
}

/// Shared between the host's `context` import (which moves it) and the WASI
/// clocks and random generators (which read it).
#[derive(Debug, Clone)]
pub struct Determinism {
    current: Arc<Mutex<Current>>,
}

impl Default for Determinism {
    fn default() -> Self {
        Self {
            current: Arc::new(Mutex::new(Current {
                timestamp_ms: 0,
                seed: 0,
                rng: None,
                monotonic_ns: 0,
            })),
        }
    }
}

impl Determinism {
    /// Makes the record with seed `seed` (see [`record_seed`]) and
    /// timestamp `timestamp_ms` the current one. Cheap: the generator is
    /// reseeded only if the record reads randomness.
    pub fn set_record(&self, seed: u64, timestamp_ms: i64) {
        let mut c = lock(&self.current);
        c.timestamp_ms = timestamp_ms;
        c.seed = seed;
        c.rng = None;
    }

    fn with_rng<R>(&self, f: impl FnOnce(&mut StdRng) -> R) -> R {
        let mut c = lock(&self.current);
        let seed = c.seed;
        f(c.rng.get_or_insert_with(|| StdRng::seed_from_u64(seed)))
    }
}

fn lock(m: &Mutex<Current>) -> std::sync::MutexGuard<'_, Current> {
    // The data is plain numbers; a panic elsewhere cannot leave it invalid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A stable 64-bit seed from a record's coordinates (FNV-1a, then a
/// SplitMix64 finaliser). Stable across hosts and Rust versions, unlike
/// `DefaultHasher`.
pub fn record_seed(topic: &str, partition: i32, offset: i64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let (partition, offset) = (partition.to_le_bytes(), offset.to_le_bytes());
    for b in topic.as_bytes().iter().chain(&partition).chain(&offset) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The latest wall-clock time a guest can read, ms: u64 nanoseconds' end.
const MAX_CLOCK_MS: u64 = u64::MAX / 1_000_000;

struct RecordClock(Determinism);

impl HostWallClock for RecordClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn now(&self) -> Duration {
        let ms = lock(&self.0.current).timestamp_ms;
        // At most what u64 nanoseconds hold (year 2554): WASI 0.1's clock,
        // which C and Go runtimes read through the adapter, is u64 ns; past
        // it C read a wrapped time and Go aborted.
        Duration::from_millis(u64::try_from(ms).unwrap_or(0).min(MAX_CLOCK_MS))
    }
}

impl HostMonotonicClock for RecordClock {
    fn resolution(&self) -> u64 {
        1_000
    }
    fn now(&self) -> u64 {
        let mut c = lock(&self.0.current);
        c.monotonic_ns += 1_000;
        c.monotonic_ns
    }
}

struct RecordRandom(Determinism);

impl TryRng for RecordRandom {
    type Error = std::convert::Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(self.0.with_rng(rand::Rng::next_u32))
    }
    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(self.0.with_rng(rand::Rng::next_u64))
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        self.0.with_rng(|r| rand::Rng::fill_bytes(r, dst));
        Ok(())
    }
}

/// Builds the WASI context for one instance.
pub fn build_ctx(determinism: &Determinism, log: &GuestLog) -> WasiCtx {
    let mut b = WasiCtxBuilder::new();
    b.stdout(LogPipe {
        log: log.clone(),
        source: LogSource::Stdout,
    })
    .stderr(LogPipe {
        log: log.clone(),
        source: LogSource::Stderr,
    })
    .wall_clock(RecordClock(determinism.clone()))
    .monotonic_clock(RecordClock(determinism.clone()))
    .secure_random(RecordRandom(determinism.clone()))
    .insecure_random(RecordRandom(determinism.clone()))
    // A constant: some runtimes seed their hash tables from it, and a
    // retried batch must iterate them in the same order.
    .insecure_random_seed(0x6f6e_6365_666c_6f77)
    .max_random_size(1 << 20)
    .allow_tcp(false)
    .allow_udp(false)
    .allow_ip_name_lookup(false)
    .socket_addr_check(|_, _| Box::pin(async { false }));
    b.build()
}

/// stdout or stderr of a guest: complete lines go to the guest log.
struct LogPipe {
    log: GuestLog,
    source: LogSource,
}

impl IsTerminal for LogPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogPipe {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(LogWriter {
            log: self.log.clone(),
            source: self.source,
        })
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(LogWriter {
            log: self.log.clone(),
            source: self.source,
        })
    }
}

struct LogWriter {
    log: GuestLog,
    source: LogSource,
}

/// Most bytes accepted per write; a guest writing more is told to write
/// again, as a pipe would.
const WRITE_BUDGET: usize = 64 * 1024;

#[async_trait::async_trait]
impl Pollable for LogWriter {
    async fn ready(&mut self) {}
}

impl OutputStream for LogWriter {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.log.write_stream(self.source, &bytes);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }
    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(WRITE_BUDGET)
    }
}

impl tokio::io::AsyncWrite for LogWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.log.write_stream(self.source, buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_stable_and_distinct() {
        // Pinned: a change here changes what every deployed processor's
        // randomness computes.
        assert_eq!(record_seed("payments", 0, 0), record_seed("payments", 0, 0));
        assert_ne!(record_seed("payments", 0, 0), record_seed("payments", 0, 1));
        assert_ne!(record_seed("payments", 0, 0), record_seed("payments", 1, 0));
        assert_ne!(record_seed("payments", 0, 0), record_seed("audit", 0, 0));
    }

    #[test]
    fn random_restarts_per_record() {
        let d = Determinism::default();
        let mut rng = RecordRandom(d.clone());
        d.set_record(record_seed("t", 1, 7), 1000);
        let a = rng.try_next_u64().unwrap();
        let a2 = rng.try_next_u64().unwrap();
        d.set_record(record_seed("t", 1, 8), 1000);
        let b = rng.try_next_u64().unwrap();
        d.set_record(record_seed("t", 1, 7), 1000);
        assert_eq!(rng.try_next_u64().unwrap(), a);
        assert_eq!(rng.try_next_u64().unwrap(), a2);
        assert_ne!(a, b);
        assert_eq!(
            RecordClock(d.clone()).now_wall(),
            Duration::from_millis(1000)
        );
        // Past year 2554 the clock stops at what u64 nanoseconds hold (a
        // C guest read a wrapped time, a Go guest aborted); before the
        // epoch it reads 0.
        d.set_record(0, i64::MAX);
        let end = RecordClock(d.clone()).now_wall();
        assert_eq!(end, Duration::from_millis(MAX_CLOCK_MS));
        assert!(u64::try_from(end.as_nanos()).is_ok());
        d.set_record(0, -5);
        assert_eq!(RecordClock(d).now_wall(), Duration::ZERO);
    }

    impl RecordClock {
        fn now_wall(&self) -> Duration {
            HostWallClock::now(self)
        }
    }
}
