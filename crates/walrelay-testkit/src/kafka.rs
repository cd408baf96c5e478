//! Reading back what was produced to a Kafka-compatible broker, for test
//! assertions.
//!
//! The readers never join a consumer group: they assign every partition of
//! the given topics from the beginning, commit nothing, and count records
//! by consuming them. They never rely on high watermarks or partition EOF
//! (Tansu reports wrong high watermarks). Topics that do not exist yet are
//! looked up again every 200 ms and read from the beginning once they show
//! up.
//!
//! The readers block a thread of Tokio's blocking pool while they run.
//!
//! For the other direction, [`relay_headers`] builds the headers a relay
//! writes, for tests that put records of their own in front of one.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// How long [`read_topics`] keeps reading after it has the expected number
/// of records, to catch unexpected extra records.
pub const EXTRA_READ_GRACE: Duration = Duration::from_millis(300);

/// How often missing topics are looked up again.
const METADATA_RETRY: Duration = Duration::from_millis(200);
/// The longest single poll, so that deadlines are met closely.
const POLL_STEP: Duration = Duration::from_millis(50);

/// One record read back from a topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumedRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// Headers in record order; a header with a null value has an empty one.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The record timestamp (create or log-append time), if any.
    pub timestamp_ms: Option<i64>,
}

impl ConsumedRecord {
    /// The value of the first header called `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The value of the first header called `name`, if it is UTF-8.
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The key, if present and UTF-8.
    pub fn key_str(&self) -> Option<&str> {
        self.key
            .as_deref()
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The value, if present and UTF-8.
    pub fn value_str(&self) -> Option<&str> {
        self.value
            .as_deref()
            .and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// The headers walrelay puts on a record: `idempotency-key` (`key_hex`,
/// the key's hex form), `walrelay-source` and, when given,
/// `walrelay-layout`. For tests that write records as another relay or
/// another source would, e.g. to fill a partition's tail before a relay
/// reads it.
pub fn relay_headers(key_hex: &str, source: &str, layout: Option<&str>) -> OwnedHeaders {
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "idempotency-key",
            value: Some(key_hex),
        })
        .insert(Header {
            key: "walrelay-source",
            value: Some(source),
        });
    match layout {
        Some(layout) => headers.insert(Header {
            key: "walrelay-layout",
            value: Some(layout),
        }),
        None => headers,
    }
}

/// When a read ends (besides its timeout).
#[derive(Clone, Copy, Debug)]
enum Until {
    /// After this many records, plus [`EXTRA_READ_GRACE`].
    Count(usize),
    /// When no record arrived (and no topic was assigned) for this long.
    Quiet(Duration),
}

/// Reads the given topics from the beginning until `expect` records have
/// been read, then reads for another [`EXTRA_READ_GRACE`] (300 ms) so that
/// unexpected extra records show up in the result too; or until `timeout`
/// passes. Either way it returns what it read: the caller asserts on the
/// count. Records come in the order they were read (per partition in offset
/// order; partitions interleave arbitrarily).
///
/// Errors only on bad arguments or when no consumer can be created; broker
/// errors while reading are retried until the timeout.
pub async fn read_topics(
    bootstrap: &str,
    topics: &[&str],
    expect: usize,
    timeout: Duration,
) -> anyhow::Result<Vec<ConsumedRecord>> {
    read_in_background(bootstrap, topics, Until::Count(expect), timeout).await
}

/// Reads the given topics from the beginning until no new record arrived
/// for `quiet` (the quiet clock starts at the call and restarts with every
/// record and every topic that shows up and gets assigned), or until
/// `timeout` passes. Returns what it read, in the order read.
///
/// `quiet` must cover connection setup and the first fetch (some tens of
/// milliseconds locally): 500 ms or more is a good choice.
pub async fn read_until_quiet(
    bootstrap: &str,
    topics: &[&str],
    quiet: Duration,
    timeout: Duration,
) -> anyhow::Result<Vec<ConsumedRecord>> {
    read_in_background(bootstrap, topics, Until::Quiet(quiet), timeout).await
}

/// The number of partitions of `topic`, from a metadata request for all
/// topics (which never auto-creates `topic`). Errors when the topic does
/// not exist. Blocking (up to ~5 s).
pub fn partition_count(bootstrap: &str, topic: &str) -> anyhow::Result<usize> {
    let consumer: BaseConsumer = client_config(bootstrap)
        .create()
        .context("creating a Kafka client")?;
    let md = consumer
        .fetch_metadata(None, Duration::from_secs(5))
        .with_context(|| format!("fetching metadata from {bootstrap}"))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| anyhow!("topic {topic:?} does not exist on {bootstrap}"))?;
    if let Some(err) = t.error() {
        bail!(
            "topic {topic:?} on {bootstrap}: {}",
            rdkafka::types::RDKafkaErrorCode::from(err)
        );
    }
    Ok(t.partitions().len())
}

async fn read_in_background(
    bootstrap: &str,
    topics: &[&str],
    until: Until,
    timeout: Duration,
) -> anyhow::Result<Vec<ConsumedRecord>> {
    if topics.is_empty() {
        bail!("no topics to read");
    }
    let bootstrap = bootstrap.to_owned();
    let topics: BTreeSet<String> = topics.iter().map(|t| (*t).to_owned()).collect();
    tokio::task::spawn_blocking(move || read_blocking(&bootstrap, topics, until, timeout))
        .await
        .context("the reader task panicked")?
}

fn read_blocking(
    bootstrap: &str,
    mut missing: BTreeSet<String>,
    until: Until,
    timeout: Duration,
) -> anyhow::Result<Vec<ConsumedRecord>> {
    let start = Instant::now();
    let deadline = start + timeout;
    let group = format!(
        "walrelay-testkit-reader-{}-{:016x}",
        std::process::id(),
        rand_seed()
    );
    let consumer: BaseConsumer = client_config(bootstrap)
        // librdkafka wants a group id for some consumer features; the
        // reader never subscribes, joins or commits.
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("allow.auto.create.topics", "false")
        .set("fetch.wait.max.ms", "50")
        .create()
        .context("creating a Kafka consumer")?;

    let mut records = Vec::new();
    let mut last_activity = start;
    let mut next_lookup = start;
    let mut grace_end: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if !missing.is_empty() && now >= next_lookup {
            let wait = deadline
                .saturating_duration_since(now)
                .clamp(Duration::from_millis(50), Duration::from_secs(1));
            match assign_found(&consumer, &mut missing, wait) {
                Ok(true) => last_activity = Instant::now(),
                Ok(false) => {}
                Err(e) => tracing::debug!("reader: {e:#}"),
            }
            next_lookup = Instant::now() + METADATA_RETRY;
        }

        let now = Instant::now();
        match until {
            Until::Count(n) if records.len() >= n => {
                let end = *grace_end.get_or_insert(now + EXTRA_READ_GRACE);
                if now >= end {
                    break;
                }
            }
            Until::Quiet(quiet) if now.duration_since(last_activity) >= quiet => break,
            _ => {}
        }
        if now >= deadline {
            tracing::debug!(
                "reader: timeout after {timeout:?} with {} records{}",
                records.len(),
                if missing.is_empty() {
                    String::new()
                } else {
                    format!("; topics never seen: {missing:?}")
                }
            );
            break;
        }

        let mut step = POLL_STEP.min(deadline - now);
        if let Some(end) = grace_end {
            step = step.min(end.saturating_duration_since(now));
        }
        match consumer.poll(step) {
            Some(Ok(msg)) => {
                records.push(to_record(&msg));
                last_activity = Instant::now();
            }
            Some(Err(e)) => tracing::debug!("reader: {e}"),
            None => {}
        }
    }
    Ok(records)
}

/// Looks the missing topics up and assigns every partition of those that
/// exist, from the beginning. Returns whether it assigned any.
fn assign_found(
    consumer: &BaseConsumer,
    missing: &mut BTreeSet<String>,
    timeout: Duration,
) -> anyhow::Result<bool> {
    let md = consumer
        .fetch_metadata(None, timeout)
        .context("fetching metadata")?;
    let mut tpl = TopicPartitionList::new();
    for t in md.topics() {
        if !missing.contains(t.name()) || t.error().is_some() || t.partitions().is_empty() {
            continue;
        }
        for p in t.partitions() {
            tpl.add_partition_offset(t.name(), p.id(), Offset::Beginning)?;
        }
        missing.remove(t.name());
    }
    if tpl.count() == 0 {
        return Ok(false);
    }
    consumer
        .incremental_assign(&tpl)
        .context("assigning partitions")?;
    Ok(true)
}

fn to_record<M: Message>(msg: &M) -> ConsumedRecord {
    let headers = msg
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                .collect()
        })
        .unwrap_or_default();
    ConsumedRecord {
        topic: msg.topic().to_owned(),
        partition: msg.partition(),
        offset: msg.offset(),
        key: msg.key().map(<[u8]>::to_vec),
        value: msg.payload().map(<[u8]>::to_vec),
        headers,
        timestamp_ms: msg.timestamp().to_millis(),
    }
}

/// Some bits that differ between calls, for unique group ids.
fn rand_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// The base configuration of the short-lived clients the testkit uses.
pub(crate) fn client_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("socket.connection.setup.timeout.ms", "3000")
        .set("reconnect.backoff.ms", "20")
        .set("reconnect.backoff.max.ms", "500");
    config
}
