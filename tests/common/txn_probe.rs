//! A probe of a topic's open transactions.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::cluster::Cluster;

/// Sees whether a topic has an open transaction holding data: its last
/// stable offset (read_committed) behind its high watermark.
pub struct TxnProbe {
    committed: BaseConsumer,
    uncommitted: BaseConsumer,
    topic: String,
    partitions: Vec<i32>,
}

impl TxnProbe {
    pub fn new(cluster: &Cluster, topic: &str) -> TxnProbe {
        let client = |isolation: &str| -> BaseConsumer {
            ClientConfig::new()
                .set("bootstrap.servers", &cluster.bootstrap)
                .set("group.id", "txn-probe")
                .set("isolation.level", isolation)
                .create()
                .expect("probe consumer")
        };
        let committed = client("read_committed");
        let md = committed
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        let partitions = md.topics()[0].partitions().iter().map(|p| p.id()).collect();
        TxnProbe {
            committed,
            uncommitted: client("read_uncommitted"),
            topic: topic.to_owned(),
            partitions,
        }
    }

    /// Records in the topic, committed or not.
    pub fn end(&self) -> i64 {
        self.partitions
            .iter()
            .map(|&p| {
                self.uncommitted
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(5))
                    .map_or(0, |(_, h)| h)
            })
            .sum()
    }

    /// Records a read_committed reader can see (up to the last stable
    /// offsets).
    pub fn committed_end(&self) -> i64 {
        self.partitions
            .iter()
            .map(|&p| {
                self.committed
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(5))
                    .map_or(0, |(_, h)| h)
            })
            .sum()
    }

    pub fn open(&self) -> bool {
        self.partitions.iter().any(|&p| {
            let lso = self
                .committed
                .fetch_watermarks(&self.topic, p, Duration::from_secs(5));
            let hw = self
                .uncommitted
                .fetch_watermarks(&self.topic, p, Duration::from_secs(5));
            matches!((lso, hw), (Ok((_, l)), Ok((_, h))) if l < h)
        })
    }
}
