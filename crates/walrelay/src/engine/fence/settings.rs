//! Reads what the fence's durability rule ([`super::durability`]) needs
//! from the cluster: a topic's `min.insync.replicas` and
//! `unclean.leader.election.enable` (DescribeConfigs); whether the brokers
//! hold the high watermark under min ISR comes from
//! [`crate::kafka::requests::api_versions`].
//!
//! Failures are not errors: a setting walrelay could not read is
//! "unknown", and the rule treats unknown as the unsafe answer (the topic
//! stays unfenced). The relay runs on; the WARN says which ACL to grant.

use std::time::Duration;

use rdkafka::admin::{AdminOptions, ResourceSpecifier};

use super::durability::TopicSettings;
use crate::kafka::client::ClientSetup;
use crate::kafka::requests::api_versions::StrictMinIsr;

/// The topic settings the rule reads.
const MIN_INSYNC_REPLICAS: &str = "min.insync.replicas";
const UNCLEAN_LEADER_ELECTION: &str = "unclean.leader.election.enable";

/// The settings of `topic`, whose partitions have at most
/// `replication_factor` replicas, read through an admin client made from
/// `admin` (walrelay's Kafka properties for an admin client).
pub async fn read(
    admin: &ClientSetup,
    topic: &str,
    replication_factor: u32,
    strict_min_isr: StrictMinIsr,
    timeout: Duration,
) -> TopicSettings {
    let (min_insync_replicas, unclean_leader_election) = match describe(admin, topic, timeout).await
    {
        Ok((min, unclean)) => (min, unclean),
        Err(why) => (Err(why), None),
    };
    TopicSettings {
        replication_factor,
        min_insync_replicas,
        unclean_leader_election,
        strict_min_isr,
    }
}

/// `min.insync.replicas` (or why not) and `unclean.leader.election.enable`
/// of `topic`; `Err` when the request itself failed.
async fn describe(
    admin: &ClientSetup,
    topic: &str,
    timeout: Duration,
) -> Result<(Result<u32, String>, Option<bool>), String> {
    let client = admin
        .admin()
        .map_err(|e| format!("creating an admin client: {e}"))?;
    let options = AdminOptions::new().request_timeout(Some(timeout));
    let resource = ResourceSpecifier::Topic(topic);
    let results = client
        .describe_configs([&resource], &options)
        .await
        .map_err(|e| format!("DescribeConfigs: {e}"))?;
    let config = match results.into_iter().next() {
        Some(Ok(config)) => config,
        Some(Err(code)) => return Err(format!("DescribeConfigs: {code:?} ({code})")),
        None => return Err("DescribeConfigs returned no result".to_owned()),
    };
    // rust-rdkafka drops the per-resource error code; a topic described
    // with no entries at all is the answer to a principal not authorized
    // to describe its configuration (measured on Kafka 4.1.1).
    if config.entries.is_empty() {
        return Err(
            "DescribeConfigs returned no settings for the topic: the principal is most likely not \
             authorized to describe its configuration (TOPIC_AUTHORIZATION_FAILED)"
                .to_owned(),
        );
    }
    let value = |name: &str| config.get(name).and_then(|e| e.value.clone());
    let min = match value(MIN_INSYNC_REPLICAS) {
        Some(v) => v
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("{MIN_INSYNC_REPLICAS}={v:?} is not a number")),
        None => Err(format!("the broker reported no {MIN_INSYNC_REPLICAS}")),
    };
    let unclean = value(UNCLEAN_LEADER_ELECTION).map(|v| v.trim().eq_ignore_ascii_case("true"));
    Ok((min, unclean))
}
