//! Prometheus metrics and the readiness state of the relay.
//!
//! One [`Metrics`] value (cheap to clone: it is an `Arc`) is shared by the
//! pipeline, which updates it, and the HTTP server (`http.rs`), which
//! renders it on `/metrics` and asks it on `/readyz`. Every metric is
//! documented in `docs/metrics.md`.
//!
//! Updates on the hot path are atomic operations: per-topic counters are
//! looked up once per topic and session ([`TopicCounters`]), not per event.
//!
//! The readiness decision (phase, Kafka's last answers, acknowledgement
//! stalls) lives in `health.rs`; this file owns the registry and the
//! methods the pipeline calls, which update both.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use walrelay_pgoutput::{Lsn, PgTimestamp};

use crate::engine::sink::SinkError;
use crate::kafka::ClientError;

mod failover;
mod slot;

pub use slot::{SlotWal, WAL_STATUSES};
mod health;

pub use health::{ack_stall, ACK_STALL_BOUND, KAFKA_FRESHNESS};
use health::{Health, Phase};

/// Buckets of `walrelay_commit_to_ack_seconds`: 1 ms to 60 s.
pub const COMMIT_TO_ACK_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicLabels {
    topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeadLetterLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KafkaErrorLabels {
    kind: String,
    code: String,
}

/// The counters of one topic, looked up once and then updated without any
/// map lookup in the registry.
#[derive(Debug, Clone)]
pub struct TopicCounters {
    events: Counter,
    bytes: Counter,
    fence_skipped: Counter,
}

impl TopicCounters {
    /// One record of `bytes` bytes acknowledged by Kafka.
    pub fn acked(&self, bytes: u64) {
        self.events.inc();
        self.bytes.inc_by(bytes);
    }

    /// One record not written again: the partition's tail already has it.
    pub fn fence_skipped(&self) {
        self.fence_skipped.inc();
    }
}

struct Inner {
    registry: Registry,
    events: Family<TopicLabels, Counter>,
    event_bytes: Family<TopicLabels, Counter>,
    in_flight_events: Gauge<u64, AtomicU64>,
    in_flight_bytes: Gauge<u64, AtomicU64>,
    confirmed_flush_lsn: Gauge<u64, AtomicU64>,
    server_wal_end_lsn: Gauge<u64, AtomicU64>,
    slot_lag_bytes: Gauge<u64, AtomicU64>,
    /// PostgreSQL's own lag for the slot at the last publication check
    /// (`pg_current_wal_lsn()` minus the slot's `confirmed_flush_lsn`,
    /// sampled together).
    server_slot_lag: AtomicU64,
    commit_to_ack: Histogram,
    reconnects: Counter,
    sessions: Counter,
    kafka_errors: Family<KafkaErrorLabels, Counter>,
    dead_letter_records: Family<DeadLetterLabels, Counter>,
    fence_skipped: Family<TopicLabels, Counter>,
    fence_unfenced: Family<TopicLabels, Counter>,
    fence_untrusted: Family<TopicLabels, Counter>,
    fence_records_read: Counter,
    source_record_available: Gauge,
    ready: Gauge,
    failover: failover::FailoverGauges,
    slot: slot::SlotGauges,
    streaming: AtomicBool,
    health: Health,
}

/// The relay's metrics and readiness state. Clones share everything.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every walrelay metric registered (all zero).
    pub fn new() -> Metrics {
        Self::with_origin(Instant::now())
    }

    /// With the readiness clock started at `origin` (tests start it in the
    /// past to have old timestamps without waiting).
    fn with_origin(origin: Instant) -> Metrics {
        let mut r = Registry::with_prefix("walrelay");
        let events = add(
            &mut r,
            "events",
            "Records acknowledged by Kafka, per topic (replays after a restart count again)",
            Family::<TopicLabels, Counter>::default(),
        );
        let event_bytes = add_in(
            &mut r,
            "event",
            Unit::Bytes,
            "Bytes of records acknowledged by Kafka (key, value, headers, topic name), per topic",
            Family::<TopicLabels, Counter>::default(),
        );
        let in_flight_events = add(
            &mut r,
            "in_flight_events",
            "Records sent to Kafka and not yet acknowledged",
            Gauge::<u64, AtomicU64>::default(),
        );
        let in_flight_bytes = add_in(
            &mut r,
            "in_flight",
            Unit::Bytes,
            "Bytes of records sent to Kafka and not yet acknowledged",
            Gauge::<u64, AtomicU64>::default(),
        );
        let confirmed_flush_lsn = add(
            &mut r,
            "confirmed_flush_lsn",
            "Last WAL position walrelay confirmed to PostgreSQL, as a byte position",
            Gauge::<u64, AtomicU64>::default(),
        );
        let server_wal_end_lsn = add(&mut r, "server_wal_end_lsn", "The server's current WAL position (pg_current_wal_lsn(), sampled every publication_check_interval, or the replication stream's wal_end if higher), as a byte position", Gauge::<u64, AtomicU64>::default());
        let slot_lag_bytes = add_in(&mut r, "slot_lag", Unit::Bytes, "WAL the slot still holds for walrelay: server_wal_end_lsn minus confirmed_flush_lsn, or PostgreSQL's own lag for the slot at the last check when larger", Gauge::<u64, AtomicU64>::default());
        let commit_to_ack = add_in(&mut r, "commit_to_ack", Unit::Seconds, "Time from a transaction's commit (PostgreSQL clock) to Kafka's acknowledgement of each of its records (relay clock)", Histogram::new(COMMIT_TO_ACK_BUCKETS));
        let reconnects = add(
            &mut r,
            "reconnects",
            "Sessions restarted after a transient failure (PostgreSQL or Kafka lost)",
            Counter::default(),
        );
        let sessions = add(
            &mut r,
            "sessions",
            "Sessions that started streaming from the slot",
            Counter::default(),
        );
        let kafka_errors = add(
            &mut r,
            "kafka_errors",
            "Kafka errors that ended a session, by kind and librdkafka error code",
            Family::<KafkaErrorLabels, Counter>::default(),
        );
        let dead_letter_records = add(&mut r, "dead_letter_records", "Events diverted to the dead-letter topic, by kind of problem (counted when sent; a replay after a restart counts again)", Family::<DeadLetterLabels, Counter>::default());
        // Every kind from the start, so that a rate over it is defined
        // before the first dead letter.
        for kind in crate::engine::route::DEAD_LETTER_KINDS {
            drop(dead_letter_records.get_or_create(&DeadLetterLabels {
                kind: (*kind).to_owned(),
            }));
        }
        let fence_skipped = add(&mut r, "fence_skipped_records", "Replayed records not written to Kafka again because the partition's tail already had them (the tail fence), per topic", Family::<TopicLabels, Counter>::default());
        let fence_unfenced = add(&mut r, "fence_unfenced_topics", "Sessions in which a topic was not fenced because its layout (partition count or routing) changed since its last records were written, per topic", Family::<TopicLabels, Counter>::default());
        let fence_untrusted = add(&mut r, "fence_untrusted_partitions", "Sessions in which a partition was not fenced because its last record of this source did not provably belong to it (a copy: its layout names another partition, or its walrelay-prev-key names no record before it), per topic", Family::<TopicLabels, Counter>::default());
        let fence_records_read = add(
            &mut r,
            "fence_records_read",
            "Records the tail fence read from the ends of partitions",
            Counter::default(),
        );
        let source_record_available = add(&mut r, "source_record_available", "1 while the source record (relay.source_record_topic) was read at the session's start and its last write succeeded; 0 while it is missing, unreadable or cannot be written, and restore detection relies on the data topics' tails alone", Gauge::<i64>::default());
        source_record_available.set(1);
        let up = add(
            &mut r,
            "up",
            "1 while the walrelay process runs",
            Gauge::<i64>::default(),
        );
        up.set(1);
        let failover = failover::FailoverGauges::register(&mut r);
        let slot = slot::SlotGauges::register(&mut r);
        let ready = add(&mut r, "ready", "1 while /readyz answers 200 (streaming from the slot and Kafka reachable), as of the last scrape", Gauge::<i64>::default());
        r.register(
            "build",
            "walrelay build information",
            Info::new(vec![(
                "version".to_owned(),
                env!("CARGO_PKG_VERSION").to_owned(),
            )]),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry: r,
                events,
                event_bytes,
                in_flight_events,
                in_flight_bytes,
                confirmed_flush_lsn,
                server_wal_end_lsn,
                slot_lag_bytes,
                server_slot_lag: AtomicU64::new(0),
                commit_to_ack,
                reconnects,
                sessions,
                kafka_errors,
                dead_letter_records,
                fence_skipped,
                fence_unfenced,
                fence_untrusted,
                fence_records_read,
                source_record_available,
                ready,
                failover,
                slot,
                streaming: AtomicBool::new(false),
                health: Health::new(origin),
            }),
        }
    }

    /// The exposition in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let ready = self.readiness().is_ok();
        self.inner.ready.set(i64::from(ready));
        let mut out = String::new();
        // Writing to a String cannot fail; the encoder only fails on a
        // failing writer.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry);
        out
    }

    /// The counters of `topic`, to keep for the rest of the session.
    pub fn topic(&self, topic: &str) -> TopicCounters {
        let labels = TopicLabels {
            topic: topic.to_owned(),
        };
        TopicCounters {
            events: self.inner.events.get_or_create_owned(&labels),
            bytes: self.inner.event_bytes.get_or_create_owned(&labels),
            fence_skipped: self.inner.fence_skipped.get_or_create_owned(&labels),
        }
    }

    /// The tail fence read the tails of `topic`: `records` records, and
    /// the topic was left unfenced or not.
    pub fn fence_read(&self, topic: &str, records: u64, unfenced: bool) {
        self.inner.fence_records_read.inc_by(records);
        if unfenced {
            self.inner
                .fence_unfenced
                .get_or_create(&TopicLabels {
                    topic: topic.to_owned(),
                })
                .inc();
        }
    }

    /// Whether the source record could be read at the session's start
    /// and written since ([`crate::source::source_record`]).
    pub fn set_source_record_available(&self, available: bool) {
        self.inner.source_record_available.set(i64::from(available));
    }

    /// A partition of `topic` was left unfenced because its tail record
    /// of this source did not provably belong to its sequence.
    pub fn fence_untrusted(&self, topic: &str) {
        self.inner
            .fence_untrusted
            .get_or_create(&TopicLabels {
                topic: topic.to_owned(),
            })
            .inc();
    }

    /// A record committed at `commit_time` (PostgreSQL's clock) was
    /// acknowledged now (this host's clock). Negative differences (clock
    /// skew) count as 0.
    pub fn observe_commit_to_ack(&self, commit_time: PgTimestamp) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i128::try_from(d.as_micros()).unwrap_or(i128::MAX));
        let micros = (now - commit_time.unix_micros()).max(0);
        // Precision beyond 2^53 µs (285 years) does not matter here.
        #[allow(clippy::cast_precision_loss)]
        let seconds = micros as f64 / 1e6;
        self.inner.commit_to_ack.observe(seconds);
    }

    /// Any record acknowledged: Kafka is reachable.
    pub fn kafka_ok(&self) {
        self.inner.health.kafka_ok();
    }

    /// Kafka acknowledged a record: it is reachable, and the relay's
    /// records are moving (see [`ACK_STALL_BOUND`]).
    pub fn acknowledged(&self) {
        self.inner.health.acknowledged();
    }

    /// A contact with Kafka failed outside of a session (the readiness
    /// probe): not ready until the next success.
    pub fn kafka_unreachable(&self, reason: impl Into<String>) {
        self.inner.health.kafka_unreachable(reason.into());
    }

    /// A Kafka error ended a session.
    pub fn kafka_error(&self, error: &SinkError) {
        let (kind, code) = kafka_error_labels(error);
        self.inner
            .kafka_errors
            .get_or_create(&KafkaErrorLabels { kind, code })
            .inc();
        self.kafka_unreachable(error.to_string());
    }

    /// The tracker's in-flight totals.
    pub fn set_in_flight(&self, events: usize, bytes: usize) {
        if events > 0 && self.inner.in_flight_events.get() == 0 {
            self.inner.health.started_waiting();
        }
        self.inner.in_flight_events.set(events as u64);
        self.inner.in_flight_bytes.set(bytes as u64);
    }

    /// The position last confirmed to PostgreSQL.
    pub fn set_confirmed(&self, lsn: Lsn) {
        self.inner.confirmed_flush_lsn.set(lsn.0);
        self.update_lag();
    }

    /// The server's WAL position: `pg_current_wal_lsn()` from the periodic
    /// publication check (which keeps sampling while the relay does not
    /// read: Kafka down, between sessions), or the `wal_end` of a keepalive
    /// or XLogData header. These sources run at different points, so the
    /// gauge keeps the highest seen rather than going back and forth.
    pub fn set_server_wal_end(&self, lsn: Lsn) {
        if lsn.0 == 0 {
            return;
        }
        self.inner
            .server_wal_end_lsn
            .inner()
            .fetch_max(lsn.0, Ordering::Relaxed);
        self.update_lag();
    }

    /// PostgreSQL's own lag for the slot, from the periodic check: the
    /// server's WAL position minus the slot's `confirmed_flush_lsn`, read
    /// in one statement.
    pub fn set_server_slot_lag(&self, bytes: u64) {
        self.inner.server_slot_lag.store(bytes, Ordering::Relaxed);
        self.update_lag();
    }

    /// The lag: the larger of what this process computes (server position
    /// minus the position it confirmed) and PostgreSQL's own figure at the
    /// last check. The process's figure alone can be too low exactly when
    /// it matters: with Kafka down the relay stops reading, the walsender
    /// blocks on a full socket and never processes the last status
    /// update, so the slot still holds WAL the relay counts as confirmed
    /// (seen: 0.6 MB here against PostgreSQL's 4.5 MB).
    fn update_lag(&self) {
        let end = self.inner.server_wal_end_lsn.get();
        let confirmed = self.inner.confirmed_flush_lsn.get();
        let server = self.inner.server_slot_lag.load(Ordering::Relaxed);
        // Before the first session (a standby waiting for the slot) the
        // process knows no confirmed position: no lag rather than the
        // whole WAL position.
        if end > 0 && confirmed > 0 {
            self.inner
                .slot_lag_bytes
                .set(end.saturating_sub(confirmed).max(server));
        }
    }

    /// What the last publication check found about a PostgreSQL failover.
    pub fn set_failover(&self, findings: &[crate::source::slot_failover::Finding]) {
        self.inner.failover.set(findings);
    }

    /// The slot's `wal_status` and `safe_wal_size` at the last publication
    /// check (`None`: no such slot).
    pub fn set_slot_wal(&self, slot: Option<&SlotWal>) {
        self.inner.slot.set(slot);
    }

    /// A session started streaming from the slot.
    pub fn session_started(&self, confirmed: Lsn) {
        self.inner.sessions.inc();
        self.set_confirmed(confirmed);
        self.set_in_flight(0, 0);
        self.inner.streaming.store(true, Ordering::Relaxed);
        self.inner.health.set_phase(Phase::Streaming);
    }

    /// A session ended; `error` is why, if it failed.
    pub fn session_ended(&self, error: Option<String>) {
        self.inner.streaming.store(false, Ordering::Relaxed);
        self.set_in_flight(0, 0);
        self.inner.health.session_ended(error);
    }

    /// A new session is about to start after a transient failure.
    pub fn reconnecting(&self) {
        self.inner.reconnects.inc();
    }

    /// Stop requested: the relay drains and exits.
    pub fn draining(&self) {
        self.inner.streaming.store(false, Ordering::Relaxed);
        self.inner.health.set_phase(Phase::Draining);
    }

    /// The relay returned (for whatever reason).
    pub fn stopped(&self) {
        self.inner.streaming.store(false, Ordering::Relaxed);
        self.inner.health.set_phase(Phase::Stopped);
    }

    /// Whether a session is streaming from the slot right now.
    pub fn is_streaming(&self) -> bool {
        self.inner.streaming.load(Ordering::Relaxed)
    }

    /// `Ok` when the relay is streaming from the slot and Kafka answered
    /// within [`KAFKA_FRESHNESS`] with no failure since; otherwise why not.
    pub fn readiness(&self) -> Result<(), String> {
        self.inner
            .health
            .readiness(self.inner.in_flight_events.get())
    }

    /// One event of `kind` ([`crate::engine::route::RouteError::kind`]) diverted
    /// to the dead-letter topic.
    pub fn dead_letter_record(&self, kind: &str) {
        self.inner
            .dead_letter_records
            .get_or_create(&DeadLetterLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }
}

/// `kind`: the [`SinkError`] variant in snake case; `code`: librdkafka's
/// error code name, or empty.
fn kafka_error_labels(error: &SinkError) -> (String, String) {
    let kind = match error {
        SinkError::Client(ClientError::Config { .. }) => "config",
        SinkError::Client(ClientError::Create(_)) => "create",
        SinkError::Client(ClientError::Login(_)) => "login",
        SinkError::QueueFull => "queue_full",
        SinkError::Produce { .. } => "produce",
        SinkError::Delivery { .. } | SinkError::NotAcknowledged { .. } => "delivery",
        SinkError::RecordTooLarge { .. } => "record_too_large",
        SinkError::Metadata { .. } => "metadata",
        SinkError::TopicMissing { .. } => "topic_missing",
        SinkError::FlushTimeout { .. } => "flush_timeout",
        SinkError::Flush(_) => "flush",
        SinkError::Task { .. } => "task",
    };
    let code = error.code().map(|c| format!("{c:?}")).unwrap_or_default();
    (kind.to_owned(), code)
}

/// Registers `metric` as `name` and returns it (a handle: clones share
/// the value).
fn add<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// [`add`] with a unit (a suffix of the metric's name).
fn add_in<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    unit: Unit,
    help: &str,
    metric: M,
) -> M {
    registry.register_with_unit(name, help, unit, metric.clone());
    metric
}

#[cfg(test)]
mod tests;
