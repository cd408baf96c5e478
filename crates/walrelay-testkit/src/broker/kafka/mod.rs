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
//! with SCRAM users or OAUTHBEARER ([`oauth`]) and the standard authorizer
//! ([`security`]), and
//! [`KafkaCluster::grant`] / [`KafkaCluster::revoke`] the ACLs ([`acl`]).
//!
//! Unlike Tansu: the high watermark is the offset after the last record,
//! `read_committed` hides aborted transactions, partitions can be added,
//! auto-created topics get one partition (`num.partitions`), and the
//! storage survives a restart of a node.

use std::path::{Path, PathBuf};
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
mod faults;
mod home;
mod node;
mod oauth;
mod options;
mod security;
mod shared;

pub use acl::{AclOperation, AclResource};
pub use oauth::{OAuthValidation, ALLOWED_URLS_PROPERTY, OAUTH_MECHANISM};
pub use security::{KafkaSecurity, ListenerAuth, ScramUser, SCRAM_MECHANISM};

pub use config::NodePorts;
pub use home::{KafkaHome, KAFKA_HOME_ENV, KAFKA_VERSION};
pub use node::{Jvm, KafkaNode};
pub use options::{Advertise, KafkaOptions};
pub use shared::SharedKafka;

/// How often a start is retried when another process took a chosen port.
const PORT_ATTEMPTS: usize = 4;
/// How long the JVMs may take until every node answers metadata requests.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

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
