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
//! * **ack**: walrelay runs in this process (`walrelay::engine::pipeline::run`) and
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
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;
use walrelay::config::{Config, MessageRoute, OutboxConfig};

use crate::env::BenchEnv;
use crate::polling::PollingOptions;
use crate::workload::{PREFIX, PUBLICATION};

mod load;
mod plain;
mod relay;
mod run;
pub mod stalls;

pub(crate) use load::{connect_clients, generate};
pub(crate) use plain::producer as plain_producer;
pub use run::run_mode;

/// The default unmeasured load before each mode's measured rates. Each
/// mode runs on a fresh broker, and a JVM broker compiles its hot paths
/// over its first 20-30 s of load: on two cores that compilation competes
/// with the path being measured. In one run, three back-to-back stretches
/// of 20 s at 5k/s after a 5 s warm-up gave p99s of 9.2, 7.3 and 7.2 ms
/// (plain producer), 13.7, 8.0 and 11.4 (walrelay, messages) and 38.2,
/// 10.3 and 8.5 (walrelay, outbox): the first stretch measures the
/// broker's warm-up, more so for the path with more processes in it (the
/// walsender and the relay).
pub const DEFAULT_WARMUP_SECONDS: f64 = 30.0;

/// An event waiting longer than this for its ack is part of a stall.
pub const STALL_MS: f64 = 50.0;

/// Clients the generator uses.
pub const CLIENTS: u64 = 4;

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
    /// The binary of the `wr_bin` mode, and the baseline's (`wr_base`).
    pub walrelay_bin: std::path::PathBuf,
    pub baseline_bin: Option<std::path::PathBuf>,
    /// Where the binaries' configurations and logs go.
    pub scratch: std::path::PathBuf,
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
