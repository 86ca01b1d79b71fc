//! Tenants: who may call the admin API, which names they own, and how much
//! they may use.
//!
//! `tenants.toml` (read by `onceflow host --tenants`):
//!
//! ```toml
//! [operator]                       # optional: may read every tenant's metrics
//! token-sha256 = "9f86d0…"         # sha256 of the token, hex (`onceflow hash-token`)
//!
//! [[tenant]]
//! name = "acme"
//! token-sha256 = "…"               # or two, while rotating: ["old…", "new…"]
//! topic-prefix = "acme."           # default: "<name>."; must start with "<name>."
//! [tenant.quotas]
//! deployments = 10                 # deployments at once
//! worker-threads = 8               # summed over its deployments
//! memory-mb = 256                  # per instance (limits.memory-mb)
//! guest-memory-mb = 2048           # all its instances on one host together
//! fuel-per-record = 100000000      # limits.fuel-per-record
//! timeout-ms = 60000               # limits.timeout-ms (a call's deadline)
//! log-lines-per-second = 1000      # limits.log-lines-per-second
//! state-mb = 1024                  # limits.state-mb (state per instance)
//! cpu-share = 100                  # percent of a host's CPU its guests may take
//! artifact-mb = 1024               # its uploaded components together
//! held-mb = 256                    # held in host memory per deployment or sink
//! host-held-mb = 1024              # the same, all of them on one host together
//! ```
//!
//! Kafka treats `.` and `_` in topic names as one character, so tenant
//! names that collide under that folding (`evil` and `evil_acme`: tenant
//! `evil`'s processor `acme_w` would own tenant `evil_acme`'s `w`'s names)
//! are refused when the file is read.
//!
//! A tenant's consumer groups, transactional ids and changelog topics are
//! named `<tenant>.<processor>…` and its topics start with its topic prefix,
//! which itself starts with `<tenant>.`: one prefixed Kafka ACL on
//! `<tenant>.` (topics, groups, transactional ids) backs the host's checks.
//! Tokens are only ever compared as sha256 digests and never logged.
//!
//! Rotating a token: list the new digest beside the old one
//! (`token-sha256 = ["<old>", "<new>"]`), hand out the new token, then drop
//! the old digest. `onceflow host` re-reads the file when it changes (see
//! [`TenantsFile`]); a file that does not parse is logged and ignored, the
//! previous tenants stay in force.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::manifest::Manifest;
use crate::stream::names;

/// Why `tenants.toml` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TenancyError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
}

/// Limits on what one tenant may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Quotas {
    /// Deployments at once (paused ones count; deleted ones do not).
    pub deployments: u32,
    /// Worker threads summed over the tenant's deployments.
    pub worker_threads: u32,
    /// Largest `limits.memory-mb` of an instance.
    pub memory_mb: u64,
    /// Guest memory of all the tenant's instances on one host together, in
    /// MiB: a deployment runs one instance per input partition, and all of
    /// them may land on one host, so each counts partitions x
    /// `limits.memory-mb`.
    pub guest_memory_mb: u64,
    /// Largest `limits.fuel-per-record`.
    pub fuel_per_record: u64,
    /// Largest `limits.timeout-ms`: how long one call may hold a worker
    /// thread when fuel does not stop it (a guest waiting in a host call).
    pub timeout_ms: u64,
    /// Largest `limits.log-lines-per-second` (per instance).
    pub log_lines_per_second: u32,
    /// Largest `limits.state-mb`: committed state per instance (input
    /// partition), all its stores together.
    pub state_mb: u64,
    /// Percent of a host's CPU (all its cores) the tenant's guest calls on
    /// that host may take together; past it, its workers wait
    /// (`stream/cpu.rs`). 100: no limit.
    pub cpu_share: u32,
    /// MiB of uploaded components the tenant holds together (each counted
    /// once however often uploaded); components none of its deployments
    /// runs are collected after the hosts' `--artifact-grace-secs`.
    pub artifact_mb: u64,
    /// MiB the host holds in memory for one of its deployments (or sinks)
    /// at once: outputs and state changes not yet committed, a sink's
    /// batches. A batch that reaches it is committed in parts
    /// (`memory.rs`). At least 64 (one call's cap).
    pub held_mb: u64,
    /// The same for all its deployments and sinks on one host together.
    pub host_held_mb: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            deployments: 10,
            worker_threads: 8,
            memory_mb: 256,
            guest_memory_mb: 2048,
            fuel_per_record: 100_000_000,
            timeout_ms: 60_000,
            log_lines_per_second: 1_000,
            state_mb: 1024,
            cpu_share: 100,
            artifact_mb: 1024,
            held_mb: crate::memory::DEFAULT_HELD_MB,
            host_held_mb: 1024,
        }
    }
}

/// One tenant.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Name (also the first part of every Kafka name it owns).
    pub name: String,
    /// Topics the tenant may name start with this.
    pub topic_prefix: String,
    /// Its limits.
    pub quotas: Quotas,
    /// One digest, or two while a token is being rotated.
    token_sha256: Vec<[u8; 32]>,
}

/// Who made a request.
#[derive(Debug, Clone, Copy)]
pub enum Principal<'a> {
    /// A tenant, by its token.
    Tenant(&'a Tenant),
    /// The operator token: reads every tenant's metrics, deploys nothing.
    Operator,
}

/// A deployment the tenant already has, for quota checks.
#[derive(Debug, Clone)]
pub struct Existing {
    /// Processor name.
    pub name: String,
    /// Its `processing.worker-threads`.
    pub worker_threads: u32,
    /// Its instances' memory on one host at most: input partitions x
    /// `limits.memory-mb`.
    pub guest_memory_mb: u64,
}

/// All tenants of a host.
#[derive(Debug, Clone, Default)]
pub struct Tenants {
    tenants: BTreeMap<String, Tenant>,
    /// None, one, or two while rotating.
    operator_sha256: Vec<[u8; 32]>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawFile {
    operator: Option<RawOperator>,
    #[serde(default)]
    tenant: Vec<RawTenant>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawOperator {
    token_sha256: Digests,
}

/// `token-sha256`: one digest, or a list of up to [`MAX_TOKENS`] while a
/// token is rotated.
#[derive(Deserialize)]
#[serde(untagged)]
enum Digests {
    One(String),
    Several(Vec<String>),
}

/// Valid tokens per tenant at once: the current one and its successor.
pub const MAX_TOKENS: usize = 2;

impl Digests {
    fn parse(self) -> Result<Vec<[u8; 32]>, String> {
        let hex = match self {
            Digests::One(d) => vec![d],
            Digests::Several(ds) => ds,
        };
        if hex.is_empty() || hex.len() > MAX_TOKENS {
            return Err(format!(
                "token-sha256 lists {} digests: give one, or two while rotating a token \
                 (the old and the new), and drop the old one once every client has the new",
                hex.len()
            ));
        }
        hex.iter().map(|d| parse_digest(d)).collect()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawTenant {
    name: String,
    token_sha256: Digests,
    topic_prefix: Option<String>,
    #[serde(default)]
    quotas: Quotas,
}

/// The hex sha256 of a token, as `tenants.toml` stores it.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.trim().as_bytes()))
}

fn parse_digest(hex_digest: &str) -> Result<[u8; 32], String> {
    let bytes = hex::decode(hex_digest.trim())
        .map_err(|_| "token-sha256 must be 64 hex digits (see `onceflow hash-token`)".to_owned())?;
    bytes
        .try_into()
        .map_err(|_| "token-sha256 must be 64 hex digits (see `onceflow hash-token`)".to_owned())
}

/// Compares digests in constant time (the digest of a guessed token must
/// not leak how many leading bytes matched).
fn digest_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tenants {
    /// Reads `tenants.toml`.
    pub fn load(path: &Path) -> Result<Self, TenancyError> {
        let text = std::fs::read_to_string(path).map_err(|source| TenancyError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|message| TenancyError::Invalid {
            path: path.to_owned(),
            message,
        })
    }

    fn parse_for_host(text: &str) -> Result<Self, String> {
        let tenants = Self::parse(text)?;
        if tenants.tenants.is_empty() {
            return Err("no [[tenant]] entries: nobody could deploy".to_owned());
        }
        Ok(tenants)
    }

    /// Parses the text of `tenants.toml`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let raw: RawFile = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())?;
        let mut tenants = BTreeMap::new();
        let mut digests: Vec<[u8; 32]> = Vec::new();
        for t in raw.tenant {
            crate::manifest::check_name(&t.name).map_err(|m| format!("tenant name: {m}"))?;
            let topic_prefix = t.topic_prefix.unwrap_or_else(|| format!("{}.", t.name));
            if !topic_prefix.starts_with(&format!("{}.", t.name)) {
                return Err(format!(
                    "tenant {:?}: topic-prefix {topic_prefix:?} must start with \"{}.\" so one prefixed ACL covers its topics, groups and transactional ids",
                    t.name, t.name
                ));
            }
            if !(1..=100).contains(&t.quotas.cpu_share) {
                return Err(format!(
                    "tenant {:?}: cpu-share = {} must be a percent of the host's CPU, 1 to 100",
                    t.name, t.quotas.cpu_share
                ));
            }
            if t.quotas.held_mb < 64 || t.quotas.host_held_mb < t.quotas.held_mb {
                return Err(format!(
                    "tenant {:?}: held-mb = {} and host-held-mb = {}: held-mb must be at least 64 \
                     (one guest call may hold 64 MiB) and host-held-mb at least held-mb",
                    t.name, t.quotas.held_mb, t.quotas.host_held_mb
                ));
            }
            let own = t
                .token_sha256
                .parse()
                .map_err(|m| format!("tenant {:?}: {m}", t.name))?;
            for digest in &own {
                if digests.iter().any(|d| digest_eq(d, digest)) {
                    return Err(format!(
                        "tenant {:?}: its token is also another tenant's (or listed twice): \
                         give every tenant its own token",
                        t.name
                    ));
                }
                digests.push(*digest);
            }
            let tenant = Tenant {
                name: t.name.clone(),
                topic_prefix,
                quotas: t.quotas,
                token_sha256: own,
            };
            if tenants.insert(t.name.clone(), tenant).is_some() {
                return Err(format!("tenant {:?} is listed twice", t.name));
            }
        }
        check_folding(tenants.keys())?;
        let operator_sha256 = match raw.operator {
            Some(o) => o
                .token_sha256
                .parse()
                .map_err(|m| format!("operator: {m}"))?,
            None => Vec::new(),
        };
        if operator_sha256
            .iter()
            .any(|op| digests.iter().any(|d| digest_eq(d, op)))
        {
            return Err(
                "operator: its token is also a tenant's: give the operator a token of its own"
                    .to_owned(),
            );
        }
        Ok(Self {
            tenants,
            operator_sha256,
        })
    }

    /// The principal a bearer token stands for, if any.
    pub fn authenticate(&self, token: &str) -> Option<Principal<'_>> {
        let digest: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
        // Compare against every tenant (no early exit): the time taken does
        // not depend on which one matched.
        let mut found = None;
        for t in self.tenants.values() {
            for d in &t.token_sha256 {
                if digest_eq(d, &digest) {
                    found = Some(Principal::Tenant(t));
                }
            }
        }
        for op in &self.operator_sha256 {
            if digest_eq(op, &digest) {
                found = Some(Principal::Operator);
            }
        }
        found
    }

    /// A tenant by name.
    pub fn get(&self, name: &str) -> Option<&Tenant> {
        self.tenants.get(name)
    }

    /// Every tenant.
    pub fn iter(&self) -> impl Iterator<Item = &Tenant> {
        self.tenants.values()
    }
}

/// `tenants.toml` as a running host watches it: [`TenantsFile::changed`]
/// reads the file again and parses it when its text changed.
#[derive(Debug)]
pub struct TenantsFile {
    path: PathBuf,
    /// The text last read, whether it parsed or not (a bad edit is
    /// reported once, not at every poll).
    seen: String,
}

impl TenantsFile {
    /// Reads `path` for a host: as [`Tenants::load`], and a file with no
    /// tenant is refused (nobody could deploy).
    pub fn open(path: &Path) -> Result<(Self, Tenants), TenancyError> {
        let seen = std::fs::read_to_string(path).map_err(|source| TenancyError::Read {
            path: path.to_owned(),
            source,
        })?;
        let tenants = Tenants::parse_for_host(&seen).map_err(|message| TenancyError::Invalid {
            path: path.to_owned(),
            message,
        })?;
        Ok((
            Self {
                path: path.to_owned(),
                seen,
            },
            tenants,
        ))
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `None` while the file's text is what was last read; otherwise the
    /// new tenants, or why the new text cannot be used. A file that cannot
    /// be read (being replaced) is tried again at the next call.
    pub fn changed(&mut self) -> Option<Result<Tenants, TenancyError>> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        if text == self.seen {
            return None;
        }
        self.seen = text;
        Some(
            Tenants::parse_for_host(&self.seen).map_err(|message| TenancyError::Invalid {
                path: self.path.clone(),
                message,
            }),
        )
    }
}

/// Refuses two tenants whose names Kafka would mix up: every name a tenant
/// owns starts with `<tenant>.`, and Kafka folds `.` into `_`, so tenant
/// `a`'s names can be tenant `a_b`'s when `a_b` starts with `a_`.
fn check_folding<'a>(names: impl Iterator<Item = &'a String>) -> Result<(), String> {
    let names: Vec<&String> = names.collect();
    for a in &names {
        for b in &names {
            if a != b && b.starts_with(&format!("{a}_")) {
                return Err(format!(
                    "tenants {a:?} and {b:?} collide in Kafka, which treats '.' and '_' as one \
                     character: tenant {a:?}'s processor \"{}\" would own the names of tenant \
                     {b:?}'s processor \"x\"; rename one tenant (use '-' instead of '_')",
                    format_args!("{}_x", &b[a.len() + 1..])
                ));
            }
        }
    }
    Ok(())
}

impl Tenant {
    /// Checks a manifest against the tenant's namespace and quotas, given
    /// its input's partition count (one instance each) and the tenant's
    /// other deployments. The message names the offending key.
    pub fn admit(&self, m: &Manifest, partitions: u32, others: &[Existing]) -> Result<(), String> {
        if m.tenant != self.name {
            return Err(format!(
                "the manifest says tenant = {:?} but your token is tenant {:?}'s: set tenant = {:?}",
                m.tenant, self.name, self.name
            ));
        }
        let named = names::named_topics(m);
        for (key, topic) in &named {
            if !topic.starts_with(&self.topic_prefix) {
                return Err(format!(
                    "{key}: topic {topic:?} is outside your namespace: tenant {:?} may only use topics starting with {:?}",
                    self.name, self.topic_prefix
                ));
            }
        }
        // Reads too: a changelog is read by its own tasks only (query a
        // store with `onceflow query`).
        if let Some(refusal) = names::first_reserved(named) {
            return Err(refusal);
        }
        let q = &self.quotas;
        if m.limits.memory_mb > q.memory_mb {
            return Err(format!(
                "limits.memory-mb = {} exceeds your quota of {} MiB per instance",
                m.limits.memory_mb, q.memory_mb
            ));
        }
        if m.limits.fuel_per_record == 0 {
            return Err(format!(
                "limits.fuel-per-record = 0 turns fuel metering off, which tenants may not do: set it to at most {}",
                q.fuel_per_record
            ));
        }
        if m.limits.fuel_per_record > q.fuel_per_record {
            return Err(format!(
                "limits.fuel-per-record = {} exceeds your quota of {}",
                m.limits.fuel_per_record, q.fuel_per_record
            ));
        }
        if m.limits.timeout_ms > q.timeout_ms {
            return Err(format!(
                "limits.timeout-ms = {} exceeds your quota of {} ms per call",
                m.limits.timeout_ms, q.timeout_ms
            ));
        }
        if m.limits.log_lines_per_second > q.log_lines_per_second {
            return Err(format!(
                "limits.log-lines-per-second = {} exceeds your quota of {} per instance",
                m.limits.log_lines_per_second, q.log_lines_per_second
            ));
        }
        if m.limits.state_mb > q.state_mb {
            return Err(format!(
                "limits.state-mb = {} exceeds your quota of {} MiB of state per instance",
                m.limits.state_mb, q.state_mb
            ));
        }
        let others: Vec<&Existing> = others.iter().filter(|e| e.name != m.name).collect();
        if others.len() as u32 + 1 > q.deployments {
            return Err(format!(
                "quota exceeded: tenant {:?} may run {} deployments and has {} already: delete one first",
                self.name,
                q.deployments,
                others.len()
            ));
        }
        let threads: u32 =
            others.iter().map(|e| e.worker_threads).sum::<u32>() + m.processing.worker_threads;
        if threads > q.worker_threads {
            return Err(format!(
                "quota exceeded: processing.worker-threads = {} would make {threads} worker threads for tenant {:?}, whose quota is {}",
                m.processing.worker_threads, self.name, q.worker_threads
            ));
        }
        let memory = u64::from(partitions) * m.limits.memory_mb;
        let total = others.iter().map(|e| e.guest_memory_mb).sum::<u64>() + memory;
        if total > q.guest_memory_mb {
            return Err(format!(
                "quota exceeded: {partitions} input partitions x limits.memory-mb = {} MiB would \
                 make {total} MiB of guest memory for tenant {:?} on a host (one instance per \
                 partition), whose quota is {} MiB: lower limits.memory-mb or use fewer partitions",
                m.limits.memory_mb, self.name, q.guest_memory_mb
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenants() -> Tenants {
        Tenants::parse(&format!(
            r#"
[operator]
token-sha256 = "{}"

[[tenant]]
name = "acme"
token-sha256 = "{}"
[tenant.quotas]
deployments = 2
worker-threads = 3

[[tenant]]
name = "globex"
token-sha256 = "{}"
topic-prefix = "globex.prod."
"#,
            hash_token("op-secret"),
            hash_token("acme-secret"),
            hash_token("globex-secret")
        ))
        .expect("valid tenants.toml")
    }

    fn manifest(tenant: &str, input: &str, output: &str, threads: u32) -> Manifest {
        Manifest::parse(
            &format!(
                r#"
name = "wallet"
tenant = "{tenant}"
inputs = ["{input}"]
stores = ["balances"]
[build]
language = "rust"
[outputs]
out = "{output}"
[processing]
worker-threads = {threads}
"#
            ),
            PathBuf::from("onceflow.toml"),
        )
        .expect("valid manifest")
    }

    #[test]
    fn tokens_map_to_their_tenant_only() {
        let t = tenants();
        assert!(
            matches!(t.authenticate("acme-secret"), Some(Principal::Tenant(x)) if x.name == "acme")
        );
        assert!(
            matches!(t.authenticate("globex-secret"), Some(Principal::Tenant(x)) if x.name == "globex")
        );
        assert!(matches!(
            t.authenticate("op-secret"),
            Some(Principal::Operator)
        ));
        assert!(t.authenticate("acme-secreT").is_none());
        assert!(t.authenticate("").is_none());
    }

    #[test]
    fn namespace_and_quotas_are_enforced() {
        let t = tenants();
        let acme = t.get("acme").expect("acme");
        acme.admit(&manifest("acme", "acme.in", "acme.out", 1), 1, &[])
            .expect("own topics");
        let e = acme
            .admit(&manifest("acme", "globex.prod.in", "acme.out", 1), 1, &[])
            .unwrap_err();
        assert!(
            e.contains("\"globex.prod.in\" is outside your namespace"),
            "{e}"
        );
        let e = acme
            .admit(&manifest("globex", "acme.in", "acme.out", 1), 1, &[])
            .unwrap_err();
        assert!(e.contains("token is tenant \"acme\"'s"), "{e}");
        let e = acme
            .admit(&manifest("acme", "acme.in", "acme.x-changelog", 1), 1, &[])
            .unwrap_err();
        assert!(
            e.starts_with("outputs.out: topic \"acme.x-changelog\" is reserved"),
            "{e}"
        );
        // Reads too, each refusal naming its key.
        let e = acme
            .admit(&manifest("acme", "acme.x-changelog", "acme.out", 1), 1, &[])
            .unwrap_err();
        assert!(e.starts_with("inputs: topic \"acme.x-changelog\""), "{e}");
        let mut table = manifest("acme", "acme.in", "acme.out", 1);
        table.tables = vec![("t".into(), "acme.w-s-changelog".into())];
        let e = acme.admit(&table, 1, &[]).unwrap_err();
        assert!(
            e.starts_with("tables.t: topic \"acme.w-s-changelog\""),
            "{e}"
        );
        let others = [
            Existing {
                name: "a".into(),
                worker_threads: 1,
                guest_memory_mb: 128,
            },
            Existing {
                name: "b".into(),
                worker_threads: 1,
                guest_memory_mb: 128,
            },
        ];
        let e = acme
            .admit(&manifest("acme", "acme.in", "acme.out", 1), 1, &others)
            .unwrap_err();
        assert!(e.contains("may run 2 deployments"), "{e}");
        let e = acme
            .admit(&manifest("acme", "acme.in", "acme.out", 3), 1, &others[..1])
            .unwrap_err();
        assert!(e.contains("would make 4 worker threads"), "{e}");
        // Redeploying an existing name is an upgrade, not one more.
        let same = [
            Existing {
                name: "wallet".into(),
                worker_threads: 2,
                guest_memory_mb: 128,
            },
            others[0].clone(),
        ];
        acme.admit(&manifest("acme", "acme.in", "acme.out", 2), 1, &same)
            .expect("upgrade within quota");
        let globex = t.get("globex").expect("globex");
        let e = globex
            .admit(
                &manifest("globex", "globex.in", "globex.prod.out", 1),
                1,
                &[],
            )
            .unwrap_err();
        assert!(e.contains("starting with \"globex.prod.\""), "{e}");
    }

    #[test]
    fn a_token_is_rotated_with_two_digests() {
        let (old, new, op) = (hash_token("old"), hash_token("new"), hash_token("op"));
        let both = Tenants::parse(&format!(
            "[operator]\ntoken-sha256 = \"{op}\"\n[[tenant]]\nname = \"a\"\ntoken-sha256 = [\"{old}\", \"{new}\"]\n"
        ))
        .expect("two digests");
        for token in ["old", "new"] {
            assert!(
                matches!(both.authenticate(token), Some(Principal::Tenant(t)) if t.name == "a"),
                "{token}"
            );
        }
        assert!(matches!(both.authenticate("op"), Some(Principal::Operator)));
        assert!(both.authenticate("other").is_none());
        let e = Tenants::parse(&format!(
            "[[tenant]]\nname = \"a\"\ntoken-sha256 = [\"{old}\", \"{new}\", \"{op}\"]\n"
        ))
        .unwrap_err();
        assert!(e.contains("lists 3 digests"), "{e}");
        let e = Tenants::parse("[[tenant]]\nname = \"a\"\ntoken-sha256 = []\n").unwrap_err();
        assert!(e.contains("lists 0 digests"), "{e}");
        // A second digest may not be another tenant's, nor the operator's.
        let e = Tenants::parse(&format!(
            "[[tenant]]\nname = \"a\"\ntoken-sha256 = \"{old}\"\n[[tenant]]\nname = \"b\"\ntoken-sha256 = [\"{new}\", \"{old}\"]\n"
        ))
        .unwrap_err();
        assert!(e.contains("tenant \"b\"") && e.contains("own token"), "{e}");
        let e = Tenants::parse(&format!(
            "[operator]\ntoken-sha256 = \"{old}\"\n[[tenant]]\nname = \"a\"\ntoken-sha256 = \"{old}\"\n"
        ))
        .unwrap_err();
        assert!(e.contains("operator") && e.contains("its own"), "{e}");
    }

    #[test]
    fn a_watched_file_reports_each_change_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("tenants.toml");
        let file = |token: &str| {
            format!(
                "[[tenant]]\nname = \"a\"\ntoken-sha256 = \"{}\"\n",
                hash_token(token)
            )
        };
        std::fs::write(&path, file("one")).expect("write");
        let (mut watched, first) = TenantsFile::open(&path).expect("open");
        assert!(first.authenticate("one").is_some());
        assert!(watched.changed().is_none(), "unchanged");
        std::fs::write(&path, file("two")).expect("write");
        let second = watched.changed().expect("a change").expect("valid");
        assert!(second.authenticate("two").is_some() && second.authenticate("one").is_none());
        assert!(watched.changed().is_none(), "reported once");
        std::fs::write(&path, "[[tenant]]\nname = 3\n").expect("write");
        let e = watched
            .changed()
            .expect("a change")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tenants.toml"), "{e}");
        assert!(watched.changed().is_none(), "a bad edit is reported once");
        std::fs::write(&path, "").expect("write");
        let e = watched
            .changed()
            .expect("a change")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no [[tenant]] entries"), "{e}");
        std::fs::remove_file(&path).expect("remove");
        assert!(
            watched.changed().is_none(),
            "a missing file keeps the tenants"
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let e = Tenants::parse("[[tenant]]\nname = \"a\"\ntoken-sha256 = \"xyz\"\n").unwrap_err();
        assert!(e.contains("64 hex digits"), "{e}");
        let h = hash_token("t");
        let e = Tenants::parse(&format!(
            "[[tenant]]\nname = \"a\"\ntoken-sha256 = \"{h}\"\ntopic-prefix = \"b.\"\n"
        ))
        .unwrap_err();
        assert!(e.contains("must start with \"a.\""), "{e}");
        let e = Tenants::parse(&format!(
            "[[tenant]]\nname = \"a\"\ntoken-sha256 = \"{h}\"\n[[tenant]]\nname = \"b\"\ntoken-sha256 = \"{h}\"\n"
        ))
        .unwrap_err();
        assert!(e.contains("own token"), "{e}");
        // `evil`'s processor `acme_w` would derive `evil.acme_w-…`, which
        // Kafka takes for `evil_acme.w-…` (before: both loaded, and the
        // first deploy blocked the other tenant's with InvalidTopic).
        let h2 = hash_token("u");
        let e = Tenants::parse(&format!(
            "[[tenant]]\nname = \"evil\"\ntoken-sha256 = \"{h}\"\n[[tenant]]\nname = \"evil_acme\"\ntoken-sha256 = \"{h2}\"\n"
        ))
        .unwrap_err();
        assert!(e.contains("\"evil\" and \"evil_acme\" collide"), "{e}");
        assert!(e.contains("\"acme_x\""), "{e}");
        // Names that only share a start are fine.
        Tenants::parse(&format!(
            "[[tenant]]\nname = \"evil\"\ntoken-sha256 = \"{h}\"\n[[tenant]]\nname = \"evil-acme\"\ntoken-sha256 = \"{h2}\"\n"
        ))
        .expect("no folding collision");
    }

    /// 40 partitions x 60 MiB: one instance per partition, 2,400 MiB on one
    /// host (before: admitted, and the host grew to 2.51 GB).
    #[test]
    fn guest_memory_counts_every_partitions_instance() {
        let t = tenants();
        let acme = t.get("acme").expect("acme");
        let mut m = manifest("acme", "acme.in", "acme.out", 1);
        m.limits.memory_mb = 60;
        let e = acme.admit(&m, 40, &[]).unwrap_err();
        assert!(
            e.contains("40 input partitions x limits.memory-mb = 60 MiB would make 2400 MiB"),
            "{e}"
        );
        acme.admit(&m, 30, &[]).expect("1800 MiB is within 2048");
        let other = Existing {
            name: "other".into(),
            worker_threads: 1,
            guest_memory_mb: 300,
        };
        let e = acme.admit(&m, 30, &[other]).unwrap_err();
        assert!(e.contains("2100 MiB"), "{e}");
    }

    #[test]
    fn call_deadlines_and_log_rates_are_under_quota() {
        let t = tenants();
        let acme = t.get("acme").expect("acme");
        let mut m = manifest("acme", "acme.in", "acme.out", 1);
        m.limits.timeout_ms = 600_000;
        let e = acme.admit(&m, 1, &[]).unwrap_err();
        assert!(
            e.contains("limits.timeout-ms = 600000 exceeds your quota of 60000 ms"),
            "{e}"
        );
        m.limits.timeout_ms = 60_000;
        m.limits.log_lines_per_second = 1_000_000;
        let e = acme.admit(&m, 1, &[]).unwrap_err();
        assert!(
            e.contains("limits.log-lines-per-second = 1000000 exceeds your quota"),
            "{e}"
        );
        m.limits.log_lines_per_second = 1_000;
        acme.admit(&m, 1, &[]).expect("within quota");
    }
}
