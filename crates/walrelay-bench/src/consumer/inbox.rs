//! The reference peer: the classic inbox-table consumer.
//!
//! This is the pattern walrelay's high-water mark replaces, written the
//! way teams write it: a table with one row per processed event id
//! (`inbox`, primary key on the id), and per record
//! `INSERT INTO inbox ... ON CONFLICT DO NOTHING`; when that inserted a
//! row, the side effect, in the same transaction. Offsets are stored after
//! the database commit and committed every second, as the walrelay loop
//! does. It runs serially over all partitions (one connection), with one
//! transaction per record or per up to `per_tx` records.

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

/// Consumes `topic` until `stop`, applying every record once by the inbox
/// table. `applied` counts records after their transaction committed.
pub async fn run(
    kafka: ClientConfig,
    topic: &str,
    mut client: Client,
    per_tx: usize,
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
    let inbox = client.prepare(INBOX_INSERT).await?;
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
                    for m in chunk {
                        let id = idempotency_key(m).context("a record without idempotency-key")?;
                        if tx.execute(&inbox, &[&id]).await? == 1 {
                            let payload = String::from_utf8_lossy(m.payload().unwrap_or_default());
                            tx.execute(&effect, &[&id, &payload.as_ref()]).await?;
                            applied.observe(m.payload());
                        }
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
