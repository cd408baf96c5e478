//! The source record in Kafka: creating its topic (`setup`), reading a
//! source's record (every session start, `setup`, `status --kafka`), and
//! writing it as confirmation advances (a task beside the session).
//!
//! None of it can fail a session: a record that cannot be read or
//! written is [`Unavailable`], which the session reports once (a WARN and
//! the `walrelay_source_record_available` gauge) before it falls back on
//! the data topics' tails.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;
use tracing::{info, warn};
use walrelay_pgoutput::Lsn;

use super::{Identity, RecordedEvent, SourceRecord};
use crate::kafka::acl::{reader_error, Acl, ReaderError};
use crate::kafka::client::{client_config, ClientSetup, KafkaClient};
use crate::kafka::login::PlainContext;
use crate::kafka::properties::KafkaConfig;
use crate::metrics::Metrics;

/// The topic's settings when `setup` creates it: compacted (one live
/// record per source, kept forever), segments rolled hourly so that
/// compaction keeps up with a write per second, and the brokers'
/// default replication (like the data topics users create).
const TOPIC_CONFIG: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("segment.ms", "3600000"),
    ("min.cleanable.dirty.ratio", "0.1"),
];

/// How many records back from the end a read looks at a time.
const WINDOW: i64 = 1_000;

/// Why a source record could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// The topic does not exist: nothing is written to it either (a
    /// broker that creates topics on first use would create it
    /// uncompacted).
    #[error(
        "topic \"{0}\" does not exist: run walrelay setup, which creates it (compacted), or create \
         it with cleanup.policy=compact"
    )]
    TopicMissing(String),
    #[error("{0}")]
    Other(String),
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> Unavailable {
    Unavailable::Other(format!("{what}: {e}"))
}

/// What `setup` did about the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicSetup {
    Created,
    /// It existed; `Some` when its `cleanup.policy` is not `compact`.
    Existed(Option<String>),
}

/// Creates `topic` compacted, or checks the one that exists.
pub async fn ensure_topic(
    kafka: &KafkaConfig,
    topic: &str,
    timeout: Duration,
) -> Result<TopicSetup, Unavailable> {
    let admin = client_config(kafka, KafkaClient::Admin)
        .map_err(|e| unavailable("the Kafka admin client's settings", e))?
        .admin()
        .map_err(|e| unavailable("creating a Kafka admin client", e))?;
    let options = AdminOptions::new()
        .request_timeout(Some(timeout))
        .operation_timeout(Some(timeout));
    let mut new = NewTopic::new(topic, 1, TopicReplication::Fixed(-1));
    for (k, v) in TOPIC_CONFIG {
        new = new.set(k, v);
    }
    let created = admin
        .create_topics([&new], &options)
        .await
        .map_err(|e| unavailable(&format!("creating topic \"{topic}\""), e))?;
    match created.into_iter().next() {
        Some(Ok(_)) => return Ok(TopicSetup::Created),
        Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => {}
        Some(Err((_, code))) => {
            return Err(Unavailable::Other(explain(
                code,
                &format!("creating topic \"{topic}\""),
                &[Acl::topic("Create", topic)],
            )))
        }
        None => return Err(Unavailable::Other("CreateTopics returned no result".into())),
    }
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
        .await
        .map_err(|e| unavailable(&format!("describing topic \"{topic}\""), e))?;
    let policy = described
        .into_iter()
        .next()
        .and_then(Result::ok)
        .and_then(|c| c.get("cleanup.policy").and_then(|e| e.value.clone()));
    Ok(TopicSetup::Existed(match policy {
        Some(p) if p.split(',').any(|p| p.trim() == "compact") => None,
        Some(p) => Some(p),
        None => Some("unknown (the configuration could not be described)".into()),
    }))
}

/// The record of `source` in `topic`: `Ok(None)` when the topic holds
/// none (a source that has not confirmed an event yet, or a record
/// deleted by hand).
pub async fn read(
    kafka: &KafkaConfig,
    topic: &str,
    source: &str,
    timeout: Duration,
) -> Result<Option<SourceRecord>, Unavailable> {
    let reader = client_config(kafka, KafkaClient::Fence)
        .map_err(|e| unavailable("the Kafka reader's settings", e))?;
    let (topic, source) = (topic.to_owned(), source.to_owned());
    tokio::task::spawn_blocking(move || read_blocking(&reader, &topic, &source, timeout))
        .await
        .map_err(|e| unavailable("the reading task", e))?
}

fn read_blocking(
    reader: &ClientSetup,
    topic: &str,
    source: &str,
    timeout: Duration,
) -> Result<Option<SourceRecord>, Unavailable> {
    let consumer = reader
        .consumer()
        .map_err(|e| unavailable("creating the Kafka reader", e))?;
    let found = read_with(&consumer, topic, source, timeout);
    crate::kafka::client::close_in_background(consumer);
    found
}

/// [`read_blocking`] with its reader.
fn read_with(
    consumer: &BaseConsumer<PlainContext>,
    topic: &str,
    source: &str,
    timeout: Duration,
) -> Result<Option<SourceRecord>, Unavailable> {
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| unavailable(&format!("reading the metadata of topic \"{topic}\""), e))?;
    let partitions = match metadata.topics().first() {
        Some(t) => match t.error() {
            None => t.partitions().len(),
            Some(e) => {
                let code = RDKafkaErrorCode::from(e);
                return Err(match code {
                    RDKafkaErrorCode::UnknownTopicOrPartition => {
                        Unavailable::TopicMissing(topic.to_owned())
                    }
                    _ => Unavailable::Other(explain(
                        code,
                        &format!("reading the metadata of topic \"{topic}\""),
                        &[Acl::topic("Describe", topic), Acl::topic("Read", topic)],
                    )),
                });
            }
        },
        None => return Err(Unavailable::TopicMissing(topic.to_owned())),
    };
    // A source's record lies in the partition its key hashes to; one
    // partition unless someone created the topic otherwise.
    let partition = i32::try_from(crate::engine::partition::partition_for_key(
        source.as_bytes(),
        u32::try_from(partitions.max(1)).unwrap_or(1),
    ))
    .unwrap_or(0);
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, timeout)
        .map_err(|e| unavailable(&format!("reading the offsets of topic \"{topic}\""), e))?;
    let mut end = high;
    while end > low {
        let start = (end - WINDOW).max(low);
        if let Some(value) = last_value_of(consumer, topic, partition, source, start, end, timeout)?
        {
            return SourceRecord::decode(source, &value)
                .map(Some)
                .map_err(|e| Unavailable::Other(e.to_string()));
        }
        end = start;
    }
    Ok(None)
}

/// The value of the last record keyed `source` in `[start, end)`.
fn last_value_of(
    consumer: &BaseConsumer<PlainContext>,
    topic: &str,
    partition: i32,
    source: &str,
    start: i64,
    end: i64,
    timeout: Duration,
) -> Result<Option<Vec<u8>>, Unavailable> {
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Offset(start))
        .map_err(|e| unavailable("assigning the partition", e))?;
    consumer
        .assign(&assignment)
        .map_err(|e| unavailable("assigning the partition", e))?;
    let deadline = std::time::Instant::now() + timeout;
    let mut found = None;
    let mut last_error = None;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(Unavailable::Other(format!(
                "reading topic \"{topic}\" did not reach offset {end} within {timeout:?}{}",
                last_error
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default()
            )));
        }
        match consumer.poll(left.min(Duration::from_millis(100))) {
            None => {}
            Some(Ok(m)) => {
                if m.key() == Some(source.as_bytes()) {
                    // A tombstone deletes the record.
                    found = m.payload().map(<[u8]>::to_vec);
                }
                if m.offset() + 1 >= end {
                    return Ok(found);
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(found),
            Some(Err(e)) => {
                let what = format!("reading topic \"{topic}\"");
                match reader_error(e.rdkafka_error_code()) {
                    ReaderError::UnusedGroup => {}
                    ReaderError::Denied(code) | ReaderError::TopicGone(code) => {
                        return Err(Unavailable::Other(explain(
                            code,
                            &what,
                            &[Acl::topic("Read", topic)],
                        )))
                    }
                    ReaderError::Transient => last_error = Some(e.to_string()),
                }
            }
        }
    }
}

/// Writes the source record as confirmation advances: the session offers
/// the latest confirmed candidate, a task writes the newest one at most
/// once per interval. The first failure of a session is a WARN (and the
/// gauge), later ones are counted only until a write succeeds again.
pub struct Writer {
    latest: watch::Sender<Option<(RecordedEvent, Lsn)>>,
    task: tokio::task::JoinHandle<()>,
    /// `None` once dropped (on a thread of its own).
    producer: Option<Arc<FutureProducer<PlainContext>>>,
    topic: String,
    identity: Identity,
}

impl Writer {
    /// A writer for this session, or why there is none.
    pub fn start(
        kafka: &KafkaConfig,
        topic: &str,
        identity: Identity,
        interval: Duration,
        metrics: Option<Metrics>,
    ) -> Result<Writer, Unavailable> {
        let producer = client_config(kafka, KafkaClient::SourceRecord)
            .map_err(|e| unavailable("the source record writer's settings", e))?
            .future_producer()
            .map_err(|e| unavailable("creating the source record writer", e))?;
        let (latest, mut offered) = watch::channel(None);
        let task = {
            let (producer, topic, identity) =
                (producer.clone(), topic.to_owned(), identity.clone());
            tokio::spawn(async move {
                let mut failing = false;
                while offered.changed().await.is_ok() {
                    let Some((event, confirmed)) = offered.borrow_and_update().clone() else {
                        continue;
                    };
                    let result = write(
                        &producer,
                        &topic,
                        &identity,
                        Some(event),
                        confirmed,
                        interval * 5,
                    )
                    .await;
                    report(&result, &mut failing, &topic, metrics.as_ref());
                    tokio::time::sleep(interval).await;
                }
            })
        };
        Ok(Writer {
            latest,
            task,
            producer: Some(producer),
            topic: topic.to_owned(),
            identity,
        })
    }

    /// A candidate the slot confirmed, at `confirmed`.
    pub fn offer(&self, event: RecordedEvent, confirmed: Lsn) {
        self.latest.send_replace(Some((event, confirmed)));
    }

    /// The session stops cleanly: write what it confirmed last (bounded
    /// by `timeout`), so that the record is as recent as it can be.
    pub async fn finish(mut self, timeout: Duration) {
        self.task.abort();
        let (Some((event, confirmed)), Some(producer)) =
            (self.latest.borrow().clone(), self.producer.take())
        else {
            return;
        };
        let result = write(
            &producer,
            &self.topic,
            &self.identity,
            Some(event),
            confirmed,
            timeout,
        )
        .await;
        if let Err(e) = result {
            warn!(topic = %self.topic, error = %e, "could not write the source record before stopping; the next session relies on the previous one");
        }
        crate::kafka::client::close_in_background(producer);
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(producer) = self.producer.take() {
            crate::kafka::client::close_in_background(producer);
        }
    }
}

/// `setup`'s record of a source that has not confirmed an event yet, so
/// that a later session that finds none knows it was deleted.
pub async fn write_first(
    kafka: &KafkaConfig,
    topic: &str,
    identity: &Identity,
    position: Lsn,
    timeout: Duration,
) -> Result<(), Unavailable> {
    let producer = client_config(kafka, KafkaClient::SourceRecord)
        .map_err(|e| unavailable("the source record writer's settings", e))?
        .future_producer()
        .map_err(|e| unavailable("creating the source record writer", e))?;
    write(&producer, topic, identity, None, position, timeout).await
}

async fn write(
    producer: &FutureProducer<PlainContext>,
    topic: &str,
    identity: &Identity,
    event: Option<RecordedEvent>,
    confirmed: Lsn,
    timeout: Duration,
) -> Result<(), Unavailable> {
    let record = SourceRecord {
        source_id: identity.source_id.clone(),
        system_identifier: identity.system_identifier.clone(),
        timeline: identity.timeline,
        slot: identity.slot.clone(),
        event,
        confirmed,
        written_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    };
    let value = record.encode();
    producer
        .send(
            FutureRecord::to(topic)
                .key(identity.source_id.as_bytes())
                .payload(&value),
            timeout,
        )
        .await
        .map(|_| ())
        .map_err(|(e, _)| {
            let what = format!("writing to topic \"{topic}\"");
            Unavailable::Other(match e.rdkafka_error_code() {
                Some(code) => explain(code, &what, &[Acl::topic("Write", topic)]),
                None => format!("{what}: {e}"),
            })
        })
}

/// What Kafka answered `what` with `code`: the missing ACL and its
/// grant when it is an authorization error.
fn explain(code: RDKafkaErrorCode, what: &str, needed: &[Acl<'_>]) -> String {
    crate::kafka::acl::denied(code, what, needed)
        .unwrap_or_else(|| format!("{what} failed: {code} ({code:?})"))
}

fn report(
    result: &Result<(), Unavailable>,
    failing: &mut bool,
    topic: &str,
    metrics: Option<&Metrics>,
) {
    match (result, *failing) {
        (Ok(()), true) => {
            info!(%topic, "the source record is written again");
            *failing = false;
        }
        (Err(e), false) => {
            warn!(%topic, error = %e, "cannot write the source record, the evidence that lets a later session recognise a restored database once the data topics' records expired; relaying goes on, restore detection falls back on the data topics' tails (docs/operations.md, \"The source record\")");
            *failing = true;
        }
        _ => {}
    }
    if let Some(m) = metrics {
        m.set_source_record_available(result.is_ok());
    }
}
