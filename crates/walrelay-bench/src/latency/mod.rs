//! Latency under live load at fixed rates.
//!
//! Method (all timestamps from one monotonic clock, in this process):
//!
//! * **commit**: the generator's clients run one-event transactions
//!   (`synchronous_commit = on`, autocommit) and take the time right after
//!   the server's reply to each, i.e. when the application learns that its
//!   transaction committed. Rates are open loop: event `j` of a client is
//!   due at `start + j / rate_per_client`; a client that falls behind sends
//!   at once, and the achieved rate is reported.
//! * **ack**: walrelay runs in this process (`walrelay::pipeline::run`) and
//!   reports every Kafka delivery report on its trace channel; a task takes
//!   the time when it receives it. The polling relay takes it when each
//!   delivery future resolves.
//! * **the references** ([`plain`]): a plain rdkafka producer with
//!   walrelay's settings sends the same records at the same rate, alone
//!   (its "commit" is the moment it hands a record to librdkafka: what the
//!   broker costs) and as a dual write (it commits the event's transaction
//!   first, then sends: the same database load, and the floor of any relay
//!   that starts after the commit). Its ack is the delivery report.
//! * **consumer**: a consumer thread reading the topic (`fetch.wait.max.ms
//!   = 5`) takes the time when a record is returned to it.
//! * **Debezium** (`dbz`: the tuned variant, outbox rows through the Event
//!   Router, as its users mostly run it): Kafka Connect has no hook that
//!   tells another process when a record was acknowledged, so its "ack"
//!   is the consumer's receipt: its commit → ack column is commit →
//!   consumer, to be read against walrelay's commit → consumer.
//!
//! Events are joined by their sequence number (message content prefix,
//! outbox `id`); walrelay's acks carry the idempotency key, which the
//! consumer maps to the sequence number. The first event of each mode
//! (connection, metadata) and a warm-up of a few seconds at the first rate
//! (a fresh broker and relay are slow for their first seconds of load) are
//! not counted. Every run names its stalls ([`stalls`]): the windows of
//! commit time in which events waited longer than [`STALL_MS`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use walrelay::config::{Config, MessageRoute, OutboxConfig};
use walrelay::pipeline::{self, Trace};

use crate::env::BenchEnv;
use crate::kafka::TimestampingConsumer;
use crate::polling::{Acks, PollingOptions, PollingRelay};
use crate::workload::{Kind, PREFIX, PUBLICATION};

mod load;
mod plain;
pub mod stalls;

pub(crate) use load::{connect_clients, generate};

pub use stalls::Stall;

/// Who relays, and what the application writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mode {
    /// The reference: no database, a plain producer at the same rate.
    #[serde(rename = "plain producer, messages")]
    PlainProducer,
    /// The reference under the same database load: commit, then produce.
    #[serde(rename = "dual write, messages")]
    DualWrite,
    #[serde(rename = "walrelay, messages")]
    WalrelayMessages,
    #[serde(rename = "walrelay, outbox")]
    WalrelayOutbox,
    /// Messages with `linger.ms=20` instead of the default 5: fewer,
    /// larger produce requests (see docs/benchmarks.md, latency).
    #[serde(rename = "walrelay linger.ms=20, messages")]
    WalrelayMessagesLinger20,
    #[serde(rename = "polling, outbox")]
    PollingOutbox,
    /// Debezium's tuned variant, outbox rows through the Event Router;
    /// "ack" is the consumer's receipt (no ack hook).
    #[serde(rename = "debezium tuned, outbox")]
    DebeziumOutbox,
}

impl Mode {
    pub const ALL: [Mode; 7] = [
        Mode::PlainProducer,
        Mode::DualWrite,
        Mode::WalrelayMessages,
        Mode::WalrelayOutbox,
        Mode::WalrelayMessagesLinger20,
        Mode::PollingOutbox,
        Mode::DebeziumOutbox,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Mode::PlainProducer => "plain producer (reference)",
            Mode::DualWrite => "dual write: commit, then produce (reference)",
            Mode::WalrelayMessages => "walrelay, messages",
            Mode::WalrelayOutbox => "walrelay, outbox",
            Mode::WalrelayMessagesLinger20 => "walrelay linger.ms=20, messages",
            Mode::PollingOutbox => "polling relay, outbox",
            Mode::DebeziumOutbox => "Debezium tuned, outbox (ack = consumer's receipt)",
        }
    }

    pub fn kind(self) -> Kind {
        match self {
            Mode::PlainProducer
            | Mode::DualWrite
            | Mode::WalrelayMessages
            | Mode::WalrelayMessagesLinger20 => Kind::Messages,
            Mode::WalrelayOutbox | Mode::PollingOutbox | Mode::DebeziumOutbox => Kind::Outbox,
        }
    }

    /// The mode's short name (`--latency-modes`, topic and slot names).
    pub fn tag(self) -> &'static str {
        match self {
            Mode::PlainProducer => "plain",
            Mode::DualWrite => "dual",
            Mode::WalrelayMessages => "wr_msg",
            Mode::WalrelayOutbox => "wr_outbox",
            Mode::WalrelayMessagesLinger20 => "wr_msg_l20",
            Mode::PollingOutbox => "poll_outbox",
            Mode::DebeziumOutbox => "dbz",
        }
    }
}

/// Percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    pub(crate) fn of(h: &Histogram<u64>) -> Percentiles {
        let ms = |us: u64| us as f64 / 1000.0;
        Percentiles {
            p50: ms(h.value_at_quantile(0.5)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        }
    }
}

/// One mode at one rate.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyRun {
    pub mode: Mode,
    pub repeat: u32,
    /// Events per second asked for; `None` is "as fast as the generator
    /// can".
    pub target_rate: Option<u64>,
    pub achieved_rate: f64,
    pub events: u64,
    pub commit_to_ack: Percentiles,
    pub commit_to_consumer: Percentiles,
    /// Events acknowledged before the client had its commit reply (counted
    /// as 0 ms).
    pub ack_before_commit_reply: u64,
    /// The windows of commit time whose events waited longer than
    /// [`STALL_MS`] for their ack (the slowest few, in time order).
    #[serde(default)]
    pub ack_stalls: Vec<Stall>,
}

/// An event waiting longer than this for its ack is part of a stall.
pub const STALL_MS: f64 = 50.0;

/// Clients the generator uses.
pub const CLIENTS: u64 = 4;
const SETTLE_TIMEOUT: Duration = Duration::from_secs(180);

/// How the latency runs are done (the same for every mode).
#[derive(Debug, Clone)]
pub struct LatencyOptions {
    /// Events/s; `None` is as fast as the generator can.
    pub rates: Vec<Option<u64>>,
    /// Live load per rate.
    pub duration: Duration,
    pub polling: PollingOptions,
    pub payload_size: usize,
    /// Extra librdkafka properties for walrelay's producer.
    pub kafka_properties: Vec<(String, String)>,
    /// Live load at the first rate before the measured rates, not counted.
    pub warmup: Duration,
}

/// Runs `mode` at each rate for `duration`, with a fresh slot (walrelay)
/// or an empty table (polling) and a fresh topic.
pub async fn run_mode(
    env: &BenchEnv,
    mode: Mode,
    repeat: u32,
    options: &LatencyOptions,
) -> Result<Vec<LatencyRun>> {
    let LatencyOptions {
        rates,
        duration,
        polling,
        payload_size,
        kafka_properties,
        warmup,
    } = options;
    let (duration, polling, payload_size) = (*duration, *polling, *payload_size);
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
    let bootstrap = env.bootstrap();
    let consumer = TimestampingConsumer::start(&bootstrap, &topic, mode.kind())?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let wal_acks: Arc<Mutex<Vec<(u128, Instant)>>> = Arc::default();
    let poll_acks: Acks = Arc::default();
    let ack_count = Arc::new(AtomicU64::new(0));
    let slot = format!("lat_{tag}");
    let plain_producer = match mode {
        Mode::PlainProducer | Mode::DualWrite => Some(plain::producer(&bootstrap)?),
        _ => None,
    };
    let relay = match mode {
        Mode::PlainProducer | Mode::DualWrite => {
            // Nothing relays: the generator produces itself.
            let mut stop = stop_rx;
            tokio::spawn(async move {
                while !*stop.borrow() {
                    if stop.changed().await.is_err() {
                        break;
                    }
                }
                Ok(())
            })
        }
        Mode::WalrelayMessages | Mode::WalrelayOutbox | Mode::WalrelayMessagesLinger20 => {
            env.create_slot(&slot).await?;
            let mut c = relay_config(env, &slot, &topic, kafka_properties);
            if mode == Mode::WalrelayMessagesLinger20 {
                c.kafka.properties.insert("linger.ms".into(), "20".into());
            }
            let (trace_tx, mut trace_rx) = mpsc::unbounded_channel();
            let (acks, count) = (wal_acks.clone(), ack_count.clone());
            tokio::spawn(async move {
                while let Some(t) = trace_rx.recv().await {
                    if let Trace::Acked { key, .. } = t {
                        acks.lock().expect("lock").push((key.0, Instant::now()));
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
            tokio::spawn(async move {
                pipeline::run(c, stop_rx, Some(trace_tx))
                    .await
                    .map_err(anyhow::Error::from)
            })
        }
        Mode::PollingOutbox => {
            let mut relay =
                PollingRelay::new(env.new_client().await?, &bootstrap, &topic, polling)?;
            let acks = poll_acks.clone();
            tokio::spawn(async move { relay.run(stop_rx, acks).await })
        }
        Mode::DebeziumOutbox => {
            let mut worker = crate::debezium::LatencyWorker::start(env, &slot).await?;
            // Holds the worker: fails when its JVM exits, stops it at the
            // stop (SIGTERM).
            let mut stop = stop_rx;
            tokio::spawn(async move {
                while !*stop.borrow() {
                    tokio::select! {
                        changed = stop.changed() => if changed.is_err() { break },
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {
                            if worker.exited()? {
                                bail!("the Debezium worker exited");
                            }
                        }
                    }
                }
                worker.stop()
            })
        }
    };
    // Acks: the polling relay's list, or walrelay's count from the trace.
    let polled = matches!(
        mode,
        Mode::PollingOutbox | Mode::PlainProducer | Mode::DualWrite
    );
    let by_consumer = mode == Mode::DebeziumOutbox;
    let acked = || -> u64 {
        if polled {
            poll_acks.lock().expect("lock").len() as u64
        } else if by_consumer {
            consumer.count.load(Ordering::Relaxed)
        } else {
            ack_count.load(Ordering::Relaxed)
        }
    };

    let result = async {
        let clients = connect_clients(env).await?;
        // Warm-up: one event, seen by the consumer.
        let mut next_seq = 1u64;
        let mut expected = 0u64;
        let load = |rate: Option<u64>, duration: Duration, first: u64, n_clients: u64| {
            let (clients, topic, poll_acks) = (&clients, &topic, &poll_acks);
            let plain_producer = plain_producer.as_ref();
            async move {
                Ok::<_, anyhow::Error>(match (plain_producer, rate) {
                    (Some(p), Some(rate)) => Some(
                        plain::generate(
                            p,
                            (mode == Mode::DualWrite).then_some(clients.as_slice()),
                            topic,
                            payload_size,
                            rate,
                            duration,
                            first,
                            n_clients,
                            poll_acks,
                        )
                        .await?,
                    ),
                    // "As fast as it can" has no meaning for a producer
                    // that waits for nothing.
                    (Some(_), None) => None,
                    (None, _) => Some(
                        generate(
                            clients,
                            mode.kind(),
                            payload_size,
                            rate,
                            duration,
                            first,
                            n_clients,
                        )
                        .await?,
                    ),
                })
            }
        };
        let warm = match &plain_producer {
            Some(_) => load(Some(1000), Duration::from_millis(1), next_seq, 1).await?,
            None => load(None, Duration::ZERO, next_seq, 1).await?,
        }
        .unwrap_or_default();
        expected += warm.len() as u64;
        next_seq += 1;
        settle(&consumer, &acked, expected, &relay).await?;

        // The first seconds of load on a fresh broker, topic and relay are
        // slow for every mode, the plain producer too (60-200 ms for 2-5 s
        // on Kafka: the JVM compiling the paths this load takes): a warm-up
        // at the first rate, not counted.
        if !warmup.is_zero() {
            let rate = rates.first().copied().flatten().unwrap_or(1000);
            let t = Instant::now();
            let commits = load(Some(rate), *warmup, next_seq, CLIENTS)
                .await?
                .unwrap_or_default();
            next_seq = commits.iter().map(|c| c.0).max().unwrap_or(next_seq) + 1;
            expected += commits.len() as u64;
            settle(&consumer, &acked, expected, &relay).await?;
            let acks = acks_by_seq(polled, by_consumer, &poll_acks, &wal_acks, &consumer);
            let commit_at: HashMap<u64, Instant> = commits.into_iter().collect();
            let (h, _) = histogram(&commit_at, &acks)?;
            tracing::info!(
                "latency {}: warm-up at {rate}/s for {:.1} s, ack p50 {:.1} / p99 {:.1} ms (not counted)",
                mode.label(),
                t.elapsed().as_secs_f64(),
                Percentiles::of(&h).p50,
                Percentiles::of(&h).p99
            );
        }

        let mut runs = Vec::new();
        for &rate in rates {
            let t = Instant::now();
            let Some(commits) = load(rate, duration, next_seq, CLIENTS).await? else {
                continue;
            };
            let elapsed = t.elapsed().as_secs_f64();
            let events = commits.len() as u64;
            next_seq = commits.iter().map(|c| c.0).max().unwrap_or(next_seq) + 1;
            expected += events;
            settle(&consumer, &acked, expected, &relay).await?;

            let seen = consumer.seen.lock().expect("lock").clone();
            let acks = acks_by_seq(polled, by_consumer, &poll_acks, &wal_acks, &consumer);
            let commit_at: HashMap<u64, Instant> = commits.into_iter().collect();
            let (ack_h, early) = histogram(&commit_at, &acks)?;
            let consumed: Vec<(u64, Instant)> = seen.iter().map(|s| (s.seq, s.at)).collect();
            let (cons_h, _) = histogram(&commit_at, &consumed)?;
            let waits: Vec<(f64, f64)> = acks
                .iter()
                .filter_map(|(seq, at)| {
                    let c = commit_at.get(seq)?;
                    let wait = at.saturating_duration_since(*c).as_secs_f64() * 1000.0;
                    Some((c.saturating_duration_since(t).as_secs_f64(), wait))
                })
                .collect();
            let ack_stalls = stalls::find(&waits, STALL_MS, 0.1, 8);
            if let Ok(dir) = std::env::var("WALRELAY_BENCH_LATENCY_CSV") {
                write_waits_csv(&dir, &tag, rate, &waits)?;
            }
            if ack_h.len() != events || cons_h.len() != events {
                bail!(
                    "{}: {} events committed, {} acks and {} consumed records matched",
                    mode.label(),
                    events,
                    ack_h.len(),
                    cons_h.len()
                );
            }
            runs.push(LatencyRun {
                mode,
                repeat,
                target_rate: rate,
                achieved_rate: events as f64 / elapsed,
                events,
                commit_to_ack: Percentiles::of(&ack_h),
                commit_to_consumer: Percentiles::of(&cons_h),
                ack_before_commit_reply: early,
                ack_stalls,
            });
            tracing::info!(
                "latency {} rate {:?}: {} events, {:.0}/s, ack p99 {:.2} ms",
                mode.label(),
                rate,
                events,
                events as f64 / elapsed,
                Percentiles::of(&ack_h).p99
            );
        }
        Ok(runs)
    }
    .await;

    stop_tx.send(true).ok();
    let relay_result = tokio::time::timeout(Duration::from_secs(60), relay)
        .await
        .context("the relay did not stop within 60 s")?;
    consumer.stop()?;
    if mode == Mode::DebeziumOutbox {
        // Its walsender may hold the slot for a moment after the stop.
        crate::debezium::drop_slot_when_free(env, &slot).await?;
    } else if !polled {
        env.drop_slot(&slot).await?;
    }
    let runs = result?;
    relay_result.context("relay task panicked")??;
    Ok(runs)
}

/// Acks by sequence number: the polling relay's and the plain producer's
/// as they are, walrelay's (by idempotency key) through the consumer's
/// records, and with `by_consumer` (Debezium: no ack hook) the consumer's
/// receipts.
fn acks_by_seq(
    polled: bool,
    by_consumer: bool,
    poll_acks: &Acks,
    wal_acks: &Mutex<Vec<(u128, Instant)>>,
    consumer: &TimestampingConsumer,
) -> Vec<(u64, Instant)> {
    if polled {
        return poll_acks.lock().expect("lock").clone();
    }
    if by_consumer {
        return consumer
            .seen
            .lock()
            .expect("lock")
            .iter()
            .map(|s| (s.seq, s.at))
            .collect();
    }
    let by_key: HashMap<u128, u64> = consumer
        .seen
        .lock()
        .expect("lock")
        .iter()
        .filter_map(|s| s.key.map(|k| (k, s.seq)))
        .collect();
    wal_acks
        .lock()
        .expect("lock")
        .iter()
        .filter_map(|(k, at)| by_key.get(k).map(|seq| (*seq, *at)))
        .collect()
}

/// Every event's (commit time after the rate's start, ms to its ack) as
/// CSV in `dir`, for a closer look at a run (`WALRELAY_BENCH_LATENCY_CSV`).
fn write_waits_csv(dir: &str, tag: &str, rate: Option<u64>, waits: &[(f64, f64)]) -> Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let rate = rate.map_or("max".to_string(), |r| r.to_string());
    let path = std::path::Path::new(dir).join(format!("{tag}_{rate}.csv"));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
    writeln!(f, "commit_s,ack_ms")?;
    let mut sorted = waits.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (at, ms) in sorted {
        writeln!(f, "{at:.4},{ms:.3}")?;
    }
    Ok(())
}

/// walrelay's configuration for the bench: `slot` of the bench
/// publication, the raw route and the outbox table both to `topic`,
/// status updates every 100 ms, and extra producer properties.
pub(crate) fn relay_config(
    env: &BenchEnv,
    slot: &str,
    topic: &str,
    kafka_properties: &[(String, String)],
) -> Config {
    let mut c = Config::default();
    c.postgres.url = env.url();
    c.postgres.slot = slot.to_owned();
    c.postgres.publication = PUBLICATION.into();
    c.postgres.status_interval = Duration::from_millis(100);
    c.kafka.bootstrap_servers = env.bootstrap();
    c.kafka.properties.extend(kafka_properties.iter().cloned());
    c.messages.push(MessageRoute {
        prefix: PREFIX.into(),
        topic: topic.to_owned(),
    });
    c.outbox.push(OutboxConfig {
        table: crate::workload::OUTBOX_TABLE.into(),
        topic: topic.to_owned(),
        columns: Default::default(),
    });
    c
}

/// Records `at - commit` per event in microseconds; events timestamped
/// before the commit reply count as 0 and are counted.
pub(crate) fn histogram(
    commits: &HashMap<u64, Instant>,
    at: &[(u64, Instant)],
) -> Result<(Histogram<u64>, u64)> {
    let mut h = Histogram::<u64>::new_with_max(600_000_000, 3)?;
    let mut early = 0;
    for (seq, t) in at {
        let Some(c) = commits.get(seq) else { continue };
        let us = match t.checked_duration_since(*c) {
            Some(d) => d.as_micros() as u64,
            None => {
                early += 1;
                0
            }
        };
        h.saturating_record(us);
    }
    Ok((h, early))
}

/// Waits until the relay acknowledged and the consumer saw `expected`
/// events (or the relay failed).
async fn settle(
    consumer: &TimestampingConsumer,
    acked: &impl Fn() -> u64,
    expected: u64,
    relay: &tokio::task::JoinHandle<Result<()>>,
) -> Result<()> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let seen = consumer.count.load(Ordering::Relaxed);
        let a = acked();
        if seen >= expected && a >= expected {
            return Ok(());
        }
        if relay.is_finished() {
            bail!("the relay stopped early ({a} acks, {seen} consumed, {expected} expected)");
        }
        if Instant::now() >= deadline {
            bail!("not settled within {SETTLE_TIMEOUT:?}: {a} acks, {seen} consumed, {expected} expected");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
