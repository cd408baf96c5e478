//! The Kafka side of `walrelay verify`: assign every partition of the
//! requested topics without joining a group, and read until nothing new
//! arrived for `--idle-timeout` (never trusting high watermarks or EOF,
//! which some brokers get wrong), feeding the analysis.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::kafka::client::ClientSetup;
use crate::kafka::login::PlainContext;
use anyhow::{bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::kafka::metadata::{topic_metadata, TopicMetadata};
use crate::kafka::properties::KafkaConfig;

use super::analysis::{Analyzer, Report};
use super::render::StoppedBy;
use super::VerifyArgs;

/// The longest single poll, so that deadlines and interrupts are met
/// closely.
const POLL_STEP: Duration = Duration::from_millis(100);
/// The longest metadata lookup.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_ERRORS_KEPT: usize = 20;

/// `walrelay verify`'s reader: the one builder of Kafka client properties
/// ([`crate::kafka::client`], secrets resolved), with a group id of its own.
/// librdkafka assigns partitions only to a consumer with a group id; the
/// reader never joins, commits or fetches offsets, so it needs no ACL on
/// the group, and a refusal to look the group up is ignored.
fn consumer_config(kafka: &KafkaConfig) -> anyhow::Result<ClientSetup> {
    let mut c =
        crate::kafka::client::client_config(kafka, crate::kafka::client::KafkaClient::Verify)?;
    c.config
        .set("group.id", format!("walrelay-verify-{:016x}", random_u64()));
    Ok(c)
}

/// Some bits that differ between runs, for a unique group id.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish()
}

/// `walrelay verify` needs Read on each topic it reads (which implies the
/// Describe its metadata request needs), and no group.
fn denied(code: rdkafka::types::RDKafkaErrorCode, topic: &str) -> Option<String> {
    crate::kafka::acl::denied(
        code,
        &format!("Read on topic \"{topic}\""),
        &[crate::kafka::acl::Acl::topic("Read", topic)],
    )
}

/// Why the client cannot talk to the brokers, if librdkafka reported a
/// failed TLS handshake or login among its queued errors (it reports
/// them through the consumer's queue, not the metadata request's error).
fn transport_refusal(consumer: &BaseConsumer<PlainContext>) -> Option<String> {
    (0..64).find_map(|_| match consumer.poll(Duration::ZERO)? {
        Err(e) => match e.rdkafka_error_code()? {
            RDKafkaErrorCode::SSL => Some(
                "the TLS handshake with the broker failed (see librdkafka's error above): check \
                 that ssl.ca.location names the CA that signed the brokers' certificates \
                 (docs/security.md)"
                    .to_owned(),
            ),
            code => crate::kafka::acl::denied(code, "a metadata request", &[]),
        },
        Ok(_) => None,
    })
}

/// Which partitions to read, from where.
fn plan(
    consumer: &BaseConsumer<PlainContext>,
    args: &VerifyArgs,
    bootstrap: &str,
    timeout: Duration,
) -> anyhow::Result<BTreeMap<(String, i32), Offset>> {
    let md = consumer
        .fetch_metadata(None, timeout)
        .map_err(|e| match transport_refusal(consumer) {
            Some(why) => anyhow::anyhow!("{e}; {why}"),
            None => anyhow::anyhow!(e),
        })
        .with_context(|| format!("fetching metadata from {bootstrap}"))?;
    let partitions_of = |topic: &str| -> anyhow::Result<Vec<i32>> {
        let mut found = topic_metadata(&md, topic);
        if matches!(found, TopicMetadata::NotYet { .. }) {
            // Metadata of all topics leaves out those the principal may
            // not describe; asked by name, Kafka says so.
            if let Ok(named) = consumer.fetch_metadata(Some(topic), timeout) {
                if let TopicMetadata::Failed(code) = topic_metadata(&named, topic) {
                    found = TopicMetadata::Failed(code);
                }
            }
        }
        match found {
            TopicMetadata::Partitions(ids) => Ok(ids),
            TopicMetadata::NotYet { why } => bail!(
                "topic {topic:?} does not exist on {bootstrap}, or has no partitions yet ({why})"
            ),
            TopicMetadata::Failed(code) => match denied(code, topic) {
                Some(message) => bail!("{message}"),
                None => bail!("topic {topic:?} on {bootstrap}: {code}"),
            },
        }
    };
    let mut plan = BTreeMap::new();
    for topic in &args.topics {
        for p in partitions_of(topic)? {
            plan.insert((topic.clone(), p), Offset::Beginning);
        }
    }
    for s in &args.from {
        if !partitions_of(&s.topic)?.contains(&s.partition) {
            bail!("topic {:?} has no partition {}", s.topic, s.partition);
        }
        plan.insert((s.topic.clone(), s.partition), Offset::Offset(s.offset));
    }
    Ok(plan)
}

pub(super) struct ReadOutcome {
    pub(super) report: Report,
    pub(super) stopped_by: StoppedBy,
    pub(super) errors: Vec<String>,
}

pub(super) fn read(
    kafka: &KafkaConfig,
    args: &VerifyArgs,
    started: Instant,
    stop: &AtomicBool,
) -> anyhow::Result<ReadOutcome> {
    let deadline = args.timeout.map(|t| started + t);
    let remaining = || deadline.map(|d| d.saturating_duration_since(Instant::now()));
    let consumer = consumer_config(kafka)?
        .consumer()
        .context("creating the Kafka consumer")?;
    let metadata_timeout = remaining().map_or(METADATA_TIMEOUT, |r| r.min(METADATA_TIMEOUT));
    let plan = plan(&consumer, args, &kafka.bootstrap_servers, metadata_timeout)?;
    let mut analyzer = Analyzer::new();
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in &plan {
        analyzer.expect_partition(topic, *partition);
        tpl.add_partition_offset(topic, *partition, *offset)?;
    }
    consumer.assign(&tpl).context("assigning partitions")?;

    let mut errors: Vec<String> = Vec::new();
    let mut last_record = Instant::now();
    let stopped_by = loop {
        if stop.load(Ordering::Relaxed) {
            break StoppedBy::Interrupted;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break StoppedBy::Timeout;
        }
        let idle_left = args.idle_timeout.saturating_sub(now - last_record);
        if idle_left.is_zero() {
            break StoppedBy::Idle;
        }
        let step = remaining()
            .map_or(POLL_STEP, |r| r.min(POLL_STEP))
            .min(idle_left);
        match consumer.poll(step) {
            Some(Ok(msg)) => {
                let headers: Vec<(&str, &[u8])> = msg
                    .headers()
                    .map(|hs| {
                        hs.iter()
                            .map(|h| (h.key, h.value.unwrap_or_default()))
                            .collect()
                    })
                    .unwrap_or_default();
                analyzer.observe(msg.topic(), msg.partition(), msg.offset(), &headers);
                last_record = Instant::now();
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            // The group lookup librdkafka makes for any consumer with a
            // group id; the reader does not use the group.
            Some(Err(e))
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed) =>
            {
                tracing::debug!("reading from Kafka (the unused group): {e}");
            }
            Some(Err(e)) => {
                let text = match e.rdkafka_error_code() {
                    Some(code) if crate::kafka::acl::is_denied(code) => {
                        denied(code, &args.topics.join(", ")).unwrap_or_else(|| e.to_string())
                    }
                    _ => e.to_string(),
                };
                if !errors.contains(&text) {
                    tracing::warn!("reading from Kafka: {text}");
                    if errors.len() < MAX_ERRORS_KEPT {
                        errors.push(text);
                    }
                }
            }
            None => {}
        }
    };
    Ok(ReadOutcome {
        report: analyzer.report(),
        stopped_by,
        errors,
    })
}
