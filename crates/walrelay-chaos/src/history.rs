//! The history the checker judges, gathered from the systems themselves
//! rather than from what the harness believes happened:
//!
//! * the committed units: `chaos_ledger` in the source database;
//! * the non-transactional messages: decoded by PostgreSQL through the
//!   harness's own `test_decoding` slot ([`Auditor`]), because their
//!   durability does not follow any commit the client saw;
//! * the consumer's applications: `chaos_applied`, in order;
//! * the records on the wire: every record of every topic, read back;
//! * the relay's audit trace: what it produced, what Kafka acknowledged,
//!   and what it confirmed to PostgreSQL, from `--trace-file`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::BufRead;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::TryStreamExt;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::event::EventId;
use crate::services::{AUDIT_SLOT, TOPICS};
use crate::workload::connect;

/// Collects the non-transactional messages PostgreSQL decodes from its
/// WAL, through a `test_decoding` slot the harness drains now and then
/// (after a crash the slot may go back a little: the set absorbs repeats).
pub struct Auditor {
    url: String,
    client: Option<tokio_postgres::Client>,
    pub non_tx: HashSet<EventId>,
    pub malformed: Vec<String>,
}

impl Auditor {
    pub fn new(url: String) -> Auditor {
        Auditor {
            url,
            client: None,
            non_tx: HashSet::new(),
            malformed: Vec::new(),
        }
    }

    /// Creates the slot; a `failover` slot (PostgreSQL 17 or later) when
    /// the source has a failover standby, so that the audit survives the
    /// failovers the relay does.
    pub async fn create_slot(&mut self, failover: bool) -> Result<()> {
        let sql = if failover {
            "SELECT pg_create_logical_replication_slot($1, 'test_decoding', failover => true)"
        } else {
            "SELECT pg_create_logical_replication_slot($1, 'test_decoding')"
        };
        connect(&self.url)
            .await?
            .execute(sql, &[&AUDIT_SLOT])
            .await
            .context("creating the audit slot")?;
        Ok(())
    }

    /// Drains the slot; errors (PostgreSQL down) are for the caller to
    /// retry later.
    pub async fn drain(&mut self) -> Result<usize> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            self.client = Some(connect(&self.url).await?);
        }
        let client = self.client.as_ref().expect("connected");
        let rows = client
            .query(
                "SELECT data FROM pg_logical_slot_get_changes($1, NULL, NULL)
                 WHERE data LIKE 'message: transactional: 0 prefix: chaos,%'",
                &[&AUDIT_SLOT],
            )
            .await;
        let rows = match rows {
            Ok(r) => r,
            Err(e) => {
                self.client = None;
                return Err(e.into());
            }
        };
        for row in &rows {
            let data: String = row.get(0);
            match data
                .split_once(" content:")
                .and_then(|(_, c)| EventId::parse(c))
            {
                Some(id) => {
                    self.non_tx.insert(id);
                }
                None => self.malformed.push(data),
            }
        }
        Ok(rows.len())
    }
}

/// Units whose transaction committed, with their event counts.
pub async fn ledger(url: &str) -> Result<HashMap<u64, u32>> {
    let client = connect(url).await?;
    let rows = client
        .query("SELECT unit, events FROM chaos_ledger", &[])
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i32>(1) as u32))
        .collect())
}

/// One application by the consumer.
#[derive(Clone, Debug)]
pub struct Applied {
    pub event: Option<EventId>,
    pub raw: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: u128,
}

/// Every row of `table` (`chaos_applied`, or the Python or the Java
/// consumer's `chaos_applied_py`, `chaos_applied_java`), in application
/// order.
pub async fn applied(dsn: &str, table: &str) -> Result<Vec<Applied>> {
    let client = connect(dsn).await?;
    let rows = client
        .query_raw(
            &format!(
                "SELECT event, topic, kafka_partition, kafka_offset, idempotency_key
                 FROM {table} ORDER BY seq"
            ),
            std::iter::empty::<i32>(),
        )
        .await?;
    futures_util::pin_mut!(rows);
    let mut out = Vec::new();
    while let Some(r) = rows.try_next().await? {
        let raw: String = r.get(0);
        let key: String = r.get(4);
        out.push(Applied {
            event: EventId::parse(&raw),
            raw,
            topic: r.get(1),
            partition: r.get(2),
            offset: r.get(3),
            key: u128::from_str_radix(&key, 16).unwrap_or(0),
        });
    }
    Ok(out)
}

/// One record read back from Kafka.
#[derive(Clone, Debug)]
pub struct WireRecord {
    pub topic_index: u8,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<u128>,
    pub event: Option<EventId>,
}

/// Reads every partition of every topic from the beginning until at
/// least `expect` distinct keys were seen and nothing new arrived for
/// `quiet`, or `timeout` passed.
pub fn read_wire(
    bootstrap: &str,
    expect: usize,
    quiet: Duration,
    timeout: Duration,
) -> Result<Vec<WireRecord>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "group.id",
            format!("chaos-wire-reader-{}", std::process::id()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "50")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for (topic, partitions) in TOPICS {
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
    }
    consumer.assign(&tpl)?;
    let started = Instant::now();
    let mut last = Instant::now();
    let mut keys = HashSet::new();
    let mut out = Vec::new();
    while started.elapsed() < timeout && (keys.len() < expect || last.elapsed() < quiet) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                last = Instant::now();
                let key = m.headers().and_then(|hs| {
                    hs.iter()
                        .find(|h| h.key == "idempotency-key")
                        .and_then(|h| std::str::from_utf8(h.value?).ok())
                        .and_then(|s| u128::from_str_radix(s, 16).ok())
                });
                if let Some(k) = key {
                    keys.insert(k);
                }
                out.push(WireRecord {
                    topic_index: TOPICS
                        .iter()
                        .position(|(t, _)| *t == m.topic())
                        .unwrap_or(0) as u8,
                    partition: m.partition(),
                    offset: m.offset(),
                    key,
                    event: m.payload().and_then(EventId::from_payload),
                });
            }
            Some(Err(e)) => tracing::debug!("wire reader: {e}"),
            None => {}
        }
    }
    Ok(out)
}

/// What the relay's audit trace shows.
#[derive(Debug, Default)]
pub struct TraceSummary {
    pub lines: u64,
    pub malformed: u64,
    pub processes: u64,
    pub sessions: u64,
    pub failed_sessions: u64,
    pub produced: u64,
    pub acked: u64,
    pub confirmations: u64,
    /// Confirmations that covered a produced, unacknowledged key (the
    /// first few described in `violations`).
    pub violation_count: u64,
    pub violations: Vec<String>,
    /// Session errors, by their first words.
    pub errors: HashMap<String, u64>,
}

/// Checks the trace file: at every confirmation of an LSN, every record
/// the session produced whose key's commit LSN (high 64 bits) is below it
/// was already acknowledged by Kafka. Each session (and each process)
/// numbers its records afresh.
pub fn check_trace(path: &Path) -> Result<TraceSummary> {
    let mut s = TraceSummary::default();
    let file = std::fs::File::open(path)
        .with_context(|| format!("opening the trace {}", path.display()))?;
    // Unacknowledged records of the current session: seq → commit LSN, and
    // the same ordered by LSN for the check.
    let mut unacked: HashMap<u64, u64> = HashMap::new();
    let mut by_lsn: BTreeSet<(u64, u64)> = BTreeSet::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if line.is_empty() {
            continue;
        }
        s.lines += 1;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            s.malformed += 1;
            continue;
        };
        let num = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
        let key = || {
            v.get("key")
                .and_then(serde_json::Value::as_str)
                .and_then(|k| u128::from_str_radix(k, 16).ok())
        };
        match v.get("t").and_then(serde_json::Value::as_str) {
            Some("start") | Some("session_started") | Some("session_ended") => {
                match v["t"].as_str() {
                    Some("start") => s.processes += 1,
                    Some("session_started") => s.sessions += 1,
                    _ => {
                        if let Some(e) = v.get("error").and_then(serde_json::Value::as_str) {
                            s.failed_sessions += 1;
                            let head: String =
                                e.split_whitespace().take(6).collect::<Vec<_>>().join(" ");
                            *s.errors.entry(head).or_default() += 1;
                        }
                    }
                }
                unacked.clear();
                by_lsn.clear();
            }
            Some("produced") => {
                s.produced += 1;
                if let (Some(seq), Some(k)) = (num("seq"), key()) {
                    let lsn = (k >> 64) as u64;
                    unacked.insert(seq, lsn);
                    by_lsn.insert((lsn, seq));
                } else {
                    s.malformed += 1;
                }
            }
            Some("acked") => {
                s.acked += 1;
                if let Some(seq) = num("seq") {
                    if let Some(lsn) = unacked.remove(&seq) {
                        by_lsn.remove(&(lsn, seq));
                    }
                }
            }
            Some("confirmed") => {
                s.confirmations += 1;
                let lsn = num("lsn").unwrap_or(0);
                if let Some(&(first, seq)) = by_lsn.first() {
                    if first < lsn {
                        s.violation_count += 1;
                    }
                    if first < lsn && s.violations.len() < 20 {
                        s.violations.push(format!(
                            "confirmed {lsn:#x} while record seq {seq} with commit LSN {first:#x} was unacknowledged"
                        ));
                    }
                }
            }
            _ => s.malformed += 1,
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_check_catches_a_confirmation_ahead_of_an_acknowledgement() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.jsonl");
        let key =
            |lsn: u64, pos: u64| format!("{:032x}", (u128::from(lsn) << 64) | u128::from(pos));
        let good = format!(
            "\n{{\"t\":\"start\",\"pid\":1}}\n{{\"t\":\"session_started\",\"confirmed\":0}}\n\
             {{\"t\":\"produced\",\"seq\":0,\"key\":\"{}\",\"topic\":\"t\",\"partition\":0}}\n\
             {{\"t\":\"produced\",\"seq\":1,\"key\":\"{}\",\"topic\":\"t\",\"partition\":0}}\n\
             {{\"t\":\"acked\",\"seq\":0,\"key\":\"{}\",\"partition\":0,\"offset\":0}}\n\
             {{\"t\":\"confirmed\",\"lsn\":150}}\n{{\"t\":\"produced\",\"seq\":2,\"key\":",
            key(100, 1),
            key(200, 2),
            key(100, 1)
        );
        std::fs::write(&path, &good).unwrap();
        let s = check_trace(&path).unwrap();
        assert_eq!((s.confirmations, s.violation_count, s.malformed), (1, 0, 1));

        // Confirming 250 while the record committed at 200 is unacknowledged.
        let bad = good.replace("\"lsn\":150", "\"lsn\":250");
        std::fs::write(&path, bad).unwrap();
        let s = check_trace(&path).unwrap();
        assert_eq!(s.violation_count, 1, "{:?}", s.violations);
    }
}
