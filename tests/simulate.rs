//! The deterministic simulation of the exactly-once protocol (issue 41;
//! the simulator is `tests/sim/`). CI runs 10,000 seeds of today's logic,
//! and shows that the simulation sees the two holes it must see: the abort
//! that purged produce requests in flight, and a rebalance callback that
//! commits with the rejoined generation. `scripts/simulate` runs as many
//! seeds as asked, or one seed with its trace.
//!
//! Settings: `ONCEFLOW_SIM_SEEDS` (default 10,000), `ONCEFLOW_SIM_SEED` (the
//! first seed, default 0), `ONCEFLOW_SIM_LOGIC` (`production`, `purge` or
//! `late-revoke`: the logic `explore_seeds` runs, default production),
//! `ONCEFLOW_SIM_TRACE=1` (print the trace of the first seed run).
//! Figures are printed as `FIGURE sim_<name> <value>`.

mod sim;

use sim::{Logic, Totals};

fn setting<T: std::str::FromStr>(name: &str) -> Option<T> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a valid value for {name}")),
    )
}

fn figures(label: &str, t: &Totals) {
    println!("FIGURE sim_{label}_seeds {}", t.seeds);
    println!("FIGURE sim_{label}_steps {}", t.steps);
    println!("FIGURE sim_{label}_commits {}", t.commits);
    println!("FIGURE sim_{label}_aborts {}", t.aborts);
    let f = &t.faults;
    for (kind, n) in [
        ("slow_connections", f.slow),
        ("responses_dropped", f.dropped),
        ("requests_duplicated", f.duplicated),
        ("rebalances", f.rebalances),
        ("crashes", f.crashes),
        ("zombies", f.zombies),
        ("transactions_expired", f.expired_txns),
    ] {
        println!("FIGURE sim_{label}_faults_{kind} {n}");
    }
}

#[test]
fn explore_seeds() {
    let seeds = setting("ONCEFLOW_SIM_SEEDS").unwrap_or(10_000);
    let first = setting("ONCEFLOW_SIM_SEED").unwrap_or(0);
    let name: String = setting("ONCEFLOW_SIM_LOGIC").unwrap_or_else(|| "production".to_owned());
    let logic = Logic::named(&name).unwrap_or_else(|| {
        panic!("ONCEFLOW_SIM_LOGIC={name:?}: use production, purge or late-revoke")
    });
    if setting::<u8>("ONCEFLOW_SIM_TRACE") == Some(1) {
        let outcome = sim::run(first, logic, true);
        println!("{}", outcome.trace.join("\n"));
        println!("seed {first}: {:?}", outcome.violation);
    }
    let started = std::time::Instant::now();
    let (totals, failure) = sim::explore(first, seeds, logic);
    figures(&name.replace('-', "_"), &totals);
    println!(
        "simulate: {} seeds from {first} under {name} in {:.1} s",
        totals.seeds,
        started.elapsed().as_secs_f64()
    );
    if let Some(outcome) = failure {
        panic!("{}", sim::report(&outcome, &name));
    }
}

/// Runs 10,000 seeds of an old `logic`: the simulation must find its hole.
fn find(logic: Logic, name: &str) -> sim::Outcome {
    let (totals, failure) = sim::explore(0, 10_000, logic);
    let outcome = failure.unwrap_or_else(|| {
        panic!("the {name} logic survived 10,000 seeds: the simulation cannot see its hole")
    });
    let label = name.replace('-', "_");
    println!("FIGURE sim_{label}_found_at_seed {}", outcome.seed);
    println!("FIGURE sim_{label}_seeds_run {}", totals.seeds);
    println!("{}", sim::report(&outcome, name));
    outcome
}

/// The simulation sees the duplicate of the abort that purged requests in
/// flight (before issue 41's fix).
#[test]
fn finds_the_purge_duplicate() {
    let outcome = find(Logic::PURGE, "purge");
    let violation = outcome.violation.as_deref().unwrap_or_default();
    assert!(violation.starts_with("Duplicate"), "{violation}");
}

/// The simulation sees a rebalance callback that commits with the
/// rejoined generation (the guard removed).
#[test]
fn finds_the_late_revoke_commit() {
    let outcome = find(Logic::LATE_REVOKE, "late-revoke");
    let violation = outcome.violation.as_deref().unwrap_or_default();
    assert!(
        violation.starts_with("SpansGenerations") || violation.starts_with("Duplicate"),
        "{violation}"
    );
}
