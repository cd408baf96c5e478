//! Starting one consumer (walrelay's loop, the inbox consumers, the read
//! limit, a Python or a Java child), waiting for what it applied, and stopping it.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::ClientConfig;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::types::Type;
use tokio_postgres::Transaction;
use walrelay_consumer::{ConsumerLoop, Database, Delivery, PgHwmStore};

use super::{
    connect, inbox, java, python, Applied, Consumer, EFFECT_INSERT_BATCH, EFFECT_INSERT_ONE,
    RUN_TIMEOUT,
};
use crate::env::BenchEnv;

/// Where a consumer reads and writes: its topic and group, its database,
/// and the interpreter for the Python consumers.
pub(super) struct Target<'a> {
    pub topic: &'a str,
    pub group: &'a str,
    pub dsn: &'a str,
    pub python: Option<&'a Path>,
    /// The Java consumers' classpath.
    pub java: Option<&'a str>,
    /// The topic's partitions: the Java plain loops run one loop per
    /// partition, as a team would give each partition its own consumer.
    pub partitions: i32,
}

fn kafka_config(env: &BenchEnv, group: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", env.bootstrap())
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        // Tansu joins groups in about half the session timeout.
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
        .set("fetch.wait.max.ms", "5");
    c
}

/// Starts `consumer` on `target`; it runs until `stop`.
pub(super) async fn start(
    env: &BenchEnv,
    consumer: Consumer,
    target: Target<'_>,
    applied: Applied,
    stop: watch::Receiver<bool>,
) -> Result<JoinHandle<Result<()>>> {
    let kafka = kafka_config(env, target.group);
    if let Some(mode) = super::python_mode(consumer) {
        let python = target
            .python
            .context("no Python interpreter for the Python consumer")?;
        let target = python::Target {
            python,
            bootstrap: env.bootstrap(),
            topic: target.topic,
            dsn: target.dsn,
            group: target.group,
            mode,
        };
        return python::start(target, applied, stop);
    }
    if let Some(mode) = super::java_mode(consumer) {
        let target = java::Target {
            classpath: target.java.context("no classpath for the Java consumer")?,
            bootstrap: env.bootstrap(),
            topic: target.topic,
            jdbc_url: java::jdbc_url(target.dsn)?,
            group: target.group,
            mode,
            loops: target.partitions,
        };
        return java::start(target, applied, stop);
    }
    let topic = target.topic.to_owned();
    Ok(match consumer {
        Consumer::WalrelayBatch | Consumer::WalrelayRecord => {
            let batch = consumer == Consumer::WalrelayBatch;
            start_walrelay(kafka, batch, &topic, target.dsn, applied, stop)?
        }
        Consumer::ReadLimit => {
            tokio::spawn(async move { read_only(kafka, &topic, applied, stop).await })
        }
        Consumer::Inbox1 | Consumer::Inbox500 | Consumer::InboxCareful | Consumer::ApplyLimit => {
            start_inbox(kafka, consumer, topic, target.dsn, applied, stop).await?
        }
        Consumer::PythonBatch
        | Consumer::PythonRecord
        | Consumer::PythonInboxCareful
        | Consumer::PythonApplyLimit
        | Consumer::JavaBatch
        | Consumer::JavaInboxCareful
        | Consumer::JavaApplyLimit => unreachable!("started above"),
    })
}

/// walrelay's loop on `topic`, with the batch handler (`batch`) or the
/// per-record one; `applied` counts what its batches committed.
fn start_walrelay(
    kafka: ClientConfig,
    batch: bool,
    topic: &str,
    dsn: &str,
    applied: Applied,
    stop: watch::Receiver<bool>,
) -> Result<JoinHandle<Result<()>>> {
    let store = PgHwmStore::new();
    let count = Arc::clone(&applied.count);
    let counters = store.counters().clone();
    let lp = ConsumerLoop::new(kafka, &[topic], store, Database::from_dsn(dsn)?)?;
    let _ = applied.metrics.set(lp.metrics());
    // `processed` counts after each batch commit.
    let running = stop.clone();
    tokio::spawn(async move {
        while !*running.borrow() {
            count.store(counters.processed.get(), Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    // The loop's future borrows the handler across awaits in a way
    // the compiler cannot prove `Send` for every lifetime; it runs
    // on a thread of its own, as a service's `main` would run it.
    let runtime = tokio::runtime::Handle::current();
    Ok(tokio::task::spawn_blocking(move || {
        runtime.block_on(async move {
            if batch {
                apply_batches(lp, applied, stop).await
            } else {
                apply_records(lp, applied, stop).await
            }
        })
    }))
}

/// walrelay's loop with the batch handler: one multi-row insert per
/// batch.
async fn apply_batches(
    lp: ConsumerLoop,
    applied: Applied,
    stop: watch::Receiver<bool>,
) -> Result<()> {
    lp.run_batches(
        async |tx: &Transaction<'_>, records: &[Delivery<'_>]| {
            let mut ids = Vec::with_capacity(records.len());
            let mut payloads = Vec::with_capacity(records.len());
            for d in records {
                ids.push(d.meta.key.to_hex());
                payloads.push(String::from_utf8_lossy(d.payload().unwrap_or_default()));
            }
            // Typed, as docs/consumer.md advises: parse,
            // bind and execute in one round trip.
            tx.execute_typed(
                EFFECT_INSERT_BATCH,
                &[(&ids, Type::TEXT_ARRAY), (&payloads, Type::TEXT_ARRAY)],
            )
            .await?;
            applied.observe();
            Ok::<(), tokio_postgres::Error>(())
        },
        stop,
    )
    .await?;
    Ok(())
}

/// walrelay's loop with the per-record handler: one insert per record
/// inside the batch transaction.
async fn apply_records(
    lp: ConsumerLoop,
    applied: Applied,
    stop: watch::Receiver<bool>,
) -> Result<()> {
    lp.run(
        async |tx: &Transaction<'_>, d: &Delivery<'_>| {
            let payload = String::from_utf8_lossy(d.payload().unwrap_or_default());
            // Typed: parse, bind and execute in one
            // round trip (`execute(&str)` takes two).
            tx.execute_typed(
                EFFECT_INSERT_ONE,
                &[
                    (&d.meta.key.to_hex(), Type::TEXT),
                    (&payload.as_ref(), Type::TEXT),
                ],
            )
            .await?;
            applied.observe();
            Ok::<(), tokio_postgres::Error>(())
        },
        stop,
    )
    .await?;
    Ok(())
}

/// The inbox consumers and the apply limit: records per transaction and
/// how each applies them.
async fn start_inbox(
    kafka: ClientConfig,
    consumer: Consumer,
    topic: String,
    dsn: &str,
    applied: Applied,
    stop: watch::Receiver<bool>,
) -> Result<JoinHandle<Result<()>>> {
    let (per_tx, style) = match consumer {
        Consumer::Inbox1 => (1, inbox::Style::PerRecord),
        Consumer::Inbox500 => (500, inbox::Style::PerRecord),
        Consumer::InboxCareful => (500, inbox::Style::Careful),
        _ => (500, inbox::Style::NoDedupe),
    };
    let client = connect(dsn).await?;
    Ok(tokio::spawn(async move {
        inbox::run(kafka, &topic, client, per_tx, style, applied, stop).await
    }))
}

/// Reads `topic` and counts, nothing else: what the broker serves to one
/// consumer.
async fn read_only(
    kafka: ClientConfig,
    topic: &str,
    applied: Applied,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    use rdkafka::consumer::{Consumer as _, StreamConsumer};
    let mut kafka = kafka;
    kafka.set("enable.auto.commit", "false");
    let consumer: StreamConsumer = kafka.create()?;
    consumer.subscribe(&[topic])?;
    loop {
        tokio::select! {
            _ = stop.changed() => return Ok(()),
            m = consumer.recv() => {
                m?;
                applied.observe();
                applied.count.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Waits until `applied` reached `n`, or the consumer ended.
pub(super) async fn wait_applied(
    applied: &Applied,
    n: u64,
    task: &JoinHandle<Result<()>>,
) -> Result<Instant> {
    let deadline = Instant::now() + RUN_TIMEOUT;
    loop {
        let got = applied.count.load(Ordering::Relaxed);
        if got >= n {
            return Ok(Instant::now());
        }
        if task.is_finished() {
            bail!("the consumer stopped after {got} of {n} records");
        }
        if Instant::now() > deadline {
            bail!("{got} of {n} records applied within {RUN_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

pub(super) async fn stop_consumer(
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<()>>,
) -> Result<()> {
    stop.send(true).ok();
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .context("the consumer did not stop within 60 s")??
}
