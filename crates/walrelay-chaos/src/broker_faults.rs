//! Faults of a three-broker Apache Kafka cluster ([`Brokers::Cluster`]):
//! what production clusters do to a relay while it writes. Each returns
//! once the cluster has recovered (every partition of the chaos topics
//! fully replicated again), so faults never overlap: one broker down at a
//! time keeps every partition at or above `min.insync.replicas=2`.
//!
//! [`Brokers::Cluster`]: crate::services::Brokers::Cluster

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::RngExt;
use walrelay_testkit::KafkaCluster;

use crate::fault_kind::FaultKind;
use crate::services::{Supervised, GROUP, TOPICS};

/// How long the cluster may take to have every replica in sync again.
const RECOVERY: Duration = Duration::from_secs(120);

type Cluster = Arc<Mutex<KafkaCluster>>;

/// Runs `f` on the cluster in a blocking task (the testkit's calls block
/// on JVMs and admin requests).
async fn on<T: Send + 'static>(
    cluster: &Cluster,
    f: impl FnOnce(&mut KafkaCluster) -> Result<T> + Send + 'static,
) -> Result<T> {
    let cluster = Arc::clone(cluster);
    tokio::task::spawn_blocking(move || {
        let mut guard = cluster
            .lock()
            .map_err(|_| anyhow!("a cluster operation panicked"))?;
        f(&mut guard)
    })
    .await?
}

/// Waits until every chaos topic is fully replicated.
fn recovered(c: &KafkaCluster) -> Result<()> {
    for (topic, _) in TOPICS {
        c.await_fully_replicated(topic, RECOVERY)
            .with_context(|| format!("after the fault:\n{}", c.log_tail(15)))?;
    }
    Ok(())
}

/// A partition the relay writes to, at random.
fn some_partition(rng: &mut StdRng) -> (&'static str, i32) {
    let (topic, partitions) = *TOPICS.choose(rng).expect("topics");
    (topic, rng.random_range(0..partitions))
}

/// How long a killed broker stays down.
fn downtime(rng: &mut StdRng) -> Duration {
    Duration::from_millis(rng.random_range(500..3000))
}

/// Applies a broker fault; returns what it hit, for the log.
pub async fn inject(
    kind: FaultKind,
    cluster: &Cluster,
    relay: &mut Supervised,
    rng: &mut StdRng,
) -> Result<String> {
    match kind {
        FaultKind::LeaderKill => {
            let (topic, partition, leader) = kill_a_leader(cluster, rng).await?;
            tokio::time::sleep(downtime(rng)).await;
            restart(cluster, leader).await?;
            Ok(format!("node {leader}, leader of {topic}/{partition}"))
        }
        FaultKind::RelayKillInElection => {
            // The relay dies right after the leader: its next session's
            // fence reads the partitions while their leadership moves.
            let (topic, partition, leader) = kill_a_leader(cluster, rng).await?;
            relay.kill9().await?;
            relay.start()?;
            tokio::time::sleep(downtime(rng)).await;
            restart(cluster, leader).await?;
            Ok(format!("node {leader}, leader of {topic}/{partition}"))
        }
        FaultKind::RollingRestart => {
            on(cluster, |c| {
                for id in 1..=c.nodes().len() {
                    c.restart_node_gracefully(id)?;
                    recovered(c)?;
                }
                Ok(())
            })
            .await?;
            Ok("nodes 1, 2, 3".to_owned())
        }
        FaultKind::Reassignment => {
            // The leader's replica is moved off the partition (leadership
            // moves with it), then back (it copies the partition again
            // from the new leader): data moves while the relay writes.
            let (topic, partition) = some_partition(rng);
            on(cluster, move |c| {
                let (leader, _) = c.partition_state(topic, partition)?;
                let others: Vec<i32> = c
                    .partition_replicas(topic, partition)?
                    .into_iter()
                    .filter(|&r| r != leader)
                    .collect();
                c.reassign(topic, partition, &others)?;
                let back: Vec<i32> = others.iter().copied().chain([leader]).collect();
                c.reassign(topic, partition, &back)?;
                recovered(c)?;
                Ok(format!(
                    "{topic}/{partition}: node {leader} off and back, {others:?} then {back:?}"
                ))
            })
            .await
        }
        FaultKind::ControllerRestart => {
            let id = on(cluster, |c| {
                let id = c.active_controller()?;
                c.kill_node(id)?;
                Ok(id)
            })
            .await?;
            tokio::time::sleep(downtime(rng)).await;
            restart(cluster, i32::try_from(id)?).await?;
            Ok(format!("node {id}, the active controller"))
        }
        FaultKind::CoordinatorKill => {
            let id = on(cluster, |c| {
                let id = c.group_coordinator(GROUP)?;
                c.kill_node(id)?;
                Ok(id)
            })
            .await?;
            tokio::time::sleep(downtime(rng)).await;
            restart(cluster, i32::try_from(id)?).await?;
            Ok(format!("node {id}, coordinator of group {GROUP}"))
        }
        FaultKind::BelowMinIsr => {
            // Every replica must be in sync for a write to the topic; one
            // follower of its partition 0 dies (the other partitions that
            // broker follows or leads are under min ISR too).
            let (topic, _) = some_partition(rng);
            let follower = on(cluster, move |c| {
                c.set_topic_config(topic, "min.insync.replicas", "3")?;
                let follower = c.kill_a_follower(topic, 0)?;
                c.await_partition(
                    topic,
                    0,
                    RECOVERY,
                    "the killed follower out of the in-sync set",
                    |_, isr| !isr.contains(&follower),
                )?;
                Ok(follower)
            })
            .await?;
            let down = Duration::from_millis(rng.random_range(5_000..40_000));
            tokio::time::sleep(down).await;
            restart(cluster, follower).await?;
            on(cluster, move |c| {
                c.set_topic_config(topic, "min.insync.replicas", "2")
            })
            .await?;
            Ok(format!(
                "{topic} with min.insync.replicas=3, node {follower} down {down:?}"
            ))
        }
        other => Err(anyhow!("{other} is not a broker fault")),
    }
}

/// Kills (SIGKILL) the leader of a random partition the relay writes to:
/// the partition and the node.
async fn kill_a_leader(cluster: &Cluster, rng: &mut StdRng) -> Result<(&'static str, i32, i32)> {
    let (topic, partition) = some_partition(rng);
    let leader = on(cluster, move |c| {
        let (leader, _) = c.partition_state(topic, partition)?;
        c.kill_node(usize::try_from(leader)?)?;
        Ok(leader)
    })
    .await?;
    Ok((topic, partition, leader))
}

/// Starts node `id` again and waits for every replica to be in sync.
async fn restart(cluster: &Cluster, id: i32) -> Result<()> {
    on(cluster, move |c| {
        c.restart_node(usize::try_from(id)?)?;
        recovered(c)
    })
    .await
}
