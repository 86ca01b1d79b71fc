//! Page views per page in tumbling one-minute windows with a ten-second
//! grace, emitted once per window when it closes: Kafka Streams'
//! `groupByKey().windowedBy(TimeWindows.ofSizeAndGrace(1 min, 10 s)).count()
//! .suppress(untilWindowCloses(unbounded()))`, in the sandbox.
//!
//! Input: key = the page (`/home`), the record's timestamp = when it was
//! viewed; the value is not read. Output `counts`: key = the page, value =
//! `{"page":"/home","start":1700000040000,"end":1700000100000,"count":3}`.
//! A view whose window had closed (stream time past its end + grace) is
//! reported late; the manifest dead-letters it.

use std::time::Duration;

use onceflow_sdk::{Config, Context, Error, Processor, Record, TimeWindows};

const WINDOWS: TimeWindows =
    TimeWindows::tumbling(Duration::from_secs(60), Duration::from_secs(10));

const STORE: &str = "views";

struct PageViews;

impl Processor for PageViews {
    fn init(_config: &Config) -> Result<(), Error> {
        // Every 10 s of stream time: each point where a window closes.
        onceflow_sdk::schedule_punctuation(WINDOWS.punctuation_interval())
    }

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Error> {
        let page = record.key_str()?;
        let views = ctx.window_store(STORE);
        let open = WINDOWS.open_windows(record.timestamp, ctx.stream_time());
        if open.is_empty() {
            ctx.report_late(format!(
                "view of {page} at {} arrived after its window closed (stream time {})",
                record.timestamp,
                ctx.stream_time().unwrap_or(record.timestamp)
            ));
            return Ok(());
        }
        for start in open {
            let count = views.get_i64(page, start)?.unwrap_or(0);
            views.put_i64(page, start, count + 1)?;
        }
        Ok(())
    }

    fn punctuate(ctx: &mut Context, stream_time: i64) -> Result<(), Error> {
        let views = ctx.window_store(STORE);
        WINDOWS.take_closed(&views, stream_time, |window| {
            let page = std::str::from_utf8(&window.key)
                .map_err(|_| Error::new("a stored page is not UTF-8"))?;
            let count = std::str::from_utf8(&window.value)
                .map_err(|_| Error::new("a stored count is not UTF-8"))?;
            let value = format!(
                "{{\"page\":{},\"start\":{},\"end\":{},\"count\":{count}}}",
                json_string(page),
                window.start,
                WINDOWS.end(window.start)
            );
            ctx.emit("counts", page, value)
        })?;
        Ok(())
    }
}

/// `text` as a JSON string, quoted and escaped.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

onceflow_sdk::export_processor!(PageViews);

#[cfg(test)]
mod tests {
    use super::*;
    use onceflow_sdk::testing::TestHost;

    fn view(page: &str, at_s: i64) -> Record {
        Record {
            key: Some(page.as_bytes().to_vec()),
            value: Some(b"{}".to_vec()),
            timestamp: at_s * 1000,
            ..Record::default()
        }
    }

    #[test]
    fn counts_each_window_once_when_it_closes() {
        let mut host = TestHost::new().with_output("counts");
        host.init::<PageViews>().unwrap();
        for (page, at) in [("/a", 0), ("/a", 10), ("/b", 30), ("/a", 59)] {
            host.process::<PageViews>(&view(page, at)).unwrap();
        }
        assert!(host.emitted().is_empty(), "the first window is still open");
        host.process::<PageViews>(&view("/c", 75)).unwrap();
        let values: Vec<String> = host
            .take_emitted()
            .iter()
            .map(|e| String::from_utf8(e.value.clone().unwrap()).unwrap())
            .collect();
        assert_eq!(
            values,
            [
                r#"{"page":"/a","start":0,"end":60000,"count":3}"#,
                r#"{"page":"/b","start":0,"end":60000,"count":1}"#,
            ]
        );
        host.process::<PageViews>(&view("/a", 5)).unwrap();
        assert_eq!(host.late_records().len(), 1, "the view at 5 s is late");
        assert!(host.windows("views").iter().all(|w| w.start == 60_000));
    }

    #[test]
    fn pages_are_json_escaped() {
        assert_eq!(json_string("/a\"b\\"), r#""/a\"b\\""#);
    }
}
