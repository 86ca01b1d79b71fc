//! The names a deployment owns in Kafka, derived from its manifest, and
//! where they collide.
//!
//! | name | form |
//! |---|---|
//! | consumer group | `<tenant>.<name>` (the application id) |
//! | changelog topic of a store | `<tenant>.<name>-<store>-changelog` ([`changelog_topic`]) |
//! | transactional id of worker `n` | `<tenant>.<name>-<instance>-<n>` ([`transactional_id`]) |
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

/// The topics a deployment writes besides its changelogs: its outputs and
/// its dead-letter topic, with what each is (for messages).
fn written_topics(m: &Manifest) -> Vec<(String, String)> {
    let mut topics: Vec<(String, String)> = m
        .outputs
        .iter()
        .map(|(alias, topic)| (topic.clone(), format!("output {alias:?}")))
        .collect();
    if let ErrorPolicy::DeadLetter { topic } = &m.errors {
        topics.push((topic.clone(), "dead-letter topic".to_owned()));
    }
    topics
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
/// input, an output or the dead-letter topic. Each entry says what to
/// rename.
pub fn own_conflicts(m: &Manifest) -> Vec<String> {
    let logs = changelogs(m);
    let mut found = Vec::new();
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
/// letters, or, on the given hosts, the same transactional ids (each would
/// fence the other's producers). `hosts` are the instance ids the
/// deployments run with (every live host of the fleet).
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
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("output \"x\""), "{found:?}");
        assert!(own_conflicts(&manifest("w", &["a", "b"], "")).is_empty());
    }
}
