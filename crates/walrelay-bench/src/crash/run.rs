//! One tool's crash run: its slot and topics, the live workload, `kill -9`
//! at seeded random moments with a restart after each, the drain, the
//! read-back and its counts.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use super::load::LiveLoad;
use super::relay::{Cost, Relay};
use super::wire::{analyse, WireCounts, WireReader};
use super::{CrashTool, Settings};
use crate::debezium::readback::Writer;
use crate::debezium::watch::current_end_offsets;
use crate::env::BenchEnv;
use crate::workload::Kind;

/// A small seeded generator (splitmix64): the kill moments of a seed are
/// the same on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi]`.
    pub fn duration(&mut self, lo: Duration, hi: Duration) -> Duration {
        let f = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi.saturating_sub(lo)).mul_f64(f)
    }
}

/// One `kill -9`.
#[derive(Debug, Clone, Serialize)]
pub struct Kill {
    /// Seconds from the workload's start.
    pub at_s: f64,
    /// How long the relay streamed before it (the seeded gap).
    pub after_s: f64,
    /// Events committed by then.
    pub committed: u64,
    /// From the new start until it streamed again.
    pub restart_s: f64,
}

/// What a tool's run measured.
#[derive(Debug, Clone, Serialize)]
pub struct ToolRun {
    pub tool: CrashTool,
    pub slot: String,
    pub topics: Vec<String>,
    pub first_seq: u64,
    /// The first start, spawn to streaming.
    pub start_s: f64,
    pub kills: Vec<Kill>,
    /// Seconds the workload ran.
    pub load_s: f64,
    pub transactions: u64,
    pub messages: u64,
    pub outbox_rows: u64,
    /// From the workload's stop until every event was read back (or the
    /// settle time without progress ran out).
    pub drain_s: f64,
    pub counts: WireCounts,
    pub records_per_event: f64,
    pub cost: Cost,
    /// Whether the final SIGTERM stopped it by itself.
    pub stopped_cleanly: bool,
}

/// Where a tool's records go, and how to read them.
pub struct Target {
    pub slot: String,
    /// (topic, kind): created with the bench's partitions if missing.
    pub topics: Vec<(String, Kind)>,
    pub writer: Writer,
}

/// Runs `tool` through the crash loop: `start` starts it (its first
/// start, which returns once it streams).
pub async fn run_tool<F>(
    env: &BenchEnv,
    tool: CrashTool,
    target: Target,
    first_seq: u64,
    settings: &Settings,
    rng: &mut Rng,
    start: F,
) -> Result<ToolRun>
where
    F: std::future::Future<Output = Result<Relay>>,
{
    let bootstrap = env.bootstrap();
    let bases = end_offsets(&bootstrap, &target.topics).await?;
    let t_start = Instant::now();
    let mut relay = start.await.with_context(|| format!("starting {tool}"))?;
    let start_s = t_start.elapsed().as_secs_f64();
    tracing::info!("{tool}: streaming after {start_s:.1} s; workload from seq {first_seq}");
    let mut cost = Cost::default();
    let load = LiveLoad::start(env.new_client().await?, first_seq, settings.rate);
    let t0 = Instant::now();
    let mut kills = Vec::new();
    for k in 0..settings.kills {
        let gap = rng.duration(settings.min_gap, settings.max_gap);
        if let Err(e) = streaming_for(&mut relay, &load, gap).await {
            return Err(with_load_error(load, e).await);
        }
        let at_s = t0.elapsed().as_secs_f64();
        let committed = load.committed();
        let restart_s =
            kill_and_restart(env, tool, k, settings.kills, &mut relay, &mut cost).await?;
        tracing::info!(
            "{tool}: kill -9 {}/{} at {at_s:.1} s ({committed} events committed), streaming again after {restart_s:.1} s",
            k + 1,
            settings.kills
        );
        kills.push(Kill {
            at_s,
            after_s: gap.as_secs_f64(),
            committed,
            restart_s,
        });
    }
    if let Err(e) = run_on(&mut relay, &load, settings, rng).await {
        return Err(with_load_error(load, e).await);
    }
    let committed = load.finish().await.context("the workload")?;
    let load_s = t0.elapsed().as_secs_f64();
    tracing::info!(
        "{tool}: workload stopped, {} events in {} transactions; draining",
        committed.seqs.len(),
        committed.transactions
    );

    let t_drain = Instant::now();
    let mut reader = WireReader::new(
        &bootstrap,
        target.topics.clone(),
        &bases,
        target.writer,
        first_seq,
    )?;
    read_until_drained(
        tool,
        &mut relay,
        &mut reader,
        committed.seqs.len(),
        settings,
    )
    .await?;
    let drain_s = t_drain.elapsed().as_secs_f64();
    let stopped_cleanly = relay.stop(&mut cost)?;
    tokio::task::block_in_place(|| reader.read_to_end(&bootstrap, Duration::from_secs(120)))?;
    drop(relay);
    crate::debezium::drop_slot_when_free(env, &target.slot).await?;
    let kinds: Vec<Kind> = target.topics.iter().map(|(_, k)| *k).collect();
    let counts = analyse(&reader.records, &committed.seqs, &kinds);
    Ok(ToolRun {
        tool,
        slot: target.slot,
        topics: target.topics.into_iter().map(|(t, _)| t).collect(),
        first_seq,
        start_s,
        kills,
        load_s,
        transactions: committed.transactions,
        messages: committed.messages,
        outbox_rows: committed.outbox_rows,
        drain_s,
        records_per_event: counts.records_per_event(),
        counts,
        cost,
        stopped_cleanly,
    })
}

/// Each topic's end offsets now: where the run's records start.
async fn end_offsets(bootstrap: &str, topics: &[(String, Kind)]) -> Result<Vec<Vec<i64>>> {
    let mut bases = Vec::new();
    for (t, _) in topics {
        let (b, t) = (bootstrap.to_owned(), t.clone());
        bases.push(tokio::task::spawn_blocking(move || current_end_offsets(&b, &t)).await??);
    }
    Ok(bases)
}

/// Kill `k` (from 0) of `kills`: `kill -9`, then the restart; returns
/// the seconds until the relay streamed again.
async fn kill_and_restart(
    env: &BenchEnv,
    tool: CrashTool,
    k: u32,
    kills: u32,
    relay: &mut Relay,
    cost: &mut Cost,
) -> Result<f64> {
    relay.kill(cost)?;
    relay
        .restart(&env.client)
        .await
        .with_context(|| format!("{tool}: the restart after kill {} of {kills}", k + 1))
}

/// The workload runs on for the last gap and until `--events`.
async fn run_on(
    relay: &mut Relay,
    load: &LiveLoad,
    settings: &Settings,
    rng: &mut Rng,
) -> Result<()> {
    let gap = rng.duration(settings.min_gap, settings.max_gap);
    let mut r = streaming_for(relay, load, gap).await;
    while r.is_ok() && load.committed() < settings.events {
        r = streaming_for(relay, load, Duration::from_millis(200)).await;
    }
    r
}

/// Reads the wire until every one of the `events` committed is there, or
/// until none more came for the settle time (the rest count as lost).
async fn read_until_drained(
    tool: CrashTool,
    relay: &mut Relay,
    reader: &mut WireReader,
    events: usize,
    settings: &Settings,
) -> Result<()> {
    let mut last_progress = (0usize, Instant::now());
    while reader.distinct() < events {
        relay.check_alive()?;
        tokio::task::block_in_place(|| reader.poll(Duration::from_millis(250)))?;
        if reader.distinct() > last_progress.0 {
            last_progress = (reader.distinct(), Instant::now());
        } else if last_progress.1.elapsed() >= settings.settle {
            tracing::warn!(
                "{tool}: {} of {} events on the wire, none more for {:?}: counting the rest as lost",
                reader.distinct(),
                events,
                settings.settle
            );
            break;
        }
    }
    Ok(())
}

/// Lets the relay stream under the workload for `d` (the seeded moment:
/// a schedule, not a wait for a condition), failing at once if the relay
/// or the workload dies.
async fn streaming_for(relay: &mut Relay, load: &LiveLoad, d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    loop {
        relay.check_alive()?;
        if load.is_finished() {
            anyhow::bail!("the workload stopped early (see its error at the end)");
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        tokio::time::sleep(left.min(Duration::from_millis(100))).await;
    }
}

/// `e`, with the workload's own error when the workload is what ended.
async fn with_load_error(load: LiveLoad, e: anyhow::Error) -> anyhow::Error {
    if !load.is_finished() {
        return e;
    }
    match load.finish().await {
        Err(le) => le.context("the workload failed"),
        Ok(_) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_fixes_the_moments() {
        let (lo, hi) = (Duration::from_secs(1), Duration::from_secs(3));
        let a: Vec<_> = (0..5)
            .scan(Rng::new(7), |r, _| Some(r.duration(lo, hi)))
            .collect();
        let b: Vec<_> = (0..5)
            .scan(Rng::new(7), |r, _| Some(r.duration(lo, hi)))
            .collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|d| *d >= lo && *d <= hi));
        assert_ne!(a[0], a[1]);
    }
}
