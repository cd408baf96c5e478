//! Reading Debezium's records back: which event each record is, and a
//! tally of a range of a topic against the backlog it should hold.
//!
//! An outbox record names its event in the `id` header (the Event Router
//! copies the `id` column there; the header converter writes the bigint
//! as text). A logical-message record is Debezium's change event,
//! `{"op":"m",...,"message":{"prefix":"bench","content":"<base64>"}}`
//! (JsonConverter writes the content's bytes as base64): the event's
//! sequence number is the first 20 bytes of the decoded content, as in
//! every message the bench writes.

use std::collections::HashSet;
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::env::PARTITIONS;
use crate::workload::{seq_of_payload, Kind};

/// Who wrote the records read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// Debezium: a message is its change event (JSON, content base64).
    Debezium,
    /// walrelay: a message's value is its content (the raw route).
    Walrelay,
}

/// The sequence number of the event a record carries, `None` if it
/// carries none (not a record of the bench).
pub fn seq_of_record(
    writer: Writer,
    kind: Kind,
    value: Option<&[u8]>,
    id_header: Option<&[u8]>,
) -> Option<u64> {
    match (kind, writer) {
        (Kind::Outbox, _) => std::str::from_utf8(id_header?).ok()?.trim().parse().ok(),
        (Kind::Messages, Writer::Walrelay) => seq_of_payload(value?),
        (Kind::Messages, Writer::Debezium) => {
            let v: serde_json::Value = serde_json::from_slice(value?).ok()?;
            let content = v.get("message")?.get("content")?.as_str()?;
            // 28 base64 characters hold the first 21 bytes.
            let head = base64_prefix(content.get(..28.min(content.len()))?)?;
            seq_of_payload(&head)
        }
    }
}

/// Decodes standard base64 (`A-Z a-z 0-9 + /`, `=` padding) up to the
/// first padding; `None` on any other character. Only as much as the
/// bench needs: the start of a message's content.
pub fn base64_prefix(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Records of a topic range against the backlog of events `range`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Records read.
    pub records: u64,
    /// Distinct events of the backlog among them.
    pub distinct: u64,
    /// Records of a backlog event seen before: written twice.
    pub duplicates: u64,
    /// Records of no backlog event (another sequence number, or none).
    pub other: u64,
}

impl Tally {
    /// Counts `seqs` (one per record, in any order) against `range`.
    pub fn of(seqs: impl IntoIterator<Item = Option<u64>>, range: Range<u64>) -> Tally {
        let mut seen = HashSet::new();
        let mut t = Tally::default();
        for s in seqs {
            t.records += 1;
            match s {
                Some(s) if range.contains(&s) => {
                    if seen.insert(s) {
                        t.distinct += 1;
                    } else {
                        t.duplicates += 1;
                    }
                }
                _ => t.other += 1,
            }
        }
        t
    }
}

/// Reads `topic` from offsets `from` up to `to` (one per partition, `to`
/// exclusive, as high watermarks give them) and returns each record's
/// sequence number ([`seq_of_record`]). Blocking; fails after `timeout`.
pub fn read_range(
    bootstrap: &str,
    topic: &str,
    from: &[i64],
    to: &[i64],
    writer: Writer,
    kind: Kind,
    timeout: Duration,
) -> Result<Vec<Option<u64>>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "group.id",
            format!("walrelay-bench-dbz-{}", std::process::id()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "5")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    let mut left = 0i64;
    for p in 0..PARTITIONS {
        let (f, t) = (from[p as usize], to[p as usize]);
        if t > f {
            tpl.add_partition_offset(topic, p, Offset::Offset(f))?;
            left += t - f;
        }
    }
    let mut out = Vec::with_capacity(left as usize);
    if left == 0 {
        return Ok(out);
    }
    consumer.assign(&tpl)?;
    let start = Instant::now();
    while left > 0 {
        if start.elapsed() > timeout {
            bail!(
                "{topic}: {left} records between the offsets {from:?} and {to:?} not read within {timeout:?}"
            );
        }
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.with_context(|| format!("reading {topic}"))?;
        if m.offset() >= to[m.partition() as usize] {
            continue;
        }
        left -= 1;
        let id = m
            .headers()
            .and_then(|hs| hs.iter().find(|h| h.key == "id").and_then(|h| h.value));
        out.push(seq_of_record(writer, kind, m.payload(), id));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_base64_prefixes() {
        assert_eq!(base64_prefix("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_prefix("aGVsbG8gd29ybGQ").unwrap(), b"hello world");
        assert_eq!(base64_prefix("").unwrap(), b"");
        assert!(base64_prefix("aGV*").is_none());
    }

    #[test]
    fn finds_the_event_in_debezium_records() {
        // Debezium's message event for payload(42, 200): content base64.
        let content = "MDAwMDAwMDAwMDAwMDAwMDAwNDJ4eHh4eHh4";
        assert_eq!(
            base64_prefix(content).unwrap(),
            b"00000000000000000042xxxxxxx"
        );
        let value = format!(
            r#"{{"op":"m","ts_ms":1,"source":{{}},"message":{{"prefix":"bench","content":"{content}"}}}}"#
        );
        let dbz = |kind, value, id| seq_of_record(Writer::Debezium, kind, value, id);
        assert_eq!(dbz(Kind::Messages, Some(value.as_bytes()), None), Some(42));
        assert_eq!(dbz(Kind::Messages, Some(br#"{"op":"c"}"#), None), None);
        assert_eq!(
            dbz(Kind::Outbox, Some(br#""0042xx""#), Some(b"42")),
            Some(42)
        );
        assert_eq!(dbz(Kind::Outbox, None, None), None);
        let raw = crate::workload::payload(7, 200);
        assert_eq!(
            seq_of_record(Writer::Walrelay, Kind::Messages, Some(raw.as_bytes()), None),
            Some(7)
        );
    }

    #[test]
    fn tallies_duplicates_and_strangers_apart() {
        let t = Tally::of(
            [Some(10), Some(11), Some(10), Some(12), None, Some(99)],
            10..13,
        );
        assert_eq!(
            t,
            Tally {
                records: 6,
                distinct: 3,
                duplicates: 1,
                other: 2
            }
        );
    }
}
