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
//! * **End-to-end latency** ([`live`]): the relay and one consumer run
//!   while one-event transactions commit at fixed rates, from the
//!   application's commit to the commit of the consumer's transaction
//!   holding the effect, beside a plain reference (the application
//!   produces the record itself after its commit, a plain loop applies
//!   it). With `records` 0 only these run.
//!
//! Consumers: walrelay's [`walrelay_consumer::ConsumerLoop`] with the
//! batch handler (one multi-row insert per batch) and with the per-record
//! handler (one insert per record inside the batch transaction), each on
//! 4 and 1 partitions; the inbox consumer ([`inbox`]) with one transaction
//! per record and one per up to 500 records; the Python package's
//! `ConsumerLoop` ([`python`]) with its batch and per-record handlers, as a
//! child process from the pinned virtualenv; the Java library's batch
//! handler and the Java references ([`java`]), as a `java` child process.

mod drain;
mod inbox;
mod java;
mod live;
mod live_load;
pub(crate) mod python;
mod start;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::sync::watch;
use walrelay::engine::pipeline;
use walrelay_consumer::LoopMetrics;

use crate::env::BenchEnv;
use crate::latency;
use crate::runs::{Consumer, ConsumerLatencyRun, ConsumerRun};
use crate::workload::{self, Kind, Workload};

use drain::{drain, DrainTarget};
use live::{live, LiveRun, Shape, LIVE_CONSUMERS};
use start::{start, stop_consumer, wait_applied, Target};

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
const CONSUMER_ORDER: [Consumer; 14] = [
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
    Consumer::JavaBatch,
    Consumer::JavaApplyLimit,
    Consumer::JavaInboxCareful,
];

/// Which Python process runs a consumer (none: it runs in this process).
fn python_mode(consumer: Consumer) -> Option<python::Mode> {
    match consumer {
        Consumer::PythonBatch => Some(python::Mode::PackageBatch),
        Consumer::PythonRecord => Some(python::Mode::PackageRecord),
        Consumer::PythonInboxCareful => Some(python::Mode::InboxCareful),
        Consumer::PythonApplyLimit => Some(python::Mode::ApplyLimit),
        _ => None,
    }
}

/// Which Java process runs a consumer.
fn java_mode(consumer: Consumer) -> Option<java::Mode> {
    match consumer {
        Consumer::JavaBatch => Some(java::Mode::Batch),
        Consumer::JavaInboxCareful => Some(java::Mode::InboxCareful),
        Consumer::JavaApplyLimit => Some(java::Mode::ApplyLimit),
        _ => None,
    }
}

/// What the consumer bench is asked to do.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// Only these consumers (tags such as `wr_batch`; empty: all).
    pub only: Vec<String>,
    /// Without the Python consumers (their virtualenv could not be
    /// installed).
    pub no_python: bool,
    /// Without the Java consumers (no JDK or Maven, or `java/bench` did
    /// not build).
    pub no_java: bool,
    pub records: u64,
    pub repeats: u32,
    pub rates: Vec<u64>,
    pub latency_duration: Duration,
    /// Unmeasured live load at the first rate before each end-to-end
    /// run's measured rates.
    pub latency_warmup: Duration,
    /// The first end-to-end run's warm-up instead (at least
    /// `latency_warmup`): the broker is fresh, and its JVM compiles its hot
    /// paths over its first 20-30 s of load.
    pub broker_warmup: Duration,
    /// The end-to-end runs' topics: partitions of each.
    pub live_partitions: Vec<i32>,
}

impl ConsumerOptions {
    fn wants(&self, consumer: Consumer) -> bool {
        (self.only.is_empty() || self.only.iter().any(|t| t == consumer.tag()))
            && !(self.no_python && consumer.is_python())
            && !(self.no_java && consumer.is_java())
    }
}

/// Shared between a consumer and the bench: records applied (counted after
/// their commit), and when the first record was handed over.
#[derive(Clone, Default)]
pub(crate) struct Applied {
    pub count: Arc<AtomicU64>,
    /// walrelay's loop metrics, when the consumer is walrelay's.
    metrics: Arc<OnceLock<LoopMetrics>>,
    /// The consumer's process, when it runs in a child process.
    pid: python::Pid,
    first: Arc<OnceLock<Instant>>,
}

impl Applied {
    /// The consumer was handed a record (its first one counts).
    pub fn observe(&self) {
        let now = Instant::now();
        self.first.get_or_init(|| now);
    }
}

/// Runs the whole consumer bench: throughput on 4 and 1 partitions, then
/// latency at `options.rates`; and notes for the report (the Java rows
/// skipped, and why).
pub async fn run(
    env: &mut BenchEnv,
    options: &ConsumerOptions,
    first_seq: u64,
) -> Result<(Vec<ConsumerRun>, Vec<ConsumerLatencyRun>, Vec<String>)> {
    env.fresh_broker().await?;
    let env = &*env;
    let w = Workload::new(Kind::Messages, 100, 200, options.records);
    let python = python_interpreter(options).await?;
    let (java, notes) = java_classpath(options).await;
    let options = &ConsumerOptions {
        no_java: options.no_java || java.is_none(),
        ..options.clone()
    };
    // Each run's database is named with the next number of this count.
    let mut n = 0;
    let mut runs = Vec::new();
    let mut next = first_seq;
    if options.records > 0 {
        let topics = relay_topics(env, &w, first_seq).await?;
        next += w.events;
        let backlog = Backlog {
            topics: &topics,
            events: w.events,
            python: python.as_deref(),
            java: java.as_deref(),
        };
        warm_up(env, options, &backlog).await?;
        runs = drains(env, options, &backlog, &mut n).await?;
    }
    let programs = (python.as_deref(), java.as_deref());
    let lat = latencies(env, options, programs, &mut n, next).await?;
    Ok((runs, lat, notes))
}

/// The relayed topics of the throughput runs: (topic, its slot while it
/// was relayed, partitions).
type Topics = [(String, String, i32)];

/// What every throughput run drains: the relayed topics, the events in
/// each, and the interpreter for the Python consumers.
struct Backlog<'a> {
    topics: &'a Topics,
    events: u64,
    python: Option<&'a Path>,
    /// The Java consumers' classpath.
    java: Option<&'a str>,
}

/// One backlog of `w`, committed from `first_seq`, relayed by walrelay
/// into a 4-partition and a 1-partition topic; their slots are dropped.
async fn relay_topics(
    env: &BenchEnv,
    w: &Workload,
    first_seq: u64,
) -> Result<Vec<(String, String, i32)>> {
    let mut topics = Vec::new();
    for partitions in [4, 1] {
        let topic = format!("cons.p{partitions}");
        env.create_topic_with(&topic, partitions)?;
        let slot = format!("cons_p{partitions}");
        env.create_slot(&slot).await?;
        topics.push((topic, slot, partitions));
    }
    workload::generate_backlog(&env.client, w, first_seq).await?;
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
    Ok(topics)
}

/// The pinned virtualenv's interpreter, when a Python consumer is wanted.
async fn python_interpreter(options: &ConsumerOptions) -> Result<Option<PathBuf>> {
    let wanted = [
        Consumer::PythonBatch,
        Consumer::PythonRecord,
        Consumer::PythonInboxCareful,
        Consumer::PythonApplyLimit,
    ]
    .into_iter()
    .any(|c| options.wants(c));
    if !wanted {
        return Ok(None);
    }
    Ok(Some(python::venv_python().await?))
}

/// The Java consumers' classpath (`java/bench` built with Maven), when a
/// Java consumer is wanted; without a JDK or Maven, or when the build
/// fails, none, and a note saying the Java rows were skipped and why.
async fn java_classpath(options: &ConsumerOptions) -> (Option<String>, Vec<String>) {
    let wanted = CONSUMER_ORDER
        .into_iter()
        .any(|c| c.is_java() && options.wants(c));
    if !wanted {
        return (None, Vec::new());
    }
    match java::classpath().await {
        Ok(cp) => (Some(cp), Vec::new()),
        Err(why) => {
            let note = format!("skipped the Java consumer rows (java_*): {why}");
            tracing::warn!("{note}");
            (None, vec![note])
        }
    }
}

/// One unreported run before the repeats: the broker's JIT and the
/// fresh database warm up on it, not on whichever consumer the first
/// repeat measures first (that run was 20-30 % slower than the same
/// consumer's later repeats, and set the spread).
async fn warm_up(env: &BenchEnv, options: &ConsumerOptions, backlog: &Backlog<'_>) -> Result<()> {
    if options.repeats <= 1 {
        return Ok(());
    }
    let (Some(consumer), Some((topic, _, partitions))) = (
        CONSUMER_ORDER.into_iter().find(|c| options.wants(*c)),
        backlog.topics.first(),
    ) else {
        return Ok(());
    };
    let target = DrainTarget {
        topic,
        partitions: *partitions,
        db: &format!("cons_warmup_{}", consumer.tag()),
        python: backlog.python,
        java: backlog.java,
    };
    let run = drain(env, consumer, target, backlog.events, 0).await?;
    tracing::info!(
        "consumer bench: warm-up run ({} p{partitions}, not reported): {:.0} records/s",
        consumer.label(),
        run.records_per_s
    );
    Ok(())
}

/// Every wanted consumer drains each topic, in [`CONSUMER_ORDER`], each
/// repeat.
async fn drains(
    env: &BenchEnv,
    options: &ConsumerOptions,
    backlog: &Backlog<'_>,
    n: &mut u32,
) -> Result<Vec<ConsumerRun>> {
    let mut runs = Vec::new();
    for repeat in 0..options.repeats {
        for (topic, _, partitions) in backlog.topics {
            for consumer in CONSUMER_ORDER {
                if !options.wants(consumer) {
                    continue;
                }
                if *partitions == 1 && matches!(consumer, Consumer::Inbox1 | Consumer::Inbox500) {
                    // The slow inbox consumers are serial: their
                    // 1-partition run would repeat the 4-partition one.
                    continue;
                }
                *n += 1;
                let db = format!("cons_{}_{n}", consumer.tag());
                let target = DrainTarget {
                    topic,
                    partitions: *partitions,
                    db: &db,
                    python: backlog.python,
                    java: backlog.java,
                };
                let run = drain(env, consumer, target, backlog.events, repeat).await?;
                log_drain(&run);
                runs.push(run);
            }
        }
    }
    Ok(runs)
}

/// A drain run's lines in the log: where walrelay's loop spent its time,
/// and the run's numbers.
fn log_drain(run: &ConsumerRun) {
    let (consumer, partitions, repeat) = (run.consumer, run.partitions, run.repeat);
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
}

/// End to end under live load ([`live`]): per repeat, per topic shape
/// (each of `live_partitions`, keyless then keyed), the plain reference
/// and then each wanted library's batch consumer.
async fn latencies(
    env: &BenchEnv,
    options: &ConsumerOptions,
    (python, java): (Option<&Path>, Option<&str>),
    n: &mut u32,
    first_seq: u64,
) -> Result<Vec<ConsumerLatencyRun>> {
    let mut lat = Vec::new();
    if options.rates.is_empty() {
        return Ok(lat);
    }
    let mut next = first_seq;
    let first_n = *n + 1;
    for repeat in 0..options.repeats {
        for &partitions in &options.live_partitions {
            for keyed in [false, true] {
                let shape = Shape { partitions, keyed };
                for consumer in LIVE_CONSUMERS {
                    if !options.wants(consumer) {
                        continue;
                    }
                    *n += 1;
                    let warmup = if *n == first_n {
                        options.latency_warmup.max(options.broker_warmup)
                    } else {
                        options.latency_warmup
                    };
                    let run = LiveRun {
                        rates: &options.rates,
                        duration: options.latency_duration,
                        warmup,
                        python,
                        java,
                        repeat,
                        n: *n,
                    };
                    lat.extend(
                        live(env, consumer, shape, &run, &mut next)
                            .await
                            .with_context(|| {
                                format!("end to end, {} on {shape:?}", consumer.label())
                            })?,
                    );
                }
            }
        }
    }
    Ok(lat)
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
