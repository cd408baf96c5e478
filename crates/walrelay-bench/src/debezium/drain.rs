//! Debezium's drains of one workload's backlog (every variant and
//! repeat; one drain is [`super::drain_once`]), the restart after them,
//! and the worker of the latency runs.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use walrelay_testkit::{DebeziumWorker, Variant};

use super::readback::{read_range, Tally, Writer};
use super::watch::{TopicWatch, EVERY};
use super::{drop_slot_when_free, options, slot, tool, OUTBOX_TOPIC};
use crate::env::BenchEnv;
use crate::runs::{RestartRun, Results, ToolRun};
use crate::workload::{generate_backlog, Kind, Workload};

use super::drain_once::{drain_once, end_offsets, Drained};
use super::WalrelayStart;

/// A drain fails when no new record arrived for this long while the
/// connector streamed and records are missing.
pub(super) const STALL: Duration = Duration::from_secs(120);
/// Reading a run's records back may take this long.
pub(super) const READ_TIMEOUT: Duration = Duration::from_secs(600);

/// Drains the backlog of `w` (events `first_seq..`, committed after the
/// slots of [`super::slot`] were made) with each variant in `variants`,
/// `repeats` times (the order of the variants rotating), and pushes a
/// [`ToolRun`] per drain. With `measure_restart`, the first repeat's
/// workers are restarted afterwards with one new event committed while
/// they were down ([`RestartRun`]). Drops the slots.
#[allow(clippy::too_many_arguments)]
pub async fn drain_workload(
    env: &BenchEnv,
    w: &Workload,
    repeats: u32,
    first_seq: u64,
    variants: &[Variant],
    measure_restart: bool,
    walrelay: Option<&WalrelayStart>,
    broker_idle: f64,
    results: &mut Results,
) -> Result<()> {
    if w.kind == Kind::Outbox {
        env.create_topic(OUTBOX_TOPIC)?;
    }
    let mut kept: Vec<(Variant, Drained)> = Vec::new();
    for r in 0..repeats {
        let mut order = variants.to_vec();
        let n = order.len().max(1);
        order.rotate_left(r as usize % n);
        for variant in order {
            let d = drain_once(env, w, variant, r, first_seq, broker_idle)
                .await
                .with_context(|| format!("Debezium ({variant}), repeat {r}"))?;
            push(results, w, variant, r, &d);
            if measure_restart && r == 0 {
                kept.push((variant, d));
            } else {
                drop(d);
                drop_slot_when_free(env, &slot(variant, &w.id, r)).await?;
            }
        }
    }
    if !kept.is_empty() {
        // One event committed while every worker is down: new to each.
        let seq = first_seq + w.events;
        // walrelay's start and restart too, on a slot made before the
        // event, after Debezium's (whose restarts would take its second
        // event for a replayed one).
        let walrelay = match walrelay {
            Some(ws) => Some(ws.prepare(env, w).await?),
            None => None,
        };
        commit_one(env, w, seq).await?;
        for (variant, mut d) in kept {
            let restart = restart(env, w, variant, &mut d, seq)
                .await
                .with_context(|| format!("Debezium ({variant}), restart"))?;
            tracing::info!(
                "  {} restart: streaming after {:.1} s, the new event in Kafka after {:.1} s, {} record(s) replayed",
                tool(variant).label(),
                restart.streaming_s.unwrap_or_default(),
                restart.first_new_record_s,
                restart.replayed_records
            );
            if restart.replayed_records > 0 {
                // At least once: a finding, not an error.
                results.notes.push(format!(
                    "{} ({}): after a clean stop (SIGTERM, Connect committed the offsets of every acknowledged record) the restart wrote {} record(s) of events from before the stop again",
                    w.id,
                    tool(variant).label(),
                    restart.replayed_records
                ));
            }
            results.restarts.push(restart);
            drop(d);
            drop_slot_when_free(env, &slot(variant, &w.id, 0)).await?;
        }
        if let Some(ws) = walrelay {
            let run = ws.measure(env, w, seq).await.context("walrelay's start")?;
            tracing::info!(
                "  walrelay: first record {:.2} s after its spawn, the new event {:.2} s after a restart, {} records replayed",
                run.start_first_record_s.unwrap_or_default(),
                run.first_new_record_s,
                run.replayed_records
            );
            results.restarts.push(run);
        }
        if w.kind == Kind::Outbox {
            // The polling relay drains the table next and counts its rows.
            env.client
                .execute("DELETE FROM bench_outbox WHERE id >= $1", &[&(seq as i64)])
                .await?;
        }
    }
    Ok(())
}

/// Commits event `seq` of `w`'s kind and size in a transaction of its own.
pub(super) async fn commit_one(env: &BenchEnv, w: &Workload, seq: u64) -> Result<()> {
    let one = Workload {
        events: 1,
        per_tx: 1,
        ..w.clone()
    };
    generate_backlog(&env.client, &one, seq).await?;
    Ok(())
}

fn push(results: &mut Results, w: &Workload, variant: Variant, r: u32, d: &Drained) {
    let t = tool(variant);
    if d.tally.duplicates > 0 || d.tally.other > 0 {
        let note = format!(
            "{} repeat {r} ({}): {} records in Kafka for {} events: {} duplicates, {} records of no backlog event",
            w.id,
            t.label(),
            d.tally.records,
            w.events,
            d.tally.duplicates,
            d.tally.other
        );
        tracing::warn!("{note}");
        results.notes.push(note);
    }
    if !d.stopped_cleanly {
        results.notes.push(format!(
            "{} repeat {r} ({}): the worker did not exit within 30 s of SIGTERM and was killed",
            w.id,
            t.label()
        ));
    }
    tracing::info!(
        "  {} #{r}: {:.0} events/s (streaming after {:.1} s, first record after {:.1} s), cpu {:.2} s (+{:.1} s to start), db cpu {:.2} s, peak rss {:.0} MB",
        t.label(),
        w.events as f64 / d.run.seconds,
        d.startup.streaming_s,
        d.startup.first_record_s,
        d.run.cpu_seconds,
        d.startup.cpu_seconds,
        d.run.db_cpu_seconds,
        d.run.peak_rss_bytes.unwrap_or(0) as f64 / 1e6
    );
    results.drain.push(ToolRun {
        tool: t,
        workload: w.id.clone(),
        repeat: r,
        events: w.events,
        seconds: d.run.seconds,
        events_per_s: w.events as f64 / d.run.seconds,
        cpu_seconds: d.run.cpu_seconds,
        db_cpu_seconds: Some(d.run.db_cpu_seconds),
        peak_rss_bytes: d.run.peak_rss_bytes,
        records_in_broker: Some(d.tally.records),
        broker_cpu_seconds: d.run.broker_cpu_seconds,
        kafka_bytes: d.run.kafka_bytes,
        walrelay_header_bytes: None,
        fence: None,
        startup: Some(d.startup),
        duplicates: Some(d.tally.duplicates),
    });
}

/// Restarts the stopped worker of `d` with its offsets and times it until
/// the event `seq` (committed while it was down) is in Kafka; counts the
/// records of older events written again meanwhile. Stops it again.
async fn restart(
    env: &BenchEnv,
    w: &Workload,
    variant: Variant,
    d: &mut Drained,
    seq: u64,
) -> Result<RestartRun> {
    let bootstrap = env.bootstrap();
    let base = end_offsets(&bootstrap, &d.topic).await?;
    let watch = TopicWatch::start(&bootstrap, &d.topic, base.clone())?;
    let timings = d.worker.restart().await?;
    let spawned = d.worker.started_at().context("the worker runs")?;
    let worker = &mut d.worker;
    let (tally, at) = await_event(
        &bootstrap,
        &d.topic,
        &base,
        &watch,
        Writer::Debezium,
        w.kind,
        seq,
        || match worker.exited()? {
            Some(status) => bail!(
                "the restarted worker exited ({status})\n{}",
                worker.log_tail(40)
            ),
            None => Ok(()),
        },
    )
    .await?;
    drop(watch);
    let again = tokio::task::block_in_place(|| d.worker.stop())?;
    Ok(RestartRun {
        tool: tool(variant),
        workload: w.id.clone(),
        stopped_cleanly: d.stopped_cleanly && again,
        running_s: Some(timings.running.as_secs_f64()),
        streaming_s: Some(timings.streaming.as_secs_f64()),
        first_new_record_s: at.saturating_duration_since(spawned).as_secs_f64(),
        replayed_records: tally.records - tally.distinct,
        start_first_record_s: None,
    })
}

/// Waits until the record of event `seq` is among the records `watch`
/// sees in `topic` above `base`, and returns the tally of those records
/// (against `seq` alone: the others are `other`) and when the total that
/// holds it was first seen. `alive` fails when the relay died. Fails after
/// [`STALL`] without a new record.
#[allow(clippy::too_many_arguments)]
pub(super) async fn await_event(
    bootstrap: &str,
    topic: &str,
    base: &[i64],
    watch: &TopicWatch,
    writer: Writer,
    kind: Kind,
    seq: u64,
    mut alive: impl FnMut() -> Result<()>,
) -> Result<(Tally, Instant)> {
    let mut target = 1;
    let mut progress = (0u64, Instant::now());
    loop {
        let seen = watch.seen();
        let count = seen.count();
        if count >= target {
            let (b, t, from, to) = (
                bootstrap.to_owned(),
                topic.to_owned(),
                base.to_vec(),
                seen.ends.clone(),
            );
            let seqs = tokio::task::spawn_blocking(move || {
                read_range(&b, &t, &from, &to, writer, kind, READ_TIMEOUT)
            })
            .await??;
            let tally = Tally::of(seqs, seq..seq + 1);
            if tally.distinct == 1 {
                let at = seen.reached(tally.records).context("a reached total")?;
                return Ok((tally, at));
            }
            target = tally.records + 1;
            continue;
        }
        alive()?;
        if count != progress.0 {
            progress = (count, Instant::now());
        } else if progress.1.elapsed() > STALL {
            bail!(
                "event {seq} is not in {topic} {STALL:?} after the start ({count} other records)"
            );
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// The tuned worker of a latency run: started before the load on a slot
/// and publication of its own (it creates the slot: nothing is committed
/// before it streams), stopped after (the caller drops the slot).
pub struct LatencyWorker {
    worker: DebeziumWorker,
}

impl LatencyWorker {
    /// Starts the tuned worker on `slot`; its outbox records go to
    /// [`OUTBOX_TOPIC`], which the caller creates.
    pub async fn start(env: &BenchEnv, slot: &str) -> Result<LatencyWorker> {
        super::ensure_publication(env).await?;
        let prefix = format!("lat.{slot}");
        let worker = DebeziumWorker::start(
            &env.cluster,
            &env.bootstrap(),
            options(Variant::Tuned, &format!("bench-{slot}"), slot, &prefix),
        )
        .await?;
        if let Some(t) = worker.timings() {
            tracing::info!(
                "latency: Debezium (tuned) streams {:.1} s after the JVM's spawn",
                t.streaming.as_secs_f64()
            );
        }
        Ok(LatencyWorker { worker })
    }

    /// Whether the JVM exited by itself.
    pub fn exited(&mut self) -> Result<bool> {
        Ok(self.worker.exited()?.is_some())
    }

    /// Stops the worker (SIGTERM; killed after 30 s).
    pub fn stop(mut self) -> Result<()> {
        let clean = tokio::task::block_in_place(|| self.worker.stop())?;
        if !clean {
            tracing::warn!("latency: the Debezium worker did not stop within 30 s of SIGTERM");
        }
        Ok(())
    }
}
