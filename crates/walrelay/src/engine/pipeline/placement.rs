//! Where a record goes: its partition, whether the partition already has
//! it (the tail fence), and the two headers that depend on the partition
//! (`walrelay-layout`, `walrelay-prev-key`). The one place on the way to
//! the sink that knows a topic's partitions, and so the one that checks
//! that the replay reproduces the fence ([`ReplayCheck`]).
//!
//! One map lookup per record: each topic's partition count, fence, last
//! key sent per partition and metric counters live together, filled the
//! first time the session writes to the topic.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tracing::info;

use crate::config::HeaderSet;
use crate::engine::fence::{FenceError, ReplayCheck, SessionFence, TopicState};
use crate::engine::key::EventKey;
use crate::engine::partition::{partition_for_key, partition_for_keyless};
use crate::engine::record::{header, Record};
use crate::engine::sink::KafkaSink;
use crate::error::RelayError;
use crate::metrics::{Metrics, TopicCounters};
use crate::source::source_record::{EventIdentity, RecordedEvent};

/// What the session writes to one topic.
struct Destination {
    partitions: u32,
    fence: TopicState,
    /// The last key sent to each partition in this session.
    last_sent: Vec<Option<EventKey>>,
    /// `Some` with metrics.
    counters: Option<TopicCounters>,
}

/// Where a record goes.
pub enum Placed<'a> {
    /// The partition already has it (a replay after a crash): it is not
    /// written again, and not registered with the checkpoint tracker, so
    /// nothing waits for it.
    InKafka,
    /// Send it to `partition`; count it with `counters` (with metrics).
    Send {
        partition: u32,
        counters: Option<&'a TopicCounters>,
    },
}

/// The topics of one session.
pub struct Placement {
    fence: SessionFence,
    replay: ReplayCheck,
    topics: HashMap<Arc<str>, Destination>,
    layout_header: Arc<str>,
    /// `walrelay-prev` (compact form, the lean set) or
    /// `walrelay-prev-key` (32 hex digits, the full set).
    prev_header: Arc<str>,
    header_set: HeaderSet,
}

impl Placement {
    pub fn new(fence: SessionFence, replay: ReplayCheck, header_set: HeaderSet) -> Placement {
        Placement {
            fence,
            replay,
            topics: HashMap::new(),
            layout_header: Arc::from(header::LAYOUT),
            prev_header: Arc::from(match header_set {
                HeaderSet::Lean => header::PREV,
                HeaderSet::Full => header::PREV_KEY,
            }),
            header_set,
        }
    }

    /// Partitions `record` deterministically (its key, or its event key
    /// for a keyless one) and, unless the partition already has it, adds
    /// the layout and prev-key headers.
    pub async fn place(
        &mut self,
        record: &mut Record,
        sink: &KafkaSink,
        metrics: Option<&Metrics>,
    ) -> Result<Placed<'_>, RelayError> {
        if !self.topics.contains_key(&record.topic) {
            let partitions = sink.partitions(&record.topic).await?;
            let fence = self.fence.open(&record.topic, partitions, metrics).await?;
            self.admit(&record.topic, &fence)?;
            self.topics.insert(
                record.topic.clone(),
                Destination {
                    partitions,
                    fence,
                    last_sent: vec![None; partitions as usize],
                    counters: metrics.map(|m| m.topic(&record.topic)),
                },
            );
        }
        let dest = self
            .topics
            .get_mut(&record.topic)
            .expect("the topic's destination was inserted above");
        let partition = match &record.key {
            Some(k) => partition_for_key(k, dest.partitions),
            None => partition_for_keyless(record.event_key, dest.partitions, dest.fence.keyless()),
        };
        let held = self.replay.holding();
        self.replay
            .record(&record.topic, partition, record.event_key, || {
                EventIdentity::of(record.timestamp_ms, record.value.as_deref())
            })?;
        if held && !self.replay.holding() {
            info!(key = %record.event_key, "tail fence: the replay reproduced every fence key of this session; confirming again");
        }
        if dest.fence.skip(partition, record.event_key) {
            if let Some(c) = &dest.counters {
                c.fence_skipped();
            }
            return Ok(Placed::InKafka);
        }
        // The first record of this session to the partition follows the
        // last record of this source in it, if any: that is its
        // predecessor in Kafka.
        let last = &mut dest.last_sent[partition as usize];
        let prev = last
            .replace(record.event_key)
            .or_else(|| dest.fence.last_in_kafka(partition));
        let prev = match (prev, self.header_set) {
            (None, _) => Bytes::new(),
            (Some(k), HeaderSet::Lean) => {
                let mut text = [0u8; 33];
                Bytes::copy_from_slice(k.write_compact(&mut text).as_bytes())
            }
            (Some(k), HeaderSet::Full) => {
                let mut hex = [0u8; 32];
                Bytes::copy_from_slice(k.write_hex(&mut hex).as_bytes())
            }
        };
        record.insert_walrelay_header(self.layout_header.clone(), dest.fence.layout(partition));
        // With walrelay's own headers, before the application's.
        record.insert_walrelay_header(self.prev_header.clone(), prev);
        Ok(Placed::Send {
            partition,
            counters: dest.counters.as_ref(),
        })
    }

    /// A topic's tails were read: no key of ours may be ahead of the
    /// server's WAL, each fence key must come back in the replay in its
    /// partition, and every other key of ours at a partition's end
    /// somewhere (whether the fence skips by it or not: restore detection
    /// does not rest on the fence's trust).
    fn admit(&mut self, topic: &Arc<str>, state: &TopicState) -> Result<(), FenceError> {
        for (partition, top) in (0u32..).zip(&state.tops) {
            let fence_key = state.fence.key(partition);
            let held = self.replay.holding();
            if let Some(key) = fence_key {
                self.replay.admit(topic, partition, key)?;
            }
            if let Some(key) = top.filter(|k| Some(*k) != fence_key) {
                self.replay.admit_anywhere(topic, partition, key)?;
            } else if let Some(key) = top {
                self.replay.check_not_ahead(topic, partition, *key)?;
            }
            if let (false, true, Some(key)) = (held, self.replay.holding(), fence_key.or(*top)) {
                info!(%topic, partition, fence_key = %key, fenced = fence_key.is_some(), "tail fence: confirming nothing until the replay reproduces this key of the partition's tail (it lies after the slot's position)");
            }
        }
        Ok(())
    }

    /// The source record names an event this replay passes: it must come
    /// back as itself ([`ReplayCheck::expect_recorded`]).
    pub fn expect_recorded(&mut self, event: &RecordedEvent) {
        self.replay.expect_recorded(event);
        if self.replay.holding() {
            info!(key = %event.key, topic = %event.topic, "source record: confirming nothing until the replay reproduces the event it names (it lies after the slot's position)");
        }
    }

    /// Whether nothing may be confirmed yet: a fence key of this session
    /// has not come back in the replay.
    pub fn holding(&self) -> bool {
        self.replay.holding()
    }

    /// The stream got past `lsn` (a commit's end, or a keepalive between
    /// transactions).
    pub fn passed(&mut self, lsn: walrelay_pgoutput::Lsn) -> Result<(), FenceError> {
        self.replay.passed(lsn)
    }

    /// One line per topic that had records skipped in this session.
    pub fn log_summary(&self) {
        for dest in self.topics.values() {
            dest.fence.log_summary();
        }
    }
}
