//! The consumer context: librdkafka's rebalance callbacks, turned into
//! events the loop applies between polls.
//!
//! Callbacks run inside the consumer's poll (the loop's `recv`), on the
//! loop's task: they cannot wait for a batch in flight. On revocation the
//! context commits the offsets stored so far (only those of committed
//! batches) and queues the event; the loop then drops the partitions'
//! queued records and ignores the results of their batches in flight.
//!
//! On assignment the context also splits each assigned partition's queue
//! off the consumer's main queue ([`StreamConsumer::split_partition_queue`]).
//! It does so inside the callback, right after librdkafka took the
//! assignment and before it can fetch anything (fetching waits for the
//! group's committed offsets): no record of an assigned partition ever
//! comes through the main queue, which then carries only events
//! (rebalances, errors). librdkafka keeps the split (an application's
//! forwarding is never undone by a fetch start); the loop takes its own
//! handle on the queue when it applies the event, after dropping the
//! handle of an earlier assignment (dropping a handle disables the wake-up
//! callback of the queue, which every handle shares).
//!
//! A rebalance often comes without a record (the poll that ran the
//! callback returns nothing), so queueing an event also wakes the loop
//! ([`LoopContext::rebalanced`]): it acts on the event at once, not when
//! the next record of some partition arrives. A
//! batch still in flight on a revoked partition either commits or not as
//! a whole; the partition's new owner waits on the same mark rows and
//! drops whatever it committed as duplicates, so nothing is applied twice.

use std::sync::{Mutex, OnceLock, PoisonError, Weak};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, TopicPartitionList};

use crate::metrics::{LoopMetrics, PartitionLabels};

/// A rebalance seen by the context, applied by the loop.
#[derive(Debug)]
pub(crate) enum RebalanceEvent {
    Assigned(Vec<(String, i32)>),
    Revoked(Vec<(String, i32)>),
}

/// The consumer context: commits on revoke, queues the events, and takes
/// the consumer lag from librdkafka's statistics.
pub(crate) struct LoopContext {
    events: Mutex<Vec<RebalanceEvent>>,
    /// Woken when an event is queued.
    queued: tokio::sync::Notify,
    metrics: LoopMetrics,
    /// The consumer, to split partition queues off on assignment (weak:
    /// the consumer owns the context).
    consumer: OnceLock<Weak<StreamConsumer<LoopContext>>>,
}

impl LoopContext {
    pub(crate) fn new(metrics: LoopMetrics) -> LoopContext {
        LoopContext {
            events: Mutex::new(Vec::new()),
            queued: tokio::sync::Notify::new(),
            metrics,
            consumer: OnceLock::new(),
        }
    }

    /// Tells the context its consumer (once, right after creating it).
    pub(crate) fn attach(&self, consumer: Weak<StreamConsumer<LoopContext>>) {
        let _ = self.consumer.set(consumer);
    }

    fn push(&self, event: RebalanceEvent) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
        // Stored as a permit when the loop is not waiting: never missed.
        self.queued.notify_one();
    }

    /// Completes when an event was queued since the last completion.
    pub(crate) async fn rebalanced(&self) {
        self.queued.notified().await;
    }

    /// The events seen since the last call.
    pub(crate) fn take(&self) -> Vec<RebalanceEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl ClientContext for LoopContext {
    fn stats(&self, statistics: Statistics) {
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                // -1: unknown (not fetching it, or no offset yet).
                if *partition >= 0 && p.consumer_lag >= 0 {
                    self.metrics
                        .lag_records
                        .get_or_create(&PartitionLabels {
                            topic: topic.clone(),
                            partition: *partition,
                        })
                        .set(p.consumer_lag);
                }
            }
        }
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if super::rejoin::is_refusal_log(fac, log_message) {
            // The loop says what it means and what it does, rate-limited
            // (rejoin.rs); librdkafka would say "FATAL" at every attempt.
            tracing::debug!(target: "librdkafka", "{fac}: {log_message}");
            return;
        }
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", "{fac}: {log_message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", "{fac}: {log_message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "{fac}: {log_message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", "{fac}: {log_message}"),
        }
    }
}

impl ConsumerContext for LoopContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            commit_sync(consumer, "partitions revoked");
            let revoked = partitions(tpl);
            tracing::info!(?revoked, "partitions revoked");
            self.push(RebalanceEvent::Revoked(revoked));
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let assigned = partitions(tpl);
                tracing::info!(?assigned, "partitions assigned");
                // Still inside the callback: librdkafka has fetched nothing
                // for these partitions yet. Splitting now is what keeps
                // their records off the main queue; the handle itself is
                // dropped, the loop takes its own. (Upgrading cannot fail
                // while the loop polls: it holds the consumer.)
                if let Some(consumer) = self.consumer.get().and_then(Weak::upgrade) {
                    for tp in &assigned {
                        drop(consumer.split_partition_queue(&tp.0, tp.1));
                    }
                }
                self.push(RebalanceEvent::Assigned(assigned));
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!("rebalance error: {e}"),
        }
    }
}

/// Commits the stored offsets synchronously; "nothing to commit" is fine.
pub(crate) fn commit_sync<C: Consumer<LoopContext>>(consumer: &C, why: &str) {
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) => tracing::debug!("offsets committed ({why})"),
        Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        // The records will be redelivered and skipped by their marks.
        Err(e) => tracing::warn!("committing offsets ({why}) failed: {e}"),
    }
}
