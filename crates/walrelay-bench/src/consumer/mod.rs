//! The consumer bench: walrelay's exactly-once consumer against the
//! classic inbox-table consumer, side by side on the same relayed topics.
//!
//! Method:
//!
//! * One backlog of 200-byte messages (100 per transaction) is relayed by
//!   walrelay (in this process) into a 4-partition and a 1-partition topic.
//! * Every consumer run gets a fresh database on the bench's PostgreSQL
//!   (`synchronous_commit = on`, the default) and a fresh consumer group,
//!   and applies the whole topic: one row per event in `applied_events`.
//!   The run checks that the table ends with exactly one row per event.
//! * **records/s** counts from the first record the consumer was handed
//!   to the commit that applied the last one (the group join before it is
//!   not the consumer's speed). **CPU per record** is this process's CPU
//!   (handler, loop, librdkafka threads) and **database CPU per record**
//!   the whole server's, both from the consumer's start to the end, so
//!   they include the join (conservative for every consumer alike).
//! * **Dedupe state** is what the consumer keeps to recognize duplicates
//!   after the run: walrelay's mark table (one row per partition and
//!   source) against the inbox table (one row per event).
//! * **Latency** (commit → applied) runs the relay and a consumer live
//!   while one-event transactions commit at a fixed rate; an event counts
//!   as applied when the consumer writes its side effect, inside the
//!   transaction that then commits it (the same point for both
//!   consumers).
//!
//! Consumers: walrelay's [`walrelay_consumer::ConsumerLoop`] with the
//! batch handler (one multi-row insert per batch) and with the per-record
//! handler (one insert per record inside the batch transaction), each on
//! 4 and 1 partitions; the inbox consumer ([`inbox`]) with one transaction
//! per record and one per up to 500 records; the Python package's
//! `ConsumerLoop` ([`python`]) with its batch and per-record handlers, as a
//! child process from the pinned virtualenv.

mod drain;
mod inbox;
mod live;
mod python;
pub mod report;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::ClientConfig;
use serde::Serialize;
use tokio::sync::watch;
use tokio_postgres::types::Type;
use tokio_postgres::Transaction;
use walrelay::pipeline;
use walrelay_consumer::{ConsumerLoop, Database, Delivery, LoopMetrics, PgHwmStore};

use crate::env::BenchEnv;
use crate::latency::{self, Percentiles};
use crate::workload::{self, seq_of_payload, Kind, Workload};

use drain::{drain, DrainTarget};
use live::live;

/// The side effect: one row per event.
const EFFECTS: &str = "
    CREATE TABLE IF NOT EXISTS applied_events (
        event_id text NOT NULL,
        payload text NOT NULL
    );";
pub(crate) const EFFECT_INSERT_ONE: &str =
    "INSERT INTO applied_events (event_id, payload) VALUES ($1, $2)";
pub(crate) const EFFECT_INSERT_BATCH: &str = "INSERT INTO applied_events (event_id, payload) \
     SELECT * FROM unnest($1::text[], $2::text[])";

/// How long a consumer run may take before the bench gives up.
const RUN_TIMEOUT: Duration = Duration::from_secs(900);

/// The order in which each repeat runs the consumers.
const CONSUMER_ORDER: [Consumer; 11] = [
    Consumer::WalrelayBatch,
    Consumer::WalrelayRecord,
    Consumer::ApplyLimit,
    Consumer::InboxCareful,
    Consumer::Inbox500,
    Consumer::Inbox1,
    Consumer::ReadLimit,
    Consumer::PythonBatch,
    Consumer::PythonRecord,
    Consumer::PythonApplyLimit,
    Consumer::PythonInboxCareful,
];

/// The consumers compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Consumer {
    #[serde(rename = "walrelay, batch handler")]
    WalrelayBatch,
    #[serde(rename = "walrelay, per-record handler")]
    WalrelayRecord,
    #[serde(rename = "inbox table, 1 record/tx")]
    Inbox1,
    /// Two statements per record, 500 records per transaction.
    #[serde(rename = "inbox table, 500 records/tx")]
    Inbox500,
    /// Ids and effects each one multi-row statement per 500 records.
    #[serde(rename = "inbox table, careful (multi-row, 500/tx)")]
    InboxCareful,
    /// The careful loop's effects with no deduplication at all.
    #[serde(rename = "apply limit (multi-row effects, no dedupe)")]
    ApplyLimit,
    /// A plain rdkafka consumer that only counts: the broker's read limit.
    #[serde(rename = "read limit (rdkafka, no processing)")]
    ReadLimit,
    #[serde(rename = "Python package, batch handler")]
    PythonBatch,
    #[serde(rename = "Python package, per-record handler")]
    PythonRecord,
    #[serde(rename = "Python inbox table, careful (multi-row, 500/tx)")]
    PythonInboxCareful,
    #[serde(rename = "Python apply limit (multi-row effects, no dedupe)")]
    PythonApplyLimit,
}

impl Consumer {
    pub fn label(self) -> &'static str {
        match self {
            Consumer::WalrelayBatch => "walrelay, batch handler",
            Consumer::WalrelayRecord => "walrelay, per-record handler",
            Consumer::Inbox1 => "inbox table, 1 record/tx",
            Consumer::Inbox500 => "inbox table, a statement per record, 500/tx",
            Consumer::InboxCareful => "inbox table, careful (multi-row, 500/tx)",
            Consumer::ApplyLimit => "apply limit (multi-row effects, no dedupe)",
            Consumer::ReadLimit => "read limit (rdkafka, no processing)",
            Consumer::PythonBatch => "Python package, batch handler",
            Consumer::PythonRecord => "Python package, per-record handler",
            Consumer::PythonInboxCareful => "Python inbox table, careful (multi-row, 500/tx)",
            Consumer::PythonApplyLimit => "Python apply limit (multi-row effects, no dedupe)",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Consumer::WalrelayBatch => "wr_batch",
            Consumer::WalrelayRecord => "wr_record",
            Consumer::Inbox1 => "inbox_1",
            Consumer::Inbox500 => "inbox_500",
            Consumer::InboxCareful => "inbox_careful",
            Consumer::ApplyLimit => "apply_limit",
            Consumer::ReadLimit => "read",
            Consumer::PythonBatch => "py_batch",
            Consumer::PythonRecord => "py_record",
            Consumer::PythonInboxCareful => "py_inbox_careful",
            Consumer::PythonApplyLimit => "py_apply_limit",
        }
    }

    fn python_mode(self) -> Option<python::Mode> {
        match self {
            Consumer::PythonBatch => Some(python::Mode::PackageBatch),
            Consumer::PythonRecord => Some(python::Mode::PackageRecord),
            Consumer::PythonInboxCareful => Some(python::Mode::InboxCareful),
            Consumer::PythonApplyLimit => Some(python::Mode::ApplyLimit),
            _ => None,
        }
    }
}

/// One consumer draining one topic.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerRun {
    pub consumer: Consumer,
    pub partitions: i32,
    pub repeat: u32,
    pub records: u64,
    /// From the consumer's start (client created, group joined, offsets
    /// fetched) to the first record handed to it: what a deploy waits
    /// before anything is applied.
    pub first_record_s: f64,
    pub seconds: f64,
    pub records_per_s: f64,
    pub cpu_us_per_record: f64,
    pub db_cpu_us_per_record: f64,
    /// Rows of the dedupe state after the run.
    pub state_rows: i64,
    /// Bytes of the dedupe state (table and indexes) after the run.
    pub state_bytes: i64,
    /// walrelay's consumer: batch transactions committed, and partition
    /// pauses (each one a refetch of the partition's prefetched records).
    pub batches: Option<u64>,
    pub pauses: Option<u64>,
    /// walrelay's consumer: partition-seconds per phase of its loop
    /// (`LoopMetrics::time_breakdown`: polling, paused, pool, ...).
    pub phases: Option<Vec<(String, f64)>>,
}

/// One consumer under live load at one rate.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerLatencyRun {
    pub consumer: Consumer,
    pub repeat: u32,
    pub target_rate: u64,
    pub achieved_rate: f64,
    pub events: u64,
    pub commit_to_applied: Percentiles,
}

/// What the consumer bench is asked to do.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// Only these consumers (tags such as `wr_batch`; empty: all).
    pub only: Vec<String>,
    pub records: u64,
    pub repeats: u32,
    pub rates: Vec<u64>,
    pub latency_duration: Duration,
}

/// When each event's side effect was written: (sequence number, time).
type ApplyLog = Arc<Mutex<Vec<(u64, Instant)>>>;

impl ConsumerOptions {
    fn wants(&self, consumer: Consumer) -> bool {
        self.only.is_empty() || self.only.iter().any(|t| t == consumer.tag())
    }
}

/// Shared between a consumer and the bench: records applied (counted after
/// their commit), when the first record was handed over, and optionally
/// when each event's side effect was written (for latency).
#[derive(Clone, Default)]
pub(crate) struct Applied {
    pub count: Arc<AtomicU64>,
    /// walrelay's loop metrics, when the consumer is walrelay's.
    metrics: Arc<OnceLock<LoopMetrics>>,
    /// The consumer's process, when it runs in a child process.
    pid: python::Pid,
    first: Arc<OnceLock<Instant>>,
    log: Option<ApplyLog>,
}

impl Applied {
    fn with_log() -> Applied {
        Applied {
            log: Some(Arc::default()),
            ..Applied::default()
        }
    }

    /// The consumer wrote the side effect of the event with `payload`.
    pub fn observe(&self, payload: Option<&[u8]>) {
        let now = Instant::now();
        self.first.get_or_init(|| now);
        if let Some(log) = &self.log {
            if let Some(seq) = payload.and_then(seq_of_payload) {
                log.lock().expect("lock").push((seq, now));
            }
        }
    }

    fn logged(&self) -> Vec<(u64, Instant)> {
        self.log
            .as_ref()
            .map(|l| l.lock().expect("lock").clone())
            .unwrap_or_default()
    }
}

/// Runs the whole consumer bench: throughput on 4 and 1 partitions, then
/// latency at `options.rates`.
pub async fn run(
    env: &mut BenchEnv,
    options: &ConsumerOptions,
    first_seq: u64,
) -> Result<(Vec<ConsumerRun>, Vec<ConsumerLatencyRun>)> {
    env.fresh_broker().await?;
    let w = Workload::new(Kind::Messages, 100, 200, options.records);
    let mut topics = Vec::new();
    for partitions in [4, 1] {
        let topic = format!("cons.p{partitions}");
        env.create_topic_with(&topic, partitions)?;
        let slot = format!("cons_p{partitions}");
        env.create_slot(&slot).await?;
        topics.push((topic, slot, partitions));
    }
    workload::generate_backlog(&env.client, &w, first_seq).await?;
    let (end, _) = env.current_lsn().await?;
    for (topic, slot, _) in &topics {
        relay_backlog(env, slot, topic, end).await?;
        env.drop_slot(slot).await?;
    }
    tracing::info!(
        "consumer bench: {} records relayed into {:?}",
        w.events,
        topics
    );

    let python = if [
        Consumer::PythonBatch,
        Consumer::PythonRecord,
        Consumer::PythonInboxCareful,
        Consumer::PythonApplyLimit,
    ]
    .into_iter()
    .any(|c| options.wants(c))
    {
        Some(python::venv_python().await?)
    } else {
        None
    };
    let mut runs = Vec::new();
    let mut n = 0;
    // One unreported run before the repeats: the broker's JIT and the
    // fresh database warm up on it, not on whichever consumer the first
    // repeat measures first (that run was 20-30 % slower than the same
    // consumer's later repeats, and set the spread).
    if options.repeats > 1 {
        if let (Some(consumer), Some((topic, _, partitions))) = (
            CONSUMER_ORDER.into_iter().find(|c| options.wants(*c)),
            topics.first(),
        ) {
            let target = DrainTarget {
                topic,
                partitions: *partitions,
                db: &format!("cons_warmup_{}", consumer.tag()),
                python: python.as_deref(),
            };
            let run = drain(env, consumer, target, w.events, 0).await?;
            tracing::info!(
                "consumer bench: warm-up run ({} p{partitions}, not reported): {:.0} records/s",
                consumer.label(),
                run.records_per_s
            );
        }
    }
    for repeat in 0..options.repeats {
        for (topic, _, partitions) in &topics {
            for consumer in CONSUMER_ORDER {
                if !options.wants(consumer) {
                    continue;
                }
                if *partitions == 1 && matches!(consumer, Consumer::Inbox1 | Consumer::Inbox500) {
                    // The slow inbox consumers are serial: their
                    // 1-partition run would repeat the 4-partition one.
                    continue;
                }
                n += 1;
                let db = format!("cons_{}_{n}", consumer.tag());
                let target = DrainTarget {
                    topic,
                    partitions: *partitions,
                    db: &db,
                    python: python.as_deref(),
                };
                let run = drain(env, consumer, target, w.events, repeat).await?;
                if let Some(phases) = &run.phases {
                    tracing::info!(
                        "consumer {} p{partitions} #{repeat}: where the time went (partition-seconds over {:.1} s): {}",
                        consumer.label(),
                        run.seconds,
                        phases
                            .iter()
                            .filter(|(_, s)| *s > 0.0)
                            .map(|(p, s)| format!("{p} {s:.2}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                tracing::info!(
                    "consumer {} p{partitions} #{repeat}: {:.0} records/s, {:.1} µs cpu/record, {:.1} µs db cpu/record, state {} rows / {} B, batches {:?}, pauses {:?}",
                    consumer.label(),
                    run.records_per_s,
                    run.cpu_us_per_record,
                    run.db_cpu_us_per_record,
                    run.state_rows,
                    run.state_bytes,
                    run.batches,
                    run.pauses
                );
                runs.push(run);
            }
        }
    }

    let mut lat = Vec::new();
    for repeat in 0..options.repeats {
        for consumer in [Consumer::WalrelayBatch, Consumer::Inbox500] {
            if !options.wants(consumer) || options.rates.is_empty() {
                continue;
            }
            n += 1;
            lat.extend(
                live(env, consumer, options, repeat, n)
                    .await
                    .with_context(|| format!("consumer latency, {}", consumer.label()))?,
            );
        }
    }
    Ok((runs, lat))
}

/// Relays the slot's backlog up to `end` into `topic` with walrelay in
/// this process.
async fn relay_backlog(env: &BenchEnv, slot: &str, topic: &str, end: u64) -> Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let config = latency::relay_config(env, slot, topic, &[]);
    let relay = tokio::spawn(pipeline::run(config, stop_rx, None));
    let deadline = Instant::now() + RUN_TIMEOUT;
    while env.confirmed_flush(slot).await? < end {
        if relay.is_finished() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_tx.send(true).ok();
    relay.await?.context("relaying the consumer backlog")?;
    if env.confirmed_flush(slot).await? < end {
        bail!("walrelay did not relay the consumer backlog into {topic} within {RUN_TIMEOUT:?}");
    }
    Ok(())
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

/// A fresh database with the effects table; its DSN.
async fn fresh_database(env: &BenchEnv, name: &str) -> Result<String> {
    env.client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    let dsn = format!(
        "{}?sslmode=disable",
        env.cluster.url(walrelay_testkit::SUPERUSER, name)
    );
    let client = connect(&dsn).await?;
    client.batch_execute(EFFECTS).await?;
    client.batch_execute(inbox::SCHEMA).await?;
    walrelay_consumer::migrate(&client).await?;
    Ok(dsn)
}

async fn connect(dsn: &str) -> Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("bench consumer connection: {e}");
        }
    });
    Ok(client)
}

/// Starts `consumer` on `topic`; it runs until `stop`. `python` is the
/// interpreter for the Python consumers.
#[allow(clippy::too_many_arguments)]
async fn start(
    env: &BenchEnv,
    consumer: Consumer,
    topic: &str,
    dsn: &str,
    group: &str,
    python: Option<&Path>,
    applied: Applied,
    stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<Result<()>>> {
    let kafka = kafka_config(env, group);
    if let Some(mode) = consumer.python_mode() {
        let python = python.context("no Python interpreter for the Python consumer")?;
        let target = python::Target {
            python,
            bootstrap: env.bootstrap(),
            topic,
            dsn,
            group,
            mode,
        };
        return python::start(target, applied, stop);
    }
    let topic = topic.to_owned();
    Ok(match consumer {
        Consumer::WalrelayBatch | Consumer::WalrelayRecord => {
            let store = PgHwmStore::new();
            let count = Arc::clone(&applied.count);
            let counters = store.counters().clone();
            let lp = ConsumerLoop::new(kafka, &[topic.as_str()], store, Database::from_dsn(dsn)?)?;
            let _ = applied.metrics.set(lp.metrics());
            // `processed` counts after each batch commit.
            let running = stop.clone();
            tokio::spawn(async move {
                while !*running.borrow() {
                    count.store(counters.processed.get(), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
            let batch = consumer == Consumer::WalrelayBatch;
            // The loop's future borrows the handler across awaits in a way
            // the compiler cannot prove `Send` for every lifetime; it runs
            // on a thread of its own, as a service's `main` would run it.
            let runtime = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || {
                runtime.block_on(async move {
                    if batch {
                        lp.run_batches(
                            async |tx: &Transaction<'_>, records: &[Delivery<'_>]| {
                                let mut ids = Vec::with_capacity(records.len());
                                let mut payloads = Vec::with_capacity(records.len());
                                for d in records {
                                    ids.push(d.meta.key.to_hex());
                                    payloads.push(String::from_utf8_lossy(
                                        d.payload().unwrap_or_default(),
                                    ));
                                }
                                // Typed, as docs/consumer.md advises: parse,
                                // bind and execute in one round trip.
                                tx.execute_typed(
                                    EFFECT_INSERT_BATCH,
                                    &[(&ids, Type::TEXT_ARRAY), (&payloads, Type::TEXT_ARRAY)],
                                )
                                .await?;
                                for d in records {
                                    applied.observe(d.payload());
                                }
                                Ok::<(), tokio_postgres::Error>(())
                            },
                            stop,
                        )
                        .await?;
                    } else {
                        lp.run(
                            async |tx: &Transaction<'_>, d: &Delivery<'_>| {
                                let payload =
                                    String::from_utf8_lossy(d.payload().unwrap_or_default());
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
                                applied.observe(d.payload());
                                Ok::<(), tokio_postgres::Error>(())
                            },
                            stop,
                        )
                        .await?;
                    }
                    Ok(())
                })
            })
        }
        Consumer::ReadLimit => {
            tokio::spawn(async move { read_only(kafka, &topic, applied, stop).await })
        }
        Consumer::Inbox1 | Consumer::Inbox500 | Consumer::InboxCareful | Consumer::ApplyLimit => {
            let (per_tx, style) = match consumer {
                Consumer::Inbox1 => (1, inbox::Style::PerRecord),
                Consumer::Inbox500 => (500, inbox::Style::PerRecord),
                Consumer::InboxCareful => (500, inbox::Style::Careful),
                _ => (500, inbox::Style::NoDedupe),
            };
            let client = connect(dsn).await?;
            tokio::spawn(async move {
                inbox::run(kafka, &topic, client, per_tx, style, applied, stop).await
            })
        }
        Consumer::PythonBatch
        | Consumer::PythonRecord
        | Consumer::PythonInboxCareful
        | Consumer::PythonApplyLimit => unreachable!("started above"),
    })
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
    use rdkafka::message::Message as _;
    let mut kafka = kafka;
    kafka.set("enable.auto.commit", "false");
    let consumer: StreamConsumer = kafka.create()?;
    consumer.subscribe(&[topic])?;
    loop {
        tokio::select! {
            _ = stop.changed() => return Ok(()),
            m = consumer.recv() => {
                applied.observe(m?.payload());
                applied.count.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Waits until `applied` reached `n`, or the consumer ended.
async fn wait_applied(
    applied: &Applied,
    n: u64,
    task: &tokio::task::JoinHandle<Result<()>>,
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

async fn stop_consumer(
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<()>>,
) -> Result<()> {
    stop.send(true).ok();
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .context("the consumer did not stop within 60 s")??
}
