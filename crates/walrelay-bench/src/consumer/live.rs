//! Latency under live load: the relay and one consumer run while
//! one-event transactions commit at a fixed rate.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::sync::watch;
use walrelay::engine::pipeline;

use super::{
    fresh_database, start, stop_consumer, wait_applied, Applied, Consumer, ConsumerOptions, Target,
};
use crate::env::BenchEnv;
use crate::latency;
use crate::runs::{ConsumerLatencyRun, Percentiles};
use crate::workload::Kind;

/// Latency under live load: the relay and `consumer` run while one-event
/// transactions commit at each rate.
pub(super) async fn live(
    env: &BenchEnv,
    consumer: Consumer,
    options: &ConsumerOptions,
    repeat: u32,
    n: u32,
) -> Result<Vec<ConsumerLatencyRun>> {
    env.client.batch_execute("CHECKPOINT").await?;
    let tag = format!("{}_{repeat}", consumer.tag());
    let topic = format!("cons.lat.{tag}");
    env.create_topic(&topic)?;
    let slot = format!("cons_lat_{tag}");
    env.create_slot(&slot).await?;
    let db = format!("cons_lat_{}_{n}", consumer.tag());
    let dsn = fresh_database(env, &db).await?;

    let (relay_stop, relay_rx) = watch::channel(false);
    let relay = tokio::spawn(pipeline::run(
        latency::relay_config(env, &slot, &topic, &[]),
        relay_rx,
        None,
    ));
    let applied = Applied::with_log();
    let (stop_tx, stop_rx) = watch::channel(false);
    let task = start(
        env,
        consumer,
        Target {
            topic: &topic,
            group: &db,
            dsn: &dsn,
            python: None,
            java: None,
            partitions: 1,
        },
        applied.clone(),
        stop_rx,
    )
    .await?;

    let result = async {
        let clients = latency::connect_clients(env).await?;
        // Warm-up: the group join and the connections.
        let mut next = 1u64;
        latency::generate(&clients, Kind::Messages, 200, None, Duration::ZERO, next, 1).await?;
        let mut expected = 1;
        wait_applied(&applied, expected, &task).await?;
        next += 1;
        let mut runs = Vec::new();
        for &rate in &options.rates {
            let t = Instant::now();
            let commits = latency::generate(
                &clients,
                Kind::Messages,
                200,
                Some(rate),
                options.latency_duration,
                next,
                latency::CLIENTS,
            )
            .await?;
            let elapsed = t.elapsed().as_secs_f64();
            let events = commits.len() as u64;
            next = commits.iter().map(|c| c.0).max().unwrap_or(next) + 1;
            expected += events;
            wait_applied(&applied, expected, &task).await?;
            let commit_at: HashMap<u64, Instant> = commits.into_iter().collect();
            let (h, _) = latency::histogram(&commit_at, &applied.logged())?;
            if h.len() != events {
                bail!("{events} events committed, {} applied and matched", h.len());
            }
            let p = Percentiles::of(&h);
            tracing::info!(
                "consumer latency {} at {rate}/s: p50 {:.2} ms, p99 {:.2} ms",
                consumer.label(),
                p.p50,
                p.p99
            );
            runs.push(ConsumerLatencyRun {
                consumer,
                repeat,
                target_rate: rate,
                achieved_rate: events as f64 / elapsed,
                events,
                commit_to_applied: p,
            });
        }
        anyhow::Ok(runs)
    }
    .await;
    let stopped = stop_consumer(stop_tx, task).await;
    relay_stop.send(true).ok();
    relay.await?.context("the relay of the latency run")?;
    env.drop_slot(&slot).await?;
    let runs = result?;
    stopped?;
    Ok(runs)
}
