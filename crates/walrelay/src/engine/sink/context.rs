//! librdkafka's callbacks on the producer's polling thread: delivery
//! reports (queued for the relay) and log lines and error events
//! (rate-limited).

use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{DeliveryResult, ProducerContext};
use tokio::sync::Notify;

use walrelay_pg::log_limit::KeyedLogLimit;

use super::error::{is_too_large, SinkError};
use crate::kafka::acl as kafka_acl;

/// The outcome of one [`KafkaSink::send`](super::KafkaSink::send).
#[derive(Debug)]
pub struct DeliveryReport {
    /// The `seq` passed to [`KafkaSink::send`](super::KafkaSink::send).
    pub seq: u64,
    /// `(partition, offset)` of the written record, or why it failed.
    pub result: Result<(i32, i64), SinkError>,
}

/// Delivery reports on their way from librdkafka's polling thread to the
/// relay: a vector under a mutex, taken whole, with one wake-up when it
/// turns non-empty. librdkafka reports deliveries in bursts (one per
/// produce request); a channel send and a wake-up per report cost the
/// relay more than the reports themselves.
///
/// Unbounded: the relay bounds the number of records in flight (and
/// librdkafka's queue bounds them too), so at most that many reports wait
/// here. A bounded queue would block librdkafka's polling thread.
#[derive(Default)]
pub(super) struct DeliveryQueue {
    reports: Mutex<Vec<DeliveryReport>>,
    /// Signalled when `reports` turns non-empty. `Notify` keeps the signal
    /// if nobody waits yet, so a report pushed between the reader's check
    /// and its wait is not missed.
    pub(super) ready: Notify,
}

impl DeliveryQueue {
    fn push(&self, delivery: DeliveryReport) {
        let mut reports = self.reports.lock().unwrap_or_else(PoisonError::into_inner);
        let first = reports.is_empty();
        reports.push(delivery);
        drop(reports);
        if first {
            self.ready.notify_one();
        }
    }

    /// Every report queued so far, in order.
    pub(super) fn take(&self) -> Vec<DeliveryReport> {
        std::mem::take(&mut *self.reports.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Receives librdkafka's callbacks on the producer's polling thread.
pub(super) struct SinkContext {
    pub(super) deliveries: Arc<DeliveryQueue>,
    /// The producer's fatal error (e.g. a gapless-guarantee violation), to
    /// explain the purge errors that follow it.
    pub(super) fatal: Mutex<Option<String>>,
}

/// At most one librdkafka log line per facility (and one error event per
/// error code) in this interval; the next one says how many were left out.
pub const LIBRDKAFKA_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// librdkafka repeats its complaints many times a second while a broker is
/// down (each also as an error event): per facility or error code, one
/// line per [`LIBRDKAFKA_LOG_INTERVAL`]. For the whole process, so that the
/// producers of successive sessions during an outage share it.
static LIBRDKAFKA_LOGS: LazyLock<KeyedLogLimit> =
    LazyLock::new(|| KeyedLogLimit::new(LIBRDKAFKA_LOG_INTERVAL, 64));

impl ClientContext for SinkContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        // Debug output is asked for explicitly: all of it.
        let suppressed = if matches!(level, RDKafkaLogLevel::Debug) {
            0
        } else {
            match LIBRDKAFKA_LOGS.check(fac) {
                Some(n) => n,
                None => return,
            }
        };
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility = fac, suppressed, "{message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", facility = fac, suppressed, "{message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility = fac, suppressed, "{message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", facility = fac, "{message}")
            }
        }
    }

    fn stats_raw(&self, statistics: &[u8]) {
        tracing::debug!(
            target: "librdkafka::stats",
            "{}",
            String::from_utf8_lossy(statistics)
        );
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal)) {
            tracing::error!(target: "librdkafka", "Kafka producer fatal error: {reason}");
            let mut fatal = self.fatal.lock().unwrap_or_else(PoisonError::into_inner);
            fatal.get_or_insert_with(|| reason.to_owned());
        } else {
            let code = error
                .rdkafka_error_code()
                .map_or_else(|| "other".to_owned(), |c| format!("error:{c:?}"));
            if let Some(suppressed) = LIBRDKAFKA_LOGS.check(&code) {
                tracing::warn!(target: "librdkafka", suppressed, "Kafka producer error: {error}: {reason}");
            }
        }
    }
}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, seq: usize) {
        let result = match result {
            Ok(message) => Ok((message.partition(), message.offset())),
            Err((error, message)) if is_too_large(error.rdkafka_error_code()) => {
                let code = error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
                let headers = message.headers();
                let key = headers
                    .and_then(|h| {
                        h.iter()
                            .find(|h| h.key == crate::engine::record::header::IDEMPOTENCY_KEY)
                            .and_then(|h| h.value)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                    })
                    .unwrap_or_else(|| "?".to_owned());
                let header_bytes: usize = headers.map_or(0, |h| {
                    h.iter()
                        .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
                        .sum()
                });
                Err(SinkError::RecordTooLarge {
                    key,
                    topic: message.topic().to_owned(),
                    partition: message.partition(),
                    bytes: message.key().map_or(0, <[u8]>::len)
                        + message.payload().map_or(0, <[u8]>::len)
                        + header_bytes,
                    code,
                    message: self.describe(code, message.topic()),
                })
            }
            Err((error, message)) => {
                let code = error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
                Err(SinkError::Delivery {
                    topic: message.topic().to_owned(),
                    partition: message.partition(),
                    code,
                    message: self.describe(code, message.topic()),
                })
            }
        };
        self.deliveries.push(DeliveryReport {
            seq: seq as u64,
            result,
        });
    }
}

/// A producer's authorization error for a record of `topic`: writing
/// needs Write on the topic (which implies Describe). The idempotent
/// producer's first request, InitProducerId, is allowed with Write on any
/// topic (Kafka 2.8 and later; IdempotentWrite on the cluster before): a
/// principal without Write anywhere is refused it with
/// CLUSTER_AUTHORIZATION_FAILED, measured on Kafka 4.1, which stops the
/// producer (a fatal error).
pub(super) fn denied_to_producer(code: RDKafkaErrorCode, topic: &str) -> String {
    let refused = if code == RDKafkaErrorCode::ClusterAuthorizationFailed {
        format!(
            "Write on topic \"{topic}\" (the idempotent producer's InitProducerId request, \
             which Kafka allows with Write on any topic, or IdempotentWrite on the cluster \
             before Kafka 2.8)"
        )
    } else {
        format!("Write on topic \"{topic}\"")
    };
    kafka_acl::denied(code, &refused, &[kafka_acl::Acl::topic("Write", topic)])
        .unwrap_or_else(|| code.to_string())
}

impl SinkContext {
    fn describe(&self, code: RDKafkaErrorCode, topic: &str) -> String {
        let fatal = self.fatal.lock().unwrap_or_else(PoisonError::into_inner);
        match (code, fatal.as_deref()) {
            (_, Some(reason)) => format!("{code}; the producer stopped: {reason}"),
            (code, None) if kafka_acl::is_denied(code) => denied_to_producer(code, topic),
            (RDKafkaErrorCode::MessageTimedOut, None) => format!(
                "{code}: not acknowledged within message.timeout.ms (brokers unreachable or too \
                 slow, or a partition with fewer in-sync replicas than min.insync.replicas: \
                 kafka-topics --describe --under-min-isr-partitions lists them)"
            ),
            (
                RDKafkaErrorCode::NotEnoughReplicas
                | RDKafkaErrorCode::NotEnoughReplicasAfterAppend,
                None,
            ) => format!(
                "{code}: the partition has fewer in-sync replicas than its min.insync.replicas, so \
                 Kafka does not acknowledge; nothing past this record is confirmed to PostgreSQL \
                 and walrelay retries with backoff until the replicas are back in sync (find them \
                 with kafka-topics --describe --under-min-isr-partitions; restart or repair the \
                 brokers that left the in-sync set)"
            ),
            _ => code.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Log output captured in memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A broker that is down: librdkafka reports each failed connection
    /// attempt as a log line and as an error event, about 30 a second.
    /// walrelay logged every one of them.
    #[test]
    fn librdkafka_complaining_about_a_broker_that_is_down_is_logged_once_per_interval() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let context = SinkContext {
            deliveries: Arc::new(DeliveryQueue::default()),
            fatal: Mutex::new(None),
        };
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..300 {
                // A facility of this test's own: the limit is process-wide.
                context.log(
                    RDKafkaLogLevel::Error,
                    "TESTFAIL",
                    "sasl_plaintext://b:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused",
                );
                context.error(
                    KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
                    "1/1 brokers are down",
                );
            }
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches("Connect to ipv4").count(), 1, "{text}");
        assert_eq!(text.matches("1/1 brokers are down").count(), 1, "{text}");
        assert!(text.contains("suppressed=0"), "{text}");
    }
}
