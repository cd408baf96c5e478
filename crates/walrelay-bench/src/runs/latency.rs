//! A latency run's row: the relay and workload it measured ([`Mode`]),
//! its percentiles and its stalls. The latency runs (`latency`) fill it;
//! the report reads it.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::workload::Kind;

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
    /// `--walrelay-bin` run as its own process (as users run it), messages;
    /// "ack" is the consumer's receipt. With [`Mode::BaselineBinary`]: the
    /// latency A/B of two builds.
    #[serde(rename = "walrelay binary, messages")]
    WalrelayBinary,
    /// `--baseline-bin`, the same way.
    #[serde(rename = "baseline binary, messages")]
    BaselineBinary,
}

impl Mode {
    /// Modes that decode a slot of their own, dropped after the run.
    pub fn has_slot(self) -> bool {
        matches!(
            self,
            Mode::WalrelayMessages
                | Mode::WalrelayOutbox
                | Mode::WalrelayMessagesLinger20
                | Mode::WalrelayBinary
                | Mode::BaselineBinary
                | Mode::DebeziumOutbox
        )
    }

    pub const ALL: [Mode; 9] = [
        Mode::PlainProducer,
        Mode::DualWrite,
        Mode::WalrelayMessages,
        Mode::WalrelayOutbox,
        Mode::WalrelayMessagesLinger20,
        Mode::PollingOutbox,
        Mode::DebeziumOutbox,
        Mode::WalrelayBinary,
        Mode::BaselineBinary,
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
            Mode::WalrelayBinary => "walrelay binary, messages (ack = consumer's receipt)",
            Mode::BaselineBinary => "baseline binary, messages (ack = consumer's receipt)",
        }
    }

    pub fn kind(self) -> Kind {
        match self {
            Mode::PlainProducer
            | Mode::DualWrite
            | Mode::WalrelayMessages
            | Mode::WalrelayMessagesLinger20
            | Mode::WalrelayBinary
            | Mode::BaselineBinary => Kind::Messages,
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
            Mode::WalrelayBinary => "wr_bin",
            Mode::BaselineBinary => "wr_base",
        }
    }
}

#[cfg(test)]
impl LatencyRun {
    /// A run at `rate` whose percentiles are each half the p99 (p50) or the
    /// p99 (p99.9, max), for the report's tests.
    pub fn for_tests(mode: Mode, rate: u64, ack_p99: f64, consumer_p99: f64) -> LatencyRun {
        let p = |p99: f64| Percentiles {
            p50: p99 / 2.0,
            p99,
            p999: p99,
            max: p99,
        };
        LatencyRun {
            mode,
            repeat: 0,
            target_rate: Some(rate),
            achieved_rate: rate as f64,
            events: 100,
            commit_to_ack: p(ack_p99),
            commit_to_consumer: p(consumer_p99),
            commit_to_produce: None,
            ack_before_commit_reply: 0,
            ack_stalls: Vec::new(),
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
    pub fn of(h: &Histogram<u64>) -> Percentiles {
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
    /// walrelay's modes: from the commit reply to the moment the relay
    /// handed the record to its producer (PostgreSQL's decoding and
    /// walrelay's own path), the part of commit → ack before Kafka.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_to_produce: Option<Percentiles>,
    /// Events acknowledged before the client had its commit reply (counted
    /// as 0 ms).
    pub ack_before_commit_reply: u64,
    /// The windows of commit time whose events waited longer than the
    /// latency runs' `STALL_MS` for their ack (the slowest few, in time
    /// order).
    #[serde(default)]
    pub ack_stalls: Vec<Stall>,
}

/// One window of commit time in which events waited long.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stall {
    /// Start of the window, seconds after the rate's load began.
    pub at_s: f64,
    /// The longest wait of an event committed in the window, ms.
    pub max_ms: f64,
    /// Events committed in the window that waited longer than the
    /// threshold.
    pub slow_events: u64,
}
