//! The reference peers: the classic inbox-table consumer, and the same
//! loop without deduplication (the apply limit).
//!
//! The inbox is the pattern walrelay's high-water mark replaces: a table
//! with one row per processed event id (`inbox`, primary key on the id).
//! Written two ways ([`Style`]): carefully, as a team that batches writes
//! it (per batch of up to 500 records, one transaction with one multi-row
//! `INSERT INTO inbox ... ON CONFLICT DO NOTHING RETURNING event_id` and
//! one multi-row insert of the effects of the ids it returned), and a
//! statement per record (per record `INSERT ... ON CONFLICT DO NOTHING`,
//! then its effect when that inserted a row). The apply limit writes the
//! effects with the same multi-row insert and deduplicates nothing: what
//! applying costs at all, the ceiling of every exactly-once consumer.
//!
//! Each is a plain rdkafka loop of its own (not walrelay's), serial over
//! all partitions on one connection. Offsets are stored after the
//! database commit and committed every second, as the walrelay loop does.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::FutureExt;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::watch;
use tokio_postgres::Client;

use super::Applied;

pub const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS inbox (
        event_id text PRIMARY KEY,
        processed_at timestamptz NOT NULL DEFAULT now()
    );";

const INBOX_INSERT: &str = "INSERT INTO inbox (event_id) VALUES ($1) ON CONFLICT DO NOTHING";
const INBOX_INSERT_BATCH: &str = "INSERT INTO inbox (event_id) SELECT * FROM unnest($1::text[]) \
     ON CONFLICT DO NOTHING RETURNING event_id";

/// How a reference consumer applies a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Ids and effects each one multi-row statement per batch.
    Careful,
    /// Two statements per record.
    PerRecord,
    /// Effects only, one multi-row statement per batch: no deduplication.
    NoDedupe,
}

/// Consumes `topic` until `stop`, applying every record (once by the inbox
/// table, unless `style` is [`Style::NoDedupe`]), at most `per_tx` records
/// per transaction. `applied` counts records after their transaction
/// committed.
pub async fn run(
    kafka: ClientConfig,
    topic: &str,
    mut client: Client,
    per_tx: usize,
    style: Style,
    applied: Applied,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    let mut kafka = kafka;
    kafka
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    let consumer: StreamConsumer = kafka.create().context("inbox consumer")?;
    consumer.subscribe(&[topic])?;
    let effect = client.prepare(super::EFFECT_INSERT_ONE).await?;
    let effects = client.prepare(super::EFFECT_INSERT_BATCH).await?;
    let inbox = client.prepare(INBOX_INSERT).await?;
    let inbox_batch = client.prepare(INBOX_INSERT_BATCH).await?;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut batch: Vec<OwnedMessage> = Vec::with_capacity(per_tx);
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = ticker.tick() => {
                match consumer.commit_consumer_state(CommitMode::Async) {
                    Ok(()) | Err(rdkafka::error::KafkaError::ConsumerCommit(
                        rdkafka::types::RDKafkaErrorCode::NoOffset,
                    )) => {}
                    Err(e) => tracing::warn!("inbox consumer: committing offsets: {e}"),
                }
            }
            m = consumer.recv() => {
                batch.push(m?.detach());
                while batch.len() < per_tx {
                    match consumer.recv().now_or_never() {
                        Some(m) => batch.push(m?.detach()),
                        None => break,
                    }
                }
                for chunk in batch.chunks(per_tx) {
                    let tx = client.transaction().await?;
                    if style == Style::PerRecord {
                        for m in chunk {
                            let id = idempotency_key(m).context("a record without idempotency-key")?;
                            if tx.execute(&inbox, &[&id]).await? == 1 {
                                let payload = String::from_utf8_lossy(m.payload().unwrap_or_default());
                                tx.execute(&effect, &[&id, &payload.as_ref()]).await?;
                                applied.observe();
                            }
                        }
                    } else {
                        let mut ids = Vec::with_capacity(chunk.len());
                        for m in chunk {
                            ids.push(idempotency_key(m).context("a record without idempotency-key")?);
                        }
                        let new: HashSet<String> = if style == Style::Careful {
                            tx.query(&inbox_batch, &[&ids])
                                .await?
                                .iter()
                                .map(|row| row.get(0))
                                .collect()
                        } else {
                            HashSet::new()
                        };
                        let (mut new_ids, mut payloads) = (Vec::new(), Vec::new());
                        for (m, id) in chunk.iter().zip(ids) {
                            if style == Style::NoDedupe || new.contains(&id) {
                                payloads.push(String::from_utf8_lossy(m.payload().unwrap_or_default()));
                                new_ids.push(id);
                            }
                        }
                        tx.execute(&effects, &[&new_ids, &payloads]).await?;
                        applied.observe();
                    }
                    tx.commit().await?;
                    applied.count.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    let mut tpl = TopicPartitionList::new();
                    for m in chunk {
                        tpl.add_partition_offset(m.topic(), m.partition(), Offset::Offset(m.offset() + 1))?;
                    }
                    consumer.store_offsets(&tpl)?;
                }
                batch.clear();
            }
        }
    }
    Ok(())
}

fn idempotency_key(m: &OwnedMessage) -> Option<String> {
    let headers = m.headers()?;
    headers
        .iter()
        .find(|h| h.key == "idempotency-key")
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Rows and bytes of the inbox table: the dedupe state.
pub async fn state(client: &Client) -> Result<(i64, i64)> {
    let row = client
        .query_one(
            "SELECT count(*), pg_total_relation_size('inbox') FROM inbox",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}
