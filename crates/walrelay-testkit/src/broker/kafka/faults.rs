//! A running cluster's partitions, and the faults tests inject into it:
//! who leads and is in sync, killing and restarting nodes, waiting until a
//! partition is whole again.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{KafkaCluster, KafkaNode};
use crate::kafka::client_config;

impl KafkaCluster {
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
}
