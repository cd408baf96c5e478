//! The alternative most teams write: a polling outbox relay.
//!
//! One loop, one connection: in a transaction, `SELECT ... FROM
//! bench_outbox ORDER BY id LIMIT batch FOR UPDATE SKIP LOCKED`, produce
//! every row (walrelay's producer settings, key `aggregateid`, headers `id`
//! and `type`), wait for every ack, `DELETE` the rows by id, `COMMIT`. When
//! a poll returns fewer rows than the batch, it sleeps for the poll
//! interval before the next one (that is the design being measured, not a
//! synchronisation).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tokio::sync::watch;
use tokio_postgres::Client;

use crate::kafka::walrelay_producer_config;

/// The polling relay's knobs.
#[derive(Debug, Clone, Copy)]
pub struct PollingOptions {
    /// Rows per poll (`LIMIT`).
    pub batch: i64,
    /// Sleep after a poll that found fewer than `batch` rows.
    pub interval: Duration,
}

/// Acks as (sequence number = outbox id, when the delivery report came).
pub type Acks = Arc<Mutex<Vec<(u64, Instant)>>>;

pub struct PollingRelay {
    client: Client,
    producer: FutureProducer,
    topic: String,
    opts: PollingOptions,
    pub relayed: Arc<AtomicU64>,
}

impl PollingRelay {
    pub fn new(
        client: Client,
        bootstrap: &str,
        topic: &str,
        opts: PollingOptions,
    ) -> Result<PollingRelay> {
        let producer: FutureProducer = walrelay_producer_config(bootstrap)?
            .create()
            .context("the polling relay's producer")?;
        Ok(PollingRelay {
            client,
            producer,
            topic: topic.to_owned(),
            opts,
            relayed: Arc::new(AtomicU64::new(0)),
        })
    }

    /// One poll: relays up to `batch` rows and returns how many.
    async fn poll_once(&mut self, acks: Option<&Acks>) -> Result<usize> {
        let tx = self.client.transaction().await?;
        let rows = tx
            .query(
                "SELECT id, aggregateid, type, payload FROM bench_outbox \
                 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
                &[&self.opts.batch],
            )
            .await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(0);
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut pending = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: i64 = row.get(0);
            let key: &str = row.get(1);
            let kind: &str = row.get(2);
            let payload: Option<&str> = row.get(3);
            let id_text = id.to_string();
            let headers = OwnedHeaders::new_with_capacity(2)
                .insert(Header {
                    key: "id",
                    value: Some(&id_text),
                })
                .insert(Header {
                    key: "type",
                    value: Some(kind),
                });
            let mut record = FutureRecord::to(&self.topic).key(key).headers(headers);
            if let Some(p) = payload {
                record = record.payload(p);
            }
            let delivery = self
                .producer
                .send_result(record)
                .map_err(|(e, _)| e)
                .context("queueing a record")?;
            ids.push(id);
            pending.push((id, delivery));
        }
        for (id, delivery) in pending {
            delivery
                .await
                .context("delivery future dropped")?
                .map_err(|(e, _)| e)
                .context("delivery failed")?;
            if let Some(acks) = acks {
                acks.lock()
                    .expect("lock")
                    .push((u64::try_from(id)?, Instant::now()));
            }
        }
        tx.execute("DELETE FROM bench_outbox WHERE id = ANY($1)", &[&ids])
            .await?;
        tx.commit().await?;
        self.relayed.fetch_add(rows.len() as u64, Ordering::Relaxed);
        Ok(rows.len())
    }

    /// Relays until a poll finds the table empty (a backlog drain).
    pub async fn drain(&mut self) -> Result<u64> {
        let mut n = 0;
        loop {
            let got = self.poll_once(None).await?;
            if got == 0 {
                break;
            }
            n += got as u64;
        }
        self.producer.flush(Duration::from_secs(30))?;
        Ok(n)
    }

    /// Relays until `stop` becomes true, polling every `interval` when it
    /// has caught up (live load).
    pub async fn run(&mut self, mut stop: watch::Receiver<bool>, acks: Acks) -> Result<()> {
        loop {
            let got = self.poll_once(Some(&acks)).await?;
            if (got as i64) < self.opts.batch {
                if *stop.borrow() {
                    return Ok(());
                }
                tokio::select! {
                    _ = tokio::time::sleep(self.opts.interval) => {}
                    _ = stop.changed() => {}
                }
            }
        }
    }
}
