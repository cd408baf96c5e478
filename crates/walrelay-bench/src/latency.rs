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
//! * **consumer**: a consumer thread reading the topic (`fetch.wait.max.ms
//!   = 5`) takes the time when a record is returned to it.
//!
//! Events are joined by their sequence number (message content prefix,
//! outbox `id`); walrelay's acks carry the idempotency key, which the
//! consumer maps to the sequence number. The first event of each mode is a
//! warm-up (connection, metadata) and is not counted.

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
use crate::workload::{payload, Kind, PREFIX, PUBLICATION};

/// Who relays, and what the application writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mode {
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
}

impl Mode {
    pub const ALL: [Mode; 4] = [
        Mode::WalrelayMessages,
        Mode::WalrelayOutbox,
        Mode::WalrelayMessagesLinger20,
        Mode::PollingOutbox,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Mode::WalrelayMessages => "walrelay, messages",
            Mode::WalrelayOutbox => "walrelay, outbox",
            Mode::WalrelayMessagesLinger20 => "walrelay linger.ms=20, messages",
            Mode::PollingOutbox => "polling relay, outbox",
        }
    }

    pub fn kind(self) -> Kind {
        match self {
            Mode::WalrelayMessages | Mode::WalrelayMessagesLinger20 => Kind::Messages,
            Mode::WalrelayOutbox | Mode::PollingOutbox => Kind::Outbox,
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Mode::WalrelayMessages => "wr_msg",
            Mode::WalrelayOutbox => "wr_outbox",
            Mode::WalrelayMessagesLinger20 => "wr_msg_l20",
            Mode::PollingOutbox => "poll_outbox",
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
}

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
    } = options;
    let (duration, polling, payload_size) = (*duration, *polling, *payload_size);
    // A checkpoint first, so that one started by the drains before does
    // not land in the middle of a measurement.
    env.client
        .batch_execute("TRUNCATE bench_outbox; CHECKPOINT")
        .await?;
    let tag = format!("{}_{repeat}", mode.tag());
    let topic = format!("lat.{tag}");
    env.create_topic(&topic)?;
    let bootstrap = env.bootstrap();
    let consumer = TimestampingConsumer::start(&bootstrap, &topic, mode.kind())?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let wal_acks: Arc<Mutex<Vec<(u128, Instant)>>> = Arc::default();
    let poll_acks: Acks = Arc::default();
    let ack_count = Arc::new(AtomicU64::new(0));
    let slot = format!("lat_{tag}");
    let relay = match mode {
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
    };
    // Acks: the polling relay's list, or walrelay's count from the trace.
    let polled = matches!(mode, Mode::PollingOutbox);
    let acked = || -> u64 {
        if polled {
            poll_acks.lock().expect("lock").len() as u64
        } else {
            ack_count.load(Ordering::Relaxed)
        }
    };

    let result = async {
        let clients = connect_clients(env).await?;
        // Warm-up: one event, seen by the consumer.
        let mut next_seq = 1u64;
        let mut expected = 0u64;
        let warm = generate(
            &clients,
            mode.kind(),
            payload_size,
            None,
            Duration::ZERO,
            next_seq,
            1,
        )
        .await?;
        expected += warm.len() as u64;
        next_seq += 1;
        settle(&consumer, &acked, expected, &relay).await?;

        let mut runs = Vec::new();
        for &rate in rates {
            let t = Instant::now();
            let commits = generate(
                &clients,
                mode.kind(),
                payload_size,
                rate,
                duration,
                next_seq,
                CLIENTS,
            )
            .await?;
            let elapsed = t.elapsed().as_secs_f64();
            let events = commits.len() as u64;
            next_seq = commits.iter().map(|c| c.0).max().unwrap_or(next_seq) + 1;
            expected += events;
            settle(&consumer, &acked, expected, &relay).await?;

            let seen = consumer.seen.lock().expect("lock").clone();
            let acks: Vec<(u64, Instant)> = if polled {
                poll_acks.lock().expect("lock").clone()
            } else {
                let by_key: HashMap<u128, u64> = seen
                    .iter()
                    .filter_map(|s| s.key.map(|k| (k, s.seq)))
                    .collect();
                wal_acks
                    .lock()
                    .expect("lock")
                    .iter()
                    .filter_map(|(k, at)| by_key.get(k).map(|seq| (*seq, *at)))
                    .collect()
            };
            let commit_at: HashMap<u64, Instant> = commits.into_iter().collect();
            let (ack_h, early) = histogram(&commit_at, &acks)?;
            let consumed: Vec<(u64, Instant)> = seen.iter().map(|s| (s.seq, s.at)).collect();
            let (cons_h, _) = histogram(&commit_at, &consumed)?;
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
    if !polled {
        env.drop_slot(&slot).await?;
    }
    let runs = result?;
    relay_result.context("relay task panicked")??;
    Ok(runs)
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

pub(crate) async fn connect_clients(env: &BenchEnv) -> Result<Vec<tokio_postgres::Client>> {
    let mut v = Vec::new();
    for _ in 0..CLIENTS {
        let c = env.new_client().await?;
        c.batch_execute("SET synchronous_commit = on").await?;
        v.push(c);
    }
    Ok(v)
}

/// Runs one-event transactions on `clients` (the first `n_clients`) at
/// `rate` events/s in total (or as fast as possible) for `duration`;
/// `duration` zero means one event per client. Returns (sequence number,
/// commit-reply time) per event.
pub(crate) async fn generate(
    clients: &[tokio_postgres::Client],
    kind: Kind,
    size: usize,
    rate: Option<u64>,
    duration: Duration,
    first: u64,
    n_clients: u64,
) -> Result<Vec<(u64, Instant)>> {
    let start = tokio::time::Instant::now();
    let end = start + duration;
    let tasks = clients
        .iter()
        .take(n_clients as usize)
        .enumerate()
        .map(|(i, c)| {
            let i = i as u64;
            async move {
                let stmt = match kind {
                Kind::Messages => {
                    c.prepare(&format!(
                        "SELECT pg_logical_emit_message(true, '{PREFIX}', $1::text)"
                    ))
                    .await?
                }
                Kind::Outbox => {
                    c.prepare(
                        "INSERT INTO bench_outbox (id, aggregatetype, aggregateid, type, payload) \
                         VALUES ($1, 'bench', $2, 'Created', $3)",
                    )
                    .await?
                }
            };
                let mut out = Vec::new();
                let gap = rate.map(|r| Duration::from_secs_f64(n_clients as f64 / r as f64));
                for j in 0u64.. {
                    let now = tokio::time::Instant::now();
                    if duration.is_zero() {
                        if j == 1 {
                            break;
                        }
                    } else if now >= end {
                        break;
                    }
                    if let Some(gap) = gap {
                        let due = start + gap.mul_f64(j as f64);
                        if due >= end {
                            break;
                        }
                        tokio::time::sleep_until(due).await;
                    }
                    let seq = first + j * n_clients + i;
                    let body = payload(seq, size);
                    match kind {
                        Kind::Messages => {
                            c.execute(&stmt, &[&body]).await?;
                        }
                        Kind::Outbox => {
                            let agg = format!("agg-{}", seq % 1000);
                            c.execute(&stmt, &[&(seq as i64), &agg, &body]).await?;
                        }
                    }
                    out.push((seq, Instant::now()));
                }
                anyhow::Ok(out)
            }
        });
    let mut all = Vec::new();
    for r in futures_util::future::join_all(tasks).await {
        all.extend(r?);
    }
    Ok(all)
}
