//! The live load of the latency runs: one-event transactions committed
//! by a few database clients at a fixed rate (open loop), each timed at
//! its commit reply.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::env::BenchEnv;
use crate::workload::{payload, Kind, PREFIX};

use super::CLIENTS;

pub(crate) async fn connect_clients(env: &BenchEnv) -> Result<Vec<tokio_postgres::Client>> {
    let mut v = Vec::new();
    for _ in 0..CLIENTS {
        let c = env.new_client().await?;
        c.batch_execute("SET synchronous_commit = on").await?;
        v.push(c);
    }
    Ok(v)
}

/// Runs one-event transactions on `clients` (the first `n_clients`) at
/// `rate` events/s in total (or as fast as possible) for `duration`;
/// `duration` zero means one event per client. Returns (sequence number,
/// commit-reply time) per event.
pub(crate) async fn generate(
    clients: &[tokio_postgres::Client],
    kind: Kind,
    size: usize,
    rate: Option<u64>,
    duration: Duration,
    first: u64,
    n_clients: u64,
) -> Result<Vec<(u64, Instant)>> {
    let start = tokio::time::Instant::now();
    let end = start + duration;
    let tasks = clients
        .iter()
        .take(n_clients as usize)
        .enumerate()
        .map(|(i, c)| {
            let i = i as u64;
            async move {
                let stmt = match kind {
                Kind::Messages => {
                    c.prepare(&format!(
                        "SELECT pg_logical_emit_message(true, '{PREFIX}', $1::text)"
                    ))
                    .await?
                }
                Kind::Outbox => {
                    c.prepare(
                        "INSERT INTO bench_outbox (id, aggregatetype, aggregateid, type, payload) \
                         VALUES ($1, 'bench', $2, 'Created', $3)",
                    )
                    .await?
                }
            };
                let mut out = Vec::new();
                let gap = rate.map(|r| Duration::from_secs_f64(n_clients as f64 / r as f64));
                for j in 0u64.. {
                    let now = tokio::time::Instant::now();
                    if duration.is_zero() {
                        if j == 1 {
                            break;
                        }
                    } else if now >= end {
                        break;
                    }
                    if let Some(gap) = gap {
                        let due = start + gap.mul_f64(j as f64);
                        if due >= end {
                            break;
                        }
                        tokio::time::sleep_until(due).await;
                    }
                    let seq = first + j * n_clients + i;
                    let body = payload(seq, size);
                    match kind {
                        Kind::Messages => {
                            c.execute(&stmt, &[&body]).await?;
                        }
                        Kind::Outbox => {
                            let agg = format!("agg-{}", seq % 1000);
                            c.execute(&stmt, &[&(seq as i64), &agg, &body]).await?;
                        }
                    }
                    out.push((seq, Instant::now()));
                }
                anyhow::Ok(out)
            }
        });
    let mut all = Vec::new();
    for r in futures_util::future::join_all(tasks).await {
        all.extend(r?);
    }
    Ok(all)
}
