//! The Kafka side of the relay: an idempotent, gapless producer with
//! explicit partitions and one delivery report per record.
//!
//! Delivery guarantees are not configurable. walrelay's consumers accept a
//! record only if its idempotency key is above the partition's high-water
//! mark, so the producer must write, per partition, a gapless run of the key
//! sequence in send order (see `contract.md`, "Kafka side"). That needs
//! `enable.idempotence=true`, `acks=all`, `enable.gapless.guarantee=true`,
//! at most 5 in-flight requests per connection and FIFO queuing; a user
//! property that would weaken any of them is rejected with
//! [`SinkError::Client`] ([`crate::kafka::policy`]). Every other librdkafka property is passed through
//! as-is.
//!
//! Delivery reports are produced by librdkafka on the producer's own polling
//! thread ([`ThreadedProducer`]) and collected in a delivery queue, so
//! they keep flowing while the async side is busy; [`KafkaSink::next_delivery`]
//! reads them. Any delivery error means: stop forwarding, drop the sink, restart
//! from the slot's confirmed LSN ([`SinkError::restarts_pipeline`]).
//!
//! | module | owns |
//! |---|---|
//! | this one | [`KafkaSink`]: creating the producer, its delivery deadline ([`producer_properties`]), partition counts, sending, delivery reports, flushing |
//! | `context` | librdkafka's callbacks: delivery reports, rate-limited log lines |
//! | `error` | [`SinkError`] and the [`Recovery`] each one calls for |
//!
//! The properties it is created with ([`SinkConfig`]: walrelay's defaults,
//! the user's properties, the enforced guarantees) and their checks are
//! every Kafka client's, so they live in the Kafka wing
//! ([`crate::kafka::properties`], [`crate::kafka::policy`]); this module
//! imports them, never the reverse.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, PurgeConfig, ThreadedProducer};

use crate::engine::record::Record;
use crate::kafka::metadata::{topic_metadata, TopicMetadata};
use crate::kafka::properties::{to_client_config, SinkConfig, DEFAULT_MESSAGE_TIMEOUT_MS};
use crate::kafka::ClientError;
use crate::secrets::redact;

mod context;
mod error;

pub use context::{DeliveryReport, LIBRDKAFKA_LOG_INTERVAL};
pub use error::{Recovery, SinkError};

use context::{DeliveryQueue, SinkContext};
use error::is_too_large;

type Inner = ThreadedProducer<SinkContext>;

/// An idempotent, gapless Kafka producer with explicit partitions.
///
/// Dropping it purges everything not yet acknowledged (the pipeline replays
/// from the slot anyway) and waits at most about half a second for
/// librdkafka to wind down; it blocks the current thread for that long.
pub struct KafkaSink {
    producer: Arc<Inner>,
    deliveries: Arc<DeliveryQueue>,
    /// Reports taken from `deliveries` and not yet returned.
    taken: std::vec::IntoIter<DeliveryReport>,
    metadata_timeout: Duration,
    /// The user's `message.timeout.ms`, which the relay enforces itself
    /// ([`producer_properties`]); `None`: wait forever.
    delivery_timeout: Option<Duration>,
}

impl fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("in_flight", &self.producer.in_flight_count())
            .field("metadata_timeout", &self.metadata_timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// Creates the producer (it connects in the background).
    pub fn new(config: &SinkConfig) -> Result<KafkaSink, SinkError> {
        let login = config.login()?;
        let (props, delivery_timeout) = producer_properties(&config.effective_properties()?);
        let mut client_config = to_client_config(&props);
        // librdkafka's log level gates what reaches `ClientContext::log`.
        client_config.set_log_level(
            if props.contains_key("debug")
                || tracing::enabled!(target: "librdkafka", tracing::Level::DEBUG)
            {
                RDKafkaLogLevel::Debug
            } else if tracing::enabled!(target: "librdkafka", tracing::Level::INFO) {
                RDKafkaLogLevel::Info
            } else {
                RDKafkaLogLevel::Warning
            },
        );
        tracing::debug!(properties = ?redact(&props), "creating the Kafka producer");

        let deliveries = Arc::new(DeliveryQueue::default());
        let context = SinkContext {
            deliveries: Arc::clone(&deliveries),
            fatal: Mutex::new(None),
        };
        let producer: Arc<Inner> = login
            .client(&client_config, context)
            .map_err(ClientError::from_rdkafka)?;
        Ok(KafkaSink {
            producer,
            deliveries,
            taken: Vec::new().into_iter(),
            metadata_timeout: config.metadata_timeout,
            delivery_timeout,
        })
    }

    /// How long a record may wait for its acknowledgement before the
    /// session gives up on it (`message.timeout.ms`); `None`: forever.
    /// librdkafka never times a record out itself: the caller does, with
    /// [`stop_sending`](Self::stop_sending) first.
    pub fn delivery_timeout(&self) -> Option<Duration> {
        self.delivery_timeout
    }

    /// Sends nothing more: every record not yet in a produce request is
    /// purged (and reported failed), and acknowledgements of those in
    /// flight are no longer awaited. What the broker appends from this
    /// producer is then a prefix of each partition's records, never a run
    /// with a hole, so a session that gives up calls this before anything
    /// else. Does not block.
    pub fn stop_sending(&self) {
        self.producer
            .purge(PurgeConfig::default().queue().inflight().non_blocking());
    }

    /// The topic's partition count, from metadata: one round trip, so the
    /// caller keeps it (the session's placement asks once per topic and
    /// session; a new session builds a new sink). Fetching
    /// metadata may auto-create a missing topic where the brokers allow it;
    /// a topic that still does not exist when the metadata timeout runs out
    /// is [`SinkError::TopicMissing`].
    pub async fn partitions(&self, topic: &str) -> Result<u32, SinkError> {
        let producer = Arc::clone(&self.producer);
        let name = topic.to_owned();
        let timeout = self.metadata_timeout;
        let count = tokio::task::spawn_blocking(move || partition_count(&producer, &name, timeout))
            .await
            .map_err(|e| SinkError::Task {
                operation: "metadata",
                message: e.to_string(),
            })??;
        Ok(count)
    }

    /// Enqueues one record for `partition` without blocking. Its outcome
    /// arrives later from [`next_delivery`](Self::next_delivery), tagged with
    /// `seq`. [`SinkError::QueueFull`] means nothing was enqueued: wait for
    /// deliveries and send again.
    pub fn send(&self, seq: u64, record: &Record, partition: u32) -> Result<(), SinkError> {
        let produce_error = |code: RDKafkaErrorCode, message: String| SinkError::Produce {
            topic: record.topic.to_string(),
            partition: i32::try_from(partition).unwrap_or(i32::MAX),
            code,
            message,
        };
        let Ok(kafka_partition) = i32::try_from(partition) else {
            return Err(produce_error(
                RDKafkaErrorCode::InvalidArgument,
                "partition number out of range".to_owned(),
            ));
        };
        let Ok(opaque) = usize::try_from(seq) else {
            return Err(produce_error(
                RDKafkaErrorCode::InvalidArgument,
                "sequence number does not fit in usize".to_owned(),
            ));
        };
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (name, value) in &record.headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_ref()),
            });
        }
        let mut kafka_record: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(&record.topic, opaque)
                .partition(kafka_partition)
                .headers(headers);
        if let Some(key) = &record.key {
            kafka_record = kafka_record.key(key.as_ref());
        }
        if let Some(value) = &record.value {
            kafka_record = kafka_record.payload(value.as_ref());
        }
        if let Some(timestamp) = record.timestamp_ms {
            kafka_record = kafka_record.timestamp(timestamp);
        }
        match self.producer.send(kafka_record) {
            Ok(()) => Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                Err(SinkError::QueueFull)
            }
            Err((error, _)) if is_too_large(error.rdkafka_error_code()) => {
                Err(SinkError::RecordTooLarge {
                    key: record.event_key.to_hex(),
                    topic: record.topic.to_string(),
                    partition: kafka_partition,
                    bytes: record.size() - record.topic.len(),
                    code: RDKafkaErrorCode::MessageSizeTooLarge,
                    message: error.to_string(),
                })
            }
            Err((error, _)) => {
                let code = error
                    .rdkafka_error_code()
                    .unwrap_or(RDKafkaErrorCode::InvalidArgument);
                let message = match self.stopped_because(&record.topic) {
                    Some(stopped) => format!("{code}; {stopped}"),
                    None => error.to_string(),
                };
                Err(produce_error(code, message))
            }
        }
    }

    /// The next delivery report, in the order librdkafka reports them
    /// (per partition that is send order). Cancel-safe: the only await is
    /// the wake-up, and reports already taken stay in the sink. Pends
    /// while nothing is in flight. The producer lives as long as the sink,
    /// so there is no "closed" outcome.
    pub async fn next_delivery(&mut self) -> DeliveryReport {
        loop {
            if let Some(delivery) = self.try_next_delivery() {
                return delivery;
            }
            self.deliveries.ready.notified().await;
        }
    }

    /// A delivery report that is already available, without waiting.
    pub fn try_next_delivery(&mut self) -> Option<DeliveryReport> {
        let delivery = match self.taken.next() {
            Some(d) => d,
            None => {
                self.taken = self.deliveries.take().into_iter();
                self.taken.next()?
            }
        };
        Some(self.explain(delivery))
    }

    /// Adds the producer's fatal error to a purge error reported before the
    /// fatal error event reached the context.
    /// An authorization error that stopped the producer gets the ACL to
    /// grant, whichever report carries it.
    fn explain(&self, mut delivery: DeliveryReport) -> DeliveryReport {
        if let Err(SinkError::Delivery {
            code,
            message,
            topic,
            ..
        }) = &mut delivery.result
        {
            let purged = matches!(
                code,
                RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight
            );
            if purged && !message.contains("the producer stopped") {
                if let Some(stopped) = self.stopped_because(topic) {
                    message.push_str(&format!("; {stopped}"));
                }
            } else if let Some((fatal, _)) = self.producer.client().fatal_error() {
                if crate::kafka::acl::is_denied(fatal) && !message.contains("Kafka denied") {
                    message.push_str(&format!("; {}", context::denied_to_producer(fatal, topic)));
                }
            }
        }
        delivery
    }

    /// Why the producer stopped (its fatal error), with the ACL to grant
    /// when Kafka refused it something, e.g. the idempotent producer's id.
    fn stopped_because(&self, topic: &str) -> Option<String> {
        let (code, reason) = self.producer.client().fatal_error()?;
        let mut stopped = format!("the producer stopped: {code:?}: {reason}");
        if crate::kafka::acl::is_denied(code) {
            stopped.push_str("; ");
            stopped.push_str(&context::denied_to_producer(code, topic));
        }
        Some(stopped)
    }

    /// Records (and requests) librdkafka has not finished with, including
    /// delivery reports not yet handed to the channel.
    pub fn in_flight(&self) -> i32 {
        self.producer.in_flight_count()
    }

    /// Waits until every enqueued record has a delivery report (success or
    /// failure), or `timeout`. Runs on a blocking thread; cancelling the
    /// returned future does not stop that thread before `timeout`.
    ///
    /// Queued records still wait out `linger.ms`: rdkafka 0.39 implements
    /// flush as repeated `rd_kafka_flush(0)` calls plus polling, so
    /// librdkafka's "ignore linger while flushing" lasts only for each
    /// instant call. With the default `linger.ms=5` that does not matter.
    pub async fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        let producer = Arc::clone(&self.producer);
        tokio::task::spawn_blocking(move || match producer.flush(timeout) {
            Ok(()) => Ok(()),
            Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => {
                Err(SinkError::FlushTimeout {
                    in_flight: producer.in_flight_count(),
                })
            }
            Err(error) => Err(SinkError::Flush(
                error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
            )),
        })
        .await
        .map_err(|e| SinkError::Task {
            operation: "flush",
            message: e.to_string(),
        })?
    }
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        // Unacknowledged records fail with a purge error (nobody listens any
        // more); a flush running on a blocking thread returns promptly. The
        // producer's own drop then purges again, flushes for at most 500 ms
        // and destroys the client.
        self.stop_sending();
    }
}

/// Blocking: the topic's partition count from metadata, retried until
/// `timeout` while the topic is missing or being created.
fn partition_count(producer: &Inner, topic: &str, timeout: Duration) -> Result<u32, SinkError> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(50);
    loop {
        let remaining = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let metadata = producer
            .client()
            .fetch_metadata(Some(topic), remaining)
            .map_err(|error| {
                let code = error.rdkafka_error_code();
                SinkError::Metadata {
                    topic: topic.to_owned(),
                    code,
                    message: match code {
                        Some(code) => format!("{code} (waited up to {timeout:?})"),
                        None => error.to_string(),
                    },
                }
            })?;
        let last_error = match topic_metadata(&metadata, topic) {
            TopicMetadata::Partitions(ids) => {
                return u32::try_from(ids.len()).map_err(|_| SinkError::Metadata {
                    topic: topic.to_owned(),
                    code: None,
                    message: "too many partitions".to_owned(),
                });
            }
            // Missing, or being auto-created: ask again.
            TopicMetadata::NotYet { why } => why,
            TopicMetadata::Failed(code) => {
                // Metadata of a topic needs Describe, which Write implies.
                let message = crate::kafka::acl::denied(
                    code,
                    &format!("Describe on topic \"{topic}\""),
                    &[crate::kafka::acl::Acl::topic("Write", topic)],
                )
                .unwrap_or_else(|| code.to_string());
                return Err(SinkError::Metadata {
                    topic: topic.to_owned(),
                    code: Some(code),
                    message,
                });
            }
        };
        if Instant::now() + backoff >= deadline {
            return Err(SinkError::TopicMissing {
                topic: topic.to_owned(),
                last_error,
            });
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// The properties of walrelay's own producer, and the delivery timeout
/// the relay enforces itself: librdkafka gets `message.timeout.ms=0`
/// (never time a record out), and the user's `message.timeout.ms` (or
/// `delivery.timeout.ms`; 30 s by default) becomes the relay's own
/// deadline, `None` for `0` (wait forever, as in librdkafka).
///
/// Why: `enable.gapless.guarantee` does not cover records failed by
/// `message.timeout.ms`. librdkafka times out a queued record, bumps the
/// producer's epoch and sends the records queued after it: the partition
/// gets a gap (measured in the chaos run with PostgreSQL failovers: a
/// broker stalled past the timeout, 828 events of one session missing
/// from the wire while later ones of the same session were written, and
/// the next session's tail fence then skipped them as already in Kafka).
/// The relay's deadline instead purges everything not yet sent before it
/// fails the session, so what reaches the broker is a prefix of each
/// partition's records.
pub fn producer_properties(
    props: &BTreeMap<String, String>,
) -> (BTreeMap<String, String>, Option<Duration>) {
    let mut props = props.clone();
    let configured = ["message.timeout.ms", "delivery.timeout.ms"]
        .iter()
        .find_map(|name| props.remove(*name))
        .unwrap_or_else(|| DEFAULT_MESSAGE_TIMEOUT_MS.to_string());
    // librdkafka accepts 0 to 900000 ms (checked when the configuration
    // is validated, before this); anything unparsable is left to it.
    let timeout = match configured.trim().parse::<u64>() {
        Ok(0) => None,
        Ok(ms) => Some(Duration::from_millis(ms)),
        Err(_) => {
            props.insert("message.timeout.ms".to_owned(), configured);
            return (
                props,
                Some(Duration::from_millis(DEFAULT_MESSAGE_TIMEOUT_MS.into())),
            );
        }
    };
    props.insert("message.timeout.ms".to_owned(), "0".to_owned());
    (props, timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn librdkafka_never_times_a_record_out_and_the_relay_keeps_the_timeout() {
        let (lib, timeout) = producer_properties(&props(&[("message.timeout.ms", "30000")]));
        assert_eq!(lib["message.timeout.ms"], "0");
        assert_eq!(timeout, Some(Duration::from_secs(30)));

        // The alias, replaced by the one name librdkafka gets.
        let (lib, timeout) = producer_properties(&props(&[("delivery.timeout.ms", "5000")]));
        assert_eq!(lib["message.timeout.ms"], "0");
        assert!(!lib.contains_key("delivery.timeout.ms"));
        assert_eq!(timeout, Some(Duration::from_secs(5)));

        // 0 is librdkafka's "forever": the relay waits forever too.
        let (lib, timeout) = producer_properties(&props(&[("message.timeout.ms", "0")]));
        assert_eq!(lib["message.timeout.ms"], "0");
        assert_eq!(timeout, None);

        // None set (the defaults always set it): walrelay's default.
        let (lib, timeout) = producer_properties(&props(&[("linger.ms", "5")]));
        assert_eq!(lib["message.timeout.ms"], "0");
        assert_eq!(lib["linger.ms"], "5");
        assert_eq!(timeout, Some(Duration::from_secs(30)));
    }
}
