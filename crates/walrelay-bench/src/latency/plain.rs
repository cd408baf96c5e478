//! The latency references: a plain rdkafka producer with walrelay's
//! settings sends the records the live load would make, at the same rate.
//!
//! * Alone (no database in the path), its send-to-ack times are what the
//!   broker and librdkafka cost on this machine.
//! * As a **dual write**, each of its tasks first commits a one-event
//!   transaction of the same shape as the live load's (on a database
//!   without a slot, so nothing decodes it) and sends the record when the
//!   commit reply arrives: the same database load on the same cores, and
//!   the latency floor of any relay that starts after the commit. (A dual
//!   write loses the record when the process dies between the two; it is
//!   a yardstick, not a design.) walrelay's commit-to-ack beside it is
//!   what the replication path adds.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::env::PARTITIONS;
use crate::kafka::walrelay_producer_config;
use crate::polling::Acks;
use crate::workload::payload;

/// One stretch of the references' load: `rate` events/s in total for
/// `duration` from `clients` tasks, sequence numbers from `first`,
/// payloads of `size` bytes.
pub struct Stretch {
    pub size: usize,
    pub rate: u64,
    pub duration: Duration,
    pub first: u64,
    pub clients: u64,
}

/// Sends one record per event at `rate` events/s in total for `duration`
/// from `clients` open-loop tasks (as the database generator does: event
/// `j` of a task is due at `start + j / rate_per_task`), each shaped like
/// walrelay's one-event transactions (keyless, the lean header set, one
/// partition per event in turn). With `db` (one client per task) each
/// record is sent after committing its transaction (a dual write). Returns
/// (sequence number, commit or send time) per event; each delivery
/// report's time goes to `acks`.
pub async fn generate(
    producer: &FutureProducer,
    db: Option<&[tokio_postgres::Client]>,
    topic: &str,
    stretch: Stretch,
    acks: &Acks,
) -> Result<Vec<(u64, Instant)>> {
    let Stretch {
        size,
        rate,
        duration,
        first,
        clients,
    } = stretch;
    let start = tokio::time::Instant::now();
    let end = start + duration;
    let gap = Duration::from_secs_f64(clients as f64 / rate as f64);
    let tasks = (0..clients).map(|i| async move {
        let commit = match db {
            Some(db) => {
                let c = db.get(i as usize).context("a client per task")?;
                // The live load's statement, under a prefix nothing reads.
                let stmt = c
                    .prepare("SELECT pg_logical_emit_message(true, 'bench-dual', $1::text)")
                    .await?;
                Some((c, stmt))
            }
            None => None,
        };
        let mut sent = Vec::new();
        let mut pending = Vec::new();
        for j in 0u64.. {
            let due = start + gap.mul_f64(j as f64);
            if due >= end {
                break;
            }
            tokio::time::sleep_until(due).await;
            let seq = first + j * clients + i;
            let body = payload(seq, size);
            if let Some((c, stmt)) = &commit {
                c.execute(stmt, &[&body]).await?;
            }
            let key = walrelay::engine::key::EventKey::new(0x1_0000_0000 + seq * 300, 0);
            let key_hex = format!("{:032x}", key.0);
            let partition = (seq % PARTITIONS as u64) as i32;
            let layout = format!("{partition}/{PARTITIONS}/9f86d081884c7d65");
            let prev = walrelay::engine::key::EventKey::new(
                0x1_0000_0000 + seq.saturating_sub(1) * 300,
                0,
            )
            .to_compact();
            let headers = OwnedHeaders::new_with_capacity(4)
                .insert(Header {
                    key: "idempotency-key",
                    value: Some(&key_hex),
                })
                .insert(Header {
                    key: "walrelay-source",
                    value: Some("7300000000000000000/postgres/lat_wr_msg_0"),
                })
                .insert(Header {
                    key: "walrelay-layout",
                    value: Some(&layout),
                })
                .insert(Header {
                    key: "walrelay-prev",
                    value: Some(&prev),
                });
            let record: FutureRecord<'_, (), str> = FutureRecord::to(topic)
                .payload(body.as_str())
                .partition(partition)
                .headers(headers);
            sent.push((seq, Instant::now()));
            let delivery = producer
                .send_result(record)
                .map_err(|(e, _)| e)
                .context("queueing a record")?;
            let acks = acks.clone();
            pending.push(tokio::spawn(async move {
                let done = delivery.await;
                let at = Instant::now();
                done.context("delivery future dropped")?
                    .map_err(|(e, _)| e)
                    .context("delivery failed")?;
                acks.lock().expect("lock").push((seq, at));
                anyhow::Ok(())
            }));
        }
        for p in pending {
            p.await.context("delivery task panicked")??;
        }
        anyhow::Ok(sent)
    });
    let mut all = Vec::new();
    for r in futures_util::future::join_all(tasks).await {
        all.extend(r?);
    }
    Ok(all)
}

/// The producer for [`generate`]: walrelay's effective settings.
pub fn producer(bootstrap: &str) -> Result<FutureProducer> {
    walrelay_producer_config(bootstrap)?
        .create()
        .context("creating the plain producer")
}
