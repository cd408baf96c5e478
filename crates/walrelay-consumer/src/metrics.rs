//! What the consumer did, as counters a test can read and metrics a service
//! can expose through Prometheus (`prometheus-client`).
//!
//! [`Counters`] are the exact totals (lock-free, shared by clones of a
//! store). [`LoopMetrics`] adds what only the loop knows: batch sizes,
//! apply latency, retries and, per partition, the high-water mark, the
//! consumer lag and whether the partition is stopped. Both register into a
//! [`Registry`] under `walrelay_consumer_*`; docs/metrics.md lists them.

use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Live counters, shared (`Arc`) between a store and whoever reports them.
///
/// Reading them is cheap and lock-free; a [`CountersSnapshot`] is not an
/// atomic cut across them, which does not matter for monitoring.
#[derive(Debug, Default)]
pub struct Counters {
    /// Records whose side effects were committed.
    pub processed: Counter<u64, AtomicU64>,
    /// Deliveries skipped because their key was not above the high-water
    /// mark (replays, redeliveries after a rebalance or a crash).
    pub duplicates: Counter<u64, AtomicU64>,
    /// Records whose previous key (`walrelay-prev` or `walrelay-prev-key`) was above the high-water mark:
    /// something before them was never processed (see the crate docs for
    /// what this can and cannot detect).
    pub gaps: Counter<u64, AtomicU64>,
    /// Attempts that failed (handler error or database error) and were
    /// rolled back.
    pub errors: Counter<u64, AtomicU64>,
    /// Records parked in the dead-letter table.
    pub parked: Counter<u64, AtomicU64>,
}

/// A copy of [`Counters`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    /// See [`Counters::processed`].
    pub processed: u64,
    /// See [`Counters::duplicates`].
    pub duplicates: u64,
    /// See [`Counters::gaps`].
    pub gaps: u64,
    /// See [`Counters::errors`].
    pub errors: u64,
    /// See [`Counters::parked`].
    pub parked: u64,
}

impl Counters {
    /// Reads all counters.
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            processed: self.processed.get(),
            duplicates: self.duplicates.get(),
            gaps: self.gaps.get(),
            errors: self.errors.get(),
            parked: self.parked.get(),
        }
    }

    /// Registers the counters (shared, not copied) into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("walrelay_consumer");
        r.register(
            "records_applied",
            "Records whose side effects were committed",
            self.processed.clone(),
        );
        r.register(
            "duplicates_skipped",
            "Deliveries skipped because the high-water mark already covered them",
            self.duplicates.clone(),
        );
        r.register(
            "gaps",
            "Records whose previous key (walrelay-prev or walrelay-prev-key) was above the high-water mark",
            self.gaps.clone(),
        );
        r.register(
            "failed_attempts",
            "Batch or record attempts that failed and were rolled back",
            self.errors.clone(),
        );
        r.register(
            "parked",
            "Records parked in walrelay_consumer_parked",
            self.parked.clone(),
        );
    }

    pub(crate) fn incr(counter: &Counter<u64, AtomicU64>) {
        counter.inc();
    }
}

/// Labels of a per-partition metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
}

/// Labels of a per-partition, per-source metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MarkLabels {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Source (`walrelay-source`).
    pub source: String,
}

/// The loop's own metrics (see the module docs).
#[derive(Debug, Clone)]
pub struct LoopMetrics {
    /// Records per committed batch.
    pub batch_records: Histogram,
    /// Seconds from the start of a batch transaction to its commit.
    pub apply_seconds: Histogram,
    /// Attempts retried after a failure (handler or database).
    pub retries: Counter<u64, AtomicU64>,
    /// Batch transactions committed (records per batch on average:
    /// applied records over this).
    pub batches: Counter<u64, AtomicU64>,
    /// Times a partition was paused in Kafka. Each pause makes librdkafka
    /// discard what it prefetched for the partition and fetch it again on
    /// resume. Flow control no longer pauses (a full partition's own
    /// queue is just not read); what remains is a partition stopped by a
    /// poison record, or one librdkafka gave no queue of its own (see
    /// docs/consumer.md, flow control).
    pub pauses: Counter<u64, AtomicU64>,
    /// The commit LSN (high 64 bits of the key) of each mark.
    pub hwm_commit_lsn: Family<MarkLabels, Gauge<i64, AtomicI64>>,
    /// Records in each partition after the consumer's position, from
    /// librdkafka's statistics (`statistics.interval.ms`, 5 s by default).
    pub lag_records: Family<PartitionLabels, Gauge<i64, AtomicI64>>,
    /// 1 while a partition is stopped by a poison record.
    pub stopped: Family<PartitionLabels, Gauge<i64, AtomicI64>>,
    /// Records of the group waiting in `walrelay_consumer_parked`, read
    /// from the table when the loop starts and every
    /// [`crate::consumer_loop::PARKED_REFRESH`] (a re-drive elsewhere
    /// shows too).
    pub parked_records: Gauge<i64, AtomicI64>,
    /// Where the assigned partitions' time went, in partition-seconds
    /// (each assigned partition adds one second per second, to the
    /// [`Phase`] it is in): a throughput problem shows as the phase that
    /// is not the handler.
    pub phase_seconds: Family<PhaseLabels, Counter<f64, AtomicU64>>,
}

/// Labels of [`LoopMetrics::phase_seconds`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// [`Phase::name`].
    pub phase: String,
}

/// What an assigned partition is doing, for [`LoopMetrics::phase_seconds`].
///
/// A partition without a batch in flight is in one of the first five; the
/// time of a batch in flight is split by the batch itself into the last
/// three, and [`Phase::InFlight`] counts it as the loop saw it (from the
/// start of the batch to the loop acting on its outcome), so `in_flight`
/// minus the three is the time a finished batch waited for the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Waiting for records from Kafka, with room for them.
    Polling,
    /// Paused in Kafka (its prefetched records discarded), nothing queued
    /// to apply: only a partition without a queue of its own (see
    /// docs/consumer.md, flow control).
    Paused,
    /// Waiting for a retry (backoff) or for more records (linger).
    Backoff,
    /// A batch is ready but every connection of the pool is busy.
    Pool,
    /// Stopped by a poison record.
    Stopped,
    /// A batch in flight, as the loop saw it.
    InFlight,
    /// Of a batch in flight: waiting for its connection (connecting).
    Connecting,
    /// Of a batch in flight: in the service's handler.
    Handler,
    /// Of a batch in flight: the rest of its transaction (locking and
    /// raising the marks, dropping duplicates, `COMMIT`).
    Commit,
}

impl Phase {
    /// Every phase, in report order.
    pub const ALL: [Phase; 9] = [
        Phase::Polling,
        Phase::Paused,
        Phase::Backoff,
        Phase::Pool,
        Phase::Stopped,
        Phase::InFlight,
        Phase::Connecting,
        Phase::Handler,
        Phase::Commit,
    ];

    /// The `phase` label.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Polling => "polling",
            Phase::Paused => "paused",
            Phase::Backoff => "backoff",
            Phase::Pool => "pool",
            Phase::Stopped => "stopped",
            Phase::InFlight => "in_flight",
            Phase::Connecting => "connecting",
            Phase::Handler => "handler",
            Phase::Commit => "commit",
        }
    }
}

impl Default for LoopMetrics {
    fn default() -> Self {
        LoopMetrics {
            batch_records: Histogram::new([
                1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0,
            ]),
            apply_seconds: Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0,
            ]),
            retries: Counter::default(),
            batches: Counter::default(),
            pauses: Counter::default(),
            hwm_commit_lsn: Family::default(),
            lag_records: Family::default(),
            stopped: Family::default(),
            parked_records: Gauge::default(),
            phase_seconds: Family::default(),
        }
    }
}

impl LoopMetrics {
    /// The counter of one phase (shared: adding to it adds to the metric).
    pub fn phase(&self, phase: Phase) -> Counter<f64, AtomicU64> {
        self.phase_seconds
            .get_or_create(&PhaseLabels {
                phase: phase.name().to_owned(),
            })
            .clone()
    }

    /// Partition-seconds per phase so far, in [`Phase::ALL`] order.
    pub fn time_breakdown(&self) -> Vec<(Phase, f64)> {
        Phase::ALL
            .into_iter()
            .map(|p| (p, self.phase(p).get()))
            .collect()
    }

    /// Registers the metrics (shared, not copied) into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("walrelay_consumer");
        r.register(
            "batch_records",
            "Records per committed batch transaction",
            self.batch_records.clone(),
        );
        r.register(
            "apply_seconds",
            "Time from the start of a batch transaction to its commit",
            self.apply_seconds.clone(),
        );
        r.register(
            "retries",
            "Attempts retried after a handler or database failure",
            self.retries.clone(),
        );
        r.register(
            "batches",
            "Batch transactions committed",
            self.batches.clone(),
        );
        r.register(
            "pauses",
            "Times a partition was paused in Kafka (each costs a refetch of its prefetched records)",
            self.pauses.clone(),
        );
        r.register(
            "hwm_commit_lsn",
            "Commit LSN (high 64 bits of the key) of each high-water mark",
            self.hwm_commit_lsn.clone(),
        );
        r.register(
            "lag_records",
            "Records in the partition after the last one applied",
            self.lag_records.clone(),
        );
        r.register(
            "partition_stopped",
            "1 while a partition is stopped by a poison record",
            self.stopped.clone(),
        );
        r.register(
            "parked_records",
            "Records of the group waiting in walrelay_consumer_parked (read from the table)",
            self.parked_records.clone(),
        );
        r.register(
            "partition_seconds",
            "Partition-seconds per phase: what the assigned partitions waited for",
            self.phase_seconds.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_reads_all() {
        let c = Counters::default();
        Counters::incr(&c.processed);
        Counters::incr(&c.processed);
        Counters::incr(&c.duplicates);
        Counters::incr(&c.gaps);
        c.errors.inc_by(3);
        c.parked.inc();
        assert_eq!(
            c.snapshot(),
            CountersSnapshot {
                processed: 2,
                duplicates: 1,
                gaps: 1,
                errors: 3,
                parked: 1,
            }
        );
    }

    #[test]
    fn metrics_encode_with_their_names() {
        let c = Counters::default();
        let m = LoopMetrics::default();
        let mut registry = Registry::default();
        c.register(&mut registry);
        m.register(&mut registry);
        c.processed.inc_by(7);
        m.lag_records
            .get_or_create(&PartitionLabels {
                topic: "t".into(),
                partition: 2,
            })
            .set(5);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("walrelay_consumer_records_applied_total 7"),
            "{text}"
        );
        assert!(
            text.contains("walrelay_consumer_lag_records{topic=\"t\",partition=\"2\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("walrelay_consumer_apply_seconds_bucket"),
            "{text}"
        );
    }
}
