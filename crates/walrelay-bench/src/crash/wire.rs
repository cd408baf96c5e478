//! What a tool wrote, read back from Kafka, and the counts the crash
//! comparison reports.
//!
//! Definitions (per tool, over the records its topics hold from the
//! offsets they had before its run):
//!
//! * **committed**: events the workload committed (all of them commit:
//!   only the relay is killed, never PostgreSQL).
//! * **records**: records carrying an event of the run (a record carrying
//!   none is counted apart as `other`, and should be 0).
//! * **lost**: committed events with no record at all.
//! * **duplicates**: records beyond one per event (`records - distinct`),
//!   also split by what the event is (a logical message, an outbox row).
//! * **events applied twice**: events with two or more records: what a
//!   consumer without deduplication (it applies every record it reads,
//!   once) applies more than once; the extra applications are the
//!   duplicates.
//! * **out of order**: the sequence numbers follow commit order (one
//!   writer, one transaction after another). Per topic partition, in
//!   offset order, a record of an event *not seen before in that
//!   partition* whose sequence number is below the highest seen before it
//!   in that partition. A replay (an event seen before) is a duplicate,
//!   not out of order. Such a record is one a high-water-mark consumer
//!   (what walrelay's consumers keep) skips as old: for it, a loss.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde::Serialize;

use crate::debezium::readback::{seq_of_record, Writer};
use crate::debezium::watch::current_end_offsets;
use crate::env::PARTITIONS;
use crate::workload::Kind;

/// One record read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireRecord {
    /// Index of the topic in the reader's list.
    pub topic: usize,
    pub partition: i32,
    pub seq: Option<u64>,
}

/// A tool's topics, read from given offsets on, as the records arrive.
pub struct WireReader {
    consumer: BaseConsumer,
    topics: Vec<(String, Kind)>,
    writer: Writer,
    /// Every record read so far, in offset order per partition.
    pub records: Vec<WireRecord>,
    seen: HashSet<u64>,
    /// The next offset to read of every (topic index, partition).
    next: HashMap<(usize, i32), i64>,
    /// The run's first sequence number: [`WireReader::distinct`] counts
    /// events from it on.
    min_seq: u64,
}

impl WireReader {
    /// Reads `topics` (name, what it holds) from `bases` (their end
    /// offsets before the run) on; the run's events start at `min_seq`.
    pub fn new(
        bootstrap: &str,
        topics: Vec<(String, Kind)>,
        bases: &[Vec<i64>],
        writer: Writer,
        min_seq: u64,
    ) -> Result<WireReader> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set(
                "group.id",
                format!("walrelay-bench-crash-{}", std::process::id()),
            )
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "50")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for ((topic, _), base) in topics.iter().zip(bases) {
            for p in 0..PARTITIONS {
                tpl.add_partition_offset(topic, p, Offset::Offset(base[p as usize]))?;
            }
        }
        consumer.assign(&tpl)?;
        let next = (0..topics.len())
            .flat_map(|t| (0..PARTITIONS).map(move |p| ((t, p), bases[t][p as usize])))
            .collect();
        Ok(WireReader {
            next,
            consumer,
            topics,
            writer,
            records: Vec::new(),
            seen: HashSet::new(),
            min_seq,
        })
    }

    /// Distinct events of the run read so far.
    pub fn distinct(&self) -> usize {
        self.seen.len()
    }

    /// Reads what arrives within `wait` (blocking); returns the records
    /// read.
    pub fn poll(&mut self, wait: Duration) -> Result<usize> {
        let deadline = std::time::Instant::now() + wait;
        let mut n = 0;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Some(m) = self.consumer.poll(left.min(Duration::from_millis(100))) else {
                if left.is_zero() {
                    return Ok(n);
                }
                continue;
            };
            let m = m.context("reading a tool's topics back")?;
            let topic = self
                .topics
                .iter()
                .position(|(t, _)| t == m.topic())
                .context("a record of a topic not assigned")?;
            let id = m
                .headers()
                .and_then(|hs| hs.iter().find(|h| h.key == "id").and_then(|h| h.value));
            self.next.insert((topic, m.partition()), m.offset() + 1);
            let seq = seq_of_record(self.writer, self.topics[topic].1, m.payload(), id);
            if let Some(s) = seq.filter(|&s| s >= self.min_seq) {
                self.seen.insert(s);
            }
            self.records.push(WireRecord {
                topic,
                partition: m.partition(),
                seq,
            });
            n += 1;
        }
    }

    /// Reads until every partition's position reaches its end offset as
    /// of now (the tool stopped: nothing more comes), within `timeout`.
    pub fn read_to_end(&mut self, bootstrap: &str, timeout: Duration) -> Result<()> {
        let mut ends = Vec::new();
        for (t, _) in &self.topics {
            ends.push(current_end_offsets(bootstrap, t)?);
        }
        let deadline = std::time::Instant::now() + timeout;
        loop {
            // The consumer's position passes transaction markers (an
            // exactly-once producer's), which no record carries.
            let pos = self.consumer.position()?;
            let behind = ends.iter().enumerate().any(|(t, end)| {
                (0..PARTITIONS).any(|p| {
                    let at = match pos.find_partition(&self.topics[t].0, p).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => o,
                        _ => 0,
                    };
                    self.next[&(t, p)].max(at) < end[p as usize]
                })
            });
            if !behind {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "reading back: the topics' end offsets {ends:?} not reached within {timeout:?}"
                );
            }
            self.poll(Duration::from_millis(200))?;
        }
    }
}

/// The counts of one tool's run (see the module's doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WireCounts {
    pub committed: u64,
    pub records: u64,
    pub other: u64,
    pub distinct: u64,
    pub lost: u64,
    pub duplicates: u64,
    /// Of the duplicates, those of logical messages.
    pub duplicate_messages: u64,
    /// Of the duplicates, those of outbox rows.
    pub duplicate_outbox_rows: u64,
    pub events_applied_twice: u64,
    /// The most records one event had.
    pub max_copies: u64,
    pub out_of_order: u64,
}

impl WireCounts {
    /// Records per committed event.
    pub fn records_per_event(&self) -> f64 {
        self.records as f64 / self.committed.max(1) as f64
    }
}

/// Counts `records` (in offset order per partition) against the
/// `committed` sequence numbers; `kinds` says what each topic (by index)
/// holds.
pub fn analyse(records: &[WireRecord], committed: &[u64], kinds: &[Kind]) -> WireCounts {
    let committed_set: HashSet<u64> = committed.iter().copied().collect();
    let mut c = WireCounts {
        committed: committed.len() as u64,
        ..WireCounts::default()
    };
    let mut copies: HashMap<u64, u64> = HashMap::new();
    // Per (topic, partition): events seen there, the highest sequence.
    let mut parts: BTreeMap<(usize, i32), (HashSet<u64>, u64)> = BTreeMap::new();
    for r in records {
        let Some(s) = r.seq.filter(|s| committed_set.contains(s)) else {
            c.other += 1;
            continue;
        };
        c.records += 1;
        let n = copies.entry(s).or_default();
        *n += 1;
        if *n > 1 {
            match kinds.get(r.topic) {
                Some(Kind::Messages) => c.duplicate_messages += 1,
                Some(Kind::Outbox) => c.duplicate_outbox_rows += 1,
                None => {}
            }
        }
        let (seen, max) = parts.entry((r.topic, r.partition)).or_default();
        if seen.insert(s) && s < *max {
            c.out_of_order += 1;
        }
        *max = (*max).max(s);
    }
    c.distinct = copies.len() as u64;
    c.lost = c.committed - c.distinct;
    c.duplicates = c.records - c.distinct;
    c.events_applied_twice = copies.values().filter(|&&n| n > 1).count() as u64;
    c.max_copies = copies.values().copied().max().unwrap_or(0);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(topic: usize, partition: i32, seq: u64) -> WireRecord {
        WireRecord {
            topic,
            partition,
            seq: Some(seq),
        }
    }

    #[test]
    fn counts_losses_duplicates_and_order() {
        let committed: Vec<u64> = (1..=8).collect();
        let records = [
            r(0, 0, 1),
            r(0, 0, 2),
            r(0, 0, 1), // a replay: a duplicate, not out of order
            r(0, 0, 2),
            r(0, 0, 3),
            r(0, 1, 5),
            r(0, 1, 4), // new in its partition, below 5: out of order
            r(1, 0, 6),
            r(1, 0, 6),
            r(1, 0, 6),
            WireRecord {
                topic: 1,
                partition: 0,
                seq: None,
            },
            r(1, 0, 99), // not of this run
        ];
        let c = analyse(&records, &committed, &[Kind::Messages, Kind::Outbox]);
        assert_eq!(
            c,
            WireCounts {
                committed: 8,
                records: 10,
                other: 2,
                distinct: 6,
                lost: 2, // 7 and 8
                duplicates: 4,
                duplicate_messages: 2,
                duplicate_outbox_rows: 2,
                events_applied_twice: 3,
                max_copies: 3,
                out_of_order: 1,
            }
        );
        assert!((c.records_per_event() - 1.25).abs() < 1e-9);
    }

    #[test]
    fn a_clean_run_is_one_record_per_event() {
        let committed: Vec<u64> = (10..20).collect();
        let records: Vec<_> = committed.iter().map(|&s| r(0, (s % 2) as i32, s)).collect();
        let c = analyse(&records, &committed, &[Kind::Messages, Kind::Outbox]);
        assert_eq!((c.lost, c.duplicates, c.out_of_order), (0, 0, 0));
        assert_eq!(c.records_per_event(), 1.0);
    }
}
