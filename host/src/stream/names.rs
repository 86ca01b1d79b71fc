//! The names a deployment owns in Kafka, derived from its manifest, and
//! where they collide.
//!
//! | name | form |
//! |---|---|
//! | consumer group | `<tenant>.<name>` (the application id) |
//! | changelog topic of a store | `<tenant>.<name>-<store>-changelog` ([`changelog_topic`]) |
//! | transactional id of worker `n` | `<tenant>.<name>-<instance>-<n>` ([`transactional_id`]) |
//! | replay topic | `<tenant>.<name>-onceflow.replay-changelog` (the changelog of the host's store `onceflow.replay`: [`super::replay::replay_topic`]) |
//!
//! Names, stores and instance ids may contain `-`, so two deployments can
//! derive the same changelog (`orders` + store `by-customer` and
//! `orders-by` + store `customer`) or, on hosts whose ids contain `-`, the
//! same transactional ids. The names are not changed (a manifest deployed
//! yesterday must find its topics today): colliding deployments are
//! refused instead, by `onceflow validate` and `run` for one manifest
//! ([`own_conflicts`]) and by the fleet at deploy time for two
//! ([`conflicts_between`]).
//!
//! Kafka also refuses a topic whose name differs from an existing one only
//! by `.` against `_` (their metric names would be one), so topic names are
//! compared with [`topic_collision_key`].
//!
//! Some topic names are Onceflow's own and no manifest or sink may name
//! them ([`Reserved`]): changelogs (anything ending in `-changelog`, the
//! form above, so also the changelog of a store not yet added), and the
//! host's internal topics (`_onceflow.*`: registry, components, grants,
//! statuses, usage, logs). A deployment's dead-letter topic is the host's
//! to write: its records' `onceflow.error.*` headers say where a record
//! failed, and `onceflow verify` and readers trust them, so no output may
//! write it, neither the deployment's own ([`own_conflicts`]) nor another
//! deployment's ([`conflicts_between`]). `onceflow validate` and `run`
//! refuse such writes; the fleet refuses every use, reads included
//! (`fleet::tenancy`, and a sink's topics at deploy).

use super::changelog_topic;
use crate::manifest::{ErrorPolicy, Manifest};

/// The transactional id (and client id) of worker `n` of a deployment on
/// instance `instance`. Must stay what `worker::Session::start` uses.
pub fn transactional_id(application_id: &str, instance: &str, n: u32) -> String {
    format!("{application_id}-{instance}-{n}")
}

/// What Kafka compares when it checks a new topic against existing ones:
/// `.` and `_` are the same character to it.
pub fn topic_collision_key(topic: &str) -> String {
    topic.replace('.', "_")
}

/// A topic name Onceflow keeps for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    /// Ends in `-changelog`: a state store's changelog
    /// (`<tenant>.<name>-<store>-changelog`), which only the host writes,
    /// in the transaction of the state change it records.
    Changelog,
    /// Starts with `_onceflow.` (or, to Kafka the same, `_onceflow_`): the
    /// host's registry, components, grants, statuses, usage and logs.
    Internal,
}

/// What every internal topic starts with (`fleet::registry`).
const INTERNAL_PREFIX: &str = "_onceflow.";
/// What every changelog topic ends with ([`changelog_topic`]).
const CHANGELOG_SUFFIX: &str = "-changelog";

impl Reserved {
    /// Whether `topic` is a name Onceflow reserves, and which kind.
    pub fn of(topic: &str) -> Option<Self> {
        if topic.ends_with(CHANGELOG_SUFFIX) {
            Some(Self::Changelog)
        } else if topic_collision_key(topic).starts_with(&topic_collision_key(INTERNAL_PREFIX)) {
            Some(Self::Internal)
        } else {
            None
        }
    }

    /// The refusal of `topic` at `key` (`outputs.audit`, `routes[0].topic`):
    /// what the name is reserved for and what to use instead.
    pub fn refusal(self, key: &str, topic: &str) -> String {
        match self {
            Self::Changelog => {
                let stem = topic.trim_end_matches(CHANGELOG_SUFFIX);
                format!(
                    "{key}: topic {topic:?} is reserved: names ending in \"{CHANGELOG_SUFFIX}\" \
                     are state changelogs (<tenant>.<name>-<store>-changelog), which only the \
                     host writes; use a name that does not end in \"{CHANGELOG_SUFFIX}\" \
                     (e.g. \"{stem}-changes\"), and read a store's values with `onceflow query`"
                )
            }
            Self::Internal => format!(
                "{key}: topic {topic:?} is reserved: names starting with \"{INTERNAL_PREFIX}\" \
                 (or \"_onceflow_\", the same to Kafka) are the host's own topics (registry, \
                 components, statuses, usage, logs); use a topic of your own (read usage with \
                 `onceflow usage`, logs with `onceflow logs`)"
            ),
        }
    }
}

/// The first reserved name among `(key, topic)` pairs, as its refusal.
pub fn first_reserved<'a>(named: impl IntoIterator<Item = (String, &'a str)>) -> Option<String> {
    named
        .into_iter()
        .find_map(|(key, topic)| Reserved::of(topic).map(|r| r.refusal(&key, topic)))
}

/// Every topic a manifest names, with its key (`inputs`, `tables.<store>`,
/// `outputs.<alias>`, `errors.dead-letter-topic`).
pub fn named_topics(m: &Manifest) -> Vec<(String, &str)> {
    m.inputs
        .iter()
        .map(|t| ("inputs".to_owned(), t.as_str()))
        .chain(
            m.tables
                .iter()
                .map(|(s, t)| (format!("tables.{s}"), t.as_str())),
        )
        .chain(written_keys(m))
        .collect()
}

/// The topics a manifest writes (outputs, dead-letter topic), with their
/// keys.
fn written_keys(m: &Manifest) -> Vec<(String, &str)> {
    m.outputs
        .iter()
        .map(|(alias, t)| (format!("outputs.{alias}"), t.as_str()))
        .chain(
            m.errors
                .dead_letter_topic()
                .map(|t| ("errors.dead-letter-topic".to_owned(), t)),
        )
        .collect()
}

/// The topics a deployment writes besides its changelogs: its outputs and
/// its dead-letter topic, with what each is (for messages).
fn written_topics(m: &Manifest) -> Vec<(String, String)> {
    let mut topics = outputs(m);
    topics.extend(dead_letters(m));
    topics
}

/// A deployment's outputs, with what each is (for messages).
fn outputs(m: &Manifest) -> Vec<(String, String)> {
    m.outputs
        .iter()
        .map(|(alias, topic)| (topic.clone(), format!("output {alias:?}")))
        .collect()
}

/// A deployment's dead-letter topic, if any, with what it is.
fn dead_letters(m: &Manifest) -> Vec<(String, String)> {
    match &m.errors {
        ErrorPolicy::DeadLetter { topic } => {
            vec![(topic.clone(), "dead-letter topic".to_owned())]
        }
        _ => Vec::new(),
    }
}

/// Each store's changelog topic.
fn changelogs(m: &Manifest) -> Vec<(String, String)> {
    m.stores
        .iter()
        .map(|s| (changelog_topic(m, s), format!("changelog of store {s:?}")))
        .collect()
}

/// Where one manifest's derived names collide with each other or with its
/// own topics: a store's changelog that is (to Kafka) another store's, an
/// input, an output or the dead-letter topic. Also where it would write
/// what only the host writes: an output or dead-letter topic with a
/// [`Reserved`] name, or an output that is its dead-letter topic (the guest
/// could forge dead letters, `onceflow.error.*` headers and all). Each
/// entry names the key and says what to rename.
pub fn own_conflicts(m: &Manifest) -> Vec<String> {
    let logs = changelogs(m);
    let mut found: Vec<String> = written_keys(m)
        .into_iter()
        .filter_map(|(key, topic)| Reserved::of(topic).map(|r| r.refusal(&key, topic)))
        .collect();
    if let Some(dlq) = m.errors.dead_letter_topic() {
        for (alias, topic) in &m.outputs {
            if topic_collision_key(topic) == topic_collision_key(dlq) {
                found.push(format!(
                    "outputs.{alias}: topic {topic:?} is also errors.dead-letter-topic \
                     ({dlq:?}): dead letters are the host's to write (their onceflow.error.* \
                     headers say where a record failed, and readers and `onceflow verify` \
                     trust them); send this output to a topic of its own, or give the dead \
                     letters another topic"
                ));
            }
        }
    }
    for (i, (topic, what)) in logs.iter().enumerate() {
        for (other, other_what) in &logs[i + 1..] {
            if topic_collision_key(topic) == topic_collision_key(other) {
                found.push(format!(
                    "the {what} ({topic:?}) and the {other_what} ({other:?}) are one topic to \
                     Kafka ('.' and '_' are the same character to it): rename one of the stores"
                ));
            }
        }
        let declared = m
            .inputs
            .iter()
            .map(|t| (t.clone(), "input".to_owned()))
            .chain(
                m.tables
                    .iter()
                    .map(|(s, t)| (t.clone(), format!("table {s}'s topic"))),
            )
            .chain(written_topics(m));
        for (other, other_what) in declared {
            if topic_collision_key(topic) == topic_collision_key(&other) {
                found.push(format!(
                    "the {what} is {topic:?}, which is also its {other_what} {other:?}: rename \
                     that topic or the store"
                ));
            }
        }
    }
    found
}

/// A name of one deployment that another deployment owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The new deployment's name, and what it is.
    pub mine: String,
    /// The other deployment's name, and what it is.
    pub theirs: String,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "its {} is the other's {}", self.mine, self.theirs)
    }
}

/// Where deployment `new` would use a name that deployment `old` owns:
/// the same changelog topic (shared state; a purge of one deletes the
/// other's), a changelog of one that the other writes as an output or dead
/// letters, an output of one that is the other's dead-letter topic (its
/// guest could forge the other's dead letters), or, on the given hosts, the
/// same transactional ids (each would fence the other's producers). Two
/// deployments may share a dead-letter topic. `hosts` are the instance ids
/// the deployments run with (every live host of the fleet).
pub fn conflicts_between(new: &Manifest, old: &Manifest, hosts: &[String]) -> Vec<Conflict> {
    let mut found = Vec::new();
    let (new_logs, old_logs) = (changelogs(new), changelogs(old));
    let old_owned: Vec<(String, String)> = old_logs
        .iter()
        .cloned()
        .chain(written_topics(old))
        .collect();
    let mut compare = |mine: &[(String, String)], theirs: &[(String, String)]| {
        for (topic, what) in mine {
            for (other, other_what) in theirs {
                if topic_collision_key(topic) != topic_collision_key(other) {
                    continue;
                }
                let alike = if topic == other {
                    ""
                } else {
                    " ('.' and '_' are the same character to Kafka)"
                };
                found.push(Conflict {
                    mine: format!("{what} {topic:?}"),
                    theirs: format!("{other_what} {other:?}{alike}"),
                });
            }
        }
    };
    compare(&new_logs, &old_owned);
    compare(&written_topics(new), &old_logs);
    compare(&outputs(new), &dead_letters(old));
    compare(&dead_letters(new), &outputs(old));
    let (new_app, old_app) = (new.application_id(), old.application_id());
    for h in hosts {
        for h2 in hosts {
            let id = transactional_id(&new_app, h, 0);
            if id == transactional_id(&old_app, h2, 0) {
                let prefix = id.trim_end_matches("-0");
                found.push(Conflict {
                    mine: format!("transactional ids on host {h:?} ({prefix}-<n>)"),
                    theirs: format!("transactional ids on host {h2:?}"),
                });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn manifest(name: &str, stores: &[&str], extra: &str) -> Manifest {
        let stores: Vec<String> = stores.iter().map(|s| format!("{s:?}")).collect();
        Manifest::parse(
            &format!(
                "name = {name:?}\ntenant = \"acme\"\ninputs = [\"acme.in\"]\nstores = [{}]\n{extra}\n[build]\nlanguage = \"rust\"\n",
                stores.join(", ")
            ),
            PathBuf::from("onceflow.toml"),
        )
        .expect("a valid manifest")
    }

    #[test]
    fn hyphens_make_two_deployments_share_a_changelog() {
        let orders = manifest("orders", &["by-customer"], "");
        let orders_by = manifest("orders-by", &["customer"], "");
        let found = conflicts_between(&orders_by, &orders, &["h1".into()]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0]
                .to_string()
                .contains("\"acme.orders-by-customer-changelog\""),
            "{found:?}"
        );
        // Unrelated names do not conflict.
        let other = manifest("payments", &["by-customer"], "");
        assert!(conflicts_between(&other, &orders, &["h1".into()]).is_empty());
        // A dot against an underscore is a collision to Kafka.
        let dotted = manifest("orders", &["by.customer"], "");
        let underscored = manifest("orders", &["by_customer"], "");
        assert_eq!(conflicts_between(&dotted, &underscored, &[]).len(), 1);
    }

    #[test]
    fn writing_into_another_deployments_changelog_is_a_conflict() {
        let orders = manifest("orders", &["totals"], "");
        let writer = manifest(
            "writer",
            &[],
            "[outputs]\nx = \"acme.orders-totals-changelog\"",
        );
        assert_eq!(conflicts_between(&writer, &orders, &[]).len(), 1);
        assert_eq!(conflicts_between(&orders, &writer, &[]).len(), 1);
    }

    #[test]
    fn transactional_ids_collide_only_through_hyphenated_host_ids() {
        let orders = manifest("orders", &[], "");
        let orders_by = manifest("orders-by", &[], "");
        let plain = ["ia1b2".to_owned(), "ic3d4".to_owned()];
        assert!(conflicts_between(&orders_by, &orders, &plain).is_empty());
        let hyphenated = ["h1".to_owned(), "by-h1".to_owned()];
        let found = conflicts_between(&orders_by, &orders, &hyphenated);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].to_string().contains("acme.orders-by-h1-<n>"),
            "{found:?}"
        );
    }

    #[test]
    fn a_manifests_own_names_collide() {
        let twins = manifest("w", &["by.day", "by_day"], "");
        assert_eq!(own_conflicts(&twins).len(), 1);
        let feeds_itself = manifest("w", &["s"], "[outputs]\nx = \"acme.w-s-changelog\"");
        let found = own_conflicts(&feeds_itself);
        assert_eq!(found.len(), 2, "reserved, and its own changelog: {found:?}");
        assert!(found[1].contains("output \"x\""), "{found:?}");
        assert!(own_conflicts(&manifest("w", &["a", "b"], "")).is_empty());
    }

    /// Issue 45: an output alias could name the deployment's own
    /// dead-letter topic, so its guest could emit records with forged
    /// `onceflow.error.*` headers among the host's dead letters (before:
    /// `own_conflicts` found nothing, and `validate`, `run` and the fleet
    /// took the manifest); and outputs or dead letters could go to
    /// changelogs or to the host's `_onceflow.*` topics.
    #[test]
    fn writes_into_reserved_names_are_refused_naming_the_key() {
        let dead_letter = "[errors]\npolicy = \"dead-letter\"\ndead-letter-topic = \"acme.dlq\"";
        let forger = manifest(
            "w",
            &[],
            &format!("[outputs]\nforged = \"acme.dlq\"\nok = \"acme.out\"\n{dead_letter}"),
        );
        let found = own_conflicts(&forger);
        assert_eq!(found.len(), 1, "{found:?}");
        for needle in ["outputs.forged", "\"acme.dlq\"", "errors.dead-letter-topic"] {
            assert!(found[0].contains(needle), "{needle:?} not in {found:?}");
        }
        // '.' against '_': one topic to Kafka.
        let folded = manifest(
            "w",
            &[],
            &format!("[outputs]\nforged = \"acme_dlq\"\n{dead_letter}"),
        );
        assert_eq!(own_conflicts(&folded).len(), 1);

        let cases = [
            // Another deployment's changelog, or one not derived yet.
            (
                "[outputs]\nx = \"acme.other-s-changelog\"",
                "outputs.x",
                "-changelog",
            ),
            (
                "[errors]\npolicy = \"dead-letter\"\ndead-letter-topic = \"acme.w-t-changelog\"",
                "errors.dead-letter-topic",
                "-changelog",
            ),
            (
                "[outputs]\nx = \"_onceflow.usage\"",
                "outputs.x",
                "_onceflow.",
            ),
            (
                "[outputs]\nx = \"_onceflow_logs.acme\"",
                "outputs.x",
                "_onceflow.",
            ),
            (
                "[errors]\npolicy = \"dead-letter\"\ndead-letter-topic = \"_onceflow.status\"",
                "errors.dead-letter-topic",
                "_onceflow.",
            ),
        ];
        for (extra, key, reason) in cases {
            let found = own_conflicts(&manifest("w", &["s"], extra));
            assert_eq!(found.len(), 1, "{extra}: {found:?}");
            let m = &found[0];
            assert!(
                m.starts_with(&format!("{key}: topic ")) && m.contains("reserved"),
                "{m}"
            );
            assert!(m.contains(reason) && m.contains("use "), "{m}");
        }
        // Reads are the fleet's to refuse (`Tenant::admit`): an operator's
        // own `onceflow run` may read a changelog.
        let reader = Manifest::parse(
            "name = \"r\"\ntenant = \"acme\"\ninputs = [\"acme.w-s-changelog\"]\n[build]\nlanguage = \"rust\"\n",
            PathBuf::from("onceflow.toml"),
        )
        .expect("a valid manifest");
        assert!(own_conflicts(&reader).is_empty());
        let named = named_topics(&reader);
        let refusal = first_reserved(named).expect("a reserved read");
        assert!(
            refusal.starts_with("inputs: topic \"acme.w-s-changelog\""),
            "{refusal}"
        );
    }

    #[test]
    fn one_deployment_may_not_write_anothers_dead_letters() {
        let dead_letter = "[errors]\npolicy = \"dead-letter\"\ndead-letter-topic = \"acme.dlq\"";
        let owner = manifest("a", &[], dead_letter);
        let forger = manifest("b", &[], "[outputs]\nx = \"acme.dlq\"");
        let found = conflicts_between(&forger, &owner, &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].mine, "output \"x\" \"acme.dlq\"");
        assert_eq!(found[0].theirs, "dead-letter topic \"acme.dlq\"");
        assert_eq!(conflicts_between(&owner, &forger, &[]).len(), 1);
        // A dead-letter topic shared by two deployments is fine.
        let sharer = manifest("c", &[], dead_letter);
        assert!(conflicts_between(&sharer, &owner, &[]).is_empty());
    }

    /// A manifest that deployed yesterday deploys today: no example uses a
    /// reserved name.
    #[test]
    fn the_examples_use_no_reserved_name() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut checked = 0;
        for entry in std::fs::read_dir(&root).expect("examples/") {
            let path = entry.expect("an entry").path().join("onceflow.toml");
            if !path.exists() {
                continue;
            }
            let m = Manifest::load(&path).expect("an example's manifest");
            assert!(own_conflicts(&m).is_empty(), "{}", path.display());
            assert_eq!(first_reserved(named_topics(&m)), None, "{}", path.display());
            checked += 1;
        }
        assert!(checked >= 10, "only {checked} examples");
    }
}
