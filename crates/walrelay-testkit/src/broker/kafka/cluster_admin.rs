//! Cluster operations for fault tests that librdkafka's admin API does not
//! offer: the active controller (the KRaft quorum's leader), a consumer
//! group's coordinator, a partition reassignment, a preferred-leader
//! election and a topic configuration change. Each runs Kafka's own Admin
//! client once, through `java/ClusterAdmin.java` launched as a single
//! source file against the installed jars (about two seconds: a JVM start
//! and an in-memory compile), so nothing but the JDK is needed to build
//! it.

use std::path::PathBuf;

use anyhow::{bail, Context};

use super::home::KafkaHome;
use super::KafkaCluster;

/// The Java source, next to this crate's `Cargo.toml`.
fn source() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("java/ClusterAdmin.java")
}

/// Runs `ClusterAdmin.java BOOTSTRAP args...`; its `ok <value>` line's
/// value.
fn run(home: &KafkaHome, bootstrap: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = home
        .java("128m")?
        .arg(source())
        .arg(bootstrap)
        .args(args)
        .output()
        .context("running java ClusterAdmin.java (a JDK 17 is needed: javac's compiler module)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().find_map(|l| l.strip_prefix("ok ")) {
        Some(value) if out.status.success() => Ok(value.trim().to_owned()),
        _ => bail!(
            "ClusterAdmin {args:?} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

impl KafkaCluster {
    /// The node id of the active controller (the KRaft quorum's leader).
    pub fn active_controller(&self) -> anyhow::Result<usize> {
        run(&self.home, &self.bootstrap_servers(), &["quorum-leader"])?
            .parse()
            .context("the quorum leader's id")
    }

    /// The node id of the broker coordinating consumer group `group` (the
    /// group must exist: a consumer joined it once).
    pub fn group_coordinator(&self, group: &str) -> anyhow::Result<usize> {
        run(
            &self.home,
            &self.bootstrap_servers(),
            &["coordinator", group],
        )?
        .parse()
        .context("the coordinator's id")
    }

    /// Moves `topic`'s partition `partition` to `replicas` (the first is the
    /// preferred leader) and returns once Kafka completed the reassignment
    /// (new replicas caught up, removed ones dropped).
    pub fn reassign(&self, topic: &str, partition: i32, replicas: &[i32]) -> anyhow::Result<()> {
        let list = replicas
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        run(
            &self.home,
            &self.bootstrap_servers(),
            &["reassign", topic, &partition.to_string(), &list],
        )
        .map(drop)
    }

    /// Makes the preferred (first) replica of the partition its leader, if
    /// it is not already.
    pub fn elect_preferred_leader(&self, topic: &str, partition: i32) -> anyhow::Result<()> {
        run(
            &self.home,
            &self.bootstrap_servers(),
            &["elect-preferred", topic, &partition.to_string()],
        )
        .map(drop)
    }

    /// Sets a topic configuration (`incrementalAlterConfigs`), e.g.
    /// `min.insync.replicas`; returns once the controller accepted it.
    pub fn set_topic_config(&self, topic: &str, name: &str, value: &str) -> anyhow::Result<()> {
        run(
            &self.home,
            &self.bootstrap_servers(),
            &["set-topic-config", topic, name, value],
        )
        .map(drop)
    }
}
