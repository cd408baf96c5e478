//! The command line: the benchmark's options and its subcommands.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use walrelay_testkit::{BrokerKind, KAFKA_VERSION};

use crate::crash;

#[derive(Parser, Debug)]
#[command(
    name = "walrelay-bench",
    about = "End-to-end benchmark: walrelay against the decode limit (pg_recvlogical), the produce limit (rdkafka) and a polling outbox relay; drain, latency, cost"
)]
pub(crate) struct Cli {
    /// The broker every run uses: `kafka` (a single Apache Kafka 4.x KRaft
    /// node, from scripts/install-kafka.sh) or `tansu` (memory storage).
    #[arg(long, default_value = "kafka", value_parser = parse_broker)]
    pub(crate) broker: BrokerKind,
    /// The Kafka node's collector: `g1` as Kafka's start scripts run it,
    /// or `zgc` (pauses under a millisecond), for an A/B of what the
    /// broker's pauses add to a latency.
    #[arg(long, value_enum, default_value_t = BrokerJvm::G1)]
    pub(crate) broker_jvm: BrokerJvm,
    /// Small counts, one repeat, short latency phases (a CI smoke test,
    /// well under a minute).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Backlog size of the 200-byte workloads [default: 1000000; quick: 5000].
    #[arg(long)]
    pub(crate) events: Option<u64>,
    /// Backlog size of the 4 KB workloads [default: 250000; quick: 2000].
    #[arg(long)]
    pub(crate) large_events: Option<u64>,
    /// Repeats of every measurement [default: 3; quick: 1].
    #[arg(long)]
    pub(crate) repeats: Option<u32>,
    /// Seconds of live load per rate [default: 10; quick: 1].
    #[arg(long)]
    pub(crate) latency_seconds: Option<f64>,
    /// Seconds of live load at the first rate before each latency mode's
    /// measured rates, not counted: each mode runs on a fresh broker, whose
    /// JVM compiles its hot paths over its first 20-30 s [default: 30;
    /// quick: 1]. For the consumers' end-to-end runs: before each run's
    /// rates [default: 5, the first run 30; quick: 1].
    #[arg(long)]
    pub(crate) latency_warmup_seconds: Option<f64>,
    /// Rates for the latency runs, events/s; "max" is as fast as the
    /// generator can.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,20000,max")]
    pub(crate) rates: Vec<String>,
    /// Only these latency modes: plain, dual, wr_msg, wr_outbox, wr_msg_l20,
    /// poll_outbox, dbz, wr_bin, wr_base (default all; wr_bin and wr_base,
    /// the binaries' A/B, only with --baseline-bin).
    #[arg(long, value_delimiter = ',')]
    pub(crate) latency_modes: Vec<String>,
    /// Only these workloads (ids such as msg-100tx-200b; default all).
    #[arg(long, value_delimiter = ',')]
    pub(crate) workloads: Vec<String>,
    /// Skip the drain runs.
    #[arg(long)]
    pub(crate) no_drain: bool,
    /// Skip the latency runs.
    #[arg(long)]
    pub(crate) no_latency: bool,
    /// Skip Debezium (its drain rows, its restart and its latency mode
    /// `dbz`). Debezium runs on Apache Kafka only, from
    /// scripts/install-debezium.sh (or `$WALRELAY_DEBEZIUM_HOME`).
    #[arg(long)]
    pub(crate) no_debezium: bool,
    /// Debezium's set-ups drained: `tuned`, `defaults` (bench/debezium/)
    /// [default: tuned,defaults; quick: tuned].
    #[arg(long, value_delimiter = ',')]
    pub(crate) debezium_variants: Vec<String>,
    /// Skip the consumer runs (walrelay's exactly-once consumer against
    /// the inbox-table consumer).
    #[arg(long)]
    pub(crate) no_consumer: bool,
    /// Records the consumers apply [default: 300000; quick: 3000]; 0 runs
    /// only the end-to-end latency runs.
    #[arg(long)]
    pub(crate) consumer_records: Option<u64>,
    /// Only these consumers: wr_batch, wr_record, apply_limit,
    /// inbox_careful, inbox_500, inbox_1, read, py_batch, py_record, py_apply_limit,
    /// py_inbox_careful, java_batch, java_apply_limit, java_inbox_careful (default all; the Python
    /// ones run the Python package from the pinned virtualenv of
    /// scripts/install-python-venv.sh, which the bench runs; the Java ones `java/bench`, which the
    /// bench builds with Maven, skipped with a note without a JDK or Maven).
    #[arg(long, value_delimiter = ',')]
    pub(crate) consumers: Vec<String>,
    /// Rates of the consumers' end-to-end latency runs, events/s (0:
    /// none).
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
    pub(crate) consumer_rates: Vec<u64>,
    /// Partitions of the end-to-end runs' topics (one set of runs, keyless
    /// and keyed, per count).
    #[arg(long, value_delimiter = ',', default_value = "4")]
    pub(crate) consumer_partitions: Vec<i32>,
    /// Where results go: a new folder per run, and `latest.md`.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/results"))]
    pub(crate) out: PathBuf,
    /// The walrelay binary to drain with [default: target/release/walrelay].
    #[arg(long, env = "WALRELAY_BENCH_BIN")]
    pub(crate) walrelay_bin: Option<PathBuf>,
    /// A second walrelay binary (e.g. the previous commit's) drained in the
    /// same repeats as `--walrelay-bin`, back to back, which goes first
    /// alternating: the report gives this build's drain over the
    /// baseline's, pair by pair; and both run the latency modes wr_bin and
    /// wr_base as their own processes, for the latency A/B.
    #[arg(long, env = "WALRELAY_BENCH_BASELINE_BIN")]
    pub(crate) baseline_bin: Option<PathBuf>,
    /// Drain with walrelay only: skip the decode limit, the produce limit
    /// and the polling relay (for a quick old-vs-new comparison).
    #[arg(long)]
    pub(crate) no_references: bool,
    /// Extra librdkafka property for walrelay's producer, NAME=VALUE
    /// (repeatable; for tuning experiments).
    #[arg(long = "kafka-property", value_name = "NAME=VALUE")]
    pub(crate) kafka_properties: Vec<String>,
    /// Extra argument for the drained `walrelay` binary, given before
    /// `run` (repeatable), e.g. `--walrelay-arg=--max-in-flight-bytes=16777216`.
    #[arg(long = "walrelay-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub(crate) walrelay_args: Vec<String>,
    /// Rows per poll of the polling relay.
    #[arg(long, default_value_t = 1000)]
    pub(crate) poll_batch: i64,
    /// Sleep of the polling relay after a poll that found fewer rows than
    /// the batch.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub(crate) poll_interval: Duration,
    /// A note for the report (repeatable), e.g. what else ran.
    #[arg(long)]
    pub(crate) note: Vec<String>,
    #[command(subcommand)]
    pub(crate) command: Option<BenchCommand>,
}

/// Runs other than the benchmark's (which runs without a subcommand).
#[derive(clap::Subcommand, Debug)]
pub(crate) enum BenchCommand {
    /// Issue 24's crash comparison: a live mixed workload while each tool
    /// (walrelay; Debezium) is killed with kill -9 and restarted, then
    /// what each put on the wire: lost, duplicated, out of order.
    Crash(crash::CrashArgs),
}

/// `--broker-jvm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BrokerJvm {
    G1,
    Zgc,
}

impl BrokerJvm {
    pub(crate) fn jvm(self) -> walrelay_testkit::Jvm {
        match self {
            BrokerJvm::G1 => walrelay_testkit::Jvm::Stock,
            BrokerJvm::Zgc => walrelay_testkit::Jvm::StockZgc,
        }
    }
}

fn parse_broker(s: &str) -> Result<BrokerKind> {
    s.parse()
}

/// The broker as the report names it (`machine.broker`).
pub(crate) fn broker_description(kind: BrokerKind, jvm: BrokerJvm) -> String {
    match (kind, jvm) {
        (BrokerKind::Kafka, BrokerJvm::G1) => {
            format!("Apache Kafka {KAFKA_VERSION} (one KRaft node, stock settings, the JVM of its start scripts: 1 GB heap, G1)")
        }
        (BrokerKind::Kafka, BrokerJvm::Zgc) => {
            format!("Apache Kafka {KAFKA_VERSION} (one KRaft node, stock settings, 1 GB heap, the Z collector instead of its start scripts' G1: --broker-jvm zgc)")
        }
        (BrokerKind::Tansu, _) => "Tansu 0.6.0 (memory storage)".into(),
    }
}

pub(crate) fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!(
        "cargo run --release -p walrelay-bench -- {}",
        args.join(" ")
    )
    .trim_end()
    .to_owned()
}
