//! The integration tests on a real Kafka (clusters started through
//! scripts/kafka, see tests/common/cluster.rs), one at a time: `cargo test
//! -p onceflow --test kafka -- --test-threads=1 --nocapture`. Figures are
//! printed as `FIGURE name value` lines (hence --nocapture).
//!
//! Single-threaded, libtest runs the tests in the alphabetical order of their
//! full names; the modules' letters keep the suite's order: exactly-once with
//! the Rust wallet, then the ported wallets (both on the shared cluster),
//! then the control plane (on its own cluster), then the network-fault drill
//! (three brokers behind a fault proxy; scripts/drill runs it alone, longer),
//! then the hardening of the exactly-once path, item by item (issue 16),
//! then SASL_SSL to the brokers (one node of its own with ACLs enforced),
//! then windows and stream time (the pageviews example against a model and
//! against Kafka Streams), then tables and joins (the fraud example, the
//! same), then co-partitioning with two inputs through hosts joining and
//! leaving (no task with two owners, from the assignments and from the
//! changelog's producers in the broker's log segments), then the PostgreSQL
//! sink (scripts/postgres) through kills, a zombie and a database restart,
//! against a naive sink, its tenants, and one short round of its drill
//! (scripts/drill --sink runs it longer).

mod common;

#[path = "kafka/eos.rs"]
mod a_eos;
#[path = "kafka/languages_eos.rs"]
mod b_languages_eos;
#[path = "kafka/control_plane.rs"]
mod c_control_plane;
#[path = "kafka/drill.rs"]
mod d_drill;
#[path = "kafka/hardening.rs"]
mod e_hardening;
#[path = "kafka/sasl.rs"]
mod f_sasl;
#[path = "kafka/windows.rs"]
mod g_windows;
#[path = "kafka/joins.rs"]
mod h_joins;
#[path = "kafka/copartition.rs"]
mod i_copartition;
#[path = "kafka/sink.rs"]
mod j_sink;
#[path = "kafka/sink_tenants.rs"]
mod k_sink_tenants;
#[path = "kafka/sink_drill.rs"]
mod l_sink_drill;
#[path = "kafka/replay.rs"]
mod m_replay;
