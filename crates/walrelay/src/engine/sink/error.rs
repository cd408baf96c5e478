//! The sink's errors and what the relay should do about each.

use rdkafka::error::RDKafkaErrorCode;
use tracing::warn;

use crate::kafka::ClientError;

/// What the relay should do about a [`SinkError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Nothing is lost: wait for deliveries, then send the record again.
    RetryAfterDeliveries,
    /// Stop forwarding, drop the sink, reconnect to the slot from its
    /// confirmed LSN and replay.
    RestartFromSlot,
    /// Restarting cannot help (configuration, a record the broker can never
    /// take): stop with the error.
    Fatal,
}

/// Errors of the Kafka sink.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// A producer property is invalid or would weaken the delivery
    /// guarantees ([`ClientError::Config`]), or librdkafka refused to
    /// create the producer ([`ClientError::Create`]): the checks every
    /// Kafka client of walrelay shares, with their messages.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// librdkafka's queue is full: wait for deliveries and send again.
    #[error("the Kafka producer queue is full (queue.buffering.max.messages/kbytes)")]
    QueueFull,
    /// A record could not be enqueued.
    #[error("cannot enqueue a record for {topic} partition {partition}: {message} ({code:?})")]
    Produce {
        /// Target topic.
        topic: String,
        /// Target partition.
        partition: i32,
        /// librdkafka's error code.
        code: RDKafkaErrorCode,
        /// librdkafka's description, with context.
        message: String,
    },
    /// A record larger than the producer (`message.max.bytes`, checked
    /// when it is enqueued) or the broker (the topic's
    /// `max.message.bytes`, in the delivery report) accepts. Not retried:
    /// a replay would fail at the same record. A dead-letter record cannot
    /// stand in for it either, since it would carry the same bytes.
    #[error(
        "record {key} for {topic} partition {partition} is {bytes} bytes (key, value and \
         headers), more than Kafka accepts: {message} ({code:?}); fix: raise the topic's \
         max.message.bytes and the producer's message.max.bytes (kafka.properties, e.g. \
         \"message.max.bytes\" = \"10485760\") together with the consumers' fetch sizes, or keep \
         events smaller (store large payloads elsewhere and publish a reference); nothing from \
         this event on was confirmed to PostgreSQL, so it is replayed when walrelay starts again"
    )]
    RecordTooLarge {
        /// The record's idempotency key (32 hex digits), or `?` if unknown.
        key: String,
        /// Target topic.
        topic: String,
        /// Target partition.
        partition: i32,
        /// Key, value and header bytes.
        bytes: usize,
        /// librdkafka's error code (`MessageSizeTooLarge`).
        code: RDKafkaErrorCode,
        /// librdkafka's description.
        message: String,
    },
    /// Kafka did not acknowledge a record.
    #[error("delivery to {topic} partition {partition} failed: {message} ({code:?})")]
    Delivery {
        /// Target topic.
        topic: String,
        /// Target partition.
        partition: i32,
        /// librdkafka's error code.
        code: RDKafkaErrorCode,
        /// librdkafka's description, with context.
        message: String,
    },
    /// A record waited longer than `message.timeout.ms` for its
    /// acknowledgement: the relay's own deadline, enforced after
    /// [`KafkaSink::stop_sending`](super::KafkaSink::stop_sending)
    /// (librdkafka's would leave a gap, see
    /// [`producer_properties`](super::producer_properties)).
    #[error(
        "{in_flight} records not acknowledged, the oldest after {waited:.1?}: MessageTimedOut: \
         not acknowledged within message.timeout.ms (brokers unreachable or too slow, or a \
         partition with fewer in-sync replicas than min.insync.replicas: kafka-topics \
         --describe --under-min-isr-partitions lists them); nothing was sent after them and \
         nothing from the oldest on was confirmed to PostgreSQL, so the next session replays \
         it (message.timeout.ms is {timeout:?})"
    )]
    NotAcknowledged {
        /// Records still waiting.
        in_flight: usize,
        /// How long the oldest has waited, at least.
        waited: std::time::Duration,
        /// `message.timeout.ms`.
        timeout: std::time::Duration,
    },
    /// Topic metadata could not be fetched.
    #[error("cannot fetch metadata for topic `{topic}`: {message}")]
    Metadata {
        /// The topic.
        topic: String,
        /// librdkafka's or the broker's error code.
        code: Option<RDKafkaErrorCode>,
        /// What went wrong.
        message: String,
    },
    /// The topic does not exist and the brokers did not create it.
    #[error(
        "Kafka topic `{topic}` does not exist (last broker answer: {last_error}) and was not \
         auto-created; create it before starting walrelay, e.g. `kafka-topics.sh --create \
         --topic {topic} --partitions N`, or allow auto-creation on the brokers \
         (auto.create.topics.enable=true) and in the producer (allow.auto.create.topics=true)"
    )]
    TopicMissing {
        /// The topic.
        topic: String,
        /// The broker's last answer for the topic.
        last_error: String,
    },
    /// [`KafkaSink::flush`](super::KafkaSink::flush) timed out.
    #[error("flush timed out with {in_flight} records not yet acknowledged")]
    FlushTimeout {
        /// Records (and requests) still in librdkafka's queues.
        in_flight: i32,
    },
    /// Flushing failed.
    #[error("flush failed: {0}")]
    Flush(RDKafkaErrorCode),
    /// A blocking helper task failed (panic or runtime shut down).
    #[error("Kafka {operation} task failed: {message}")]
    Task {
        /// What the task was doing.
        operation: &'static str,
        /// The join error.
        message: String,
    },
}

impl SinkError {
    /// What the relay should do about this error.
    pub fn recovery(&self) -> Recovery {
        match self {
            SinkError::QueueFull => Recovery::RetryAfterDeliveries,
            // The token service down or overloaded: a later session's
            // login may succeed.
            SinkError::Client(ClientError::Login(e)) if e.is_transient() => {
                Recovery::RestartFromSlot
            }
            SinkError::Client(_) | SinkError::RecordTooLarge { .. } => Recovery::Fatal,
            // A record too large for librdkafka is too large on replay too.
            SinkError::Produce {
                code: RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidArgument,
                ..
            } => Recovery::Fatal,
            // The contract: any delivery failure restarts from the slot.
            SinkError::Delivery { .. }
            | SinkError::NotAcknowledged { .. }
            | SinkError::Produce { .. }
            | SinkError::Metadata { .. }
            | SinkError::TopicMissing { .. }
            | SinkError::FlushTimeout { .. }
            | SinkError::Flush(_)
            | SinkError::Task { .. } => Recovery::RestartFromSlot,
        }
    }

    /// Whether the error means "stop forwarding and restart the pipeline from
    /// the slot's confirmed LSN". True for every delivery error.
    pub fn restarts_pipeline(&self) -> bool {
        self.recovery() == Recovery::RestartFromSlot
    }

    /// librdkafka's error code, if the error has one.
    pub fn code(&self) -> Option<RDKafkaErrorCode> {
        match self {
            SinkError::Produce { code, .. }
            | SinkError::Delivery { code, .. }
            | SinkError::RecordTooLarge { code, .. } => Some(*code),
            SinkError::Metadata { code, .. } => *code,
            SinkError::Flush(code) => Some(*code),
            SinkError::QueueFull => Some(RDKafkaErrorCode::QueueFull),
            SinkError::NotAcknowledged { .. } => Some(RDKafkaErrorCode::MessageTimedOut),
            _ => None,
        }
    }
}

/// librdkafka's answer to a record above `message.max.bytes` (at enqueue)
/// or the broker's limit (in a delivery report).
pub(super) fn is_too_large(code: Option<RDKafkaErrorCode>) -> bool {
    code == Some(RDKafkaErrorCode::MessageSizeTooLarge)
}

impl SinkError {
    /// Logs the structured fields of a Kafka error that ends a session
    /// (the message names them too, this makes them searchable).
    pub fn log_session_end(&self) {
        let e = self;
        let (topic, partition) = match e {
            SinkError::Produce {
                topic, partition, ..
            }
            | SinkError::Delivery {
                topic, partition, ..
            }
            | SinkError::RecordTooLarge {
                topic, partition, ..
            } => (Some(topic.as_str()), Some(*partition)),
            SinkError::Metadata { topic, .. } | SinkError::TopicMissing { topic, .. } => {
                (Some(topic.as_str()), None)
            }
            _ => (None, None),
        };
        warn!(
            topic,
            partition,
            code = e.code().map(|c| format!("{c:?}")),
            error = %e,
            "Kafka error ends the session"
        );
    }
}
