//! End-to-end latency under live load: one-event transactions commit at
//! a fixed rate while walrelay (in this process) relays them and one
//! consumer applies them; or, for the plain reference, while the
//! application produces each record itself after its commit and a plain
//! loop applies it (no walrelay, no dedupe).
//!
//! Both ends are the server's commit timestamps (`track_commit_timestamp
//! = on`, [`load`]): the source transaction's and that of the consumer's
//! transaction holding the event's effect row (`xmin` of the row). One
//! clock, taken at the same point of both commits, so the number is what
//! the application sees from its commit to the committed effect, whatever
//! process (this one, a Python or a Java child) committed it, and nothing
//! in the consumers is changed to report it. The relay's delivery reports
//! (taken in this process, set against the same clock through one
//! monotonic/wall pair per stretch) split it into commit → ack and
//! ack → effect.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use walrelay::engine::pipeline::{self, Trace};

use super::{fresh_database, start, stop_consumer, wait_applied, Applied, Consumer, Target};
use crate::env::BenchEnv;
use crate::latency;
use crate::runs::ConsumerLatencyRun;

use super::live_load::{self as load, Acks, Committed, Load, Stretch};

/// The consumers of the end-to-end runs, in order: the plain reference
/// first, then the libraries.
pub(super) const LIVE_CONSUMERS: [Consumer; 4] = [
    Consumer::ApplyLimit,
    Consumer::WalrelayBatch,
    Consumer::PythonBatch,
    Consumer::JavaBatch,
];

/// One end-to-end set-up: the topic's partitions and the records' keys.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub partitions: i32,
    /// Outbox rows keyed by `aggregateid` (1,000 keys), or keyless
    /// logical messages.
    pub keyed: bool,
}

/// What one live run needs besides the consumer and its shape.
pub(super) struct LiveRun<'a> {
    pub rates: &'a [u64],
    pub duration: Duration,
    pub warmup: Duration,
    pub python: Option<&'a Path>,
    pub java: Option<&'a str>,
    pub repeat: u32,
    /// The run's number (its database's name).
    pub n: u32,
}

/// Runs `consumer` end to end on a fresh topic of `shape` at each rate
/// (after an unmeasured warm-up at the first); `next` is the next unused
/// sequence number, advanced past the events written. Every event must
/// end up applied exactly once.
pub(super) async fn live(
    env: &BenchEnv,
    consumer: Consumer,
    shape: Shape,
    run: &LiveRun<'_>,
    next: &mut u64,
) -> Result<Vec<ConsumerLatencyRun>> {
    env.client.batch_execute("CHECKPOINT").await?;
    let keys = if shape.keyed { "k" } else { "u" };
    let tag = format!(
        "{}_{keys}_p{}_{}",
        consumer.tag(),
        shape.partitions,
        run.repeat
    );
    let topic = format!("e2e.{tag}");
    env.create_topic_with(&topic, shape.partitions)?;
    let slot = format!("e2e_{tag}");
    let db = format!("e2e_{tag}_{}", run.n);
    let dsn = fresh_database(env, &db).await?;
    let plain = consumer == Consumer::ApplyLimit;

    let acks: Acks = Arc::default();
    let (relay_stop, relay_rx) = watch::channel(false);
    let relay = if plain {
        None
    } else {
        env.create_slot(&slot).await?;
        Some(start_relay(env, &slot, &topic, relay_rx, acks.clone()))
    };
    let applied = Applied::default();
    let (stop_tx, stop_rx) = watch::channel(false);
    let target = Target {
        topic: &topic,
        group: &db,
        dsn: &dsn,
        python: run.python,
        java: run.java,
        partitions: shape.partitions,
    };
    let task = start(env, consumer, target, applied.clone(), stop_rx).await?;

    let result = async {
        let producer = if plain {
            Some(latency::plain_producer(&env.bootstrap())?)
        } else {
            None
        };
        let load = Load::connect(env, shape.keyed, producer.as_ref(), &topic, &acks).await?;
        let effects = super::connect(&dsn).await?;
        // The group join and the connections: one event per client.
        let mut written = load.run(Stretch::one_each(*next)).await?;
        advance(next, &written);
        wait_applied(&applied, written.len() as u64, &task).await?;
        if let (false, Some(&rate)) = (run.warmup.is_zero(), run.rates.first()) {
            let warm = load.run(Stretch::at(rate, run.warmup, *next)).await?;
            advance(next, &warm);
            written.extend(warm);
            wait_applied(&applied, written.len() as u64, &task).await?;
        }
        let mut runs = Vec::new();
        for &rate in run.rates {
            let t = Instant::now();
            let clock = load::Clock::now();
            let db_cpu = env.db_cpu_window()?;
            let commits = load.run(Stretch::at(rate, run.duration, *next)).await?;
            let elapsed = t.elapsed().as_secs_f64();
            advance(next, &commits);
            let total = written.len() + commits.len();
            wait_applied(&applied, total as u64, &task).await?;
            let db_cores = db_cpu.finish().await? / t.elapsed().as_secs_f64();
            let m = load::measure(env, &effects, &commits, &acks, clock).await?;
            tracing::info!(
                "end to end {} p{} {}: {rate}/s: commit → effect p50 {:.2} / p99 {:.2} / p99.9 {:.2} / max {:.2} ms; commit → ack p50 {:.2} / p99 {:.2}, ack → effect p50 {:.2} / p99 {:.2}; {:.1} events per consumer tx, DB {db_cores:.2} cores",
                consumer.label(),
                shape.partitions,
                if shape.keyed { "keyed" } else { "keyless" },
                m.commit_to_effect.p50,
                m.commit_to_effect.p99,
                m.commit_to_effect.p999,
                m.commit_to_effect.max,
                m.commit_to_ack.p50,
                m.commit_to_ack.p99,
                m.ack_to_effect.p50,
                m.ack_to_effect.p99,
                m.events_per_tx,
            );
            runs.push(ConsumerLatencyRun {
                consumer,
                partitions: shape.partitions,
                keyed: shape.keyed,
                repeat: run.repeat,
                target_rate: rate,
                achieved_rate: commits.len() as f64 / elapsed,
                events: commits.len() as u64,
                commit_to_effect: m.commit_to_effect,
                commit_to_ack: m.commit_to_ack,
                ack_to_effect: m.ack_to_effect,
                events_per_tx: m.events_per_tx,
                db_cores,
            });
            written.extend(commits);
        }
        load::check_exactly_once(&effects, &written).await?;
        anyhow::Ok(runs)
    }
    .await;
    let stopped = stop_consumer(stop_tx, task).await;
    relay_stop.send(true).ok();
    if let Some(relay) = relay {
        relay.await?.context("the relay of the end-to-end run")?;
        env.drop_slot(&slot).await?;
    }
    let runs = result?;
    stopped?;
    Ok(runs)
}

/// walrelay in this process on `slot`; each delivery report's time goes to
/// `acks` by idempotency key.
fn start_relay(
    env: &BenchEnv,
    slot: &str,
    topic: &str,
    stop: watch::Receiver<bool>,
    acks: Acks,
) -> JoinHandle<Result<()>> {
    let config = latency::relay_config(env, slot, topic, &[]);
    let (trace_tx, mut trace_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(t) = trace_rx.recv().await {
            if let Trace::Acked { key, .. } = t {
                acks.lock().expect("lock").push((key.0, Instant::now()));
            }
        }
    });
    tokio::spawn(async move {
        pipeline::run(config, stop, Some(trace_tx))
            .await
            .map_err(anyhow::Error::from)
    })
}

/// Moves `next` past the sequence numbers of `commits`.
fn advance(next: &mut u64, commits: &[Committed]) {
    if let Some(max) = commits.iter().map(|c| c.seq).max() {
        *next = (*next).max(max + 1);
    }
}
