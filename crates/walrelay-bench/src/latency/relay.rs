//! What carries a latency run's events to Kafka, per mode family: nothing
//! (the reference producer sends them itself), walrelay in this process,
//! the polling relay or a Debezium worker; and where each one's acks are.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::producer::FutureProducer;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use walrelay::engine::pipeline::{self, Trace};

use super::{plain, relay_config, LatencyOptions};
use crate::env::BenchEnv;
use crate::kafka::TimestampingConsumer;
use crate::polling::{Acks, PollingOptions, PollingRelay};
use crate::runs::Mode;

/// A mode's relay, started: its task (it runs until the stop), where its
/// acks are, and the reference producer where the application sends the
/// records itself.
pub(super) struct Relay {
    pub task: JoinHandle<Result<()>>,
    pub acks: AckSource,
    pub reference: Option<Reference>,
}

/// The reference producer, and the list its delivery reports go to.
pub(super) struct Reference {
    pub producer: FutureProducer,
    pub acks: Acks,
}

/// Where a mode's acks are.
pub(super) enum AckSource {
    /// The polling relay's or the plain producer's list, by sequence
    /// number.
    Listed(Acks),
    /// walrelay's trace: its acks by idempotency key, and their count;
    /// and when each record was handed to the producer.
    Traced {
        acks: Arc<Mutex<Vec<(u128, Instant)>>>,
        count: Arc<AtomicU64>,
        produced: Arc<Mutex<Vec<(u128, Instant)>>>,
    },
    /// Debezium has no ack hook: the consumer's receipts.
    Received,
}

impl AckSource {
    /// Acks so far: the polling relay's list, the consumer's count, or
    /// walrelay's count from the trace.
    pub fn count(&self, consumer: &TimestampingConsumer) -> u64 {
        match self {
            AckSource::Listed(acks) => acks.lock().expect("lock").len() as u64,
            AckSource::Received => consumer.count.load(Ordering::Relaxed),
            AckSource::Traced { count, .. } => count.load(Ordering::Relaxed),
        }
    }

    /// Acks by sequence number: the polling relay's and the plain
    /// producer's as they are, walrelay's (by idempotency key) through the
    /// consumer's records, and Debezium's (no ack hook) the consumer's
    /// receipts.
    pub fn by_seq(&self, consumer: &TimestampingConsumer) -> Vec<(u64, Instant)> {
        let wal_acks = match self {
            AckSource::Listed(acks) => return acks.lock().expect("lock").clone(),
            AckSource::Received => {
                return consumer
                    .seen
                    .lock()
                    .expect("lock")
                    .iter()
                    .map(|s| (s.seq, s.at))
                    .collect();
            }
            AckSource::Traced { acks, .. } => acks,
        };
        by_seq(wal_acks, consumer)
    }

    /// When walrelay handed each event to its producer, by sequence
    /// number; `None` for the other modes.
    pub fn produced_by_seq(&self, consumer: &TimestampingConsumer) -> Option<Vec<(u64, Instant)>> {
        match self {
            AckSource::Traced { produced, .. } => Some(by_seq(produced, consumer)),
            _ => None,
        }
    }
}

/// walrelay's trace times (by idempotency key) by sequence number, through
/// the consumer's records.
fn by_seq(
    by_key_times: &Mutex<Vec<(u128, Instant)>>,
    consumer: &TimestampingConsumer,
) -> Vec<(u64, Instant)> {
    let by_key: HashMap<u128, u64> = consumer
        .seen
        .lock()
        .expect("lock")
        .iter()
        .filter_map(|s| s.key.map(|k| (k, s.seq)))
        .collect();
    by_key_times
        .lock()
        .expect("lock")
        .iter()
        .filter_map(|(k, at)| by_key.get(k).map(|seq| (*seq, *at)))
        .collect()
}

/// Starts what relays in `mode` into `topic` (walrelay and Debezium on
/// `slot`, which walrelay's start creates); it runs until `stop`.
pub(super) async fn start(
    env: &BenchEnv,
    mode: Mode,
    slot: &str,
    topic: &str,
    options: &LatencyOptions,
    stop: watch::Receiver<bool>,
) -> Result<Relay> {
    match mode {
        Mode::PlainProducer | Mode::DualWrite => reference(env, stop),
        Mode::WalrelayMessages | Mode::WalrelayOutbox | Mode::WalrelayMessagesLinger20 => {
            walrelay(env, mode, slot, topic, &options.kafka_properties, stop).await
        }
        Mode::PollingOutbox => polling(env, topic, options.polling, stop).await,
        Mode::DebeziumOutbox => debezium(env, slot, stop).await,
        Mode::WalrelayBinary | Mode::BaselineBinary => {
            let bin = match mode {
                Mode::BaselineBinary => options
                    .baseline_bin
                    .as_deref()
                    .context("the baseline's latency mode needs --baseline-bin")?,
                _ => options.walrelay_bin.as_path(),
            };
            binary(env, bin, slot, topic, options, stop).await
        }
    }
}

/// A walrelay binary as its own process on a fresh `slot` (the bench's
/// configuration, as the drains run it); acks are the consumer's
/// receipts (an older build has no trace of its own to read). It stops
/// at SIGTERM and must exit 0.
async fn binary(
    env: &BenchEnv,
    bin: &Path,
    slot: &str,
    topic: &str,
    options: &LatencyOptions,
    stop: watch::Receiver<bool>,
) -> Result<Relay> {
    env.create_slot(slot).await?;
    let config = options.scratch.join(format!("latency-{slot}.toml"));
    crate::drain::write_walrelay_config(
        &config,
        env,
        slot,
        topic,
        topic,
        &options.kafka_properties,
        true,
    )?;
    let log = options.scratch.join(format!("latency-{slot}.log"));
    let logf = std::fs::File::create(&log)?;
    let mut child = std::process::Command::new(bin)
        .arg("--config")
        .arg(&config)
        .args(["--log", "warn"])
        .arg("run")
        .stdin(std::process::Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut stop = stop;
    let task = tokio::spawn(async move {
        let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
        while !*stop.borrow() {
            tokio::select! {
                changed = stop.changed() => if changed.is_err() { break },
                _ = tokio::time::sleep(Duration::from_millis(200)) => {
                    if let Some(status) = child.try_wait()? {
                        bail!("walrelay exited early ({status}): {}", log_text());
                    }
                }
            }
        }
        let pid = child.id().to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()?;
        let status = tokio::task::spawn_blocking(move || child.wait()).await??;
        if !status.success() {
            bail!("walrelay did not stop cleanly ({status}): {}", log_text());
        }
        Ok(())
    });
    Ok(Relay {
        task,
        acks: AckSource::Received,
        reference: None,
    })
}

/// The references: nothing relays, the generator produces itself with
/// the plain producer; its task only waits for the stop.
fn reference(env: &BenchEnv, stop: watch::Receiver<bool>) -> Result<Relay> {
    let reference = Reference {
        producer: plain::producer(&env.bootstrap())?,
        acks: Acks::default(),
    };
    let mut stop = stop;
    let task = tokio::spawn(async move {
        while !*stop.borrow() {
            if stop.changed().await.is_err() {
                break;
            }
        }
        Ok(())
    });
    Ok(Relay {
        task,
        acks: AckSource::Listed(reference.acks.clone()),
        reference: Some(reference),
    })
}

/// walrelay in this process on a fresh `slot` (`linger.ms=20` for that
/// mode), its acks taken from its trace channel as they arrive.
async fn walrelay(
    env: &BenchEnv,
    mode: Mode,
    slot: &str,
    topic: &str,
    kafka_properties: &[(String, String)],
    stop: watch::Receiver<bool>,
) -> Result<Relay> {
    env.create_slot(slot).await?;
    let mut c = relay_config(env, slot, topic, kafka_properties);
    if mode == Mode::WalrelayMessagesLinger20 {
        c.kafka.properties.insert("linger.ms".into(), "20".into());
    }
    let wal_acks: Arc<Mutex<Vec<(u128, Instant)>>> = Arc::default();
    let ack_count = Arc::new(AtomicU64::new(0));
    let wal_produced: Arc<Mutex<Vec<(u128, Instant)>>> = Arc::default();
    let (trace_tx, mut trace_rx) = mpsc::unbounded_channel();
    let (acks, count, produced) = (wal_acks.clone(), ack_count.clone(), wal_produced.clone());
    tokio::spawn(async move {
        while let Some(t) = trace_rx.recv().await {
            match t {
                Trace::Acked { key, .. } => {
                    acks.lock().expect("lock").push((key.0, Instant::now()));
                    count.fetch_add(1, Ordering::Relaxed);
                }
                Trace::Produced { key, .. } => {
                    produced.lock().expect("lock").push((key.0, Instant::now()));
                }
                _ => {}
            }
        }
    });
    let task = tokio::spawn(async move {
        pipeline::run(c, stop, Some(trace_tx))
            .await
            .map_err(anyhow::Error::from)
    });
    Ok(Relay {
        task,
        acks: AckSource::Traced {
            acks: wal_acks,
            count: ack_count,
            produced: wal_produced,
        },
        reference: None,
    })
}

/// The polling relay on the (emptied) outbox table; it lists its acks.
async fn polling(
    env: &BenchEnv,
    topic: &str,
    options: PollingOptions,
    stop: watch::Receiver<bool>,
) -> Result<Relay> {
    let mut relay = PollingRelay::new(env.new_client().await?, &env.bootstrap(), topic, options)?;
    let poll_acks = Acks::default();
    let acks = poll_acks.clone();
    let task = tokio::spawn(async move { relay.run(stop, acks).await });
    Ok(Relay {
        task,
        acks: AckSource::Listed(poll_acks),
        reference: None,
    })
}

/// The tuned Debezium worker on `slot`; acks are the consumer's receipts.
async fn debezium(env: &BenchEnv, slot: &str, stop: watch::Receiver<bool>) -> Result<Relay> {
    let mut worker = crate::debezium::LatencyWorker::start(env, slot).await?;
    // Holds the worker: fails when its JVM exits, stops it at the
    // stop (SIGTERM).
    let mut stop = stop;
    let task = tokio::spawn(async move {
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
    });
    Ok(Relay {
        task,
        acks: AckSource::Received,
        reference: None,
    })
}
