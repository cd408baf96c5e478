//! The fence of one relay session: each topic's layout header and fence,
//! decided when the session first writes to the topic.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tracing::{info, warn};

use super::decide::{Decision, PartitionTail};
use super::durability;
use super::keyless::{self, Change, Placing};
use super::tail;
use super::FenceError;
use super::{Layout, TopicFence, TopicLayout, Unfenced};
use crate::config::{Config, KeylessPlacement};
use crate::engine::key::EventKey;
use crate::kafka::client::ClientSetup;
use crate::kafka::requests::api_versions::{self, StrictMinIsr};
use crate::metrics::Metrics;
use walrelay_pgoutput::Lsn;

/// What the session knows of one topic it writes to.
#[derive(Debug)]
pub struct TopicState {
    name: Arc<str>,
    /// Per partition, the `walrelay-layout` header value of its records.
    layouts: Vec<Bytes>,
    /// The rule placing the topic's keyless records in this session.
    keyless: KeylessPlacement,
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

    /// The rule placing the topic's records without a key.
    #[must_use]
    pub fn keyless(&self) -> KeylessPlacement {
        self.keyless
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
    /// The tail reader's configuration. With `relay.fence = false` the
    /// tails are still read, for restore detection only
    /// ([`super::ReplayCheck`]), and a failed read is a WARN, not an
    /// error.
    reader: Option<ClientSetup>,
    /// `relay.fence`: whether what the tails hold is skipped.
    skip: bool,
    /// The admin client's configuration, for the topics' durability
    /// settings ([`super::settings`]).
    admin: Option<ClientSetup>,
    /// Whether the brokers hold the high watermark under min ISR, asked
    /// once per session, when a replicated topic first needs it
    /// ([`api_versions`]).
    strict_min_isr: tokio::sync::OnceCell<StrictMinIsr>,
    source: Bytes,
    /// The slot's confirmed position: where the replay starts.
    start: Lsn,
    /// For each topic's routing fingerprint.
    config: Arc<Config>,
    timeout: Duration,
}

impl SessionFence {
    /// For a session whose records carry `source` in `walrelay-source`,
    /// replaying from `start`.
    pub fn new(
        config: &Config,
        reader: Option<ClientSetup>,
        admin: Option<ClientSetup>,
        source: &str,
        start: Lsn,
    ) -> SessionFence {
        SessionFence {
            reader,
            skip: config.relay.fence,
            admin,
            strict_min_isr: tokio::sync::OnceCell::new(),
            source: Bytes::copy_from_slice(source.as_bytes()),
            start,
            config: Arc::new(config.clone()),
            timeout: config.relay.fence_timeout,
        }
    }

    /// The state of `topic`, which has `partitions` partitions: its layout,
    /// the rule placing its keyless records, and its fence from the
    /// partitions' tails (read now, once per topic and session).
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
        let configured = self.config.relay.keyless_placement;
        let unread = || vec![None; partitions as usize];
        let (fence, last_in_kafka, tops, keyless) = match &self.reader {
            None => (
                TopicFence::Unfenced(Unfenced::Disabled),
                unread(),
                unread(),
                configured,
            ),
            Some(reader) if !self.skip => match self.read_tails(reader, topic, partitions).await {
                Ok(tails) => {
                    info!(%topic, "relay.fence = false: the partitions' tails were read to detect a restore, and nothing is skipped");
                    let keyless = self.keyless_rule(topic, &tails.partitions);
                    let (last, tops) = tails.ends();
                    (
                        TopicFence::Unfenced(Unfenced::Disabled),
                        last,
                        tops,
                        keyless,
                    )
                }
                Err(e) => {
                    warn!(%topic, "relay.fence = false, and the partitions' tails could not be read to detect a restore ({e}): in this session a database whose WAL went back is caught for this topic only if it went back behind its keys, and keyless records are placed by relay.keyless_placement even if a replay was placed by another rule; grant Read on the topic to restore both");
                    (
                        TopicFence::Unfenced(Unfenced::Disabled),
                        unread(),
                        unread(),
                        configured,
                    )
                }
            },
            Some(reader) => {
                let tails = self.read_tails(reader, topic, partitions).await?;
                let keyless = self.keyless_rule(topic, &tails.partitions);
                let placing = Placing {
                    rule: keyless,
                    start: self.start,
                };
                let fence = self.fence_of(topic, &tails, now, placing, metrics).await;
                let (last, tops) = tails.ends();
                (fence, last, tops, keyless)
            }
        };
        let layouts = (0..partitions)
            .map(|partition| {
                Layout {
                    partition,
                    topic: now,
                    keyless,
                }
                .header_value()
            })
            .collect();
        Ok(TopicState {
            name: topic.clone(),
            layouts,
            keyless,
            last_in_kafka,
            tops,
            fence,
            skipped: vec![(0, false); partitions as usize],
        })
    }

    /// The fence of a topic whose tails were read, logged and counted.
    async fn fence_of(
        &self,
        topic: &Arc<str>,
        tails: &tail::TopicTails,
        now: TopicLayout,
        placing: Placing,
        metrics: Option<&Metrics>,
    ) -> TopicFence {
        let Decision {
            mut fence,
            untrusted,
        } = TopicFence::decide(&tails.partitions, now, placing);
        if let TopicFence::Fenced(_) = fence {
            if let Err(why) = self.durable(topic, tails.replication_factor).await {
                fence = TopicFence::Unfenced(Unfenced::NotProvenAcked(why));
            }
        }
        let records: u64 = tails.partitions.iter().map(|t| t.records_read).sum();
        let elapsed_ms = u64::try_from(tails.elapsed.as_millis()).unwrap_or(u64::MAX);
        log_fence(topic, &fence, now);
        for (partition, why) in &untrusted {
            warn!(%topic, partition, "tail fence off for this partition in this session: {why}; its replay is written again (duplicates for readers without a high-water mark) rather than trusting a record walrelay may not have written there");
        }
        info!(
            %topic,
            partitions = tails.partitions.len(),
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
        fence
    }

    /// The rule placing `topic`'s keyless records in this session
    /// ([`keyless::choose`]), logged when it is not simply the configured
    /// one.
    fn keyless_rule(&self, topic: &str, tails: &[PartitionTail]) -> KeylessPlacement {
        let choice = keyless::choose(tails, self.config.relay.keyless_placement, self.start);
        match choice.change {
            None => {}
            Some(Change::Adopted { from }) => {
                info!(%topic, was = from.as_str(), now = choice.rule.as_str(), "keyless records of this topic are placed by relay.keyless_placement from this session on; nothing placed by the earlier rule is replayed");
            }
            Some(Change::Deferred {
                configured,
                newest_replayed,
            }) => {
                info!(%topic, placed_by = choice.rule.as_str(), configured = configured.as_str(), newest_replayed = %newest_replayed, "keyless records of this topic stay placed by the rule that placed the records this session replays, so each lands where its first copy went; relay.keyless_placement takes over at a later session, once the slot has confirmed past them");
            }
        }
        choice.rule
    }
}

impl SessionFence {
    async fn read_tails(
        &self,
        reader: &ClientSetup,
        topic: &Arc<str>,
        partitions: u32,
    ) -> Result<tail::TopicTails, FenceError> {
        let (reader, name, source, timeout) = (
            reader.clone(),
            topic.to_string(),
            self.source.clone(),
            self.timeout,
        );
        tokio::task::spawn_blocking(move || {
            tail::read(&reader, &name, partitions, &source, timeout)
        })
        .await
        .map_err(|e| FenceError::Read {
            topic: topic.to_string(),
            message: format!("the reading task failed: {e}"),
        })?
    }

    async fn ask_strict_min_isr(&self) -> StrictMinIsr {
        // Every broker of the cluster, from the metadata the admin client
        // reads (it is only asked where an admin client is configured).
        let (strict, why) = match &self.admin {
            Some(admin) => api_versions::cluster_strict_min_isr(admin, self.timeout).await,
            None => (
                StrictMinIsr::Unknown,
                Some("no admin client configured".to_owned()),
            ),
        };
        match why {
            None => info!(strict_min_isr = %strict, "whether the Kafka brokers hold the high watermark while a partition is under min.insync.replicas"),
            Some(why) => warn!("could not learn whether the Kafka brokers hold the high watermark while a partition is under min.insync.replicas ({why}): treated as not, so replicated topics with min.insync.replicas >= 2 are not fenced"),
        }
        strict
    }

    /// The fence's durability rule for `topic` ([`durability`]): reads the
    /// topic's settings and logs, once per topic and session, settings
    /// under which Kafka itself may lose acknowledged records.
    async fn durable(
        &self,
        topic: &str,
        replication_factor: u32,
    ) -> Result<(), durability::NotProvenAcked> {
        let settings = match &self.admin {
            // A single replica needs no settings (and no admin client).
            _ if replication_factor <= 1 => durability::TopicSettings {
                replication_factor,
                min_insync_replicas: Err("not read: one replica".to_owned()),
                unclean_leader_election: None,
                strict_min_isr: StrictMinIsr::Unknown,
            },
            Some(admin) => {
                let strict = *self
                    .strict_min_isr
                    .get_or_init(|| self.ask_strict_min_isr())
                    .await;
                super::settings::read(admin, topic, replication_factor, strict, self.timeout).await
            }
            None => durability::TopicSettings {
                replication_factor,
                min_insync_replicas: Err("no admin client configured".to_owned()),
                unclean_leader_election: None,
                strict_min_isr: StrictMinIsr::Unknown,
            },
        };
        for risk in durability::acknowledged_may_be_lost(&settings) {
            warn!(%topic, "Kafka may lose records of this topic it acknowledged: {risk} (docs/operations.md, \"Kafka settings for the relay's topics\")");
        }
        info!(
            %topic,
            replication_factor,
            min_insync_replicas = ?settings.min_insync_replicas,
            unclean_leader_election = ?settings.unclean_leader_election,
            strict_min_isr = %settings.strict_min_isr,
            "the topic's durability settings"
        );
        durability::readable_implies_acked(&settings)
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
        TopicFence::Unfenced(why @ Unfenced::NotProvenAcked(_)) => {
            warn!(%topic, "tail fence off for this topic: {why}; a replay is written to it again (duplicates for readers without a high-water mark) rather than skipping a record Kafka may not keep");
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
