//! `server.properties` of one combined (broker and controller) KRaft node:
//! stock settings except what a small local cluster needs.

use std::fmt::Write as _;
use std::path::Path;

use super::security::{security_properties, KafkaSecurity, SECURE_LISTENER};
use crate::cluster::HOST;

/// Where a node listens: the broker listener (clients), the CONTROLLER
/// listener (the Raft quorum) and, on a secured node, the SASL_SSL
/// listener ([`super::security`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodePorts {
    pub broker: u16,
    pub controller: u16,
    pub secure: Option<u16>,
}

/// The brokers' session timeout and heartbeat interval of consumer-protocol
/// groups, and the bounds that let them be that short.
const CONSUMER_GROUP_TIMING: [(&str, &str); 4] = [
    ("group.consumer.min.session.timeout.ms", "3000"),
    ("group.consumer.session.timeout.ms", "3000"),
    ("group.consumer.min.heartbeat.interval.ms", "1000"),
    ("group.consumer.heartbeat.interval.ms", "1000"),
];

/// `server.properties` for node `node_id` of a cluster whose nodes listen
/// on `all` (node ids 1..=all.len(), every node a voter), with its data in
/// `data_dir`. Clients are told to connect to `advertised` (`HOST:PORT`),
/// by default the node's own broker listener. With `security`, the node
/// also has a SASL_SSL listener on `all[node_id - 1].secure`.
pub(crate) fn server_properties(
    node_id: usize,
    all: &[NodePorts],
    data_dir: &Path,
    advertised: Option<&str>,
    security: Option<&KafkaSecurity>,
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
    let secure = match (security, me.secure) {
        (Some(_), Some(port)) => format!(",{SECURE_LISTENER}://{HOST}:{port}"),
        _ => String::new(),
    };
    set(
        "listeners",
        &format!(
            "PLAINTEXT://{HOST}:{},CONTROLLER://{HOST}:{}{secure}",
            me.broker, me.controller
        ),
    );
    let advertised = match advertised {
        Some(a) => a.to_owned(),
        None => format!("{HOST}:{}", me.broker),
    };
    set(
        "advertised.listeners",
        &format!("PLAINTEXT://{advertised}{secure}"),
    );
    set("controller.listener.names", "CONTROLLER");
    set("inter.broker.listener.name", "PLAINTEXT");
    let secure_map = if secure.is_empty() {
        String::new()
    } else {
        format!(",{SECURE_LISTENER}:{SECURE_LISTENER}")
    };
    set(
        "listener.security.protocol.map",
        &format!("PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT{secure_map}"),
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
    // Groups of Kafka 4's consumer protocol (`group.protocol=consumer`)
    // take their session timeout and heartbeat interval from the broker
    // (the clients cannot set them): 3 s and 1 s instead of 45 s and 5 s,
    // so that a killed member's partitions move, and its restart under the
    // same group.instance.id joins, within seconds (docs/operations.md).
    for (key, value) in CONSUMER_GROUP_TIMING {
        set(key, value);
    }
    if let Some(security) = security {
        s.push_str(&security_properties(security));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::kafka::ListenerAuth;

    #[test]
    fn a_single_node_lowers_the_internal_topics_replication() {
        let ports = [NodePorts {
            broker: 9092,
            controller: 9093,
            secure: None,
        }];
        let text = server_properties(1, &ports, Path::new("/tmp/d"), None, None);
        for line in [
            "node.id=1",
            "controller.quorum.voters=1@127.0.0.1:9093",
            "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
            "advertised.listeners=PLAINTEXT://127.0.0.1:9092",
            "log.dirs=/tmp/d",
            "offsets.topic.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "group.consumer.session.timeout.ms=3000",
            "group.consumer.heartbeat.interval.ms=1000",
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
                secure: None,
            })
            .collect();
        let text = server_properties(2, &ports, Path::new("/d"), Some("127.0.0.1:7000"), None);
        assert!(text.contains(
            "controller.quorum.voters=1@127.0.0.1:9001,2@127.0.0.1:9003,3@127.0.0.1:9005"
        ));
        assert!(text.contains("node.id=2\n"));
        assert!(text.contains("advertised.listeners=PLAINTEXT://127.0.0.1:7000\n"));
        assert!(text.contains("listeners=PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9003\n"));
        assert!(!text.contains("replication.factor"), "{text}");
        assert!(
            !text.contains("SASL") && !text.contains("authorizer"),
            "{text}"
        );
    }

    #[test]
    fn a_secured_node_adds_a_sasl_ssl_listener_and_the_authorizer() {
        let ports = [NodePorts {
            broker: 9092,
            controller: 9093,
            secure: Some(9094),
        }];
        let security = KafkaSecurity {
            ca_pem: String::new(),
            cert_pem: "C".into(),
            key_pem: "K".into(),
            auth: ListenerAuth::Scram(Vec::new()),
            super_users: Vec::new(),
        };
        let text = server_properties(1, &ports, Path::new("/d"), None, Some(&security));
        for line in [
            "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093,SASL_SSL://127.0.0.1:9094",
            "advertised.listeners=PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9094",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
            "super.users=User:ANONYMOUS",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
