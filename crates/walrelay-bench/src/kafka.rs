//! Kafka clients of the bench: walrelay's producer settings for the other
//! producers, a counting reader, a timestamping consumer and the plain
//! rdkafka producer that gives the produce limit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};
use walrelay::kafka::properties::SinkConfig;

use crate::env::PARTITIONS;
use crate::workload::{seq_of_payload, Kind, Workload};

/// A producer configuration with exactly walrelay's effective properties
/// (idempotence, `acks=all`, gapless, `linger.ms`, batching, compression):
/// the other producers in the bench must not get an easier deal.
pub fn walrelay_producer_config(bootstrap: &str) -> Result<ClientConfig> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    for (k, v) in walrelay_producer_properties(bootstrap)? {
        c.set(k, v);
    }
    Ok(c)
}

/// The producer properties walrelay runs with by default (its
/// throughput defaults and enforced guarantees).
pub fn walrelay_producer_properties(
    bootstrap: &str,
) -> Result<std::collections::BTreeMap<String, String>> {
    SinkConfig::new(bootstrap, Default::default())
        .effective_properties()
        .context("walrelay's producer properties")
}

fn consumer_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("group.id", format!("walrelay-bench-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("allow.auto.create.topics", "false")
        .set("fetch.wait.max.ms", "5");
    c
}

fn assign_from_beginning(consumer: &BaseConsumer, topic: &str) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    Ok(())
}

/// What [`count_records`] read.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counted {
    pub records: u64,
    /// Bytes of walrelay's own headers (`idempotency-key` and every
    /// `walrelay-*`), names and values, over all of them.
    pub walrelay_header_bytes: u64,
}

/// Counts the records in `topic` by reading it (Tansu's watermarks are
/// wrong), and the bytes of walrelay's headers on them. Stops at `expect`
/// records, after `quiet` without a record once records have started to
/// arrive (Tansu can take several seconds to answer the first fetch of a
/// topic holding a million records), or at `timeout`. Blocking.
pub fn count_records(
    bootstrap: &str,
    topic: &str,
    expect: u64,
    quiet: Duration,
    timeout: Duration,
) -> Result<Counted> {
    let consumer: BaseConsumer = consumer_config(bootstrap).create()?;
    assign_from_beginning(&consumer, topic)?;
    let start = Instant::now();
    let mut last = start;
    let mut n = Counted::default();
    while n.records < expect
        && (n.records == 0 || last.elapsed() < quiet)
        && start.elapsed() < timeout
    {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                n.records += 1;
                if let Some(hs) = m.headers() {
                    n.walrelay_header_bytes += hs
                        .iter()
                        .filter(|h| walrelay::engine::record::header::is_reserved(h.key))
                        .map(|h| (h.key.len() + h.value.map_or(0, <[u8]>::len)) as u64)
                        .sum::<u64>();
                }
                last = Instant::now();
            }
            Some(Err(e)) => tracing::debug!("count {topic}: {e}"),
            None => {}
        }
    }
    Ok(n)
}

/// One record as the timestamping consumer saw it.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    pub seq: u64,
    /// The `idempotency-key` header, if there is one (walrelay's records).
    pub key: Option<u128>,
    pub at: Instant,
}

/// A consumer on its own thread that reads `topic` from the beginning and
/// timestamps every record on arrival (`fetch.wait.max.ms=5`).
pub struct TimestampingConsumer {
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub count: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl TimestampingConsumer {
    pub fn start(bootstrap: &str, topic: &str, kind: Kind) -> Result<TimestampingConsumer> {
        let consumer: BaseConsumer = consumer_config(bootstrap).create()?;
        assign_from_beginning(&consumer, topic)?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, c, st) = (seen.clone(), count.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("bench-consumer".into())
            .spawn(move || -> Result<()> {
                while !st.load(Ordering::Relaxed) {
                    let Some(msg) = consumer.poll(Duration::from_millis(50)) else {
                        continue;
                    };
                    let msg = match msg {
                        Ok(m) => m,
                        Err(e) => {
                            tracing::debug!("consumer: {e}");
                            continue;
                        }
                    };
                    let at = Instant::now();
                    let mut key = None;
                    let mut id = None;
                    if let Some(hs) = msg.headers() {
                        for h in hs.iter() {
                            let v = h.value.unwrap_or_default();
                            match h.key {
                                "idempotency-key" => {
                                    key = std::str::from_utf8(v)
                                        .ok()
                                        .and_then(|t| u128::from_str_radix(t, 16).ok())
                                }
                                "id" => {
                                    id = std::str::from_utf8(v).ok().and_then(|t| t.parse().ok())
                                }
                                _ => {}
                            }
                        }
                    }
                    let seq = match kind {
                        Kind::Messages => msg.payload().and_then(seq_of_payload),
                        Kind::Outbox => id,
                    };
                    let Some(seq) = seq else {
                        bail!("a record in {} without a sequence number", msg.topic());
                    };
                    s.lock().expect("lock").push(Seen { seq, key, at });
                    c.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })?;
        Ok(TimestampingConsumer {
            seen,
            count,
            stop,
            thread: Some(thread),
        })
    }

    pub fn stop(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => bail!("the consumer thread panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for TimestampingConsumer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Counting {
    acked: AtomicU64,
    failed: AtomicU64,
}

impl ClientContext for Counting {}

impl ProducerContext for Counting {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.acked.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// What [`produce_limit`] measured.
#[derive(Debug, Clone, Copy)]
pub struct ProduceRun {
    pub seconds: f64,
    pub cpu_seconds: f64,
}

/// Whose records the produce limit sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordShape {
    /// walrelay's: the lean header set with values of the same lengths,
    /// the partition walrelay picks.
    Walrelay,
    /// The Python relay's (`python_relay.py`): the `idempotency-key`
    /// header only, keyed outbox records and keyless messages placed by
    /// the producer's default partitioner.
    OneHeader,
}

/// The produce limit: a plain rdkafka producer with walrelay's settings
/// sends `w.events` records shaped like walrelay's or the Python relay's
/// ([`RecordShape`]; same value size, keyed by `aggregateid` for outbox
/// workloads, keyless for messages) and waits for every ack. Blocking.
pub fn produce_limit(
    bootstrap: &str,
    topic: &str,
    w: &Workload,
    shape: RecordShape,
) -> Result<ProduceRun> {
    let producer: BaseProducer<Counting> =
        walrelay_producer_config(bootstrap)?.create_with_context(Counting::default())?;
    let value = crate::workload::payload(0, w.payload);
    // As long as the drained relays' default source (their slots' names).
    let source = "7300000000000000000/postgres/wr_msg_100tx_200b_0";
    let cpu0 = crate::procstat::self_cpu_seconds()?;
    let t0 = Instant::now();
    let mut prev = vec![String::new(); PARTITIONS as usize];
    for i in 0..w.events {
        let tx = i / w.per_tx;
        let lsn = 0x1_0000_0000u64 + tx * 300;
        let key_hex = format!("{:016x}{:016x}", lsn, i % w.per_tx);
        let agg = format!("agg-{}", i % 1000);
        // Where walrelay puts it: one partition per keyless transaction,
        // murmur2 of the key for outbox rows.
        let partition = match w.kind {
            Kind::Messages => (tx % PARTITIONS as u64) as i32,
            Kind::Outbox => {
                walrelay::engine::partition::partition_for_key(agg.as_bytes(), PARTITIONS as u32)
                    as i32
            }
        };
        let mut headers = OwnedHeaders::new_with_capacity(6).insert(Header {
            key: "idempotency-key",
            value: Some(&key_hex),
        });
        let mut record: BaseRecord<'_, str, str> = BaseRecord::to(topic).payload(value.as_str());
        if shape == RecordShape::Walrelay {
            let layout = format!("{partition}/{PARTITIONS}/9f86d081884c7d65");
            let key = walrelay::engine::key::EventKey::new(lsn, i % w.per_tx);
            let prev_key = std::mem::replace(&mut prev[partition as usize], key.to_compact());
            headers = headers
                .insert(Header {
                    key: "walrelay-source",
                    value: Some(source),
                })
                .insert(Header {
                    key: "walrelay-layout",
                    value: Some(&layout),
                })
                .insert(Header {
                    key: "walrelay-prev",
                    value: Some(&prev_key),
                });
            record = record.partition(partition);
        }
        let id;
        match w.kind {
            Kind::Messages => {}
            Kind::Outbox if shape == RecordShape::OneHeader => record = record.key(&agg),
            Kind::Outbox => {
                id = i.to_string();
                headers = headers
                    .insert(Header {
                        key: "id",
                        value: Some(&id),
                    })
                    .insert(Header {
                        key: "type",
                        value: Some("Created"),
                    });
                record = record.key(&agg);
            }
        }
        let mut record = record.headers(headers);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
        if i % 1024 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    producer
        .flush(Duration::from_secs(120))
        .context("flushing the producer")?;
    let seconds = t0.elapsed().as_secs_f64();
    let cpu_seconds = crate::procstat::self_cpu_seconds()? - cpu0;
    let ctx = producer.context();
    let (acked, failed) = (
        ctx.acked.load(Ordering::Relaxed),
        ctx.failed.load(Ordering::Relaxed),
    );
    if acked != w.events || failed != 0 {
        bail!(
            "produce limit: {acked} of {} records acknowledged, {failed} failed",
            w.events
        );
    }
    Ok(ProduceRun {
        seconds,
        cpu_seconds,
    })
}
