//! The fence of one relay session: each topic's layout header and fence,
//! decided when the session first writes to the topic.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use tracing::{info, warn};

use super::decide::Decision;
use super::tail::{self, FenceError};
use super::{Layout, TopicFence, TopicLayout, Unfenced};
use crate::config::Config;
use crate::key::EventKey;
use crate::metrics::Metrics;

/// What the session knows of one topic it writes to.
#[derive(Debug)]
pub struct TopicState {
    name: Arc<str>,
    /// Per partition, the `walrelay-layout` header value of its records.
    layouts: Vec<Bytes>,
    /// Per partition, the key of the last record of this source in it
    /// when the session opened the topic: the `walrelay-prev-key` of the
    /// session's first record to it.
    last_in_kafka: Vec<Option<EventKey>>,
    /// Per partition, the highest key of this source found at its end
    /// (trusted as a fence key or not).
    pub tops: Vec<Option<EventKey>>,
    /// What need not be written again.
    pub fence: TopicFence,
    /// Per partition: records skipped in this session, and whether the
    /// replay went past the fence key (logged once).
    skipped: Vec<(u64, bool)>,
}

impl TopicState {
    /// The `walrelay-layout` header value of a record to `partition`.
    #[must_use]
    pub fn layout(&self, partition: u32) -> Bytes {
        self.layouts
            .get(partition as usize)
            .cloned()
            .unwrap_or_default()
    }

    /// The key of the last record of this source in `partition` when the
    /// topic was opened.
    #[must_use]
    pub fn last_in_kafka(&self, partition: u32) -> Option<EventKey> {
        self.last_in_kafka
            .get(partition as usize)
            .copied()
            .flatten()
    }

    /// Whether the record with `key` for `partition` is already in Kafka;
    /// counts it if so. The first record past a partition's fence key
    /// logs how many were skipped before it.
    pub fn skip(&mut self, partition: u32, key: EventKey) -> bool {
        let Some((skipped, passed)) = self.skipped.get_mut(partition as usize) else {
            return false;
        };
        if *passed {
            return false;
        }
        if self.fence.covers(partition, key) {
            *skipped += 1;
            return true;
        }
        *passed = true;
        if *skipped > 0 {
            info!(topic = %self.name, partition, skipped = *skipped, first_written = %key, "tail fence: the replay caught up with the partition; the records before this key were already in Kafka and were not written again");
        }
        false
    }

    /// Records skipped in this session.
    pub fn skipped(&self) -> u64 {
        self.skipped.iter().map(|(n, _)| n).sum()
    }

    /// One line if the session skipped records of this topic.
    pub fn log_summary(&self) {
        let skipped = self.skipped();
        if skipped > 0 {
            info!(topic = %self.name, skipped, "tail fence: replayed records already in Kafka were not written again in this session");
        }
    }
}

/// The per-session fence state.
pub struct SessionFence {
    /// The tail reader's configuration; `None` with `relay.fence = false`.
    reader: Option<ClientConfig>,
    source: Bytes,
    /// For each topic's routing fingerprint.
    config: Arc<Config>,
    timeout: Duration,
}

impl SessionFence {
    /// For a session whose records carry `source` in `walrelay-source`.
    pub fn new(config: &Config, reader: Option<ClientConfig>, source: &str) -> SessionFence {
        SessionFence {
            reader: if config.relay.fence { reader } else { None },
            source: Bytes::copy_from_slice(source.as_bytes()),
            config: Arc::new(config.clone()),
            timeout: config.relay.fence_timeout,
        }
    }

    /// The state of `topic`, which has `partitions` partitions: its layout,
    /// and its fence from the partitions' tails (read now, once per topic
    /// and session).
    pub async fn open(
        &self,
        topic: &Arc<str>,
        partitions: u32,
        metrics: Option<&Metrics>,
    ) -> Result<TopicState, FenceError> {
        let now = TopicLayout {
            partitions,
            routing: super::routing_fingerprint(&self.config, topic),
        };
        let layouts = (0..partitions)
            .map(|partition| {
                Layout {
                    partition,
                    topic: now,
                }
                .header_value()
            })
            .collect();
        let unread = || vec![None; partitions as usize];
        let (fence, last_in_kafka, tops) = match &self.reader {
            None => (TopicFence::Unfenced(Unfenced::Disabled), unread(), unread()),
            Some(reader) => {
                let (reader, name, source, timeout) = (
                    reader.clone(),
                    topic.to_string(),
                    self.source.clone(),
                    self.timeout,
                );
                let tails = tokio::task::spawn_blocking(move || {
                    tail::read(&reader, &name, partitions, &source, timeout)
                })
                .await
                .map_err(|e| FenceError::Read {
                    topic: topic.to_string(),
                    message: format!("the reading task failed: {e}"),
                })??;
                let Decision { fence, untrusted } = TopicFence::decide(&tails.partitions, now);
                let records: u64 = tails.partitions.iter().map(|t| t.records_read).sum();
                let elapsed_ms = u64::try_from(tails.elapsed.as_millis()).unwrap_or(u64::MAX);
                log_fence(topic, &fence, now);
                for (partition, why) in &untrusted {
                    warn!(%topic, partition, "tail fence off for this partition in this session: {why}; its replay is written again (duplicates for readers without a high-water mark) rather than trusting a record walrelay may not have written there");
                }
                info!(
                    %topic,
                    partitions,
                    records_read = records,
                    elapsed_ms,
                    fenced = matches!(fence, TopicFence::Fenced(_)),
                    untrusted = untrusted.len(),
                    "read the partition tails of the topic"
                );
                if let Some(m) = metrics {
                    m.fence_read(topic, records, matches!(fence, TopicFence::Unfenced(_)));
                    for _ in &untrusted {
                        m.fence_untrusted(topic);
                    }
                }
                let last = tails.partitions.iter().map(|t| t.last()).collect();
                let tops = tails
                    .partitions
                    .iter()
                    .map(|t| t.top().map(|r| r.key))
                    .collect();
                (fence, last, tops)
            }
        };
        Ok(TopicState {
            name: topic.clone(),
            layouts,
            last_in_kafka,
            tops,
            fence,
            skipped: vec![(0, false); partitions as usize],
        })
    }
}

/// One line per partition of a fenced topic, or the WARN of an unfenced
/// one.
fn log_fence(topic: &str, fence: &TopicFence, now: TopicLayout) {
    match fence {
        TopicFence::Fenced(keys) => {
            for (partition, key) in keys.iter().enumerate() {
                match key {
                    Some(key) => {
                        info!(%topic, partition, fence_key = %key, "tail fence: records up to this key are in the partition and are not written again")
                    }
                    None => {
                        info!(%topic, partition, "tail fence: no trusted record of this source at the end of the partition; nothing to skip")
                    }
                }
            }
        }
        TopicFence::Unfenced(why) => {
            let was = match why {
                Unfenced::LayoutChanged { was, .. } => was.to_string(),
                _ => "none".to_owned(),
            };
            warn!(%topic, layout_was = %was, layout_now = %now, "tail fence off for this topic in this session: {why}; a replay is written to it again (duplicates for readers without a high-water mark), and its new records fence the next session");
        }
    }
}
