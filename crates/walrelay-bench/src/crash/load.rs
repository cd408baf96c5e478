//! The live mixed workload of a crash run: on one connection, one
//! transaction after another (so the order of sequence numbers is the
//! order of commit), each with 1-4 transactional logical messages
//! (`pg_logical_emit_message(true, 'bench', ...)`) followed by 1-3 outbox
//! rows, paced to a rate. Every event's sequence number is in its payload
//! (a message's content starts with it, an outbox row's `id` is it), as
//! in the bench's backlogs ([`crate::workload`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio_postgres::Client;

use crate::workload::PREFIX;

/// Bytes of payload per event.
pub const PAYLOAD: usize = 200;
/// Distinct outbox keys (`aggregateid`).
const KEYS: u64 = 64;

/// How many messages and outbox rows transaction `i` writes.
pub fn shape(i: u64) -> (u64, u64) {
    (1 + i % 4, 1 + i % 3)
}

/// The events a workload committed, in commit order.
#[derive(Debug, Clone, Default)]
pub struct Committed {
    /// Sequence numbers, ascending (= commit order).
    pub seqs: Vec<u64>,
    pub transactions: u64,
    pub messages: u64,
    pub outbox_rows: u64,
}

/// A running workload; [`LiveLoad::finish`] stops it.
pub struct LiveLoad {
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Result<Committed>>,
}

impl LiveLoad {
    /// Starts committing events from sequence number `first` at about
    /// `rate` events per second on `client`.
    pub fn start(client: Client, first: u64, rate: f64) -> LiveLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run(
            client,
            first,
            rate,
            Arc::clone(&stop),
            Arc::clone(&committed),
        ));
        LiveLoad {
            stop,
            committed,
            task,
        }
    }

    /// Events committed so far.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
    }

    /// Whether it failed or ended (it only ends on an error).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops after the transaction in progress: what committed.
    pub async fn finish(self) -> Result<Committed> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.context("the workload task")?
    }
}

async fn run(
    client: Client,
    first: u64,
    rate: f64,
    stop: Arc<AtomicBool>,
    committed_count: Arc<AtomicU64>,
) -> Result<Committed> {
    let filler = "x".repeat(PAYLOAD - 20);
    let emit = client
        .prepare(&format!(
            "SELECT count(pg_logical_emit_message(true, '{PREFIX}', bench_payload(g, $3))) \
               FROM generate_series($1::bigint, $2::bigint) g"
        ))
        .await?;
    let insert = client
        .prepare(&format!(
            "INSERT INTO bench_outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT g, 'bench', 'agg-' || (g % {KEYS}), 'Created', bench_payload(g, $3) \
               FROM generate_series($1::bigint, $2::bigint) g"
        ))
        .await?;
    let mut out = Committed::default();
    let mut seq = first;
    let t0 = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let (m, o) = shape(out.transactions);
        let (a, b) = (seq as i64, (seq + m) as i64);
        client.batch_execute("BEGIN").await?;
        client.execute(&emit, &[&a, &(b - 1), &filler]).await?;
        client
            .execute(&insert, &[&b, &(b + o as i64 - 1), &filler])
            .await?;
        client
            .batch_execute("COMMIT")
            .await
            .with_context(|| format!("committing the events {a}..{}", b + o as i64))?;
        out.seqs.extend(seq..seq + m + o);
        out.transactions += 1;
        out.messages += m;
        out.outbox_rows += o;
        seq += m + o;
        committed_count.store(out.seqs.len() as u64, Ordering::Relaxed);
        // Pacing to the rate, not a wait for a condition.
        let due = t0 + Duration::from_secs_f64(out.seqs.len() as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_cycle_through_mixes() {
        let shapes: Vec<_> = (0..12).map(shape).collect();
        assert!(shapes.contains(&(1, 1)) && shapes.contains(&(4, 3)));
        assert!(shapes
            .iter()
            .all(|&(m, o)| (1..=4).contains(&m) && (1..=3).contains(&o)));
    }
}
