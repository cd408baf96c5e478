//! Throwaway Apache Kafka clusters: KRaft nodes that are broker and
//! controller at once, on free ports of 127.0.0.1, from the jars
//! `scripts/install-kafka.sh` installs (or `$WALRELAY_KAFKA_HOME`).
//!
//! [`KafkaCluster::start`] formats each node's storage, starts the JVMs and
//! returns once every node answers metadata requests listing all of them
//! (a few seconds: a JVM start). Dropping it kills the JVMs and removes the
//! directory (`WALRELAY_KEEP_BROKER=1` keeps it). Settings are Kafka's
//! defaults except what a small cluster needs ([`config`]). One node is
//! what the suites use today; [`KafkaOptions::nodes`] is there for a
//! three-node cluster. [`KafkaOptions::security`] adds a SASL_SSL listener
//! with SCRAM users and the standard authorizer ([`security`]), and
//! [`KafkaCluster::grant`] / [`KafkaCluster::revoke`] the ACLs ([`acl`]).
//!
//! Unlike Tansu: the high watermark is the offset after the last record,
//! `read_committed` hides aborted transactions, partitions can be added,
//! auto-created topics get one partition (`num.partitions`), and the
//! storage survives a restart of a node.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::broker::util::keep_broker;
use crate::cluster::HOST;
use crate::kafka::client_config;
use cluster_id::random_cluster_id;

mod acl;
mod cluster_admin;
mod cluster_id;
mod config;
mod home;
mod node;
mod security;
mod shared;

pub use acl::{AclOperation, AclResource};
pub use security::{KafkaSecurity, ScramUser, SCRAM_MECHANISM};

pub use config::NodePorts;
pub use home::{KafkaHome, KAFKA_HOME_ENV, KAFKA_VERSION};
pub use node::{Jvm, KafkaNode};
pub use shared::SharedKafka;

/// How often a start is retried when another process took a chosen port.
const PORT_ATTEMPTS: usize = 4;
/// How long the JVMs may take until every node answers metadata requests.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

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

/// Another process answers on a port this cluster chose: start again on
/// other ports.
#[derive(Debug)]
struct PortTaken(String);

impl std::fmt::Display for PortTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} belongs to another process", self.0)
    }
}

impl std::error::Error for PortTaken {}

/// A running Apache Kafka cluster of combined KRaft nodes.
#[derive(Debug)]
pub struct KafkaCluster {
    home: KafkaHome,
    dir: PathBuf,
    cluster_id: String,
    nodes: Vec<KafkaNode>,
    started_in: Duration,
    security: Option<KafkaSecurity>,
}

impl KafkaCluster {
    /// Finds the install ([`KafkaHome::find`]) and starts `opts.nodes`
    /// nodes; blocking. Errors carry the tail of the nodes' logs.
    pub fn start(opts: KafkaOptions) -> anyhow::Result<KafkaCluster> {
        Self::start_with_home(KafkaHome::find()?, opts)
    }

    /// Like [`KafkaCluster::start`], with an explicit install.
    pub fn start_with_home(home: KafkaHome, opts: KafkaOptions) -> anyhow::Result<KafkaCluster> {
        if opts.nodes == 0 {
            bail!("a Kafka cluster needs at least one node");
        }
        let began = Instant::now();
        let mut last_error = None;
        for _ in 0..PORT_ATTEMPTS {
            let dir = tempfile::Builder::new()
                .prefix("walrelay-kafka-")
                .tempdir()
                .context("creating the cluster directory")?
                .keep();
            let mut cluster = KafkaCluster {
                home: home.clone(),
                dir,
                cluster_id: random_cluster_id(),
                nodes: Vec::new(),
                started_in: Duration::ZERO,
                security: opts.security.clone(),
            };
            match cluster.boot(&opts) {
                Ok(()) => {
                    cluster.started_in = began.elapsed();
                    tracing::info!(
                        "Apache Kafka ({} node(s)) at {} ready in {:?}",
                        opts.nodes,
                        cluster.bootstrap_servers(),
                        cluster.started_in
                    );
                    return Ok(cluster);
                }
                // A node exited while starting: most likely a port that
                // another process took meanwhile; try other ports.
                Err(e) if cluster.any_exited() || e.downcast_ref::<PortTaken>().is_some() => {
                    tracing::debug!("kafka: a node exited while starting, retrying: {e:#}");
                    last_error = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error
            .unwrap_or_else(|| anyhow!("no attempt made"))
            .context(format!(
                "starting Apache Kafka failed {PORT_ATTEMPTS} times"
            )))
    }

    fn boot(&mut self, opts: &KafkaOptions) -> anyhow::Result<()> {
        let n = opts.nodes;
        let per_node = if opts.security.is_some() { 3 } else { 2 };
        // Held until all are chosen, so that they differ.
        let listeners = (0..per_node * n)
            .map(|_| std::net::TcpListener::bind((HOST, 0)))
            .collect::<Result<Vec<_>, _>>()
            .context("binding 127.0.0.1:0 to find ports")?;
        let mut chosen = Vec::with_capacity(per_node * n);
        for l in &listeners {
            chosen.push(l.local_addr()?.port());
        }
        drop(listeners);
        let ports: Vec<NodePorts> = chosen
            .chunks(per_node)
            .map(|p| NodePorts {
                broker: p[0],
                controller: p[1],
                secure: p.get(2).copied(),
            })
            .collect();
        for id in 1..=n {
            let advertised = opts.advertise.as_ref().map(|f| f(id, ports[id - 1].broker));
            let dir = self.dir.join(format!("node-{id}"));
            let node = KafkaNode::new(
                id,
                &ports,
                dir,
                advertised.as_deref(),
                opts.security.as_ref(),
                opts.jvm,
            )?;
            if !opts.server_properties.is_empty() {
                let path = node.dir().join("server.properties");
                let mut text = std::fs::read_to_string(&path)?;
                for (key, value) in &opts.server_properties {
                    text.push_str(&format!("{key}={value}\n"));
                }
                std::fs::write(&path, text)?;
            }
            self.nodes.push(node);
        }
        // Format in parallel: each is a JVM start of its own.
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .nodes
                .iter()
                .map(|node| {
                    s.spawn(|| {
                        node.format(
                            &self.home,
                            &self.cluster_id,
                            self.security.as_ref(),
                            &opts.features,
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .try_for_each(|h| h.join().map_err(|_| anyhow!("format panicked"))?)
        })?;
        for node in &mut self.nodes {
            node.spawn(&self.home)?;
        }
        self.wait_ready().map_err(|e| {
            e.context(format!(
                "Apache Kafka did not become ready; logs:\n{}",
                self.log_tail(30)
            ))
        })
    }

    fn any_exited(&mut self) -> bool {
        self.nodes
            .iter_mut()
            .any(|n| matches!(n.exit_status(), Ok(Some(_))))
    }

    /// Whether every node's JVM runs.
    pub fn all_running(&mut self) -> bool {
        self.nodes
            .iter_mut()
            .all(|n| matches!(n.exit_status(), Ok(None)))
    }

    /// Every node answers a metadata request that lists all the nodes, and
    /// the cluster id is this cluster's.
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last_error = anyhow!("no metadata request made");
        for i in 0..self.nodes.len() {
            let addr = format!("{HOST}:{}", self.nodes[i].port());
            let client: BaseConsumer = client_config(&addr)
                .create()
                .context("creating a Kafka client")?;
            loop {
                if let Some(status) = self.nodes[i].exit_status()? {
                    bail!("node {} exited while starting ({status})", i + 1);
                }
                let remaining = deadline.saturating_duration_since(Instant::now());
                let timeout = remaining.clamp(Duration::from_millis(100), Duration::from_secs(1));
                match client.fetch_metadata(None, timeout) {
                    Ok(md) if md.brokers().len() == self.nodes.len() => {
                        match client.client().fetch_cluster_id(timeout) {
                            Some(id) if id == self.cluster_id => break,
                            Some(id) => {
                                return Err(anyhow!(PortTaken(addr))
                                    .context(format!("another cluster ({id:?}) answers")))
                            }
                            None => last_error = anyhow!("no cluster id from {addr}"),
                        }
                    }
                    Ok(md) => {
                        last_error = anyhow!(
                            "{addr} lists {} of {} brokers",
                            md.brokers().len(),
                            self.nodes.len()
                        )
                    }
                    Err(e) => last_error = anyhow!(e).context(format!("metadata from {addr}")),
                }
                if Instant::now() >= deadline {
                    return Err(last_error.context(format!("not ready within {READY_TIMEOUT:?}")));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Every node's broker listener, comma-separated, for
    /// `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("{HOST}:{}", n.port()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every node's SASL_SSL listener, comma-separated, for clients'
    /// `bootstrap.servers` on a secured cluster.
    pub fn secure_bootstrap_servers(&self) -> anyhow::Result<String> {
        self.nodes
            .iter()
            .map(|n| {
                n.secure_port()
                    .map(|p| format!("{HOST}:{p}"))
                    .ok_or_else(|| anyhow!("the cluster was started without security"))
            })
            .collect::<anyhow::Result<Vec<_>>>()
            .map(|v| v.join(","))
    }

    /// The CA certificate (PEM) clients of a secured cluster trust.
    pub fn ca_pem(&self) -> Option<&str> {
        self.security.as_ref().map(|s| s.ca_pem.as_str())
    }

    /// Allows `principal` (`User:name`) `operations` on `resource`; returns
    /// once the broker enforces it.
    pub fn grant(
        &self,
        principal: &str,
        resource: &AclResource,
        operations: &[AclOperation],
    ) -> anyhow::Result<()> {
        acl::grant(&self.bootstrap_servers(), principal, resource, operations)
    }

    /// Takes back what [`KafkaCluster::grant`] allowed; returns once the
    /// broker enforces it.
    pub fn revoke(
        &self,
        principal: &str,
        resource: &AclResource,
        operations: &[AclOperation],
    ) -> anyhow::Result<()> {
        acl::revoke(&self.bootstrap_servers(), principal, resource, operations)
    }

    /// The operations allowed to `principal` on `resource`.
    pub fn allowed(
        &self,
        principal: &str,
        resource: &AclResource,
    ) -> anyhow::Result<Vec<AclOperation>> {
        acl::allowed(&self.bootstrap_servers(), principal, resource)
    }

    /// The nodes, by id (node `i` at index `i - 1`).
    pub fn nodes(&self) -> &[KafkaNode] {
        &self.nodes
    }

    /// The leader (node id) and in-sync replicas of `topic`'s partition
    /// `partition`, as the metadata of a running node says.
    pub fn partition_state(&self, topic: &str, partition: i32) -> anyhow::Result<(i32, Vec<i32>)> {
        let (leader, mut isr, _) = self.partition_metadata(topic, partition)?;
        isr.sort_unstable();
        Ok((leader, isr))
    }

    /// The replicas (node ids, preferred leader first) of the partition.
    pub fn partition_replicas(&self, topic: &str, partition: i32) -> anyhow::Result<Vec<i32>> {
        Ok(self.partition_metadata(topic, partition)?.2)
    }

    /// (leader, in-sync replicas, replicas) of the partition.
    fn partition_metadata(
        &self,
        topic: &str,
        partition: i32,
    ) -> anyhow::Result<(i32, Vec<i32>, Vec<i32>)> {
        let client: BaseConsumer = client_config(&self.bootstrap_servers())
            .create()
            .context("creating a Kafka client")?;
        let md = client
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .with_context(|| format!("metadata of {topic}"))?;
        md.topics()
            .iter()
            .filter(|t| t.name() == topic)
            .flat_map(|t| t.partitions())
            .find(|p| p.id() == partition)
            .map(|p| (p.leader(), p.isr().to_vec(), p.replicas().to_vec()))
            .ok_or_else(|| anyhow!("no partition {partition} of {topic} in the metadata"))
    }

    /// Waits until `check` holds for the partition's (leader, in-sync
    /// replicas), up to `timeout`; returns the state that satisfied it.
    pub fn await_partition(
        &self,
        topic: &str,
        partition: i32,
        timeout: Duration,
        what: &str,
        check: impl Fn(i32, &[i32]) -> bool,
    ) -> anyhow::Result<(i32, Vec<i32>)> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.partition_state(topic, partition) {
                Ok((leader, isr)) if check(leader, &isr) => return Ok((leader, isr)),
                Ok(state) => format!("{state:?}"),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "{topic}/{partition}: {what} not seen within {timeout:?} (last (leader, isr): {last})"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills (SIGKILL) an in-sync follower of `topic`'s partition
    /// `partition`, never its leader; returns the node's id.
    pub fn kill_a_follower(&mut self, topic: &str, partition: i32) -> anyhow::Result<i32> {
        let (leader, isr) = self.partition_state(topic, partition)?;
        let follower = isr
            .iter()
            .copied()
            .find(|&n| n != leader)
            .ok_or_else(|| anyhow!("{topic}/{partition}: no follower in sync (isr {isr:?})"))?;
        self.kill_node(usize::try_from(follower)?)?;
        Ok(follower)
    }

    /// Kills node `id` (SIGKILL); its data stays for
    /// [`KafkaCluster::restart_node`].
    pub fn kill_node(&mut self, id: usize) -> anyhow::Result<()> {
        self.node_mut(id)?.kill()
    }

    /// Kills node `id` if it runs and starts it again on the same ports
    /// with its data; waits until every node answers metadata requests
    /// listing them all.
    pub fn restart_node(&mut self, id: usize) -> anyhow::Result<()> {
        let home = self.home.clone();
        let node = self.node_mut(id)?;
        node.kill()?;
        node.spawn(&home)?;
        self.wait_ready().map_err(|e| {
            e.context(format!(
                "node {id} did not come back; logs:\n{}",
                self.log_tail(30)
            ))
        })
    }

    /// Restarts node `id` as a rolling restart does: a controlled shutdown
    /// (SIGTERM, up to 60 s), then the same start as
    /// [`KafkaCluster::restart_node`].
    pub fn restart_node_gracefully(&mut self, id: usize) -> anyhow::Result<()> {
        self.node_mut(id)?.terminate(Duration::from_secs(60))?;
        self.restart_node(id)
    }

    /// Waits until every partition of `topic` has all its replicas in sync,
    /// up to `timeout`: the cluster recovered from a fault.
    pub fn await_fully_replicated(&self, topic: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let client: BaseConsumer = client_config(&self.bootstrap_servers())
            .create()
            .context("creating a Kafka client")?;
        loop {
            let last = match client.fetch_metadata(Some(topic), Duration::from_secs(5)) {
                Ok(md) => {
                    let lagging: Vec<String> = md
                        .topics()
                        .iter()
                        .flat_map(|t| t.partitions())
                        .filter(|p| p.isr().len() < p.replicas().len() || p.leader() < 0)
                        .map(|p| format!("{}: isr {:?} of {:?}", p.id(), p.isr(), p.replicas()))
                        .collect();
                    if lagging.is_empty() && md.topics().iter().any(|t| !t.partitions().is_empty())
                    {
                        return Ok(());
                    }
                    lagging.join("; ")
                }
                Err(e) => format!("{e}"),
            };
            if Instant::now() >= deadline {
                bail!("{topic} not fully replicated within {timeout:?} ({last})");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn node_mut(&mut self, id: usize) -> anyhow::Result<&mut KafkaNode> {
        let n = self.nodes.len();
        id.checked_sub(1)
            .and_then(|i| self.nodes.get_mut(i))
            .ok_or_else(|| anyhow!("no node {id} in a cluster of {n}"))
    }

    /// The cluster's directory (a `node-<id>` directory per node).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How long the start took (format, JVM start, first metadata).
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The replication factor topics get: the node count, at most 3.
    pub fn replication_factor(&self) -> i32 {
        self.nodes.len().min(3) as i32
    }

    /// Creates a topic with `partitions` partitions (replication
    /// [`KafkaCluster::replication_factor`]) and waits until every
    /// partition has a leader. An existing topic of that size is fine.
    pub fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        crate::broker::admin::create_topic(
            &self.bootstrap_servers(),
            name,
            partitions,
            self.replication_factor(),
        )
    }

    /// [`KafkaCluster::create_topic`] with `replication` replicas and
    /// topic configurations, e.g. `("min.insync.replicas", "3")`.
    pub fn create_topic_with(
        &self,
        name: &str,
        partitions: i32,
        replication: i32,
        configs: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        crate::broker::admin::create_topic_with(
            &self.bootstrap_servers(),
            name,
            partitions,
            replication,
            configs,
        )
    }

    /// Raises a topic's partition count to `total` (what
    /// `kafka-topics --alter --partitions` does).
    pub fn add_partitions(&self, name: &str, total: i32) -> anyhow::Result<()> {
        crate::broker::admin::add_partitions(&self.bootstrap_servers(), name, total)
    }

    /// Deletes topics and waits until metadata no longer lists them.
    pub fn delete_topics(&self, names: &[&str]) -> anyhow::Result<()> {
        crate::broker::admin::delete_topics(&self.bootstrap_servers(), names)
    }

    /// The last `n` lines of each node's log, under a heading per node.
    pub fn log_tail(&self, n: usize) -> String {
        self.nodes
            .iter()
            .map(|node| {
                format!(
                    "--- Kafka node {} ({}) ---\n{}",
                    node.id(),
                    node.log_path().display(),
                    node.log_tail(n)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Err(e) = node.kill() {
                tracing::warn!("killing Kafka node {}: {e:#}", node.id());
            }
        }
        if keep_broker() {
            eprintln!(
                "walrelay-testkit: keeping the Kafka cluster directory {} ({}; \
                 {} is set)",
                self.dir.display(),
                self.bootstrap_servers(),
                crate::broker::util::KEEP_BROKER_ENV
            );
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!("removing {}: {e}", self.dir.display());
        }
    }
}
