//! Throwaway brokers for tests: Apache Kafka ([`KafkaCluster`], the broker
//! walrelay's users run) and Tansu ([`TansuBroker`], a small
//! Kafka-compatible broker that starts in a tenth of a second), behind one
//! API, [`TestBroker`].
//!
//! Suites that can run on either pick the broker with `WALRELAY_BROKER`
//! (`tansu`, the default, or `kafka`): [`TestBroker::start`]. On Kafka,
//! the tests of one test binary share nodes ([`SharedKafka`]); on Tansu
//! each test has its own broker.

use std::fmt;

use anyhow::bail;

mod admin;
pub mod kafka;
mod tansu;
pub(crate) mod util;

pub use kafka::{
    AclOperation, AclResource, Jvm, KafkaCluster, KafkaHome, KafkaNode, KafkaOptions,
    KafkaSecurity, ListenerAuth, OAuthValidation, ScramUser, SharedKafka,
};
pub use tansu::{TansuBroker, TANSU_BIN_ENV};
pub use util::KEEP_BROKER_ENV;

/// Environment variable choosing the broker of [`TestBroker::start`]:
/// `tansu` (the default) or `kafka`.
pub const BROKER_ENV: &str = "WALRELAY_BROKER";

/// Which broker implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokerKind {
    /// Apache Kafka (KRaft), from `scripts/install-kafka.sh`.
    Kafka,
    /// Tansu with in-memory storage, from `scripts/install-tansu.sh`.
    Tansu,
}

impl BrokerKind {
    /// From `$WALRELAY_BROKER`; Tansu when unset or empty.
    pub fn from_env() -> anyhow::Result<BrokerKind> {
        match std::env::var(BROKER_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(BrokerKind::Tansu),
            Ok(v) if v.is_empty() => Ok(BrokerKind::Tansu),
            Ok(v) => v.parse(),
            Err(e) => bail!("{BROKER_ENV}: {e}"),
        }
    }
}

impl std::str::FromStr for BrokerKind {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<BrokerKind> {
        match s.to_ascii_lowercase().as_str() {
            "kafka" | "apache-kafka" => Ok(BrokerKind::Kafka),
            "tansu" => Ok(BrokerKind::Tansu),
            other => bail!("{BROKER_ENV}={other:?}: expected \"kafka\" or \"tansu\""),
        }
    }
}

impl fmt::Display for BrokerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BrokerKind::Kafka => "Apache Kafka",
            BrokerKind::Tansu => "Tansu",
        })
    }
}

/// A broker for one test, of either kind. Dropping it removes the Tansu
/// broker, or hands the Kafka node back to the pool with its topics
/// deleted.
#[derive(Debug)]
pub struct TestBroker {
    backend: Backend,
}

#[derive(Debug)]
enum Backend {
    /// A node shared with the binary's other tests, one at a time.
    Kafka(SharedKafka),
    /// A cluster of this test's own (e.g. one that advertises a proxy).
    KafkaOwn(KafkaCluster),
    Tansu(TansuBroker),
}

impl TestBroker {
    /// A broker of the kind `$WALRELAY_BROKER` names. Blocking.
    pub fn start() -> anyhow::Result<TestBroker> {
        Self::start_kind(BrokerKind::from_env()?)
    }

    /// A broker of `kind`: a leased single Kafka node, or a new Tansu.
    pub fn start_kind(kind: BrokerKind) -> anyhow::Result<TestBroker> {
        let backend = match kind {
            BrokerKind::Kafka => Backend::Kafka(SharedKafka::lease()?),
            BrokerKind::Tansu => Backend::Tansu(TansuBroker::start()?),
        };
        Ok(TestBroker { backend })
    }

    /// A broker of `kind` of the caller's own, running as its users run
    /// it: for Apache Kafka, the JVM of Kafka's start scripts
    /// ([`Jvm::Stock`]: 1 GB heap, G1) rather than the tests' small serial
    /// one, whose collection pauses would show in every latency. For the
    /// bench.
    pub fn start_own_stock(kind: BrokerKind) -> anyhow::Result<TestBroker> {
        Self::start_own_jvm(kind, Jvm::Stock)
    }

    /// As [`TestBroker::start_own_stock`], with the Kafka node's JVM run as
    /// `jvm` says (Tansu has none).
    pub fn start_own_jvm(kind: BrokerKind, jvm: Jvm) -> anyhow::Result<TestBroker> {
        let backend = match kind {
            BrokerKind::Kafka => Backend::KafkaOwn(KafkaCluster::start(KafkaOptions {
                jvm,
                ..KafkaOptions::default()
            })?),
            BrokerKind::Tansu => Backend::Tansu(TansuBroker::start()?),
        };
        Ok(TestBroker { backend })
    }

    /// A broker of `kind` of the caller's own, never shared (e.g. for the
    /// demo, which prints what it does and removes it at the end).
    pub fn start_own(kind: BrokerKind) -> anyhow::Result<TestBroker> {
        let backend = match kind {
            BrokerKind::Kafka => Backend::KafkaOwn(KafkaCluster::start(KafkaOptions::default())?),
            BrokerKind::Tansu => Backend::Tansu(TansuBroker::start()?),
        };
        Ok(TestBroker { backend })
    }

    /// A broker of `kind` of this test's own that tells clients (in its
    /// metadata) to connect to `advertised` (`HOST:PORT`) instead of its
    /// listener: a fault-injecting TCP proxy in front of it. `on_port` gets
    /// the broker's own port before it is checked for readiness (and again
    /// if a start is retried on other ports), so the proxy can forward to
    /// it by then.
    pub fn start_advertising(
        kind: BrokerKind,
        advertised: &str,
        on_port: impl Fn(u16) + Send + Sync + 'static,
    ) -> anyhow::Result<TestBroker> {
        let backend = match kind {
            BrokerKind::Kafka => {
                let advertised = advertised.to_owned();
                let advertise: kafka::Advertise = std::sync::Arc::new(move |_, port| {
                    on_port(port);
                    advertised.clone()
                });
                Backend::KafkaOwn(KafkaCluster::start(KafkaOptions {
                    nodes: 1,
                    advertise: Some(advertise),
                    ..KafkaOptions::default()
                })?)
            }
            BrokerKind::Tansu => {
                Backend::Tansu(TansuBroker::start_advertising(advertised, on_port)?)
            }
        };
        Ok(TestBroker { backend })
    }

    /// A Kafka cluster the caller started (e.g. with an OAuth listener),
    /// as a test broker: its PLAINTEXT listener is what
    /// [`TestBroker::bootstrap_servers`] gives.
    pub fn from_cluster(cluster: KafkaCluster) -> TestBroker {
        TestBroker {
            backend: Backend::KafkaOwn(cluster),
        }
    }

    /// Which broker this is.
    pub fn kind(&self) -> BrokerKind {
        match self.backend {
            Backend::Kafka(_) | Backend::KafkaOwn(_) => BrokerKind::Kafka,
            Backend::Tansu(_) => BrokerKind::Tansu,
        }
    }

    /// For `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> String {
        match &self.backend {
            Backend::Kafka(k) => k.bootstrap_servers(),
            Backend::KafkaOwn(k) => k.bootstrap_servers(),
            Backend::Tansu(t) => t.bootstrap_servers(),
        }
    }

    /// Creates a topic with `partitions` partitions and waits until it is
    /// usable. An existing topic of that size is fine.
    pub fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        match &self.backend {
            Backend::Kafka(k) => k.create_topic(name, partitions),
            Backend::KafkaOwn(k) => k.create_topic(name, partitions),
            Backend::Tansu(t) => t.create_topic(name, partitions),
        }
    }

    /// Whether [`TestBroker::add_partitions`] works (not on Tansu).
    pub fn can_add_partitions(&self) -> bool {
        self.kind() == BrokerKind::Kafka
    }

    /// Raises a topic's partition count to `total`. Tansu cannot: an error.
    pub fn add_partitions(&self, name: &str, total: i32) -> anyhow::Result<()> {
        match self.as_kafka() {
            Some(k) => k.add_partitions(name, total),
            None => bail!("Tansu cannot add partitions to a topic ({name:?})"),
        }
    }

    /// Deletes every record of `name` up to each partition's end
    /// (DeleteRecords: what retention does to a quiet topic). Apache
    /// Kafka only.
    pub fn delete_records_to_end(&self, name: &str) -> anyhow::Result<()> {
        match self.as_kafka() {
            Some(_) => admin::delete_records_to_end(&self.bootstrap_servers(), name),
            None => bail!("records are deleted on Apache Kafka only ({name:?})"),
        }
    }

    /// Whether the broker reports real high watermarks (the offset after
    /// the last record). Tansu reports the start of the last batch.
    pub fn true_high_watermarks(&self) -> bool {
        self.kind() == BrokerKind::Kafka
    }

    /// Whether `read_committed` consumers skip aborted transactions (not
    /// on Tansu).
    pub fn isolates_transactions(&self) -> bool {
        self.kind() == BrokerKind::Kafka
    }

    /// The broker's recent log lines (for failure messages).
    pub fn log_tail(&self, n: usize) -> String {
        match &self.backend {
            Backend::Kafka(k) => k.lease_log_tail(n),
            Backend::KafkaOwn(k) => k.log_tail(n),
            Backend::Tansu(t) => t.log_tail(n),
        }
    }

    /// The Tansu broker, when this is one (restarts, proxies).
    pub fn as_tansu(&self) -> Option<&TansuBroker> {
        match &self.backend {
            Backend::Tansu(t) => Some(t),
            Backend::Kafka(_) | Backend::KafkaOwn(_) => None,
        }
    }

    /// The Tansu broker, when this is one, to stop or restart it.
    pub fn as_tansu_mut(&mut self) -> Option<&mut TansuBroker> {
        match &mut self.backend {
            Backend::Tansu(t) => Some(t),
            Backend::Kafka(_) | Backend::KafkaOwn(_) => None,
        }
    }

    /// The Kafka cluster, when this is one.
    pub fn as_kafka(&self) -> Option<&KafkaCluster> {
        match &self.backend {
            Backend::Kafka(k) => Some(k),
            Backend::KafkaOwn(k) => Some(k),
            Backend::Tansu(_) => None,
        }
    }
}
