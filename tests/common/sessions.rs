//! The session test guests' workload (`tests/guests/sessions*`: clicks
//! counted per user and session, gap 5 s, grace 10 s) and an independent
//! model of what they must emit by docs/time.md's rules. Shared by the
//! offline languages test and the broker's Kafka Streams twin.

use std::collections::{BTreeMap, BTreeSet};

/// The session guests' gap, ms.
pub const GAP: i64 = 5_000;
/// The session guests' grace, ms.
pub const GRACE: i64 = 10_000;

/// Where the offline test's clicks begin.
pub const BASE: i64 = 1_700_000_000_000;

/// When the boundary clicks of user `edge` begin (see [`clicks`]), for
/// clicks from `base`.
pub const fn edge_at(base: i64) -> i64 {
    base + 40_000
}

/// Clicks `(user, time)`: first the Rust SDK unit test's story (two
/// sessions, a record that merges two, a late one), then `n` clicks of 15
/// users (some names need JSON escaping) mostly moving forward, some out of
/// order (bridging sessions, or late), some after long pauses.
pub fn clicks(n: usize, seed: u64, base: i64) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = [0, 3_000, 20_000, 22_000, 10_000, 15_000]
        .into_iter()
        .map(|at| ("u".to_owned(), base + at))
        .collect();
    out.push(("v".to_owned(), base + 30_000));
    // [0, 3 s] ends before 30 s - gap - grace: a click at 1 s is late.
    out.push(("u".to_owned(), base + 1_000));
    // The boundaries (gap 5 s, grace 10 s: late when the merged session ends
    // before stream time - 15 s, closed once stream time passes end + 20
    // s), on a user alone at the front of its partition's time:
    let t = edge_at(base);
    for at in [
        0,      // [0]
        20_000, // [0] not closed at exactly end + 20 s; a new [20 s]
        5_000,  // exactly gap + grace behind: on time, [0, 5 s] (2)
        20_001, // [20 s, 20.001 s]
        4_999,  // its session would end at 5 s, 1 ms too early: late
        25_000, // [0, 5 s] not closed at exactly end + 20 s; [20 s, 25 s]
        10_000, // touches [0, 5 s] and is on time: it grows to 10 s (3),
        //         where suppress(untilWindowCloses) had emitted it at 20 s
        30_001, // [0, 10 s] closed and emitted once; a new [30.001 s]
    ] {
        out.push(("edge".to_owned(), t + at));
    }
    let mut users: Vec<String> = (0..12).map(|i| format!("user-{i}")).collect();
    users.extend([
        "zo\u{eb}".to_owned(),
        "q\"uote".to_owned(),
        "\u{65e5}\u{672c}".to_owned(),
    ]);
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as i64
    };
    let mut now = t + 30_001;
    for _ in 0..n {
        let user = users[next() as usize % users.len()].clone();
        let at = match next() % 100 {
            0..=79 => {
                now += next() % 1_500;
                now
            }
            80..=94 => now - next() % 20_000,
            _ => {
                now += 5_000 + next() % 25_000;
                now
            }
        };
        out.push((user, at));
    }
    out
}

/// What the session guests must do with `clicks` over `partitions`
/// partitions, by docs/time.md's rules for a session count with gap 5 s and
/// grace 10 s: a click is late when its merged session ends before stream
/// time - gap - grace (Kafka Streams' rule), and a session is emitted once,
/// at the record that moves its partition's stream time past its end + 2 *
/// gap + grace (a partition's sessions in key and start order). The
/// `(key, value)` lines they emit, in order, how many clicks are late, and
/// the sessions left open at the end `(partition, key, start, end, count)`.
pub type SessionsModel = (
    Vec<(String, String)>,
    usize,
    BTreeSet<(i32, String, i64, i64, u64)>,
);

/// A partition's open sessions: (key, start) -> (end, count).
pub type OpenSessions = BTreeMap<(Vec<u8>, i64), (i64, u64)>;

pub fn sessions_model(clicks: &[(String, i64)], partitions: i32) -> SessionsModel {
    let mut time: BTreeMap<i32, i64> = BTreeMap::new();
    let mut open: BTreeMap<i32, OpenSessions> = BTreeMap::new();
    let mut emitted = Vec::new();
    let mut late = 0;
    for (user, at) in clicks {
        let key = user.as_bytes().to_vec();
        let p = onceflow::offline::kafka_partition(&key, partitions);
        let before = time.get(&p).copied();
        let now = before.map_or(*at, |t| t.max(*at));
        time.insert(p, now);
        let sessions = open.entry(p).or_default();
        // The sessions within the gap of this click: merged with it.
        let touching: Vec<(i64, i64, u64)> = sessions
            .iter()
            .filter(|((k, start), (end, _))| *k == key && *start <= at + GAP && end + GAP >= *at)
            .map(|((_, start), (end, count))| (*start, *end, *count))
            .collect();
        let start = touching.iter().map(|s| s.0).fold(*at, i64::min);
        let end = touching.iter().map(|s| s.1).fold(*at, i64::max);
        if end < now - GAP - GRACE {
            late += 1;
        } else {
            for (s, _, _) in &touching {
                sessions.remove(&(key.clone(), *s));
            }
            let count = touching.iter().map(|s| s.2).sum::<u64>() + 1;
            sessions.insert((key, start), (end, count));
        }
        // Punctuation at every advance of stream time (and the first record).
        if before.is_none_or(|t| now > t) {
            let closed: OpenSessions = sessions
                .iter()
                .filter(|(_, (end, _))| now > end + 2 * GAP + GRACE)
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            for ((k, start), (end, count)) in closed {
                sessions.remove(&(k.clone(), start));
                let user = String::from_utf8(k).expect("UTF-8 users");
                emitted.push((user, format!("{start} {end} {count}")));
            }
        }
    }
    let left = open
        .into_iter()
        .flat_map(|(p, sessions)| {
            sessions.into_iter().map(move |((k, start), (end, count))| {
                (
                    p,
                    String::from_utf8(k).expect("UTF-8 users"),
                    start,
                    end,
                    count,
                )
            })
        })
        .collect();
    (emitted, late, left)
}
