//! The bench's runs and results: what each runner produces (a drain's
//! [`ToolRun`], a latency run, a consumer run, Debezium's start and
//! restart) and the [`Results`] of a whole run that collects them, is
//! written as `results.json` and rendered by `report`.
//!
//! Why a module of its own: these types are the contract between the
//! runners (`drain`, `workload_drain`, `latency`, `consumer`,
//! `debezium`, `crash`) and the report (`report`, `svg`). With the types
//! in the runners, the report imported the runners and the runners
//! imported the report for `Results` and `Tool`: a cycle, so that neither
//! side could be read or changed alone. Here they import neither: this
//! module depends only on the workload's description ([`Workload`],
//! itself a leaf) and on serde, and both sides depend on it.
//!
//! Only data and the few pure functions that build it from a measurement
//! (a histogram's percentiles, the fence's log line, the machine's
//! `/proc`). The serde field names are the `results.json` format: keep
//! them.

use serde::Serialize;

use crate::workload::Workload;

mod consumer;
mod debezium;
mod latency;

pub use consumer::{Consumer, ConsumerLatencyRun, ConsumerRun};
pub use debezium::{RestartRun, Startup};
pub use latency::{LatencyRun, Mode, Percentiles, Stall};

/// Who drained the backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tool {
    /// The `walrelay` binary.
    Walrelay,
    /// The `walrelay` binary with `relay.fence = false`: what the tail
    /// fence costs.
    WalrelayNoFence,
    /// The `walrelay` binary with `relay.headers = "full"`: what the
    /// lean header set (the default) saves in bytes and broker CPU.
    WalrelayFullHeaders,
    /// `--baseline-bin`: another walrelay build (e.g. the previous
    /// commit's), fence on, drained in the same repeats.
    WalrelayBaseline,
    /// `pg_recvlogical` to a file: the decode limit.
    PgRecvlogical,
    /// A plain rdkafka producer: the produce limit, with walrelay's
    /// records (its headers included).
    Producer,
    /// The same producer with the Python relay's records (one header):
    /// the floor the Python relay stands on.
    ProducerOneHeader,
    /// A plain Python relay (psycopg2, pgoutput decoded in Python,
    /// confluent-kafka's idempotent producer, one header, the slot
    /// confirmed after delivery): `python_relay.py`.
    PythonRelay,
    /// The polling outbox relay.
    Polling,
    /// Debezium's PostgreSQL connector with the Outbox Event Router on a
    /// Kafka Connect standalone worker, with Debezium's and Connect's
    /// defaults (`bench/debezium/`, variant `defaults`).
    Debezium,
    /// The same, tuned as Debezium's docs and users advise (variant
    /// `tuned`).
    DebeziumTuned,
}

impl Tool {
    pub const ALL: [Tool; 11] = [
        Tool::Walrelay,
        Tool::WalrelayNoFence,
        Tool::WalrelayFullHeaders,
        Tool::WalrelayBaseline,
        Tool::PgRecvlogical,
        Tool::Producer,
        Tool::ProducerOneHeader,
        Tool::PythonRelay,
        Tool::Polling,
        Tool::DebeziumTuned,
        Tool::Debezium,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Tool::Walrelay => "walrelay",
            Tool::WalrelayNoFence => "walrelay, fence off",
            Tool::WalrelayFullHeaders => "walrelay, full header set",
            Tool::WalrelayBaseline => "walrelay, baseline binary",
            Tool::PgRecvlogical => "decode limit (pg_recvlogical)",
            Tool::Producer => "produce limit (rdkafka)",
            Tool::ProducerOneHeader => "produce limit, the Python relay's records",
            Tool::PythonRelay => "Python relay (psycopg2, confluent-kafka)",
            Tool::Polling => "polling relay",
            Tool::Debezium => "Debezium, defaults",
            Tool::DebeziumTuned => "Debezium, tuned",
        }
    }
}

/// One tool draining one workload once.
#[derive(Debug, Clone, Serialize)]
pub struct ToolRun {
    pub tool: Tool,
    pub workload: String,
    pub repeat: u32,
    pub events: u64,
    pub seconds: f64,
    pub events_per_s: f64,
    /// CPU seconds of the tool (for the producer and the polling relay:
    /// the bench process while it ran them).
    pub cpu_seconds: f64,
    /// CPU seconds of the whole PostgreSQL server during the drain.
    pub db_cpu_seconds: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    /// Records found in the broker afterwards (walrelay's topic).
    pub records_in_broker: Option<u64>,
    /// CPU seconds of the broker during the run.
    pub broker_cpu_seconds: Option<f64>,
    /// Bytes the broker stores for the run's topic (Kafka's log segments).
    pub kafka_bytes: Option<u64>,
    /// Bytes of walrelay's own headers (names and values) over the
    /// records read back.
    pub walrelay_header_bytes: Option<u64>,
    /// walrelay's tail fence read at its first record.
    pub fence: Option<FenceCost>,
    /// Debezium: the worker's start before the drain (its `seconds`,
    /// CPU and rate count from the moment the connector streamed).
    pub startup: Option<Startup>,
    /// Debezium: records of a backlog event written more than once (a
    /// finding, not an error; `records_in_broker` counts them).
    pub duplicates: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub postgres: String,
    pub broker: String,
}

impl Machine {
    pub fn detect(postgres: &str, broker: String) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kb: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory_gib: (kb / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            postgres: postgres.to_owned(),
            broker,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} cores ({}), {} GiB RAM, Linux {}, {}, {}",
            self.cores, self.cpu, self.memory_gib, self.kernel, self.postgres, self.broker
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Results {
    pub command: String,
    pub mode: String,
    pub started: String,
    pub finished: Option<String>,
    pub machine: Machine,
    pub repeats: u32,
    pub latency_seconds: f64,
    pub polling_batch: i64,
    pub polling_interval_ms: u64,
    pub workloads: Vec<Workload>,
    pub drain: Vec<ToolRun>,
    pub latency: Vec<LatencyRun>,
    pub consumer: Vec<ConsumerRun>,
    pub consumer_latency: Vec<ConsumerLatencyRun>,
    /// Debezium's workers stopped and started again after their drains.
    pub restarts: Vec<RestartRun>,
    pub notes: Vec<String>,
}

#[cfg(test)]
impl Results {
    /// Empty results over `workloads`, for the report's tests.
    pub fn for_tests(workloads: Vec<Workload>, repeats: u32) -> Results {
        Results {
            command: String::new(),
            mode: "quick".into(),
            started: String::new(),
            finished: None,
            machine: Machine::detect("15", "Kafka".into()),
            repeats,
            latency_seconds: 1.0,
            polling_batch: 1,
            polling_interval_ms: 1,
            workloads,
            drain: Vec::new(),
            latency: Vec::new(),
            consumer: Vec::new(),
            consumer_latency: Vec::new(),
            restarts: Vec::new(),
            notes: Vec::new(),
        }
    }
}

/// What the tail fence's read of a topic's partition tails cost, as the
/// relay logs it (`read the partition tails of the topic`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct FenceCost {
    pub elapsed_ms: u64,
    pub records_read: u64,
}

impl FenceCost {
    /// The first such line of a walrelay log (text format).
    pub fn from_log(log: &str) -> Option<FenceCost> {
        let line = log
            .lines()
            .find(|l| l.contains("read the partition tails of the topic"))?;
        let field = |name: &str| -> Option<u64> {
            let at = line.find(&format!(" {name}="))? + name.len() + 2;
            line[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        };
        Some(FenceCost {
            elapsed_ms: field("elapsed_ms")?,
            records_read: field("records_read")?,
        })
    }
}
