//! What a [`super::KafkaCluster`] starts: its nodes, what they advertise,
//! their features and settings, security and JVM.

use std::sync::Arc;

use super::node::Jvm;
use super::security::KafkaSecurity;

/// Given a node's id and its broker port, the `HOST:PORT` it advertises to
/// clients (e.g. a fault-injecting proxy that this call points at the
/// port). Called before the node starts, and again with new ports if a
/// start is retried.
pub type Advertise = Arc<dyn Fn(usize, u16) -> String + Send + Sync>;

/// What to start.
#[derive(Clone)]
pub struct KafkaOptions {
    /// Combined broker-controller nodes, every one a voter (1 or 3).
    pub nodes: usize,
    /// What each node advertises; by default its own broker listener.
    pub advertise: Option<Advertise>,
    /// Feature levels the storage is formatted with (`--feature
    /// name=level`), e.g. `eligible.leader.replicas.version=0` for a
    /// cluster without Eligible Leader Replicas; by default the release's.
    pub features: Vec<(String, u16)>,
    /// Broker settings added to every node's `server.properties` (they win
    /// over the defaults), e.g. a shorter `broker.session.timeout.ms` so a
    /// killed broker leaves the in-sync sets sooner.
    pub server_properties: Vec<(String, String)>,
    /// A SASL_SSL listener, SCRAM users and the authorizer
    /// ([`KafkaSecurity`]); none by default.
    pub security: Option<KafkaSecurity>,
    /// How the nodes' JVMs run ([`Jvm::Test`] by default).
    pub jvm: Jvm,
}

impl Default for KafkaOptions {
    fn default() -> Self {
        KafkaOptions {
            nodes: 1,
            advertise: None,
            features: Vec::new(),
            server_properties: Vec::new(),
            security: None,
            jvm: Jvm::Test,
        }
    }
}

impl KafkaOptions {
    /// These options, with brokers that notice a killed broker within a
    /// few seconds (heartbeat 0.5 s, session 3 s, replica lag 5 s) rather
    /// than Kafka's 9 s plus a controller failover: for fault tests that
    /// wait for an in-sync set to shrink.
    #[must_use]
    pub fn quick_to_notice_failures(mut self) -> KafkaOptions {
        for (key, value) in [
            ("broker.heartbeat.interval.ms", "500"),
            ("broker.session.timeout.ms", "3000"),
            ("replica.lag.time.max.ms", "5000"),
        ] {
            self.server_properties
                .push((key.to_owned(), value.to_owned()));
        }
        self
    }
}

impl std::fmt::Debug for KafkaOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaOptions")
            .field("nodes", &self.nodes)
            .field("advertise", &self.advertise.is_some())
            .field("features", &self.features)
            .field("server_properties", &self.server_properties)
            .field("security", &self.security)
            .finish()
    }
}
