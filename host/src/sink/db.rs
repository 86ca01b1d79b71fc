//! The database side of the PostgreSQL sink: its own tables, the claim of a
//! partition (the owner epoch), and the one transaction per batch that
//! holds the effects, the markers, the dead letters and the positions.
//! The only owner of the `postgres` client.
//!
//! The batch transaction, top to bottom ([`Db::commit_batch`]):
//!
//! 1. lock the progress rows of the batch's partitions (`FOR UPDATE`) and
//!    check that each still carries this instance's owner epoch: a zombie
//!    (an instance expelled from the group that has not noticed) finds a
//!    higher epoch, written by the partition's new owner when it claimed
//!    it, and commits nothing;
//! 2. drop records below each partition's stored position: already applied
//!    (a retry after an ambiguous COMMIT, or a replay after a crash between
//!    this commit and the Kafka offset commit);
//! 3. insert a marker per record of a route with an identity field (the
//!    identity and a SHA-256 of its value); an identity already marked is a
//!    duplicate when the digests agree and a dead letter with both digests
//!    when they do not (a position identity needs no marker: step 2 is its
//!    check);
//! 4. apply the new records' effects, per route;
//! 5. record the dead letters (forwarded to Kafka after the commit);
//! 6. store each partition's next offset;
//! 7. COMMIT.
//!
//! A data error in step 4 (a value that does not fit a column, a unique
//! violation) rolls the transaction back and the batch is applied again
//! record by record under savepoints, the failing records going to the
//! dead letters.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use postgres::error::SqlState;
use postgres::{Client, NoTls, Statement};
use serde_json::Value;

use super::SinkError;
use super::config::{Apply, PostgresConfig, SinkConfig, quote};

mod forward;
mod markers;
use markers::{conflict, insert_dead_letters, insert_markers, letter, refused_among};
mod redact;
pub(crate) mod roles;
use roles::AsTenant;
mod routes;

pub(crate) use forward::{Unforwarded, UsageRow};
pub(crate) use redact::pg_message;
use routes::{apply_route, param_kind, route_sql};

/// Markers deleted per statement of [`Db::expire_markers`].
const EXPIRE_CHUNK: u64 = 10_000;

/// One record of a batch, parsed.
#[derive(Debug, Clone)]
pub(crate) struct Item {
    /// Index of its route in the configuration.
    pub route: usize,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Bytes of key, value and headers (billed as bytes in).
    pub bytes: u64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// The value as JSON (an object), or why it cannot be applied.
    pub json: Result<Option<serde_json::Map<String, Value>>, String>,
    /// The marker's identity (route-qualified).
    pub identity: String,
    /// Whether the record gets a marker: an identity field's value does.
    /// A position identity is the record's position, which step 2 already
    /// filters (the positions move in the same transaction): its marker
    /// would only be written and expired (issue 42, item 6).
    pub marked: bool,
    /// SHA-256 of the value (32 zero bytes for a tombstone).
    pub digest: Vec<u8>,
}

/// A record that cannot be applied, and why.
#[derive(Debug, Clone)]
pub(crate) struct DeadLetter {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub reason: String,
    pub digest: Vec<u8>,
    /// For a conflicting payload: the digest of what was applied.
    pub applied_digest: Option<Vec<u8>>,
}

/// What a committed batch did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Applied {
    /// Records whose effect was applied.
    pub applied: u64,
    /// Records below the stored position (already applied by an earlier
    /// transaction of this partition).
    pub behind: u64,
    /// Records whose identity was already marked with the same digest.
    pub duplicates: u64,
    /// Records recorded as dead letters.
    pub dead: u64,
    /// Whether the batch went record by record (a data error).
    pub slow: bool,
}

/// How a batch transaction failed.
#[derive(Debug)]
pub(crate) enum BatchError {
    /// These partitions have a newer owner: drop their records; the others
    /// may be committed again.
    Fenced(Vec<(String, i32)>),
    /// A statement or the connection failed: when [`is_transient`] says so
    /// (connection lost, restart, serialization failure), reconnect and
    /// retry the same batch; else stop.
    Database(postgres::Error),
    /// Anything else: stop.
    Fatal(SinkError),
}

/// A partition's claim: this instance's epoch, and where to read from.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    pub topic: String,
    pub partition: i32,
    pub epoch: i64,
    pub next_offset: Option<i64>,
}

/// A route's prepared statements.
struct Prepared {
    apply: Statement,
    /// Upsert: `DELETE` of tombstoned keys (single-column keys only).
    delete: Option<Statement>,
}

/// The connection and what it prepared.
pub(crate) struct Db {
    client: Client,
    config: SinkConfig,
    /// The password, read once.
    password: Option<String>,
    prepared: Vec<Prepared>,
    s: Statements,
    /// Whether each batch transaction records its usage (a fleet host's
    /// sink: [`Db::bill_usage`]).
    bill: bool,
    /// Tests' fault window: markers inserted one at a time, with this pause
    /// after each ([`Db::pause_between_markers`]).
    marker_pause: Duration,
    /// Per table, the rows sent to Kafka and not acknowledged yet: settled
    /// before anything more is sent (`forward.rs`).
    unconfirmed: BTreeMap<String, Vec<i64>>,
}

/// Onceflow's tables in `schema`, quoted.
pub(crate) fn own_tables(schema: &str) -> Vec<String> {
    let schema = quote(schema);
    [
        "onceflow_sink_progress",
        "onceflow_sink_markers",
        "onceflow_sink_dead_letters",
        "onceflow_sink_usage",
    ]
    .iter()
    .map(|t| format!("{schema}.{t}"))
    .collect()
}

/// The sink's own statements, with the schema filled in.
struct Statements {
    progress: String,
    markers: String,
    dead_letters: String,
    usage: String,
}

impl Db {
    /// Connects, creates the sink's tables if missing, and prepares every
    /// route's statement (a missing table or column is named here, before
    /// any record is read).
    pub(crate) fn connect(config: &SinkConfig) -> Result<Db, SinkError> {
        let password = read_password(&config.postgres)?;
        let mut client = open(&config.postgres, password.as_deref())?;
        let user = roles::check_sink_role(&mut client)?;
        let schema = quote(&config.postgres.schema);
        let mut db = Db {
            client,
            config: config.clone(),
            password,
            prepared: Vec::new(),
            s: Statements {
                progress: format!("{schema}.onceflow_sink_progress"),
                markers: format!("{schema}.onceflow_sink_markers"),
                dead_letters: format!("{schema}.onceflow_sink_dead_letters"),
                usage: format!("{schema}.onceflow_sink_usage"),
            },
            bill: false,
            marker_pause: Duration::ZERO,
            unconfirmed: BTreeMap::new(),
        };
        db.create_tables()?;
        if let Some(role) = &config.postgres.role {
            let tenant = config.postgres.tenant.as_deref().unwrap_or(&config.name);
            let tables = own_tables(&config.postgres.schema);
            roles::check_tenant_role(&mut db.client, tenant, role, &user, &tables)?;
        }
        db.prepare_routes()?;
        Ok(db)
    }

    /// Records each batch's usage in the batch's transaction, for
    /// [`Db::forward_usage`].
    pub(crate) fn bill_usage(&mut self) {
        self.bill = true;
    }

    /// The tests' fault window: a batch's markers go in one at a time, with
    /// `pause` after each (zero: all in one statement).
    pub(crate) fn pause_between_markers(&mut self, pause: Duration) {
        self.marker_pause = pause;
    }

    /// Opens a new connection after a transient failure, with the same
    /// prepared statements.
    pub(crate) fn reconnect(&mut self) -> Result<(), SinkError> {
        self.client = open(&self.config.postgres, self.password.as_deref())?;
        self.prepare_routes()
    }

    fn create_tables(&mut self) -> Result<(), SinkError> {
        let Statements {
            progress,
            markers,
            dead_letters,
            usage,
        } = &self.s;
        // Current: checked without a lock, so a start never waits for (nor
        // stalls) the running batches.
        // (The outboxes' `claimed_until` came with a later version.)
        let present: bool = self
            .client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL \
                 AND (SELECT count(*) FROM pg_attribute WHERE attname = 'claimed_until' \
                      AND NOT attisdropped \
                      AND attrelid IN (to_regclass($3), to_regclass($4))) = 2",
                &[progress, markers, dead_letters, usage],
            )
            .map_err(|e| db_error("looking for the sink's tables", e))?
            .get(0);
        if present {
            return Ok(());
        }
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {progress} (
               sink text NOT NULL, topic text NOT NULL, kafka_partition int NOT NULL,
               next_offset bigint, owner_epoch bigint NOT NULL, owner text NOT NULL,
               updated_at timestamptz NOT NULL DEFAULT now(),
               PRIMARY KEY (sink, topic, kafka_partition));
             CREATE TABLE IF NOT EXISTS {markers} (
               sink text NOT NULL, identity text NOT NULL, digest bytea NOT NULL,
               topic text NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now(),
               PRIMARY KEY (sink, identity));
             CREATE INDEX IF NOT EXISTS onceflow_sink_markers_applied_at ON {markers} (sink, applied_at);
             CREATE TABLE IF NOT EXISTS {dead_letters} (
               id bigserial PRIMARY KEY, sink text NOT NULL, topic text NOT NULL,
               kafka_partition int NOT NULL, kafka_offset bigint NOT NULL,
               record_key bytea, record_value bytea, reason text NOT NULL,
               digest bytea NOT NULL, applied_digest bytea,
               forwarded boolean NOT NULL DEFAULT false,
               created_at timestamptz NOT NULL DEFAULT now());
             CREATE INDEX IF NOT EXISTS onceflow_sink_dead_letters_unforwarded
               ON {dead_letters} (sink, id) WHERE NOT forwarded;
             CREATE TABLE IF NOT EXISTS {usage} (
               id bigserial PRIMARY KEY, sink text NOT NULL,
               records_in bigint NOT NULL, bytes_in bigint NOT NULL,
               records_out bigint NOT NULL, dead_letters bigint NOT NULL,
               forwarded boolean NOT NULL DEFAULT false,
               created_at timestamptz NOT NULL DEFAULT now());
             CREATE INDEX IF NOT EXISTS onceflow_sink_usage_unforwarded
               ON {usage} (sink, id) WHERE NOT forwarded;
             ALTER TABLE {dead_letters} ADD COLUMN IF NOT EXISTS claimed_until timestamptz;
             ALTER TABLE {usage} ADD COLUMN IF NOT EXISTS claimed_until timestamptz;"
        );
        // Missing (a first start, or a version that adds tables): created
        // under a transaction-level advisory lock per schema, so sinks
        // starting at once do not race in the catalog. An advisory lock is
        // anyone's to take (a tenant's role too), so the wait is bounded:
        // past it, the tables are created without the lock, a race with
        // another sink retried, and the holder named in a warning.
        let lock_key = schema_lock_key(&self.config.postgres.schema);
        let mut locked = true;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = self.client.transaction().and_then(|mut t| {
                if locked {
                    t.batch_execute(&format!(
                        "SET LOCAL lock_timeout = '{}ms'",
                        SCHEMA_LOCK_WAIT.as_millis()
                    ))?;
                    t.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key])?;
                }
                t.batch_execute(&ddl)?;
                t.commit()
            });
            match result {
                Ok(()) => return Ok(()),
                Err(e)
                    if locked
                        && e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) =>
                {
                    tracing::warn!(
                        schema = %self.config.postgres.schema,
                        "another session has held the sink tables' migration lock (advisory lock \
                         {lock_key}) for over {} s: creating them without it; find the holder \
                         with SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
                         AND (classid::bigint << 32 | objid::bigint) = {lock_key}",
                        SCHEMA_LOCK_WAIT.as_secs()
                    );
                    locked = false;
                }
                // Created meanwhile by a sink that did not take the lock (a
                // unique violation in the catalog, or "already exists").
                Err(e)
                    if attempt < 6
                        && e.code()
                            .is_some_and(|c| ["23505", "42P07", "42710"].contains(&c.code())) =>
                {
                    std::thread::sleep(Duration::from_millis(50 * attempt));
                }
                Err(e) => {
                    return Err(db_error(
                        format!(
                            "creating the sink's tables in schema {:?} (the connection's user \
                             needs CREATE on it; docs/sink.md, \"The operator's setup\")",
                            self.config.postgres.schema
                        ),
                        e,
                    ));
                }
            }
        }
    }

    fn prepare_routes(&mut self) -> Result<(), SinkError> {
        let mut prepared = Vec::new();
        let as_tenant = AsTenant::of(&self.config);
        // Under the tenant's role: its tables, its schema, its privileges.
        let mut t = self
            .client
            .transaction()
            .map_err(|e| db_error("starting a transaction", e))?;
        as_tenant
            .enter(&mut t)
            .map_err(|e| db_error("switching to the tenant's role", e))?;
        for (i, route) in self.config.routes.iter().enumerate() {
            let (apply, delete) = route_sql(&route.apply);
            let what = |e: postgres::Error| SinkError::Route {
                route: i,
                topic: route.topic.clone(),
                message: format!(
                    "{}: create the table, grant it to the route's role, or fix the route \
                     (docs/sink.md)",
                    prepare_message(&e)
                ),
            };
            let apply = t.prepare(&apply).map_err(what)?;
            if let Apply::Sql { params, .. } = &route.apply {
                if apply.params().len() != params.len() {
                    return Err(SinkError::Route {
                        route: i,
                        topic: route.topic.clone(),
                        message: format!(
                            "the statement has {} parameters and `params` names {}",
                            apply.params().len(),
                            params.len()
                        ),
                    });
                }
                for (n, ty) in apply.params().iter().enumerate() {
                    if param_kind(ty).is_none() {
                        return Err(SinkError::Route {
                            route: i,
                            topic: route.topic.clone(),
                            message: format!(
                                "parameter ${} has type {ty}, which the sink does not convert \
                                 from JSON: cast it in the statement (`${}::text::{ty}`)",
                                n + 1,
                                n + 1
                            ),
                        });
                    }
                }
            }
            let delete = match delete {
                Some(sql) => Some(t.prepare(&sql).map_err(what)?),
                None => None,
            };
            prepared.push(Prepared { apply, delete });
        }
        t.commit()
            .map_err(|e| db_error("preparing the routes' statements", e))?;
        self.prepared = prepared;
        Ok(())
    }

    /// Claims `partitions` for `owner`: raises each one's owner epoch (a
    /// previous owner's next transaction on it fails), and returns the
    /// epoch and the stored position.
    pub(crate) fn claim(
        &mut self,
        partitions: &[(String, i32)],
        owner: &str,
    ) -> Result<Vec<Claim>, BatchError> {
        let topics: Vec<&str> = partitions.iter().map(|(t, _)| t.as_str()).collect();
        let parts: Vec<i32> = partitions.iter().map(|(_, p)| *p).collect();
        let sql = format!(
            "INSERT INTO {progress} AS p (sink, topic, kafka_partition, owner_epoch, owner)
             SELECT $1, t, k, 1, $4 FROM unnest($2::text[], $3::int[]) AS u(t, k)
             ON CONFLICT (sink, topic, kafka_partition) DO UPDATE
               SET owner_epoch = p.owner_epoch + 1, owner = EXCLUDED.owner, updated_at = now()
             RETURNING topic, kafka_partition, owner_epoch, next_offset",
            progress = self.s.progress
        );
        let rows = self
            .client
            .query(&sql, &[&self.config.name, &topics, &parts, &owner])
            .map_err(BatchError::Database)?;
        Ok(rows
            .iter()
            .map(|r| Claim {
                topic: r.get(0),
                partition: r.get(1),
                epoch: r.get(2),
                next_offset: r.get(3),
            })
            .collect())
    }

    /// Applies `items` (in offset order per partition) in one transaction,
    /// with the markers, the dead letters and the positions; `epochs` are
    /// this instance's claims. `before_commit` runs just before COMMIT (the
    /// tests' fault window).
    pub(crate) fn commit_batch(
        &mut self,
        items: &[Item],
        epochs: &HashMap<(String, i32), i64>,
        before_commit: &dyn Fn(),
    ) -> Result<Applied, BatchError> {
        match self.try_batch(items, epochs, false, before_commit) {
            Err(BatchError::Database(e)) if is_data_error(&e) => {
                tracing::info!(
                    "a record of the batch does not fit its table ({}): applying the batch \
                     record by record",
                    pg_message(&e)
                );
                self.try_batch(items, epochs, true, before_commit)
            }
            other => other,
        }
    }

    fn try_batch(
        &mut self,
        items: &[Item],
        epochs: &HashMap<(String, i32), i64>,
        slow: bool,
        before_commit: &dyn Fn(),
    ) -> Result<Applied, BatchError> {
        let config = &self.config;
        let bill = self.bill;
        let marker_pause = self.marker_pause;
        let s = &self.s;
        let prepared = &self.prepared;
        let as_tenant = AsTenant::of(config);
        let mut t = self.client.transaction().map_err(BatchError::Database)?;
        let mut done = Applied {
            slow,
            ..Applied::default()
        };

        // 1. The owner epochs, under the rows' locks.
        let parts = next_offsets(items);
        let topics: Vec<&str> = parts.keys().map(|(t, _)| t.as_str()).collect();
        let nums: Vec<i32> = parts.keys().map(|(_, p)| *p).collect();
        let rows = t
            .query(
                &format!(
                    "SELECT topic, kafka_partition, owner_epoch, next_offset FROM {} \
                     WHERE sink = $1 AND (topic, kafka_partition) IN \
                       (SELECT * FROM unnest($2::text[], $3::int[])) \
                     ORDER BY topic, kafka_partition FOR UPDATE",
                    s.progress
                ),
                &[&config.name, &topics, &nums],
            )
            .map_err(BatchError::Database)?;
        // Per partition of the batch (a few): the stored next offset.
        let mut stored: Vec<((String, i32), Option<i64>)> = Vec::with_capacity(rows.len());
        let mut fenced = Vec::new();
        for r in &rows {
            let at: (String, i32) = (r.get(0), r.get(1));
            let epoch: i64 = r.get(2);
            if epochs.get(&at) != Some(&epoch) {
                fenced.push(at.clone());
            }
            stored.push((at, r.get(3)));
        }
        for at in parts.keys() {
            if !stored.iter().any(|(s, _)| s == at) {
                fenced.push(at.clone());
            }
        }
        if !fenced.is_empty() {
            let _ = t.rollback();
            return Err(BatchError::Fenced(fenced));
        }

        // 2. Below the stored positions: already applied.
        let fresh: Vec<&Item> = items
            .iter()
            .filter(|i| {
                let behind = stored
                    .iter()
                    .find(|((t, p), _)| *t == i.topic && *p == i.partition)
                    .and_then(|(_, next)| *next)
                    .is_some_and(|next| i.offset < next);
                if behind {
                    done.behind += 1;
                }
                !behind
            })
            .collect();

        // What the batch uses (billed, 5b): these records, once.
        let fresh_records = fresh.len() as i64;
        let fresh_bytes: u64 = fresh.iter().map(|i| i.bytes).sum();

        // 3. Markers: what cannot be applied, what was applied before.
        let mut dead: Vec<DeadLetter> = Vec::new();
        let mut seen: HashMap<&str, &[u8]> = HashMap::new();
        let mut candidates: Vec<&Item> = Vec::new();
        for item in fresh {
            if let Err(reason) = &item.json {
                dead.push(letter(item, reason.clone(), None));
                continue;
            }
            if slow {
                // One by one: each record's marker is checked against those
                // of the records before it (a record that failed has none).
                candidates.push(item);
                continue;
            }
            match seen.get(item.identity.as_str()) {
                Some(d) if *d == item.digest.as_slice() => done.duplicates += 1,
                Some(d) => dead.push(letter(
                    item,
                    format!(
                        "identity {:?} appears twice in the batch with different payloads",
                        item.identity
                    ),
                    Some(d.to_vec()),
                )),
                None => {
                    seen.insert(&item.identity, &item.digest);
                    candidates.push(item);
                }
            }
        }
        let mut new: Vec<&Item> = Vec::new();
        if !slow {
            let to_mark: Vec<&Item> = candidates.iter().copied().filter(|i| i.marked).collect();
            let marked = insert_markers(&mut t, s, &config.name, &to_mark, marker_pause)
                .map_err(BatchError::Database)?;
            for item in candidates {
                if !item.marked {
                    new.push(item);
                    continue;
                }
                match marked.get(item.identity.as_str()) {
                    None => new.push(item),
                    Some(d) if *d == item.digest => done.duplicates += 1,
                    Some(d) => dead.push(conflict(item, d)),
                }
            }
            // 4. The effects, under the tenant's role; back to the sink's
            //    for its own tables.
            as_tenant.enter(&mut t).map_err(BatchError::Database)?;
            for (r, prep) in prepared.iter().enumerate() {
                let of_route: Vec<&Item> = new.iter().copied().filter(|i| i.route == r).collect();
                if of_route.is_empty() {
                    continue;
                }
                apply_route(&mut t, &config.routes[r].apply, prep, &of_route, &mut dead)
                    .map_err(BatchError::Database)?;
            }
            as_tenant.leave(&mut t).map_err(BatchError::Database)?;
            // Records the route refused (a missing key column, a tombstone
            // where none is allowed, a parameter that does not convert)
            // were not applied: their markers go, so that a corrected event
            // with the same identity is applied later.
            let refused = refused_among(&dead, &new);
            if !refused.is_empty() {
                t.execute(
                    &format!(
                        "DELETE FROM {} WHERE sink = $1 AND identity = ANY($2)",
                        s.markers
                    ),
                    &[&config.name, &refused],
                )
                .map_err(BatchError::Database)?;
            }
            done.applied = new.len() as u64 - refused.len() as u64;
        } else {
            for item in candidates {
                let mut sp = t.savepoint("item").map_err(BatchError::Database)?;
                let marked = if item.marked {
                    insert_markers(&mut sp, s, &config.name, &[item], Duration::ZERO)
                        .map_err(BatchError::Database)?
                } else {
                    HashMap::new()
                };
                if let Some(d) = marked.get(item.identity.as_str()) {
                    if *d == item.digest {
                        done.duplicates += 1;
                    } else {
                        dead.push(conflict(item, d));
                    }
                    sp.commit().map_err(BatchError::Database)?;
                    continue;
                }
                let route = item.route;
                let mut own_dead = Vec::new();
                as_tenant.enter(&mut sp).map_err(BatchError::Database)?;
                let applied = apply_route(
                    &mut sp,
                    &config.routes[route].apply,
                    &prepared[route],
                    &[item],
                    &mut own_dead,
                )
                .and_then(|()| as_tenant.leave(&mut sp));
                // A failed statement's savepoint is rolled back with the
                // role switch in it: the sink's role is back either way.
                match applied {
                    Ok(()) if own_dead.is_empty() => {
                        sp.commit().map_err(BatchError::Database)?;
                        done.applied += 1;
                    }
                    Ok(()) => {
                        // Rolled back: its marker too.
                        drop(sp);
                        dead.extend(own_dead);
                    }
                    Err(e) if is_data_error(&e) => {
                        drop(sp);
                        dead.push(letter(item, pg_message(&e), None));
                    }
                    Err(e) => return Err(BatchError::Database(e)),
                }
            }
        }

        // 5. Dead letters, forwarded to Kafka after the commit.
        if !dead.is_empty() {
            insert_dead_letters(&mut t, s, &config.name, &dead).map_err(BatchError::Database)?;
            done.dead = dead.len() as u64;
        }

        // 5b. What the batch used (a fleet host's sink): every record at or
        //     past its partition's position counts once, since the position
        //     moves past it in this same transaction; forwarded to Kafka
        //     after the commit.
        if bill && fresh_records > 0 {
            t.execute(
                &format!(
                    "INSERT INTO {} (sink, records_in, bytes_in, records_out, dead_letters) \
                     VALUES ($1, $2, $3, $4, $5)",
                    s.usage
                ),
                &[
                    &config.name,
                    &fresh_records,
                    &(fresh_bytes as i64),
                    &(done.applied as i64),
                    &(done.dead as i64),
                ],
            )
            .map_err(BatchError::Database)?;
        }

        // 6. The positions.
        let nexts: Vec<i64> = parts.values().copied().collect();
        t.execute(
            &format!(
                "UPDATE {} AS p SET next_offset = GREATEST(coalesce(p.next_offset, 0), u.n), \
                 updated_at = now() \
                 FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(t, k, n) \
                 WHERE p.sink = $1 AND p.topic = u.t AND p.kafka_partition = u.k",
                s.progress
            ),
            &[&config.name, &topics, &nums, &nexts],
        )
        .map_err(BatchError::Database)?;

        // 7. Commit.
        before_commit();
        t.commit().map_err(BatchError::Database)?;
        Ok(done)
    }

    /// Deletes markers older than the retention, [`EXPIRE_CHUNK`] at a
    /// time, until none is left or `slice` has passed; returns how many,
    /// and whether some may be left.
    pub(crate) fn expire_markers(
        &mut self,
        slice: Duration,
    ) -> Result<(u64, bool), postgres::Error> {
        let secs = self.config.marker_retention.as_secs_f64();
        // Forwarded usage rows past the same retention go too (the usage
        // topic holds them).
        self.client.execute(
            &format!(
                "DELETE FROM {u} WHERE ctid IN (SELECT ctid FROM {u} WHERE sink = $1 AND \
                 forwarded AND created_at < now() - make_interval(secs => $2::float8) \
                 LIMIT 10000)",
                u = self.s.usage
            ),
            &[&self.config.name, &secs],
        )?;
        let started = std::time::Instant::now();
        let mut total = 0;
        loop {
            let n = self.client.execute(
                &format!(
                    "DELETE FROM {m} WHERE ctid IN (SELECT ctid FROM {m} WHERE sink = $1 AND \
                     applied_at < now() - make_interval(secs => $2::float8) LIMIT {EXPIRE_CHUNK})",
                    m = self.s.markers
                ),
                &[&self.config.name, &secs],
            )?;
            total += n;
            if n < EXPIRE_CHUNK {
                return Ok((total, false));
            }
            if started.elapsed() >= slice {
                return Ok((total, true));
            }
        }
    }
}

/// Opens a connection, named `onceflow-sink` in `pg_stat_activity`: every
/// role sees other sessions' names, so a sink's name (its tenant's) is not
/// in it; its log says which backend it is.
pub(crate) fn open(config: &PostgresConfig, password: Option<&str>) -> Result<Client, SinkError> {
    let mut c: postgres::Config = config.connection.parse().map_err(|e| SinkError::Database {
        what: format!(
            "postgres.connection {:?} is not a connection string",
            config.connection
        ),
        source: Box::new(e),
    })?;
    if let Some(p) = password {
        c.password(p);
    }
    if c.get_application_name().is_none() {
        c.application_name("onceflow-sink");
    }
    if c.get_options().is_none() {
        // A transaction left open by an instance that stopped mid-batch
        // (SIGSTOP, a VM pause) holds its partitions' progress rows: the
        // server ends it after 10 s, so that the partitions' new owner can
        // claim them.
        c.options("-c idle_in_transaction_session_timeout=10000");
    }
    if c.get_connect_timeout().is_none() {
        c.connect_timeout(Duration::from_secs(10));
    }
    let mut client = c.connect(NoTls).map_err(|e| {
        db_error(
            format!(
                "connecting to PostgreSQL ({}); check the server, the user and the password",
                config.connection
            ),
            e,
        )
    })?;
    if let Ok(row) = client.query_one("SELECT pg_backend_pid()", &[]) {
        tracing::info!(
            backend_pid = row.get::<_, i32>(0),
            role = ?config.role,
            "connected to PostgreSQL"
        );
    }
    Ok(client)
}

pub(crate) fn read_password(config: &PostgresConfig) -> Result<Option<String>, SinkError> {
    if let Some(f) = &config.password_file {
        let text = std::fs::read_to_string(f).map_err(|source| SinkError::PasswordFile {
            path: f.clone(),
            source,
        })?;
        return Ok(Some(text.lines().next().unwrap_or_default().to_owned()));
    }
    Ok(std::env::var("PGPASSWORD").ok())
}

/// How long a start waits for the schema's migration lock before it goes
/// on without it.
const SCHEMA_LOCK_WAIT: Duration = Duration::from_secs(10);

/// The advisory lock key under which the sink's tables in `schema` are
/// created: the first 8 bytes of SHA-256 of `onceflow sink schema <schema>`
/// (stable across PostgreSQL versions and known to tests and operators).
pub(crate) fn schema_lock_key(schema: &str) -> i64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("onceflow sink schema {schema}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

fn db_error(what: impl Into<String>, e: postgres::Error) -> SinkError {
    SinkError::Database {
        what: what.into(),
        source: Box::new(e),
    }
}

/// The server's message (and its detail), or the client's, unredacted:
/// for a statement being prepared (no record's value is in it yet).
fn prepare_message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => match d.detail() {
            Some(detail) => format!("{} ({})", d.message(), detail),
            None => d.message().to_owned(),
        },
        None => e.to_string(),
    }
}

/// A record's own fault: it does not fit its table (class 22, data
/// exception; class 23, integrity constraint violation).
fn is_data_error(e: &postgres::Error) -> bool {
    e.code()
        .is_some_and(|c| c.code().starts_with("22") || c.code().starts_with("23"))
}

/// Whether a failure is worth a reconnect and a retry: the connection, the
/// server shutting down or restarting, a serialization failure or
/// deadlock, a lack of resources, or the session ended by the server's
/// idle-in-transaction or transaction timeout (25P03, 25P04: this process
/// was stopped inside a transaction, a zombie; after the reconnect its
/// claims are checked again, and partitions another instance claimed
/// meanwhile are fenced, not applied).
pub(crate) fn is_transient(e: &postgres::Error) -> bool {
    e.is_closed() || transient_state(e.code().map(SqlState::code), e.as_db_error().is_some())
}

/// [`is_transient`] by SQLSTATE (`None`: no code; `from_server`: the server
/// answered with an error, else the failure is the connection's).
fn transient_state(code: Option<&str>, from_server: bool) -> bool {
    match code {
        // No SQLSTATE: an I/O or protocol failure of the connection.
        None => !from_server,
        Some(c) => {
            c.starts_with("08")
                || c.starts_with("53")
                || c.starts_with("57P")
                || c == SqlState::T_R_SERIALIZATION_FAILURE.code()
                || c == SqlState::T_R_DEADLOCK_DETECTED.code()
                || c == SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT.code()
                // transaction_timeout (PostgreSQL 17), not named by the
                // client library yet.
                || c == "25P04"
        }
    }
}

/// The next offset of each partition of `items` (one past its last
/// record): what the batch's transaction stores, and the Kafka offsets
/// committed after it.
pub(crate) fn next_offsets(items: &[Item]) -> BTreeMap<(String, i32), i64> {
    fn store(next: &mut BTreeMap<(String, i32), i64>, (topic, partition, n): (&str, i32, i64)) {
        let e = next.entry((topic.to_owned(), partition)).or_insert(n);
        *e = (*e).max(n);
    }
    let mut next = BTreeMap::new();
    // Records come in runs of one partition: one map entry per run.
    let mut run: Option<(&str, i32, i64)> = None;
    for i in items {
        match &mut run {
            Some((t, p, n)) if *t == i.topic && *p == i.partition => *n = (*n).max(i.offset + 1),
            _ => {
                if let Some(r) = run.take() {
                    store(&mut next, r);
                }
                run = Some((&i.topic, i.partition, i.offset + 1));
            }
        }
    }
    if let Some(r) = run {
        store(&mut next, r);
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(topic: &str, partition: i32, offset: i64) -> Item {
        Item {
            bytes: 0,
            route: 0,
            topic: topic.into(),
            partition,
            offset,
            key: None,
            value: None,
            json: Ok(None),
            identity: format!("{topic}/{partition}/{offset}"),
            marked: false,
            digest: vec![0; 32],
        }
    }

    #[test]
    fn a_session_the_server_ended_for_its_timeouts_is_retried() {
        // A process stopped inside a transaction past the sink's
        // idle_in_transaction_session_timeout gets the server's FATAL
        // (25P03) when it resumes, or finds the connection closed; both are
        // a reconnect and a retry, where the claims fence a zombie (issue
        // 48: before, 25P03 ended the sink).
        assert!(transient_state(Some("25P03"), true));
        assert!(transient_state(Some("25P04"), true));
        assert!(transient_state(Some("57P01"), true));
        assert!(transient_state(Some("08006"), true));
        assert!(transient_state(Some("40001"), true));
        assert!(transient_state(None, false));
        // Errors in the batch itself are not retried.
        assert!(!transient_state(Some("23505"), true));
        assert!(!transient_state(Some("42P01"), true));
        assert!(!transient_state(Some("25P02"), true));
        assert!(!transient_state(None, true));
    }

    #[test]
    fn next_offsets_are_one_past_each_partitions_last_record() {
        let items = [
            item("a", 0, 5),
            item("a", 0, 6),
            item("b", 0, 9),
            item("a", 1, 2),
            item("a", 0, 8),
            item("b", 0, 10),
        ];
        let next = next_offsets(&items);
        assert_eq!(next.len(), 3);
        assert_eq!(next[&("a".into(), 0)], 9);
        assert_eq!(next[&("a".into(), 1)], 3);
        assert_eq!(next[&("b".into(), 0)], 11);
    }

    #[test]
    fn an_upsert_updates_the_other_columns_and_deletes_by_a_single_key() {
        let (upsert, delete) = route_sql(&Apply::Upsert {
            table: "s.balances".into(),
            columns: vec!["account".into(), "balance".into()],
            key: vec!["account".into()],
        });
        assert!(upsert.starts_with("INSERT INTO \"s\".\"balances\" (\"account\", \"balance\")"));
        assert!(upsert.ends_with(
            "ON CONFLICT (\"account\") DO UPDATE SET \"balance\" = EXCLUDED.\"balance\""
        ));
        assert!(delete.is_some_and(|d| d.contains("x.\"account\" = d.\"account\"")));
        let (_, none) = route_sql(&Apply::Upsert {
            table: "t".into(),
            columns: vec!["a".into(), "b".into()],
            key: vec!["a".into(), "b".into()],
        });
        assert!(none.is_none(), "no tombstone delete with a two-column key");
    }
}
