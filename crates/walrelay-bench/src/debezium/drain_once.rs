//! One Debezium drain of a workload's backlog: a worker of one variant
//! started on its slot, the topic watched from before its start, the
//! moment the records of every event are there measured (the worker's,
//! the database's and the broker's CPU), and the worker stopped.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use walrelay_testkit::{DebeziumWorker, Variant};

use super::drain::{READ_TIMEOUT, STALL};
use super::readback::{read_range, Tally, Writer};
use super::watch::{current_end_offsets, Seen, TopicWatch, EVERY};
use super::{options, slot, tool, OUTBOX_TOPIC};
use crate::drain::DrainRun;
use crate::env::{BenchEnv, BrokerCpuWindow, DbCpuWindow};
use crate::runs::Startup;
use crate::workload::{Kind, Workload};

/// One drain's measurements, and the stopped worker (for the restart).
pub(super) struct Drained {
    pub(super) run: DrainRun,
    pub(super) startup: Startup,
    pub(super) tally: Tally,
    pub(super) worker: DebeziumWorker,
    pub(super) topic: String,
    pub(super) stopped_cleanly: bool,
}

/// The topic a workload's records go to (`topic_prefix` is the run's).
fn topic_of(kind: Kind, topic_prefix: &str) -> String {
    match kind {
        Kind::Messages => format!("{topic_prefix}.message"),
        Kind::Outbox => OUTBOX_TOPIC.to_owned(),
    }
}

/// Starts a worker of `variant` on its slot, waits until the records of
/// every backlog event are in Kafka, measures, and stops it (SIGTERM).
pub(super) async fn drain_once(
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
    let base = end_offsets(&bootstrap, &topic).await?;
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
    let windows = CpuWindows::open(env, &slot).await?;
    let drain = Drain {
        env,
        w,
        variant,
        r,
        bootstrap: &bootstrap,
        topic: &topic,
        base: &base,
        watch: &watch,
        streaming_at,
        range: first_seq..first_seq + w.events,
    };
    let arrived = drain.wait(&mut worker, windows, broker_idle).await?;
    drop(watch);
    let stopped_cleanly = tokio::task::block_in_place(|| worker.stop())?;
    let kafka_bytes = match (env.topic_log_bytes(&topic), base_bytes) {
        (Some(after), Some(before)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    Ok(Drained {
        run: DrainRun {
            seconds: arrived
                .end_at
                .saturating_duration_since(streaming_at)
                .as_secs_f64(),
            cpu_seconds: arrived.cpu_end - cpu_ready,
            db_cpu_seconds: arrived.db_cpu.unwrap_or_default(),
            peak_rss_bytes: Some(arrived.peak),
            fence: None,
            broker_cpu_seconds: arrived.broker_cpu,
            kafka_bytes,
        },
        startup: Startup {
            running_s: timings.running.as_secs_f64(),
            streaming_s: timings.streaming.as_secs_f64(),
            first_record_s: arrived
                .first_at
                .saturating_duration_since(spawned)
                .as_secs_f64(),
            cpu_seconds: cpu_ready,
        },
        tally: arrived.tally,
        worker,
        topic,
        stopped_cleanly,
    })
}

/// `topic`'s end offsets now: where a run's records start.
pub(super) async fn end_offsets(bootstrap: &str, topic: &str) -> Result<Vec<i64>> {
    let (b, t) = (bootstrap.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || current_end_offsets(&b, &t)).await?
}

/// The database's and the broker's CPU from the moment the worker
/// streams, as the worker's.
struct CpuWindows {
    db: DbCpuWindow,
    broker: BrokerCpuWindow,
    /// What the slot's walsender used before the windows opened.
    walsender_before: f64,
}

impl CpuWindows {
    /// The database's and the broker's CPU from here, as the worker's:
    /// the drain's, not the start's (tens of seconds in which the broker's
    /// idle CPU, subtracted over the window, would drown the drain's). The
    /// walsender has been decoding since it attached, up to a queue's worth
    /// (65,536 events tuned) before this moment: what it used so far is
    /// added (it is new since the spawn, so all of it is the drain's).
    async fn open(env: &BenchEnv, slot: &str) -> Result<CpuWindows> {
        let db = env.db_cpu_window()?;
        let broker = env.broker_cpu_window();
        let walsender_before = walsender_cpu_seconds(env, slot).await?;
        Ok(CpuWindows {
            db,
            broker,
            walsender_before,
        })
    }
}

/// A drain under way: the worker streams into `topic`, watched above
/// `base` since before its start.
struct Drain<'a> {
    env: &'a BenchEnv,
    w: &'a Workload,
    variant: Variant,
    r: u32,
    bootstrap: &'a str,
    topic: &'a str,
    base: &'a [i64],
    watch: &'a TopicWatch,
    streaming_at: Instant,
    /// The backlog's sequence numbers.
    range: std::ops::Range<u64>,
}

/// What a drain measured when the records of every event were there.
struct Arrived {
    tally: Tally,
    end_at: Instant,
    first_at: Instant,
    /// The worker's CPU seconds and peak RSS then.
    cpu_end: f64,
    peak: u64,
    broker_cpu: Option<f64>,
    db_cpu: Option<f64>,
}

impl Drain<'_> {
    /// Waits until the records of every backlog event are in the topic
    /// (read back and counted by event), measuring the moment they are
    /// there; fails when the worker exits or no new record arrived for
    /// [`STALL`].
    async fn wait(
        &self,
        worker: &mut DebeziumWorker,
        windows: CpuWindows,
        broker_idle: f64,
    ) -> Result<Arrived> {
        let w = self.w;
        let CpuWindows {
            db,
            broker,
            walsender_before,
        } = windows;
        let mut target = w.events;
        // The database's CPU until the records of as many records as events
        // are there (with duplicates a little before the end).
        let mut db = Some(db);
        let mut db_cpu = None;
        let mut progress = (0u64, Instant::now());
        loop {
            let seen = self.watch.seen();
            let count = seen.count();
            if count >= target {
                // Everything is measured the moment the records are there,
                // not after the read-back (the worker idles meanwhile).
                let cpu_end = worker.cpu_seconds()?;
                let peak = worker.peak_rss_bytes()?;
                let broker_cpu = broker.finish(self.env, broker_idle);
                if let Some(db) = db.take() {
                    db_cpu = Some(db.finish().await? + walsender_before);
                }
                let tally = self.read_back(&seen).await?;
                if tally.distinct >= w.events {
                    let end_at = seen.reached(tally.records).context("a reached total")?;
                    let first_at = seen.reached(1).unwrap_or(end_at);
                    self.log_shares(&seen, end_at);
                    return Ok(Arrived {
                        tally,
                        end_at,
                        first_at,
                        cpu_end,
                        peak,
                        broker_cpu,
                        db_cpu,
                    });
                }
                // Duplicates or strangers among them: wait for as many more
                // records.
                target = w.events + tally.duplicates + tally.other;
                continue;
            }
            self.check_alive(worker, &seen, &mut progress)?;
            tokio::time::sleep(EVERY).await;
        }
    }

    /// Reads the records `seen` counted back and counts them by event.
    async fn read_back(&self, seen: &Seen) -> Result<Tally> {
        let (b, t, from, to, kind) = (
            self.bootstrap.to_owned(),
            self.topic.to_owned(),
            self.base.to_vec(),
            seen.ends.clone(),
            self.w.kind,
        );
        let seqs = tokio::task::spawn_blocking(move || {
            read_range(&b, &t, &from, &to, Writer::Debezium, kind, READ_TIMEOUT)
        })
        .await??;
        Ok(Tally::of(seqs, self.range.clone()))
    }

    /// Where the drain's time went: when a tenth, half and nine tenths of
    /// the records were there.
    fn log_shares(&self, seen: &Seen, end_at: Instant) {
        let at = |share: f64| {
            seen.reached(((self.w.events as f64 * share) as u64).max(1))
                .map_or(f64::NAN, |t| {
                    t.saturating_duration_since(self.streaming_at).as_secs_f64()
                })
        };
        tracing::info!(
            "  {} #{}: 10 % / 50 % / 90 % / all of the records {:.1} / {:.1} / {:.1} / {:.1} s after it streamed",
            tool(self.variant).label(),
            self.r,
            at(0.1),
            at(0.5),
            at(0.9),
            end_at.saturating_duration_since(self.streaming_at).as_secs_f64()
        );
    }

    /// Fails when the worker exited, or when no new record arrived for
    /// [`STALL`] (`progress`: the last count and when it changed).
    fn check_alive(
        &self,
        worker: &mut DebeziumWorker,
        seen: &Seen,
        progress: &mut (u64, Instant),
    ) -> Result<()> {
        let count = seen.count();
        if let Some(status) = worker.exited()? {
            bail!(
                "the Kafka Connect worker exited ({status}) with {count} of {} records in Kafka\n{}",
                self.w.events,
                worker.log_tail(40)
            );
        }
        if count != progress.0 {
            *progress = (count, Instant::now());
        } else if progress.1.elapsed() > STALL {
            bail!(
                "only {count} of {} records in {} and none new for {STALL:?} ({})\n{}",
                self.w.events,
                self.topic,
                seen.error
                    .as_deref()
                    .unwrap_or("no error polling the end offsets"),
                worker.log_tail(40)
            );
        }
        Ok(())
    }
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
