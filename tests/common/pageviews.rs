//! The pageviews example's workload and an independent model of what it
//! must emit: Kafka Streams' `windowedBy(TimeWindows.ofSizeAndGrace(60 s,
//! 10 s)).count().suppress(untilWindowCloses)`, computed per partition's
//! stream time. Shared by the offline and the broker tests.

use std::collections::{BTreeMap, BTreeSet};

/// Window size, ms.
pub const SIZE: i64 = 60_000;
/// Grace, ms.
pub const GRACE: i64 = 10_000;

/// `n` views of a few pages from `base` (a minute boundary), mostly moving
/// forward in time, some out of order within the grace, some late, with
/// jumps of several windows.
pub fn views(n: usize, seed: u64, base: i64) -> Vec<(String, i64)> {
    let mut state = seed;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let mut now = base;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let page = format!("/page-{}", next() % 7);
        let r = next() % 100;
        let at = match r {
            0..=79 => {
                now += (next() % 4_000) as i64;
                now
            }
            // Out of order: within the grace, or late.
            80..=94 => now - (next() % 15_000) as i64,
            95..=97 => now - 60_000 - (next() % 60_000) as i64,
            _ => {
                now += 150_000 + (next() % 200_000) as i64;
                now
            }
        };
        out.push((page, at));
    }
    out
}

/// Views of page `/edge` at the windows' exact boundaries, from `base` (a
/// minute boundary) on, for the front of a partition's time: a view at a
/// window's end (stream time there, the window still open: grace), one
/// 1 ms before it (on time), stream time at exactly end + grace (the window
/// closes and is emitted), and a view of it then (late: exactly end +
/// grace). Kafka Streams' rule for both: a window is closed when `end +
/// grace <= stream time`.
pub fn boundary_views(base: i64) -> Vec<(String, i64)> {
    [0, SIZE, SIZE - 1, SIZE + GRACE, SIZE - 1, SIZE + GRACE - 1]
        .into_iter()
        .map(|at| ("/edge".to_owned(), base + at))
        .collect()
}

/// The final count of each window closed by the end of its partition's
/// stream time `(page, start, count)`, and the late views `(page, at)`.
pub type Expected = (BTreeSet<(String, i64, u64)>, BTreeSet<(String, i64)>);

/// What the windowed count emits for `views` over `partitions` partitions
/// (Kafka's default partitioner on the page).
pub fn model(views: &[(String, i64)], partitions: i32) -> Expected {
    let mut time: BTreeMap<i32, i64> = BTreeMap::new();
    let mut counts: BTreeMap<(i32, String, i64), u64> = BTreeMap::new();
    let mut late = BTreeSet::new();
    for (page, at) in views {
        let p = onceflow::offline::kafka_partition(page.as_bytes(), partitions);
        let now = time.entry(p).or_insert(i64::MIN);
        *now = (*now).max(*at);
        let start = at - at.rem_euclid(SIZE);
        if start + SIZE + GRACE <= *now {
            late.insert((page.clone(), *at));
        } else {
            *counts.entry((p, page.clone(), start)).or_default() += 1;
        }
    }
    let closed = counts
        .into_iter()
        .filter(|((p, _, start), _)| start + SIZE + GRACE <= time[p])
        .map(|((_, page, start), count)| (page, start, count))
        .collect();
    (closed, late)
}

/// `(page, start, count)` of a `pageview-counts` value
/// (`{"page","start","end","count"}`), checking its end.
pub fn parse_count(value: &str) -> (String, i64, u64) {
    let v: serde_json::Value = serde_json::from_str(value).expect("a JSON count");
    let start = v["start"].as_i64().expect("start");
    assert_eq!(v["end"].as_i64(), Some(start + SIZE), "{value}");
    (
        v["page"].as_str().expect("page").to_owned(),
        start,
        v["count"].as_u64().expect("count"),
    )
}

/// The view time a late view's dead letter names (`... at <ms> ...`).
pub fn late_at(error: &str) -> i64 {
    assert!(error.starts_with("late record: "), "{error}");
    error
        .split(" at ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no time in {error:?}"))
}
