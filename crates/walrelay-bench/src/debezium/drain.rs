//! Debezium's drains of one workload's backlog (every variant and
//! repeat), the restart after them, and the worker of the latency runs.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use walrelay_testkit::{DebeziumWorker, Variant};

use super::readback::{read_range, Tally, Writer};
use super::watch::{current_end_offsets, TopicWatch, EVERY};
use super::{drop_slot_when_free, options, slot, tool, RestartRun, Startup, OUTBOX_TOPIC};
use crate::drain::DrainRun;
use crate::env::BenchEnv;
use crate::report::{Results, ToolRun};
use crate::workload::{generate_backlog, Kind, Workload};

use super::WalrelayStart;

/// A drain fails when no new record arrived for this long while the
/// connector streamed and records are missing.
const STALL: Duration = Duration::from_secs(120);
/// Reading a run's records back may take this long.
const READ_TIMEOUT: Duration = Duration::from_secs(600);

/// One drain's measurements, and the stopped worker (for the restart).
struct Drained {
    run: DrainRun,
    startup: Startup,
    tally: Tally,
    worker: DebeziumWorker,
    topic: String,
    stopped_cleanly: bool,
}

/// The topic a workload's records go to (`topic_prefix` is the run's).
fn topic_of(kind: Kind, topic_prefix: &str) -> String {
    match kind {
        Kind::Messages => format!("{topic_prefix}.message"),
        Kind::Outbox => OUTBOX_TOPIC.to_owned(),
    }
}

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

/// CPU seconds of the walsender holding `slot` so far (0 without one).
async fn walsender_cpu_seconds(env: &BenchEnv, slot: &str) -> Result<f64> {
    let pid: Option<i32> = env
        .client
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .and_then(|r| r.get(0));
    Ok(match pid {
        Some(pid) => crate::procstat::cpu_seconds(u32::try_from(pid)?).unwrap_or(0.0),
        None => 0.0,
    })
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

/// Starts a worker of `variant` on its slot, waits until the records of
/// every backlog event are in Kafka, measures, and stops it (SIGTERM).
async fn drain_once(
    env: &BenchEnv,
    w: &Workload,
    variant: Variant,
    r: u32,
    first_seq: u64,
    broker_idle: f64,
) -> Result<Drained> {
    let slot = slot(variant, &w.id, r);
    let prefix = format!("bench.{}.{}{r}", w.id, super::tag(variant));
    let topic = topic_of(w.kind, &prefix);
    if w.kind == Kind::Messages {
        env.create_topic(&topic)?;
    }
    let bootstrap = env.bootstrap();
    let base = {
        let (b, t) = (bootstrap.clone(), topic.clone());
        tokio::task::spawn_blocking(move || current_end_offsets(&b, &t)).await??
    };
    let base_bytes = env.topic_log_bytes(&topic);
    let watch = TopicWatch::start(&bootstrap, &topic, base.clone())?;
    let name = format!("bench-{slot}");
    let mut worker = DebeziumWorker::start(
        &env.cluster,
        &bootstrap,
        options(variant, &name, &slot, &prefix),
    )
    .await?;
    let spawned = worker.started_at().context("the worker runs")?;
    let timings = worker.timings().context("the worker started")?;
    let streaming_at = spawned + timings.streaming;
    let cpu_ready = worker.cpu_seconds()?;
    // The database's and the broker's CPU from here, as the worker's:
    // the drain's, not the start's (tens of seconds in which the broker's
    // idle CPU, subtracted over the window, would drown the drain's). The
    // walsender has been decoding since it attached, up to a queue's worth
    // (65,536 events tuned) before this moment: what it used so far is
    // added (it is new since the spawn, so all of it is the drain's).
    let db = env.db_cpu_window()?;
    let broker = env.broker_cpu_window();
    let walsender_before = walsender_cpu_seconds(env, &slot).await?;

    let range = first_seq..first_seq + w.events;
    let mut target = w.events;
    // The database's CPU until the records of as many records as events
    // are there (with duplicates a little before the end).
    let mut db = Some(db);
    let mut db_cpu = None;
    let mut progress = (0u64, Instant::now());
    let (tally, end_at, first_at, cpu_end, peak, broker_cpu) = loop {
        let seen = watch.seen();
        let count = seen.count();
        if count >= target {
            // Everything is measured the moment the records are there,
            // not after the read-back (the worker idles meanwhile).
            let cpu_end = worker.cpu_seconds()?;
            let peak = worker.peak_rss_bytes()?;
            let broker_cpu = broker.finish(env, broker_idle);
            if let Some(db) = db.take() {
                db_cpu = Some(db.finish().await? + walsender_before);
            }
            let (b, t, from, to, kind) = (
                bootstrap.clone(),
                topic.clone(),
                base.clone(),
                seen.ends.clone(),
                w.kind,
            );
            let seqs = tokio::task::spawn_blocking(move || {
                read_range(&b, &t, &from, &to, Writer::Debezium, kind, READ_TIMEOUT)
            })
            .await??;
            let tally = Tally::of(seqs, range.clone());
            if tally.distinct >= w.events {
                let end_at = seen.reached(tally.records).context("a reached total")?;
                let first_at = seen.reached(1).unwrap_or(end_at);
                // Where the drain's time went: when a tenth, half and nine
                // tenths of the records were there.
                let at = |share: f64| {
                    seen.reached(((w.events as f64 * share) as u64).max(1))
                        .map_or(f64::NAN, |t| {
                            t.saturating_duration_since(streaming_at).as_secs_f64()
                        })
                };
                tracing::info!(
                    "  {} #{r}: 10 % / 50 % / 90 % / all of the records {:.1} / {:.1} / {:.1} / {:.1} s after it streamed",
                    tool(variant).label(),
                    at(0.1),
                    at(0.5),
                    at(0.9),
                    end_at.saturating_duration_since(streaming_at).as_secs_f64()
                );
                break (tally, end_at, first_at, cpu_end, peak, broker_cpu);
            }
            // Duplicates or strangers among them: wait for as many more
            // records.
            target = w.events + tally.duplicates + tally.other;
            continue;
        }
        if let Some(status) = worker.exited()? {
            bail!(
                "the Kafka Connect worker exited ({status}) with {count} of {} records in Kafka\n{}",
                w.events,
                worker.log_tail(40)
            );
        }
        if count != progress.0 {
            progress = (count, Instant::now());
        } else if progress.1.elapsed() > STALL {
            bail!(
                "only {count} of {} records in {topic} and none new for {STALL:?} ({})\n{}",
                w.events,
                seen.error
                    .as_deref()
                    .unwrap_or("no error polling the end offsets"),
                worker.log_tail(40)
            );
        }
        tokio::time::sleep(EVERY).await;
    };
    drop(watch);
    let stopped_cleanly = tokio::task::block_in_place(|| worker.stop())?;
    let kafka_bytes = match (env.topic_log_bytes(&topic), base_bytes) {
        (Some(after), Some(before)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    Ok(Drained {
        run: DrainRun {
            seconds: end_at.saturating_duration_since(streaming_at).as_secs_f64(),
            cpu_seconds: cpu_end - cpu_ready,
            db_cpu_seconds: db_cpu.unwrap_or_default(),
            peak_rss_bytes: Some(peak),
            fence: None,
            broker_cpu_seconds: broker_cpu,
            kafka_bytes,
        },
        startup: Startup {
            running_s: timings.running.as_secs_f64(),
            streaming_s: timings.streaming.as_secs_f64(),
            first_record_s: first_at.saturating_duration_since(spawned).as_secs_f64(),
            cpu_seconds: cpu_ready,
        },
        tally,
        worker,
        topic,
        stopped_cleanly,
    })
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
    let base = {
        let (b, t) = (bootstrap.clone(), d.topic.clone());
        tokio::task::spawn_blocking(move || current_end_offsets(&b, &t)).await??
    };
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
