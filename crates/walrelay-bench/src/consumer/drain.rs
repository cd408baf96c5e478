//! Draining a relayed backlog with one consumer: records/s, CPU and the
//! dedupe state it leaves.

use std::path::Path;
use std::sync::atomic::Ordering;

use anyhow::{bail, Context, Result};
use tokio::sync::watch;

use super::{
    connect, fresh_database, inbox, start, stop_consumer, wait_applied, Applied, Consumer,
    ConsumerRun, Target,
};
use crate::env::BenchEnv;
use crate::procstat;

/// Where a drain run reads and writes.
pub(super) struct DrainTarget<'a> {
    pub(super) topic: &'a str,
    pub(super) partitions: i32,
    /// The database (and consumer group) name.
    pub(super) db: &'a str,
    pub(super) python: Option<&'a Path>,
    pub(super) java: Option<&'a str>,
}

/// One consumer applies the whole `topic` into a fresh database.
pub(super) async fn drain(
    env: &BenchEnv,
    consumer: Consumer,
    target: DrainTarget<'_>,
    records: u64,
    repeat: u32,
) -> Result<ConsumerRun> {
    let DrainTarget {
        topic,
        partitions,
        db,
        python,
        java,
    } = target;
    let dsn = fresh_database(env, db).await?;
    let applied = Applied::default();
    let (stop_tx, stop_rx) = watch::channel(false);
    let db_cpu = env.db_cpu_window()?;
    let cpu0 = procstat::self_cpu_seconds()?;
    let started = std::time::Instant::now();
    let task = start(
        env,
        consumer,
        Target {
            topic,
            group: db,
            dsn: &dsn,
            python,
            java,
            partitions,
        },
        applied.clone(),
        stop_rx,
    )
    .await?;
    let finished = wait_applied(&applied, records, &task).await;
    // A child process's CPU is its own, from its start; ours otherwise.
    let cpu = match applied.pid.get() {
        Some(pid) => procstat::cpu_seconds(*pid)?,
        None => procstat::self_cpu_seconds()? - cpu0,
    };
    let db_cpu = db_cpu.finish().await?;
    stop_consumer(stop_tx, task).await?;
    let finished = finished?;
    let first = *applied.first.get().context("no record was applied")?;
    let seconds = finished.duration_since(first).as_secs_f64().max(1e-6);

    let client = connect(&dsn).await?;
    let row = client
        .query_one(
            if consumer == Consumer::ReadLimit {
                // Applies nothing: count what it read instead.
                "SELECT $1::bigint, $1::bigint"
            } else {
                "SELECT count(*), count(DISTINCT event_id) FROM applied_events WHERE $1::bigint IS NOT NULL"
            },
            &[&(applied.count.load(Ordering::Relaxed) as i64)],
        )
        .await?;
    let (rows, distinct): (i64, i64) = (row.get(0), row.get(1));
    if rows != distinct || distinct != records as i64 {
        bail!(
            "{}: {rows} side effects of {distinct} distinct events, {records} expected exactly once",
            consumer.label()
        );
    }
    let (state_rows, state_bytes) = match consumer {
        Consumer::WalrelayBatch
        | Consumer::WalrelayRecord
        | Consumer::PythonBatch
        | Consumer::PythonRecord
        | Consumer::JavaBatch => {
            let row = client
                .query_one(
                    "SELECT count(*), pg_total_relation_size('walrelay_consumer_hwm') FROM walrelay_consumer_hwm",
                    &[],
                )
                .await?;
            (row.get(0), row.get(1))
        }
        Consumer::Inbox1
        | Consumer::Inbox500
        | Consumer::InboxCareful
        | Consumer::PythonInboxCareful
        | Consumer::JavaInboxCareful => inbox::state(&client).await?,
        Consumer::ReadLimit
        | Consumer::ApplyLimit
        | Consumer::PythonApplyLimit
        | Consumer::JavaApplyLimit => (0, 0),
    };
    let per = |s: f64| s * 1e6 / records as f64;
    Ok(ConsumerRun {
        consumer,
        partitions,
        repeat,
        records,
        first_record_s: first.saturating_duration_since(started).as_secs_f64(),
        seconds,
        records_per_s: records as f64 / seconds,
        cpu_us_per_record: per(cpu),
        db_cpu_us_per_record: per(db_cpu),
        state_rows,
        state_bytes,
        batches: applied.metrics.get().map(|m| m.batches.get()),
        pauses: applied.metrics.get().map(|m| m.pauses.get()),
        phases: applied.metrics.get().map(|m| {
            m.time_breakdown()
                .into_iter()
                .map(|(phase, seconds)| (phase.name().to_owned(), seconds))
                .collect()
        }),
    })
}
