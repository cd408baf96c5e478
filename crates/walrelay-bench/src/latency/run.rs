//! One mode's latency runs: the set-up (a fresh topic, its consumer and
//! the relay), the load (one event, the warm-up, then each rate,
//! measured) and the teardown.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::sync::watch;

use super::relay::{self, Relay};
use super::{
    connect_clients, generate, histogram, plain, stalls, LatencyOptions, CLIENTS, STALL_MS,
};
use crate::env::BenchEnv;
use crate::kafka::TimestampingConsumer;
use crate::runs::{LatencyRun, Mode, Percentiles};

const SETTLE_TIMEOUT: Duration = Duration::from_secs(180);

/// How the relay's task ended: reported after the measurement's own
/// error.
type RelayEnd = Result<Result<()>, tokio::task::JoinError>;

/// Runs `mode` at each rate for `duration`, with a fresh slot (walrelay)
/// or an empty table (polling) and a fresh topic.
pub async fn run_mode(
    env: &BenchEnv,
    mode: Mode,
    repeat: u32,
    options: &LatencyOptions,
) -> Result<Vec<LatencyRun>> {
    let run = Run::start(env, mode, repeat, options).await?;
    let result = run.measure(env, options).await;
    let relay_end = run.stop(env).await?;
    let runs = result?;
    relay_end.context("relay task panicked")??;
    Ok(runs)
}

/// A mode's run, set up: its topic (and slot), the consumer reading the
/// topic from its start, and the relay.
struct Run {
    mode: Mode,
    repeat: u32,
    /// The mode and the repeat: names the topic, the slot and the CSV
    /// files.
    tag: String,
    topic: String,
    slot: String,
    consumer: TimestampingConsumer,
    relay: Relay,
    stop_tx: watch::Sender<bool>,
}

impl Run {
    /// Empties the outbox table, then a fresh topic (the Event Router's
    /// for Debezium), the consumer on it and `mode`'s relay.
    async fn start(
        env: &BenchEnv,
        mode: Mode,
        repeat: u32,
        options: &LatencyOptions,
    ) -> Result<Run> {
        // A checkpoint first, so that one started by the drains before does
        // not land in the middle of a measurement.
        env.client
            .batch_execute("TRUNCATE bench_outbox; CHECKPOINT")
            .await?;
        let tag = format!("{}_{repeat}", mode.tag());
        let topic = match mode {
            // The Event Router's topic for the bench's aggregatetype.
            Mode::DebeziumOutbox => crate::debezium::OUTBOX_TOPIC.to_owned(),
            _ => format!("lat.{tag}"),
        };
        env.create_topic(&topic)?;
        let consumer = TimestampingConsumer::start(&env.bootstrap(), &topic, mode.kind())?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let slot = format!("lat_{tag}");
        let relay = relay::start(env, mode, &slot, &topic, options, stop_rx).await?;
        Ok(Run {
            mode,
            repeat,
            tag,
            topic,
            slot,
            consumer,
            relay,
            stop_tx,
        })
    }

    /// The load: one event, the warm-up (not counted), then each rate,
    /// measured.
    async fn measure(&self, env: &BenchEnv, options: &LatencyOptions) -> Result<Vec<LatencyRun>> {
        let mut load = Load {
            run: self,
            clients: connect_clients(env).await?,
            payload_size: options.payload_size,
            next_seq: 1,
            expected: 0,
        };
        load.first_event().await?;
        if !options.warmup.is_zero() {
            load.warm_up(&options.rates, options.warmup).await?;
        }
        let mut runs = Vec::new();
        for &rate in &options.rates {
            if let Some(run) = load.measure_rate(rate, options.duration).await? {
                runs.push(run);
            }
        }
        Ok(runs)
    }

    /// Waits until the relay acknowledged and the consumer saw `expected`
    /// events (or the relay failed).
    async fn settle(&self, expected: u64) -> Result<()> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let seen = self.consumer.count.load(Ordering::Relaxed);
            let a = self.relay.acks.count(&self.consumer);
            if seen >= expected && a >= expected {
                return Ok(());
            }
            if self.relay.task.is_finished() {
                bail!("the relay stopped early ({a} acks, {seen} consumed, {expected} expected)");
            }
            if Instant::now() >= deadline {
                bail!("not settled within {SETTLE_TIMEOUT:?}: {a} acks, {seen} consumed, {expected} expected");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the relay (within 60 s) and the consumer, and drops the
    /// mode's slot; returns how the relay's task ended.
    async fn stop(self, env: &BenchEnv) -> Result<RelayEnd> {
        self.stop_tx.send(true).ok();
        let relay_end = tokio::time::timeout(Duration::from_secs(60), self.relay.task)
            .await
            .context("the relay did not stop within 60 s")?;
        self.consumer.stop()?;
        // Debezium's walsender may hold the slot for a moment after the
        // stop; the binaries' too.
        if matches!(
            self.mode,
            Mode::DebeziumOutbox | Mode::WalrelayBinary | Mode::BaselineBinary
        ) {
            crate::debezium::drop_slot_when_free(env, &self.slot).await?;
        } else if self.mode.has_slot() {
            env.drop_slot(&self.slot).await?;
        }
        Ok(relay_end)
    }
}

/// The live load of a run: the database clients, and the events so far.
struct Load<'r> {
    run: &'r Run,
    clients: Vec<tokio_postgres::Client>,
    payload_size: usize,
    /// The next event's sequence number.
    next_seq: u64,
    /// Events the relay is to have acknowledged and the consumer to have
    /// seen, the first ones included.
    expected: u64,
}

impl Load<'_> {
    /// Commits (or sends, for the references) events from the next
    /// sequence number at `rate` events/s (`None`: as fast as it can) for
    /// `duration` from the first `n_clients` clients. `None` where the
    /// rate has no meaning for the mode.
    async fn generate(
        &self,
        rate: Option<u64>,
        duration: Duration,
        n_clients: u64,
    ) -> Result<Option<Vec<(u64, Instant)>>> {
        let (run, first) = (self.run, self.next_seq);
        Ok(match (&run.relay.reference, rate) {
            (Some(r), Some(rate)) => Some(
                plain::generate(
                    &r.producer,
                    (run.mode == Mode::DualWrite).then_some(self.clients.as_slice()),
                    &run.topic,
                    plain::Stretch {
                        size: self.payload_size,
                        rate,
                        duration,
                        first,
                        clients: n_clients,
                    },
                    &r.acks,
                )
                .await?,
            ),
            // "As fast as it can" has no meaning for a producer
            // that waits for nothing.
            (Some(_), None) => None,
            (None, _) => Some(
                generate(
                    &self.clients,
                    run.mode.kind(),
                    self.payload_size,
                    rate,
                    duration,
                    first,
                    n_clients,
                )
                .await?,
            ),
        })
    }

    /// Counts `commits` in: the next sequence number follows their
    /// highest, and the relay and the consumer are to see them too.
    fn count(&mut self, commits: &[(u64, Instant)]) {
        self.next_seq = commits.iter().map(|c| c.0).max().unwrap_or(self.next_seq) + 1;
        self.expected += commits.len() as u64;
    }

    /// Warm-up: one event, seen by the consumer.
    async fn first_event(&mut self) -> Result<()> {
        let warm = match &self.run.relay.reference {
            Some(_) => {
                self.generate(Some(1000), Duration::from_millis(1), 1)
                    .await?
            }
            None => self.generate(None, Duration::ZERO, 1).await?,
        }
        .unwrap_or_default();
        self.expected += warm.len() as u64;
        self.next_seq += 1;
        self.run.settle(self.expected).await
    }

    /// The first seconds of load on a fresh broker, topic and relay are
    /// slow for every mode, the plain producer too (60-200 ms for 2-5 s
    /// on Kafka: the JVM compiling the paths this load takes): a warm-up
    /// at the first rate, not counted.
    async fn warm_up(&mut self, rates: &[Option<u64>], warmup: Duration) -> Result<()> {
        let run = self.run;
        let rate = rates.first().copied().flatten().unwrap_or(1000);
        let t = Instant::now();
        let commits = self
            .generate(Some(rate), warmup, CLIENTS)
            .await?
            .unwrap_or_default();
        self.count(&commits);
        run.settle(self.expected).await?;
        let acks = run.relay.acks.by_seq(&run.consumer);
        let commit_at: HashMap<u64, Instant> = commits.into_iter().collect();
        let (h, _) = histogram(&commit_at, &acks)?;
        tracing::info!(
            "latency {}: warm-up at {rate}/s for {:.1} s, ack p50 {:.1} / p99 {:.1} ms (not counted)",
            run.mode.label(),
            t.elapsed().as_secs_f64(),
            Percentiles::of(&h).p50,
            Percentiles::of(&h).p99
        );
        Ok(())
    }

    /// One measured rate: its load, then each event's commit → ack and
    /// commit → consumer, and the stalls. `None` where the mode has no
    /// such rate.
    async fn measure_rate(
        &mut self,
        rate: Option<u64>,
        duration: Duration,
    ) -> Result<Option<LatencyRun>> {
        let run = self.run;
        let t = Instant::now();
        let Some(commits) = self.generate(rate, duration, CLIENTS).await? else {
            return Ok(None);
        };
        let elapsed = t.elapsed().as_secs_f64();
        let events = commits.len() as u64;
        self.count(&commits);
        run.settle(self.expected).await?;

        let seen = run.consumer.seen.lock().expect("lock").clone();
        let acks = run.relay.acks.by_seq(&run.consumer);
        let commit_at: HashMap<u64, Instant> = commits.into_iter().collect();
        let (ack_h, early) = histogram(&commit_at, &acks)?;
        let consumed: Vec<(u64, Instant)> = seen.iter().map(|s| (s.seq, s.at)).collect();
        let (cons_h, _) = histogram(&commit_at, &consumed)?;
        let produced = run.relay.acks.produced_by_seq(&run.consumer);
        let commit_to_produce = match &produced {
            Some(produced) => Some(Percentiles::of(&histogram(&commit_at, produced)?.0)),
            None => None,
        };
        let waits = waits(&acks, &commit_at, t);
        let ack_stalls = stalls::find(&waits, STALL_MS, 0.1, 8);
        if let Ok(dir) = std::env::var("WALRELAY_BENCH_LATENCY_CSV") {
            let produce_waits = produced.map(|p| waits_by_seq(&p, &commit_at));
            write_waits_csv(
                &dir,
                &run.tag,
                rate,
                &waits_by_seq(&acks, &commit_at),
                produce_waits,
                t,
                &commit_at,
            )?;
        }
        if ack_h.len() != events || cons_h.len() != events {
            bail!(
                "{}: {} events committed, {} acks and {} consumed records matched",
                run.mode.label(),
                events,
                ack_h.len(),
                cons_h.len()
            );
        }
        tracing::info!(
            "latency {} rate {:?}: {} events, {:.0}/s, ack p50 {:.2} p99 {:.2} ms, produce p50 {:?} p99 {:?} ms",
            run.mode.label(),
            rate,
            events,
            events as f64 / elapsed,
            Percentiles::of(&ack_h).p50,
            Percentiles::of(&ack_h).p99,
            commit_to_produce.as_ref().map(|p| p.p50),
            commit_to_produce.as_ref().map(|p| p.p99),
        );
        Ok(Some(LatencyRun {
            mode: run.mode,
            repeat: run.repeat,
            target_rate: rate,
            achieved_rate: events as f64 / elapsed,
            events,
            commit_to_ack: Percentiles::of(&ack_h),
            commit_to_consumer: Percentiles::of(&cons_h),
            commit_to_produce,
            ack_before_commit_reply: early,
            ack_stalls,
        }))
    }
}

/// Every acked event's (commit time after the rate's `start`, s; ms from
/// its commit to its ack).
fn waits(
    acks: &[(u64, Instant)],
    commit_at: &HashMap<u64, Instant>,
    start: Instant,
) -> Vec<(f64, f64)> {
    acks.iter()
        .filter_map(|(seq, at)| {
            let c = commit_at.get(seq)?;
            let wait = at.saturating_duration_since(*c).as_secs_f64() * 1000.0;
            Some((c.saturating_duration_since(start).as_secs_f64(), wait))
        })
        .collect()
}

/// ms from each event's commit to `at`, by sequence number.
fn waits_by_seq(at: &[(u64, Instant)], commit_at: &HashMap<u64, Instant>) -> HashMap<u64, f64> {
    at.iter()
        .filter_map(|(seq, at)| {
            let c = commit_at.get(seq)?;
            Some((
                *seq,
                at.saturating_duration_since(*c).as_secs_f64() * 1000.0,
            ))
        })
        .collect()
}

/// Every event's (commit time after the rate's `start`, ms to its ack,
/// and for walrelay ms to its hand-over to the producer) as CSV in `dir`,
/// for a closer look at a run (`WALRELAY_BENCH_LATENCY_CSV`).
fn write_waits_csv(
    dir: &str,
    tag: &str,
    rate: Option<u64>,
    ack_ms: &HashMap<u64, f64>,
    produce_ms: Option<HashMap<u64, f64>>,
    start: Instant,
    commit_at: &HashMap<u64, Instant>,
) -> Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let rate = rate.map_or("max".to_string(), |r| r.to_string());
    let path = std::path::Path::new(dir).join(format!("{tag}_{rate}.csv"));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
    writeln!(f, "commit_s,ack_ms,produce_ms")?;
    let mut rows: Vec<(f64, f64, Option<f64>)> = ack_ms
        .iter()
        .filter_map(|(seq, ms)| {
            let at = commit_at
                .get(seq)?
                .saturating_duration_since(start)
                .as_secs_f64();
            Some((
                at,
                *ms,
                produce_ms.as_ref().and_then(|p| p.get(seq).copied()),
            ))
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (at, ms, produce) in rows {
        match produce {
            Some(p) => writeln!(f, "{at:.4},{ms:.3},{p:.3}")?,
            None => writeln!(f, "{at:.4},{ms:.3},")?,
        }
    }
    Ok(())
}
