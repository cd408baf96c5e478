//! Reading the tails of a topic's partitions for the fence (blocking I/O).
//!
//! All partitions of the topic are assigned at once, each at "two records
//! before its end" (librdkafka's logical tail offset, resolved with one
//! ListOffsets request per broker, not one per partition), and read up to
//! the end of the partition: the fetch that reaches the end reports it
//! (partition EOF). Two records: the last one, and the one before it,
//! which in a partition only this relay writes to is the last one's
//! predecessor ([`decide`](super::decide) checks the chain). Starting
//! before the high watermark is enough on a broker that reports it right,
//! and on one that reports the start of the last batch instead (Tansu):
//! the whole last batch is read either way, since the read goes on to the
//! end rather than stopping at the high watermark.
//!
//! A partition whose tail holds no record of this relay's source (another
//! source wrote last), or whose top record's predecessor was not read, is
//! read again from [`LOOKBACK`] records before its end. Past that, the
//! partition is simply not fenced: stopping short only ever costs
//! duplicates, never a skipped event, because the fence key is always a
//! key that is in the partition.
//!
//! The reader reads committed records only (`isolation.level` is pinned in
//! `kafka/client.rs`), so an aborted transactional copy of a record is
//! never taken for one of ours.
//!
//! On a replicated topic the read first waits until what the leaders hold
//! is readable ([`await_topic_readable`], walrelay's own requests in
//! `kafka/requests`). The read itself stays here, with the fence, though it
//! is I/O: it goes through librdkafka rather than a request of walrelay's,
//! and what it keeps ([`OwnRecord`], [`PartitionTail`]) and how it fails
//! ([`FenceError`], naming `relay.fence_timeout` and the fix) are the
//! fence's, which the Kafka wing does not import.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::{FenceError, Layout, OwnRecord, PartitionTail};
use crate::engine::key::EventKey;
use crate::engine::record::header;
use crate::kafka::acl::{is_denied, reader_error, ReaderError};
use crate::kafka::client::ClientSetup;
use crate::kafka::requests::readable::await_topic_readable;

/// How far back a partition is read when its last record is another
/// source's.
pub const LOOKBACK: i64 = 1_000;

/// The longest single poll, so the deadline is met.
const POLL_STEP: Duration = Duration::from_millis(100);

/// The reader's librdkafka context: what it has to say arrives through
/// `poll` (and ends in [`FenceError`]), so its log and error callbacks
/// stay quiet, in particular about the partition ends the read waits for
/// (librdkafka also reports each one as a "global error").
struct Quiet;

impl ClientContext for Quiet {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        if matches!(
            level,
            RDKafkaLogLevel::Emerg
                | RDKafkaLogLevel::Alert
                | RDKafkaLogLevel::Critical
                | RDKafkaLogLevel::Error
        ) {
            tracing::warn!(facility = fac, "tail fence reader: {message}");
        } else {
            tracing::debug!(facility = fac, "tail fence reader: {message}");
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!("tail fence reader: {error}: {reason}");
    }
}

impl ConsumerContext for Quiet {}

/// The tails of one topic.
#[derive(Debug)]
pub struct TopicTails {
    /// One entry per partition, in partition order.
    pub partitions: Vec<PartitionTail>,
    /// How long the read took.
    pub elapsed: Duration,
    /// The largest replica count among the topic's partitions, from the
    /// metadata the read fetched first (for [`super::durability`]).
    pub replication_factor: u32,
}

impl TopicTails {
    /// Per partition, the key of the last record of this source in it,
    /// and the highest key of this source at its end (trusted as a fence
    /// key or not).
    #[must_use]
    pub fn ends(&self) -> (Vec<Option<EventKey>>, Vec<Option<EventKey>>) {
        (
            self.partitions.iter().map(PartitionTail::last).collect(),
            self.partitions
                .iter()
                .map(|t| t.top().map(|r| r.key))
                .collect(),
        )
    }
}

/// Reads the tails of `partitions` partitions of `topic` and keeps, per
/// partition, the highest key of `source` found there and its layout.
/// Blocking: run it on a blocking thread.
pub fn read(
    config: &ClientSetup,
    topic: &str,
    partitions: u32,
    source: &[u8],
    timeout: Duration,
) -> Result<TopicTails, FenceError> {
    let started = Instant::now();
    let deadline = started + timeout;
    let consumer: Arc<BaseConsumer<Quiet>> = config
        .consumer_with(Quiet)
        .map_err(|e| FenceError::Client(e.to_string()))?;
    // Leaders first: a tail offset assigned before they are known is
    // resolved only on librdkafka's next offset-query retry, half a second
    // later (measured: 40 ms instead of 530 ms for a read on Tansu).
    let metadata = match consumer.fetch_metadata(Some(topic), timeout) {
        Ok(metadata) => metadata,
        Err(e) => return Err(metadata_error(e, topic, partitions, timeout, deadline)),
    };
    let replication_factor = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions())
        .map(|p| u32::try_from(p.replicas().len()).unwrap_or(u32::MAX))
        .max()
        .unwrap_or(1);
    if replication_factor > 1 {
        wait_if_possible(&consumer, config, topic, partitions, deadline, timeout)?;
    }
    let mut reading = Reading {
        consumer: &consumer,
        topic,
        source,
        deadline,
        timeout,
        tails: vec![PartitionTail::default(); partitions as usize],
        first_offset: HashMap::new(),
    };
    let mut pending: Vec<u32> = (0..partitions).collect();
    for depth in [2, LOOKBACK] {
        if pending.is_empty() {
            break;
        }
        reading.round(&pending, depth)?;
        // Deeper only where this round found records but none of ours, or
        // not the top record's predecessor (an empty partition, or one
        // read from its start, has no more).
        pending.retain(|p| {
            reading.tails[*p as usize].wants_more()
                && reading.first_offset.get(p).is_some_and(|&o| o > 0)
        });
    }
    let tails = std::mem::take(&mut reading.tails);
    let elapsed = started.elapsed();
    crate::kafka::client::close_in_background(consumer);
    Ok(TopicTails {
        partitions: tails,
        elapsed,
        replication_factor,
    })
}

/// [`await_topic_readable`] where walrelay can connect to the leaders as
/// the client does; a WARN where it cannot.
fn wait_if_possible(
    consumer: &BaseConsumer<Quiet>,
    config: &ClientSetup,
    topic: &str,
    partitions: u32,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), FenceError> {
    match config.connections() {
        Ok(settings) => await_topic_readable(consumer, &settings, topic, partitions, deadline)
            .map_err(|behind| FenceError::Behind {
                topic: topic.to_owned(),
                behind,
                timeout,
            }),
        Err(why) => {
            tracing::warn!(
                %topic,
                "the tail fence does not wait for records the leaders hold unreplicated: walrelay \
                 cannot connect to the brokers as its Kafka client does ({why}); a replay after a \
                 crash may write such records again (duplicates, never a loss)"
            );
            Ok(())
        }
    }
}

/// One topic's tail read, round by round.
struct Reading<'a> {
    consumer: &'a BaseConsumer<Quiet>,
    topic: &'a str,
    source: &'a [u8],
    deadline: Instant,
    timeout: Duration,
    tails: Vec<PartitionTail>,
    /// Per partition, the lowest offset read so far: a deeper round counts
    /// only what lies below it.
    first_offset: HashMap<u32, i64>,
}

impl Reading<'_> {
    /// Reads the last `depth` records of each of `pending` to its end.
    fn round(&mut self, pending: &[u32], depth: i64) -> Result<(), FenceError> {
        let topic = self.topic;
        let mut tpl = TopicPartitionList::new();
        for &p in pending {
            tpl.add_partition_offset(topic, to_i32(p), Offset::OffsetTail(depth))
                .map_err(|e| FenceError::Client(e.to_string()))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| FenceError::Client(e.to_string()))?;
        let below: HashMap<u32, i64> = self.first_offset.clone();
        let mut open: BTreeSet<u32> = pending.iter().copied().collect();
        let mut last_error: Option<String> = None;
        while !open.is_empty() {
            let now = Instant::now();
            if now >= self.deadline {
                return Err(FenceError::Timeout {
                    topic: topic.to_owned(),
                    partitions: open.into_iter().collect(),
                    timeout: self.timeout,
                    last_error,
                });
            }
            match self.consumer.poll(POLL_STEP.min(self.deadline - now)) {
                Some(Ok(msg)) => {
                    let Ok(p) = u32::try_from(msg.partition()) else {
                        continue;
                    };
                    if !open.contains(&p) || below.get(&p).is_some_and(|&b| msg.offset() >= b) {
                        continue;
                    }
                    let lowest = self.first_offset.entry(p).or_insert(msg.offset());
                    *lowest = (*lowest).min(msg.offset());
                    self.tails[p as usize].observe(own_record(&msg, self.source));
                }
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    if let Ok(p) = u32::try_from(p) {
                        open.remove(&p);
                    }
                }
                Some(Err(e)) => {
                    if let Some(text) = read_error(topic, e)? {
                        last_error = Some(text);
                    }
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// An error of the reader: fatal (denied, the topic gone), or the text to
/// report if the read times out (none for the unused group's).
fn read_error(topic: &str, e: KafkaError) -> Result<Option<String>, FenceError> {
    match reader_error(e.rdkafka_error_code()) {
        ReaderError::UnusedGroup => {
            tracing::debug!("tail fence reader: the unused group: {e}");
            Ok(None)
        }
        ReaderError::Denied(code) => Err(FenceError::Denied {
            topic: topic.to_owned(),
            code,
        }),
        ReaderError::TopicGone(code) => Err(FenceError::Read {
            topic: topic.to_owned(),
            message: format!("{code}: the topic was deleted or is being recreated"),
        }),
        ReaderError::Transient => Ok(Some(e.to_string())),
    }
}

/// The fence's error for a failed metadata request of `topic`.
fn metadata_error(
    e: rdkafka::error::KafkaError,
    topic: &str,
    partitions: u32,
    timeout: Duration,
    deadline: Instant,
) -> FenceError {
    if let Some(code) = e.rdkafka_error_code().filter(|c| is_denied(*c)) {
        return FenceError::Denied {
            topic: topic.to_owned(),
            code,
        };
    }
    if Instant::now() >= deadline {
        return FenceError::Timeout {
            topic: topic.to_owned(),
            partitions: (0..partitions).collect(),
            timeout,
            last_error: Some(format!("fetching the topic's metadata: {e}")),
        };
    }
    FenceError::Read {
        topic: topic.to_owned(),
        message: format!("fetching the topic's metadata: {e}"),
    }
}

/// The record, if it is one of `source`'s. A record with a reserved
/// header twice, or with both forms of the previous key, is refused by
/// every reader (docs/relay.md): it is never taken for one of ours, so it
/// never becomes a fence key (a replay writes its event again, as a
/// duplicate, rather than trusting it).
fn own_record<M: Message>(msg: &M, source: &[u8]) -> Option<OwnRecord> {
    let headers = msg.headers()?;
    let hex = |value: &[u8]| {
        std::str::from_utf8(value)
            .ok()
            .and_then(|t| EventKey::from_hex(t).ok())
    };
    let compact = |value: &[u8]| {
        std::str::from_utf8(value)
            .ok()
            .and_then(|t| EventKey::from_compact(t).ok())
    };
    let (mut key, mut from, mut layout) = (None, false, None);
    // The previous key in either header set's form; walrelay writes one.
    let (mut prev_hex, mut prev_compact) = (None, None);
    let mut reserved: Vec<&str> = Vec::new();
    for h in headers.iter() {
        if header::is_reserved(h.key) {
            if reserved.iter().any(|r| r.eq_ignore_ascii_case(h.key)) {
                return None;
            }
            reserved.push(h.key);
        }
        let value = h.value.unwrap_or_default();
        match h.key {
            header::IDEMPOTENCY_KEY => key = hex(value),
            header::SOURCE => from = value == source,
            header::LAYOUT => layout = Layout::parse(value),
            header::PREV_KEY => prev_hex = Some(hex(value)),
            header::PREV => prev_compact = Some(compact(value)),
            _ => {}
        }
    }
    let prev = match (prev_hex, prev_compact) {
        (Some(p), None) | (None, Some(p)) => p,
        // Both: not walrelay's doing, and refused by every reader.
        (Some(_), Some(_)) => return None,
        (None, None) => None,
    };
    Some(OwnRecord {
        offset: msg.offset(),
        key: key.filter(|_| from)?,
        prev,
        layout,
    })
}

fn to_i32(partition: u32) -> i32 {
    i32::try_from(partition).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
    use rdkafka::Timestamp;

    use super::*;

    const KEY: &str = "00000000000001000000000000000002";

    fn message(headers: &[(&str, &str)]) -> OwnedMessage {
        let mut h = OwnedHeaders::new();
        for (key, value) in headers {
            h = h.insert(Header {
                key,
                value: Some(*value),
            });
        }
        OwnedMessage::new(
            None,
            None,
            "t".into(),
            Timestamp::NotAvailable,
            0,
            7,
            Some(h),
        )
    }

    #[test]
    fn a_well_formed_record_of_this_source_is_ours() {
        let m = message(&[
            (header::IDEMPOTENCY_KEY, KEY),
            (header::SOURCE, "s"),
            (header::PREV_KEY, ""),
        ]);
        let own = own_record(&m, b"s").expect("ours");
        assert_eq!((own.offset, own.prev), (7, None));
        assert!(own_record(&m, b"other").is_none());
    }

    #[test]
    fn both_previous_keys_or_a_reserved_header_twice_are_never_ours() {
        let both = message(&[
            (header::IDEMPOTENCY_KEY, KEY),
            (header::SOURCE, "s"),
            (header::PREV_KEY, ""),
            (header::PREV, ""),
        ]);
        assert!(own_record(&both, b"s").is_none());
        for twice in [header::IDEMPOTENCY_KEY, header::SOURCE, "Walrelay-Layout"] {
            let mut headers = vec![
                (header::IDEMPOTENCY_KEY, KEY),
                (header::SOURCE, "s"),
                (header::LAYOUT, "x"),
            ];
            headers.push((
                twice,
                if twice == header::IDEMPOTENCY_KEY {
                    KEY
                } else {
                    "s"
                },
            ));
            assert!(own_record(&message(&headers), b"s").is_none(), "{twice}");
        }
    }
}
