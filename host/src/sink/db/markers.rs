//! A batch's own rows in the sink's tables: the markers of the records it
//! applies (inserted in identity order, so that two instances never
//! deadlock on them) and its dead letters.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use postgres::Transaction;

use super::{DeadLetter, Item, Statements};

pub(super) fn letter(item: &Item, reason: String, applied: Option<Vec<u8>>) -> DeadLetter {
    DeadLetter {
        topic: item.topic.clone(),
        partition: item.partition,
        offset: item.offset,
        key: item.key.clone(),
        value: item.value.clone(),
        reason,
        digest: item.digest.clone(),
        applied_digest: applied,
    }
}

pub(super) fn conflict(item: &Item, applied: &[u8]) -> DeadLetter {
    letter(
        item,
        format!(
            "identity {:?} was applied before with a different payload (digest {} then, {} now)",
            item.identity,
            hex::encode(applied),
            hex::encode(&item.digest)
        ),
        Some(applied.to_vec()),
    )
}

/// The identities of the records of `new` that ended as dead letters in
/// `apply_route`.
pub(super) fn refused_among<'a>(dead: &[DeadLetter], new: &[&'a Item]) -> Vec<&'a str> {
    let dead: HashSet<(&str, i32, i64)> = dead
        .iter()
        .map(|d| (d.topic.as_str(), d.partition, d.offset))
        .collect();
    new.iter()
        .filter(|i| dead.contains(&(i.topic.as_str(), i.partition, i.offset)))
        .map(|i| i.identity.as_str())
        .collect()
}

/// Inserts the markers of `items`; returns the digests of those already
/// marked (by an earlier transaction, of this instance or another).
///
/// In identity order: an insert locks each identity's index entry, and two
/// instances inserting the same identities (upstream duplicates on two
/// partitions) in different orders deadlocked; PostgreSQL broke the cycle
/// after its `deadlock_timeout` (1 s) by failing one batch, applied again
/// (issue 48: 2 in one run; `c_markers_in_a_fixed_order`,
/// tests/kafka/sink.rs). With `pause` (tests), one statement per marker.
pub(super) fn insert_markers(
    t: &mut Transaction<'_>,
    s: &Statements,
    sink: &str,
    items: &[&Item],
    pause: Duration,
) -> Result<HashMap<String, Vec<u8>>, postgres::Error> {
    if items.is_empty() {
        return Ok(HashMap::new());
    }
    let mut items = items.to_vec();
    items.sort_by(|a, b| a.identity.cmp(&b.identity));
    let statement = format!(
        "INSERT INTO {} (sink, identity, digest, topic, kafka_partition, kafka_offset)
         SELECT $1, i, d, t, k, o FROM unnest($2::text[], $3::bytea[], $4::text[], $5::int[], $6::bigint[])
           WITH ORDINALITY AS u(i, d, t, k, o, n) ORDER BY n
         ON CONFLICT (sink, identity) DO NOTHING RETURNING identity",
        s.markers
    );
    let chunk = if pause.is_zero() { items.len() } else { 1 };
    let mut inserted: HashSet<String> = HashSet::new();
    for part in items.chunks(chunk) {
        let ids: Vec<&str> = part.iter().map(|i| i.identity.as_str()).collect();
        let digests: Vec<&[u8]> = part.iter().map(|i| i.digest.as_slice()).collect();
        let topics: Vec<&str> = part.iter().map(|i| i.topic.as_str()).collect();
        let parts: Vec<i32> = part.iter().map(|i| i.partition).collect();
        let offsets: Vec<i64> = part.iter().map(|i| i.offset).collect();
        let rows = t.query(
            &statement,
            &[&sink, &ids, &digests, &topics, &parts, &offsets],
        )?;
        inserted.extend(rows.iter().map(|r| r.get::<_, String>(0)));
        if !pause.is_zero() {
            tracing::info!(
                identity = ids[0],
                ms = pause.as_millis() as u64,
                "fault window: after a marker"
            );
            std::thread::sleep(pause);
        }
    }
    let ids: Vec<&str> = items.iter().map(|i| i.identity.as_str()).collect();
    let present: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|i| !inserted.contains(*i))
        .collect();
    if present.is_empty() {
        return Ok(HashMap::new());
    }
    // A new statement: under READ COMMITTED it sees a marker that another
    // transaction committed while the insert waited for it.
    let rows = t.query(
        &format!(
            "SELECT identity, digest FROM {} WHERE sink = $1 AND identity = ANY($2)",
            s.markers
        ),
        &[&sink, &present],
    )?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

pub(super) fn insert_dead_letters(
    t: &mut Transaction<'_>,
    s: &Statements,
    sink: &str,
    dead: &[DeadLetter],
) -> Result<(), postgres::Error> {
    let stmt = t.prepare(&format!(
        "INSERT INTO {} (sink, topic, kafka_partition, kafka_offset, record_key, record_value, \
         reason, digest, applied_digest) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        s.dead_letters
    ))?;
    for d in dead {
        t.execute(
            &stmt,
            &[
                &sink,
                &d.topic,
                &d.partition,
                &d.offset,
                &d.key,
                &d.value,
                &d.reason,
                &d.digest,
                &d.applied_digest,
            ],
        )?;
    }
    Ok(())
}
