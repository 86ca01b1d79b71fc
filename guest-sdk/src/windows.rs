//! Time: window stores, window helpers (time windows, sessions) and
//! stream-time punctuation.
//!
//! Time in a processor is stream time, never the wall clock: the largest
//! record timestamp its task has seen ([`Context::stream_time`]). Windows
//! close, expire and are punctuated by it, so a retried batch computes the
//! same result.
//!
//! A count per key in tumbling one-minute windows with a ten-second grace,
//! emitted once per window when it closes (Kafka Streams'
//! `suppress(untilWindowCloses)`):
//!
//! ```
//! use std::time::Duration;
//! use onceflow_sdk::{Context, Error, Processor, Record, TimeWindows};
//!
//! const WINDOWS: TimeWindows =
//!     TimeWindows::tumbling(Duration::from_secs(60), Duration::from_secs(10));
//!
//! struct Views;
//!
//! impl Processor for Views {
//!     fn init(_: &onceflow_sdk::Config) -> Result<(), Error> {
//!         // Punctuate on every point where a window closes.
//!         onceflow_sdk::schedule_punctuation(WINDOWS.punctuation_interval())
//!     }
//!
//!     fn process(ctx: &mut Context, record: &Record) -> Result<(), Error> {
//!         let page = record.key_str()?;
//!         let store = ctx.window_store("views");
//!         let open = WINDOWS.open_windows(record.timestamp, ctx.stream_time());
//!         if open.is_empty() {
//!             ctx.report_late(format!("view of {page} at {} after its window closed", record.timestamp));
//!             return Ok(());
//!         }
//!         for start in open {
//!             let count = store.get_i64(page, start)?.unwrap_or(0);
//!             store.put_i64(page, start, count + 1)?;
//!         }
//!         Ok(())
//!     }
//!
//!     fn punctuate(ctx: &mut Context, stream_time: i64) -> Result<(), Error> {
//!         let store = ctx.window_store("views");
//!         WINDOWS.take_closed(&store, stream_time, |window| {
//!             let count = String::from_utf8_lossy(&window.value).into_owned();
//!             ctx.emit("counts", &window.key, count)
//!         })?;
//!         Ok(())
//!     }
//! }
//! # let _ = Views::punctuate;
//! ```

use std::fmt;
use std::time::Duration;

use crate::bindings::onceflow::processor::types::{WindowEntry, WindowKey};
use crate::error::{Error, ErrorKind};
use crate::host::Host;

/// How many windows [`WindowStore::fetch_all`] asks the host for at a time.
pub const DEFAULT_WINDOW_PAGE: u32 = 256;

/// Asks the host to call [`crate::Processor::punctuate`] whenever the task's
/// stream time reaches a multiple of `every` (and once at the task's first
/// record), right after the record that carried it there. Call it from
/// [`crate::Processor::init`]; anywhere else it fails. A zero duration
/// cancels.
pub fn schedule_punctuation(every: Duration) -> Result<(), Error> {
    let ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
    #[cfg(target_arch = "wasm32")]
    {
        crate::bindings::onceflow::processor::context::schedule_punctuation(ms).map_err(Error::new)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        crate::testing::scheduled(ms);
        Ok(())
    }
}

/// A window of a [`WindowStore`]: a key, the window's start (ms since the
/// Unix epoch) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The key.
    pub key: Vec<u8>,
    /// The window's start, ms.
    pub start: i64,
    /// The value.
    pub value: Vec<u8>,
}

impl From<WindowEntry> for Window {
    fn from(e: WindowEntry) -> Self {
        Self {
            key: e.key,
            start: e.start,
            value: e.value,
        }
    }
}

/// A window store: a value per key and window start, declared under
/// `[window-stores.NAME]` in `onceflow.toml` (with its `retention-ms`).
///
/// A window whose start is at or before `stream time - retention` has
/// expired: reads no longer see it and writes to it are ignored. Like a
/// [`crate::Store`], each task has its own partition of the store, its
/// writes commit with the outputs, and a changelog restores it.
#[derive(Clone, Copy)]
pub struct WindowStore<'s> {
    host: &'s dyn Host,
    name: &'s str,
}

impl<'s> WindowStore<'s> {
    pub(crate) fn new(host: &'s dyn Host, name: &'s str) -> Self {
        Self { host, name }
    }

    /// The store's name.
    pub fn name(&self) -> &'s str {
        self.name
    }

    /// The value of the window of `key` starting at `start`.
    pub fn get(&self, key: impl AsRef<[u8]>, start: i64) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.host.window_get(self.name, key.as_ref(), start)?)
    }

    /// The value of a window as an integer in decimal text (see
    /// [`WindowStore::put_i64`]).
    pub fn get_i64(&self, key: impl AsRef<[u8]>, start: i64) -> Result<Option<i64>, Error> {
        let Some(bytes) = self.get(key.as_ref(), start)? else {
            return Ok(None);
        };
        std::str::from_utf8(&bytes)
            .ok()
            .and_then(|text| text.parse().ok())
            .map(Some)
            .ok_or_else(|| {
                Error::with_kind(
                    ErrorKind::InvalidData,
                    format!(
                        "window store \"{}\": the window of key \"{}\" at {start} is not an integer",
                        self.name,
                        key.as_ref().escape_ascii()
                    ),
                )
            })
    }

    /// Sets the value of the window of `key` starting at `start`.
    pub fn put(
        &self,
        key: impl AsRef<[u8]>,
        start: i64,
        value: impl AsRef<[u8]>,
    ) -> Result<(), Error> {
        Ok(self
            .host
            .window_put(self.name, key.as_ref(), start, value.as_ref())?)
    }

    /// Sets a window's value to `value` in decimal text, so that other
    /// languages' SDKs read the same bytes.
    pub fn put_i64(&self, key: impl AsRef<[u8]>, start: i64, value: i64) -> Result<(), Error> {
        self.put(key, start, value.to_string())
    }

    /// Removes the window of `key` starting at `start`.
    pub fn delete(&self, key: impl AsRef<[u8]>, start: i64) -> Result<(), Error> {
        Ok(self.host.window_delete(self.name, key.as_ref(), start)?)
    }

    /// The windows of `key` whose start is in `[earliest, latest]`, by
    /// start.
    pub fn fetch(
        &self,
        key: impl AsRef<[u8]>,
        earliest: i64,
        latest: i64,
    ) -> Result<Vec<Window>, Error> {
        let windows = self
            .host
            .window_fetch(self.name, key.as_ref(), earliest, latest)?;
        Ok(windows.into_iter().map(Window::from).collect())
    }

    /// The windows of every key whose start is in `[earliest, latest]`, in
    /// (key, start) order, fetched from the host a page at a time.
    pub fn fetch_all(&self, earliest: i64, latest: i64) -> WindowScan<'s> {
        WindowScan {
            store: *self,
            earliest,
            latest,
            after: None,
            page: Vec::new().into_iter(),
            done: false,
        }
    }
}

impl fmt::Debug for WindowStore<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowStore")
            .field("name", &self.name)
            .finish()
    }
}

/// An iterator over [`WindowStore::fetch_all`]'s windows.
pub struct WindowScan<'s> {
    store: WindowStore<'s>,
    earliest: i64,
    latest: i64,
    after: Option<WindowKey>,
    page: std::vec::IntoIter<WindowEntry>,
    done: bool,
}

impl Iterator for WindowScan<'_> {
    type Item = Result<Window, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(entry) = self.page.next() {
                return Some(Ok(entry.into()));
            }
            if self.done {
                return None;
            }
            let WindowStore { host, name } = self.store;
            let page = match host.window_fetch_all(
                name,
                self.earliest,
                self.latest,
                self.after.as_ref(),
                DEFAULT_WINDOW_PAGE,
            ) {
                Ok(page) => page,
                Err(error) => {
                    self.done = true;
                    return Some(Err(error.into()));
                }
            };
            self.done = page.len() < DEFAULT_WINDOW_PAGE as usize;
            self.after = page.last().map(|w| WindowKey {
                key: w.key.clone(),
                start: w.start,
            });
            self.page = page.into_iter();
        }
    }
}

impl fmt::Debug for WindowScan<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowScan")
            .field("store", &self.store.name)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// Fixed-size windows aligned to the epoch: tumbling (advance = size) or
/// hopping (advance < size), with a grace period, as Kafka Streams'
/// `TimeWindows`. A window `[start, start + size)` is open until stream
/// time reaches `start + size + grace`; a record all of whose windows have
/// closed is late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWindows {
    size_ms: i64,
    advance_ms: i64,
    grace_ms: i64,
}

/// A duration in ms, saturating.
const fn ms(d: Duration) -> i64 {
    let ms = d.as_millis();
    if ms > i64::MAX as u128 {
        i64::MAX
    } else {
        ms as i64
    }
}

/// A window length in ms: at least 1.
const fn length(d: Duration) -> i64 {
    let ms = ms(d);
    if ms == 0 { 1 } else { ms }
}

impl TimeWindows {
    /// Windows of `size` one after the other, records later than `grace`
    /// after a window's end being late (a zero size counts as 1 ms).
    pub const fn tumbling(size: Duration, grace: Duration) -> Self {
        Self {
            size_ms: length(size),
            advance_ms: length(size),
            grace_ms: ms(grace),
        }
    }

    /// Windows of `size` starting every `advance` (at most `size`), so a
    /// record falls in `size / advance` of them.
    pub const fn hopping(size: Duration, advance: Duration, grace: Duration) -> Self {
        let advance_ms = if length(advance) < length(size) {
            length(advance)
        } else {
            length(size)
        };
        Self {
            size_ms: length(size),
            advance_ms,
            grace_ms: ms(grace),
        }
    }

    /// The window size, ms.
    pub const fn size_ms(&self) -> i64 {
        self.size_ms
    }

    /// The grace period, ms.
    pub const fn grace_ms(&self) -> i64 {
        self.grace_ms
    }

    /// The end (exclusive) of the window starting at `start`.
    pub const fn end(&self, start: i64) -> i64 {
        start.saturating_add(self.size_ms)
    }

    /// The starts of the windows that contain `timestamp`, ascending
    /// (Kafka Streams' `windowsFor`: no window starts before the epoch).
    pub fn windows_for(&self, timestamp: i64) -> Vec<i64> {
        let first = timestamp
            .saturating_sub(self.size_ms)
            .saturating_add(self.advance_ms)
            .max(0);
        let mut start = first - first % self.advance_ms;
        let mut starts = Vec::new();
        while start <= timestamp {
            starts.push(start);
            // The last window before i64::MAX: no next one.
            let Some(next) = start.checked_add(self.advance_ms) else {
                break;
            };
            start = next;
        }
        starts
    }

    /// Whether the window starting at `start` has closed at `stream_time`.
    pub const fn is_closed(&self, start: i64, stream_time: i64) -> bool {
        self.end(start).saturating_add(self.grace_ms) <= stream_time
    }

    /// The windows containing `timestamp` that are still open at
    /// `stream_time` (all of them before the first record): empty means the
    /// record is late.
    pub fn open_windows(&self, timestamp: i64, stream_time: Option<i64>) -> Vec<i64> {
        let mut starts = self.windows_for(timestamp);
        if let Some(now) = stream_time {
            starts.retain(|&start| !self.is_closed(start, now));
        }
        starts
    }

    /// The stream-time punctuation interval that falls on every point where
    /// one of these windows closes (`end + grace` of each), so that
    /// [`TimeWindows::take_closed`] in `punctuate` emits each window at the
    /// record that closes it, as Kafka Streams' `suppress` does.
    pub fn punctuation_interval(&self) -> Duration {
        let offset = (self.size_ms + self.grace_ms).rem_euclid(self.advance_ms);
        let every = gcd(self.advance_ms, offset).max(1);
        Duration::from_millis(every as u64)
    }

    /// Every window of `store` closed at `stream_time`: calls `each` on it,
    /// then deletes it (emit final). Returns how many there were.
    pub fn take_closed(
        &self,
        store: &WindowStore<'_>,
        stream_time: i64,
        mut each: impl FnMut(&Window) -> Result<(), Error>,
    ) -> Result<u64, Error> {
        let latest = stream_time
            .saturating_sub(self.grace_ms)
            .saturating_sub(self.size_ms);
        let closed: Vec<Window> = store
            .fetch_all(i64::MIN, latest)
            .collect::<Result<_, _>>()?;
        for window in &closed {
            each(window)?;
            store.delete(&window.key, window.start)?;
        }
        Ok(closed.len() as u64)
    }
}

/// Session windows, as Kafka Streams' `SessionWindows`: a key's records
/// closer than `gap` to each other form one session `[start, end]` (the
/// first and last record's times), and a record bridging two sessions
/// merges them.
///
/// - **Late** (Kafka Streams' rule): a record whose session, merged with
///   the sessions it touches, ends before `stream time - gap - grace`
///   ([`SessionWindows::is_late`]).
/// - **Closed** (emit final): a session ending at `end` is emitted once
///   stream time passes `end + 2 * gap + grace`
///   ([`SessionWindows::is_closed`]). Until then a record the lateness
///   rule accepts can still change it: one at `end + gap` touches it, and
///   is accepted up to stream time `end + 2 * gap + grace`. (Kafka
///   Streams' `suppress(untilWindowCloses)` emits at `end + gap + grace`,
///   and emits the session again if such a record makes it grow:
///   docs/time.md.)
///
/// Sessions live in a [`WindowStore`] under their start; the value is the
/// session's end (8 bytes, big-endian) followed by the aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionWindows {
    gap_ms: i64,
    grace_ms: i64,
}

/// A session of a [`SessionWindows`] store: key, first and last record
/// times, aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The key.
    pub key: Vec<u8>,
    /// The first record's time, ms.
    pub start: i64,
    /// The last record's time, ms.
    pub end: i64,
    /// The aggregate.
    pub value: Vec<u8>,
}

impl Session {
    fn decode(window: Window) -> Option<Session> {
        let (end, value) = window.value.split_at_checked(8)?;
        Some(Session {
            end: i64::from_be_bytes(end.try_into().ok()?),
            value: value.to_vec(),
            key: window.key,
            start: window.start,
        })
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = self.end.to_be_bytes().to_vec();
        out.extend_from_slice(&self.value);
        out
    }
}

impl SessionWindows {
    /// Sessions split by `gap` of inactivity, with `grace` for records out
    /// of order.
    pub const fn with_gap(gap: Duration, grace: Duration) -> Self {
        Self {
            gap_ms: ms(gap),
            grace_ms: ms(grace),
        }
    }

    /// Whether a record is late at `stream_time` when its session (merged
    /// with the sessions it touches) ends at `end`: `end < stream_time -
    /// gap - grace`, Kafka Streams' rule.
    pub const fn is_late(&self, end: i64, stream_time: i64) -> bool {
        end.saturating_add(self.gap_ms)
            .saturating_add(self.grace_ms)
            < stream_time
    }

    /// Whether a session ending at `end` is closed at `stream_time`: no
    /// record that [`SessionWindows::is_late`] accepts can touch it any
    /// more, `stream_time > end + 2 * gap + grace`.
    pub const fn is_closed(&self, end: i64, stream_time: i64) -> bool {
        end.saturating_add(self.gap_ms)
            .saturating_add(self.gap_ms)
            .saturating_add(self.grace_ms)
            < stream_time
    }

    /// Adds a record of `key` at `timestamp` to `store`: merges the
    /// sessions it touches into one (their aggregates folded with `merge`,
    /// oldest first) and adds the record with `add` (`None`: a new session).
    /// Returns the session, or `None` when the record is late (report it
    /// with [`Context::report_late`](crate::Context::report_late)).
    pub fn record(
        &self,
        store: &WindowStore<'_>,
        key: impl AsRef<[u8]>,
        timestamp: i64,
        stream_time: Option<i64>,
        mut merge: impl FnMut(&[u8], &[u8]) -> Vec<u8>,
        add: impl FnOnce(Option<&[u8]>) -> Vec<u8>,
    ) -> Result<Option<Session>, Error> {
        let key = key.as_ref();
        let touching: Vec<Session> = store
            .fetch(key, i64::MIN, timestamp.saturating_add(self.gap_ms))?
            .into_iter()
            .filter_map(Session::decode)
            .filter(|s| s.end.saturating_add(self.gap_ms) >= timestamp)
            .collect();
        let start = touching
            .iter()
            .map(|s| s.start)
            .min()
            .unwrap_or(timestamp)
            .min(timestamp);
        let end = touching
            .iter()
            .map(|s| s.end)
            .max()
            .unwrap_or(timestamp)
            .max(timestamp);
        if stream_time.is_some_and(|now| self.is_late(end, now)) {
            return Ok(None);
        }
        let mut folded: Option<Vec<u8>> = None;
        for s in &touching {
            folded = Some(match folded {
                None => s.value.clone(),
                Some(acc) => merge(&acc, &s.value),
            });
            store.delete(key, s.start)?;
        }
        let session = Session {
            key: key.to_vec(),
            start,
            end,
            value: add(folded.as_deref()),
        };
        store.put(key, start, session.encode())?;
        Ok(Some(session))
    }

    /// Every session of `store` closed at `stream_time`: calls `each` on it,
    /// then deletes it (emit final). Returns how many there were.
    pub fn take_closed(
        &self,
        store: &WindowStore<'_>,
        stream_time: i64,
        mut each: impl FnMut(&Session) -> Result<(), Error>,
    ) -> Result<u64, Error> {
        // A closed session started at or before its end, which is before
        // stream time - 2 * gap - grace.
        let latest = stream_time
            .saturating_sub(self.grace_ms)
            .saturating_sub(self.gap_ms)
            .saturating_sub(self.gap_ms);
        let closed: Vec<Session> = store
            .fetch_all(i64::MIN, latest)
            .filter_map(|w| w.map(Session::decode).transpose())
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .filter(|s| self.is_closed(s.end, stream_time))
            .collect();
        for session in &closed {
            each(session)?;
            store.delete(&session.key, session.start)?;
        }
        Ok(closed.len() as u64)
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);
    const TEN_S: Duration = Duration::from_secs(10);

    #[test]
    fn tumbling_windows_hold_one_window_per_timestamp() {
        let w = TimeWindows::tumbling(MIN, TEN_S);
        assert_eq!(w.windows_for(0), [0]);
        assert_eq!(w.windows_for(59_999), [0]);
        assert_eq!(w.windows_for(60_000), [60_000]);
        assert!(!w.is_closed(0, 69_999));
        assert!(w.is_closed(0, 70_000));
        assert_eq!(w.open_windows(5_000, Some(75_000)), Vec::<i64>::new());
        assert_eq!(w.open_windows(5_000, None), [0]);
        assert_eq!(w.punctuation_interval(), TEN_S);
        // The last windows before the end of time, and before the epoch.
        assert_eq!(w.windows_for(i64::MAX), [i64::MAX - i64::MAX % 60_000]);
        assert_eq!(w.windows_for(i64::MIN), Vec::<i64>::new());
    }

    #[test]
    fn sessions_merge_across_a_bridging_record_and_close_after_the_gap() {
        use crate::testing::TestHost;
        let host = TestHost::new();
        let store = WindowStore::new(&host, "sessions");
        let sessions = SessionWindows::with_gap(Duration::from_secs(5), Duration::from_secs(10));
        let count = |old: Option<&[u8]>| {
            let n: u64 = old.map_or(0, |v| std::str::from_utf8(v).unwrap().parse().unwrap());
            (n + 1).to_string().into_bytes()
        };
        let sum = |a: &[u8], b: &[u8]| {
            let n = |v: &[u8]| std::str::from_utf8(v).unwrap().parse::<u64>().unwrap();
            (n(a) + n(b)).to_string().into_bytes()
        };
        for at in [0, 3_000, 20_000, 22_000] {
            sessions
                .record(&store, "u", at, Some(at), sum, count)
                .unwrap();
        }
        // 10 s bridges [0, 3 s] and [20 s, 22 s]? No: 7 s and 10 s gaps.
        let s = sessions
            .record(&store, "u", 10_000, Some(22_000), sum, count)
            .unwrap()
            .unwrap();
        assert_eq!(
            (s.start, s.end, s.value.as_slice()),
            (10_000, 10_000, &b"1"[..])
        );
        // 15 s touches [10 s] and [20 s, 22 s]: one session of 4 records.
        let s = sessions
            .record(&store, "u", 15_000, Some(22_000), sum, count)
            .unwrap()
            .unwrap();
        assert_eq!(
            (s.start, s.end, s.value.as_slice()),
            (10_000, 22_000, &b"4"[..])
        );
        // A record whose session would end before stream time - gap -
        // grace is late: at 1 s in [0, 3 s], at stream time 30 s.
        assert!(
            sessions
                .record(&store, "u", 1_000, Some(30_000), sum, count)
                .unwrap()
                .is_none()
        );
        let mut emitted = Vec::new();
        let mut take = |at: i64| {
            sessions
                .take_closed(&store, at, |s| {
                    emitted.push((s.start, s.end, s.value.clone()));
                    Ok(())
                })
                .unwrap()
        };
        // [0, 3 s] can change until 3 + 2 * 5 + 10 = 23 s; [10 s, 22 s]
        // until 42 s.
        assert_eq!(take(23_000), 0);
        assert_eq!(take(23_001), 1);
        assert_eq!(take(42_000), 0);
        assert_eq!(take(42_001), 1);
        assert_eq!(
            emitted,
            [(0, 3_000, b"2".to_vec()), (10_000, 22_000, b"4".to_vec())]
        );
        assert!(host.windows("sessions").is_empty());
    }

    #[test]
    fn a_session_is_emitted_only_when_no_accepted_record_can_change_it() {
        use crate::testing::TestHost;
        let host = TestHost::new();
        let store = WindowStore::new(&host, "sessions");
        // Gap 30 s, grace 5 s: issue 44's example, key `café-Ω`.
        let sessions = SessionWindows::with_gap(Duration::from_secs(30), Duration::from_secs(5));
        let count = |old: Option<&[u8]>| vec![old.map_or(0, |v| v[0]) + 1];
        let sum = |a: &[u8], b: &[u8]| vec![a[0] + b[0]];
        let mut emitted = Vec::new();
        let at = |t: i64, now: i64, emitted: &mut Vec<(i64, i64, u8)>| {
            let s = sessions
                .record(&store, "café-Ω", t, Some(now), sum, count)
                .unwrap()
                .map(|s| (s.start, s.end, s.value[0]));
            sessions
                .take_closed(&store, now, |s| {
                    emitted.push((s.start, s.end, s.value[0]));
                    Ok(())
                })
                .unwrap();
            s
        };
        assert_eq!(
            at(696_459, 696_459, &mut emitted),
            Some((696_459, 696_459, 1))
        );
        assert_eq!(
            at(722_000, 722_000, &mut emitted),
            Some((696_459, 722_000, 2))
        );
        // A record inside it is late at stream time 764.999 s (its merged
        // session ends at 722 s, before 764.999 - 35 s).
        assert_eq!(at(700_000, 764_999, &mut emitted), None);
        // That is past end + gap + grace (757 s), where Kafka Streams
        // emits the session; not closed here: a record at 730 s is still
        // accepted and touches it.
        assert!(emitted.is_empty());
        assert_eq!(
            at(730_000, 764_999, &mut emitted),
            Some((696_459, 730_000, 3))
        );
        // Exactly gap + grace behind stream time is on time (late only
        // when strictly before: Kafka Streams' rule); 1 ms more is late.
        assert_eq!(
            at(730_000, 765_000, &mut emitted),
            Some((696_459, 730_000, 4))
        );
        assert_eq!(at(730_000, 765_001, &mut emitted), None);
        // At 730 + 2 * 30 + 5 = 795 s a record at 760 s still touches it
        // and is accepted: the session grows.
        assert_eq!(
            at(760_000, 795_000, &mut emitted),
            Some((696_459, 760_000, 5))
        );
        assert!(emitted.is_empty(), "{emitted:?}");
        // Closed once stream time passes 760 + 65 = 825 s, emitted once.
        at(825_000, 825_000, &mut emitted);
        assert!(emitted.is_empty(), "{emitted:?}");
        at(825_001, 825_001, &mut emitted);
        assert_eq!(emitted, [(696_459, 760_000, 5)]);
    }

    #[test]
    fn time_windows_at_their_exact_boundaries_follow_kafka_streams() {
        // Kafka Streams' rule (KStreamWindowAggregate, suppress): a window
        // is closed when end + grace <= stream time.
        let w = TimeWindows::hopping(MIN, Duration::from_secs(20), TEN_S);
        // A window whose end equals stream time is open (its grace runs).
        assert_eq!(w.open_windows(59_999, Some(60_000)), [0, 20_000, 40_000]);
        // Stream time exactly at end + grace: [0, 60 s) closed; the record
        // at 59.999 s is then only in the windows starting at 20 s and 40 s.
        assert_eq!(w.open_windows(59_999, Some(70_000)), [20_000, 40_000]);
        assert_eq!(w.open_windows(59_999, Some(69_999)), [0, 20_000, 40_000]);
        // A record exactly at a window's end is not in it.
        assert_eq!(w.windows_for(60_000), [20_000, 40_000, 60_000]);
        // Late in every window: stream time at the last one's end + grace.
        assert!(w.open_windows(59_999, Some(110_000)).is_empty());
        // The punctuation falls on each closing point: 70 s, 90 s, 110 s.
        assert_eq!(w.punctuation_interval(), Duration::from_secs(10));
        let tumbling = TimeWindows::tumbling(MIN, TEN_S);
        assert_eq!(tumbling.open_windows(59_999, Some(69_999)), [0]);
        assert!(tumbling.open_windows(59_999, Some(70_000)).is_empty());
    }

    #[test]
    fn hopping_windows_overlap_as_kafka_streams_windows_for() {
        let w = TimeWindows::hopping(MIN, Duration::from_secs(20), Duration::ZERO);
        assert_eq!(w.windows_for(65_000), [20_000, 40_000, 60_000]);
        assert_eq!(w.windows_for(5_000), [0]);
        // Zero grace: a window closes at its end.
        assert!(w.is_closed(0, 60_000));
        assert!(!w.is_closed(0, 59_999));
        assert_eq!(w.punctuation_interval(), Duration::from_secs(20));
    }
}
