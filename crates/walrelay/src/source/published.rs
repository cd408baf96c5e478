//! Whether Kafka already holds records of a source: the evidence `walrelay
//! setup` looks for when it is about to create a slot and
//! `walrelay.slots` has no row for it ([`crate::source::slot_record`]). A restore
//! from a base backup taken before the first `setup` has neither the slot
//! nor the row, yet walrelay published from this database: the topics
//! the configuration names then hold records of this source, and a new
//! slot at the current position would skip what was committed since in
//! silence.
//!
//! Only the topics the configuration names (message routes, the
//! dead-letter topic, the existing topics an outbox template matches) are
//! read, at their partitions' tails, as the tail fence reads them
//! ([`crate::engine::fence::tail`]): topics named only in `walrelay.emit(...)`
//! calls are known to the application alone, and retention may have
//! expired what was there, so an empty answer proves nothing; the row in
//! `walrelay.slots` remains the main check.

use std::time::Duration;

use crate::config::Config;
use crate::engine::key::EventKey;
use crate::kafka::client::{client_config, KafkaClient};

/// The highest key of the source found at a partition's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub topic: String,
    pub partition: u32,
    pub key: EventKey,
}

/// The highest key of `source` at the ends of the configured topics'
/// partitions, or `None` when none holds one. Each Kafka request is
/// bounded by `timeout`.
pub async fn find(
    config: &Config,
    source: &str,
    timeout: Duration,
) -> Result<Option<Published>, String> {
    let reader = client_config(&config.kafka, KafkaClient::Fence).map_err(|e| e.to_string())?;
    let existing = {
        let reader = reader.clone();
        tokio::task::spawn_blocking(move || topics(&reader, timeout))
            .await
            .map_err(|e| e.to_string())??
    };
    let names: Vec<String> = existing.iter().map(|(name, _)| name.clone()).collect();
    let mut found: Option<Published> = None;
    for topic in crate::commands::status::kafka::topics_to_report(config, &[], &names) {
        let Some(&(_, partitions)) = existing.iter().find(|(name, _)| *name == topic) else {
            continue;
        };
        let (reader, name, source) = (reader.clone(), topic.clone(), source.as_bytes().to_vec());
        let tails = tokio::task::spawn_blocking(move || {
            crate::engine::fence::tail::read(&reader, &name, partitions, &source, timeout)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
        let (_, tops) = tails.ends();
        for (partition, key) in (0u32..).zip(tops) {
            if let Some(key) = key.filter(|k| found.as_ref().is_none_or(|f| *k > f.key)) {
                found = Some(Published {
                    topic: topic.clone(),
                    partition,
                    key,
                });
            }
        }
    }
    Ok(found)
}

/// The cluster's topics and their partition counts.
fn topics(
    reader: &crate::kafka::client::ClientSetup,
    timeout: Duration,
) -> Result<Vec<(String, u32)>, String> {
    use rdkafka::consumer::Consumer;
    let client = reader.consumer().map_err(|e| e.to_string())?;
    let metadata = client
        .fetch_metadata(None, timeout)
        .map_err(|e| format!("fetching the cluster's metadata: {e}"))?;
    Ok(metadata
        .topics()
        .iter()
        .map(|t| {
            (
                t.name().to_owned(),
                u32::try_from(t.partitions().len()).unwrap_or(u32::MAX),
            )
        })
        .collect())
}
