//! `server.properties` of one combined (broker and controller) KRaft node:
//! stock settings except what a small local cluster needs.

use std::fmt::Write as _;
use std::path::Path;

use crate::cluster::HOST;

/// Where a node listens: the broker listener (clients) and the CONTROLLER
/// listener (the Raft quorum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodePorts {
    pub broker: u16,
    pub controller: u16,
}

/// `server.properties` for node `node_id` of a cluster whose nodes listen
/// on `all` (node ids 1..=all.len(), every node a voter), with its data in
/// `data_dir`. Clients are told to connect to `advertised` (`HOST:PORT`),
/// by default the node's own broker listener.
pub(crate) fn server_properties(
    node_id: usize,
    all: &[NodePorts],
    data_dir: &Path,
    advertised: Option<&str>,
) -> String {
    let me = all[node_id - 1];
    let voters: Vec<String> = all
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}@{HOST}:{}", i + 1, p.controller))
        .collect();
    let mut s = String::new();
    let mut set = |k: &str, v: &str| {
        let _ = writeln!(s, "{k}={v}");
    };
    set("process.roles", "broker,controller");
    set("node.id", &node_id.to_string());
    set("controller.quorum.voters", &voters.join(","));
    set(
        "listeners",
        &format!(
            "PLAINTEXT://{HOST}:{},CONTROLLER://{HOST}:{}",
            me.broker, me.controller
        ),
    );
    let advertised = match advertised {
        Some(a) => a.to_owned(),
        None => format!("{HOST}:{}", me.broker),
    };
    set("advertised.listeners", &format!("PLAINTEXT://{advertised}"));
    set("controller.listener.names", "CONTROLLER");
    set("inter.broker.listener.name", "PLAINTEXT");
    set(
        "listener.security.protocol.map",
        "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    );
    set("log.dirs", &data_dir.display().to_string());
    // The internal topics' defaults (3 replicas, 2 in sync) need three
    // brokers; a smaller cluster lowers them to what it has.
    if all.len() < 3 {
        let n = all.len().to_string();
        set("offsets.topic.replication.factor", &n);
        set("transaction.state.log.replication.factor", &n);
        set("transaction.state.log.min.isr", "1");
        set("share.coordinator.state.topic.replication.factor", &n);
        set("share.coordinator.state.topic.min.isr", "1");
    }
    // Groups form at once instead of after 3 s (as testcontainers does).
    set("group.initial.rebalance.delay.ms", "0");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_node_lowers_the_internal_topics_replication() {
        let ports = [NodePorts {
            broker: 9092,
            controller: 9093,
        }];
        let text = server_properties(1, &ports, Path::new("/tmp/d"), None);
        for line in [
            "node.id=1",
            "controller.quorum.voters=1@127.0.0.1:9093",
            "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
            "advertised.listeners=PLAINTEXT://127.0.0.1:9092",
            "log.dirs=/tmp/d",
            "offsets.topic.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    #[test]
    fn three_nodes_are_all_voters_with_stock_replication() {
        let ports: Vec<NodePorts> = (0..3)
            .map(|i| NodePorts {
                broker: 9000 + 2 * i,
                controller: 9001 + 2 * i,
            })
            .collect();
        let text = server_properties(2, &ports, Path::new("/d"), Some("127.0.0.1:7000"));
        assert!(text.contains(
            "controller.quorum.voters=1@127.0.0.1:9001,2@127.0.0.1:9003,3@127.0.0.1:9005"
        ));
        assert!(text.contains("node.id=2\n"));
        assert!(text.contains("advertised.listeners=PLAINTEXT://127.0.0.1:7000\n"));
        assert!(text.contains("listeners=PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9003\n"));
        assert!(!text.contains("replication.factor"), "{text}");
    }
}
