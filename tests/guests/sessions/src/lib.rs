//! Test guest: clicks counted per user and session with the SDK's
//! `SessionWindows` (Kafka Streams' `SessionWindows.ofInactivityGapAndGrace
//! (5 s, 10 s)`), each session emitted once when it closes (emit final),
//! late clicks reported (and dropped by the manifest). Its ports to the
//! other SDKs (`tests/guests/sessions-{js,python,go,c}`) must print the same
//! bytes and leave the same store.
//!
//! Input: key = user, the record's timestamp = the click's time. Output
//! `sessions`: key = user, value = `<start> <end> <count>`.

use std::time::Duration;

use onceflow_sdk::{Config, Context, Error, Processor, Record, SessionWindows};

const SESSIONS: SessionWindows =
    SessionWindows::with_gap(Duration::from_secs(5), Duration::from_secs(10));

const STORE: &str = "sessions";

struct Sessions;

/// A count stored as decimal text (0 if it is not one).
fn count(bytes: &[u8]) -> u64 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
}

impl Processor for Sessions {
    fn init(_config: &Config) -> Result<(), Error> {
        // At every advance of stream time: each session is emitted at the
        // record that closes it.
        onceflow_sdk::schedule_punctuation(Duration::from_millis(1))
    }

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Error> {
        let user = record.key_str()?;
        let store = ctx.window_store(STORE);
        let session = SESSIONS.record(
            &store,
            user,
            record.timestamp,
            ctx.stream_time(),
            |a, b| (count(a) + count(b)).to_string().into_bytes(),
            |old| (old.map_or(0, count) + 1).to_string().into_bytes(),
        )?;
        if session.is_none() {
            ctx.report_late(format!(
                "click of {user} at {} after its session closed",
                record.timestamp
            ));
        }
        Ok(())
    }

    fn punctuate(ctx: &mut Context, stream_time: i64) -> Result<(), Error> {
        let store = ctx.window_store(STORE);
        SESSIONS.take_closed(&store, stream_time, |s| {
            let value = format!("{} {} {}", s.start, s.end, count(&s.value));
            ctx.emit("sessions", &s.key, value)
        })?;
        Ok(())
    }
}

onceflow_sdk::export_processor!(Sessions);
