//! `walrelay-bench crash`: issue 24's crash comparison, walrelay beside
//! Debezium (at-least-once on a standalone worker, and with Kafka
//! Connect's exactly-once source support on a distributed one). Each
//! tool gets its own slot and topics on one PostgreSQL and one Apache
//! Kafka node (started by the command, as the bench's drains
//! are); a mixed workload ([`load`]) commits live while the tool relays;
//! the tool is killed with `kill -9` `--kills` times at seeded random
//! moments and restarted after each ([`run`], [`relay`]); then the
//! workload stops, the tool drains, and its topics are read back and
//! counted ([`wire`], whose doc defines every column). Results:
//! `bench/results/crash-<stamp>.{json,md}` ([`report`]).
//!
//! Why here and not in `walrelay-chaos`: the chaos harness judges
//! walrelay against its own consumer, its ledger and its trace (a
//! walrelay-only verdict), while this compares two relays on what they
//! put on the wire, and needs what only the bench has: the Debezium
//! worker set-ups (`bench/debezium/`), the record decoding of both
//! relays' formats ([`crate::debezium::readback`]), the bench's schema
//! and environment. The counting is small and lives in [`wire`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use walrelay_testkit::{BrokerKind, ConnectDelivery, DebeziumWorker, Jvm, Variant};

mod load;
mod relay;
mod report;
mod run;
mod wire;

use crate::debezium::readback::Writer;
use crate::env::BenchEnv;
use crate::workload::{Kind, OUTBOX_TABLE, PREFIX, PUBLICATION};
use relay::{Relay, WalrelayProcess};
use run::{run_tool, Rng, Target};

/// `walrelay-bench crash`.
#[derive(clap::Args, Debug, Clone)]
pub struct CrashArgs {
    /// `kill -9` of each tool (each followed by a restart).
    #[arg(long, default_value_t = 20)]
    pub kills: u32,
    /// Seed of the kill moments [default: from the clock, printed].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Events per second the workload commits while a tool runs.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// The workload runs at least until this many events committed (it
    /// also runs through every kill and the gap after the last).
    #[arg(long, default_value_t = 0)]
    pub events: u64,
    /// The shortest time a tool streams before it is killed.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub min_gap: Duration,
    /// The longest time a tool streams before it is killed.
    #[arg(long, default_value = "8s", value_parser = humantime::parse_duration)]
    pub max_gap: Duration,
    /// After the workload, how long without a new event on the wire
    /// before the missing ones count as lost.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub settle: Duration,
    /// The tools, in order: walrelay, debezium (tuned, standalone,
    /// at-least-once), debezium_eos (KIP-618, distributed worker).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "walrelay,debezium,debezium_eos"
    )]
    pub tools: Vec<CrashTool>,
    /// The walrelay binary [default: target/release/walrelay].
    #[arg(long, env = "WALRELAY_BENCH_BIN")]
    pub walrelay_bin: Option<PathBuf>,
    /// Where `crash-<stamp>.{json,md}` go.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/results"))]
    pub out: PathBuf,
    /// A note for the report (repeatable), e.g. what else ran.
    #[arg(long)]
    pub note: Vec<String>,
}

/// A tool of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum CrashTool {
    Walrelay,
    Debezium,
    /// Named as in `results.json`.
    #[value(name = "debezium_eos")]
    DebeziumEos,
}

impl fmt::Display for CrashTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CrashTool::Walrelay => "walrelay",
            CrashTool::Debezium => "debezium",
            CrashTool::DebeziumEos => "debezium_eos",
        })
    }
}

/// The run's settings every tool gets.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub kills: u32,
    pub seed: u64,
    pub rate: f64,
    pub events: u64,
    pub min_gap: Duration,
    pub max_gap: Duration,
    pub settle: Duration,
}

/// Runs the comparison and writes its report; fails when walrelay lost
/// or duplicated an event, or any tool lost one.
pub async fn main(args: CrashArgs, workspace: &Path) -> Result<()> {
    if args.kills > 0 && args.min_gap > args.max_gap {
        bail!("--min-gap must not exceed --max-gap");
    }
    if args.rate.is_nan() || args.rate <= 0.0 {
        bail!("--rate must be above 0");
    }
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let settings = Settings {
        kills: args.kills,
        seed,
        rate: args.rate,
        events: args.events,
        min_gap: args.min_gap,
        max_gap: args.max_gap,
        settle: args.settle,
    };
    tracing::info!("crash comparison, seed {seed} (--seed {seed} replays the kill moments)");
    let bin = args
        .walrelay_bin
        .clone()
        .unwrap_or_else(|| workspace.join("target/release/walrelay"));
    if args.tools.contains(&CrashTool::Walrelay) && !bin.is_file() {
        bail!(
            "{} not found: build it first (cargo build --release -p walrelay) or pass --walrelay-bin",
            bin.display()
        );
    }
    if args.tools.iter().any(|t| *t != CrashTool::Walrelay) {
        let home = walrelay_testkit::DebeziumHome::find()?;
        tracing::info!("Debezium from {}", home.dir().display());
    }
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .replace(':', "-");
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {:?}", args.out))?;
    let scratch = tempfile::Builder::new()
        .prefix("walrelay-crash-")
        .tempdir()?;

    tracing::info!("starting PostgreSQL and Apache Kafka");
    let env = BenchEnv::start(BrokerKind::Kafka, Jvm::Stock).await?;
    crate::debezium::ensure_publication(&env).await?;
    let mut report = report::CrashReport::new(&env, &settings, &args.note);
    let mut rng = Rng::new(seed);
    for (i, tool) in args.tools.iter().copied().enumerate() {
        let first_seq = 1 + i as u64 * 1_000_000_000;
        let result = match tool {
            CrashTool::Walrelay => {
                walrelay_run(&env, &bin, scratch.path(), first_seq, &settings, &mut rng).await
            }
            CrashTool::Debezium | CrashTool::DebeziumEos => {
                debezium_run(&env, tool, first_seq, &settings, &mut rng).await
            }
        };
        match result {
            Ok(r) => {
                tracing::info!("{}", report::summary_line(&r));
                report.runs.push(r);
            }
            Err(e) => {
                tracing::error!("{tool}: {e:#}");
                report.failures.push((tool, format!("{e:#}")));
            }
        }
        report.write(&args.out, &stamp)?;
    }
    report.finish();
    let (json, md) = report.write(&args.out, &stamp)?;
    tracing::info!("report: {} and {}", json.display(), md.display());
    report.verdict()
}

async fn walrelay_run(
    env: &BenchEnv,
    bin: &Path,
    scratch: &Path,
    first_seq: u64,
    settings: &Settings,
    rng: &mut Rng,
) -> Result<run::ToolRun> {
    let slot = "crash_wr".to_owned();
    let (msg, outbox) = ("crash.wr.message".to_owned(), "crash.wr.outbox".to_owned());
    env.create_slot(&slot).await?;
    env.create_topic(&msg)?;
    env.create_topic(&outbox)?;
    let config = scratch.join("walrelay.toml");
    write_config(&config, env, &slot, &msg, &outbox)?;
    let mut relay = Relay::Walrelay(WalrelayProcess::new(
        bin.to_owned(),
        config,
        scratch.join("walrelay.log"),
        slot.clone(),
    ));
    let target = Target {
        slot,
        topics: vec![(msg, Kind::Messages), (outbox, Kind::Outbox)],
        writer: Writer::Walrelay,
    };
    let start = async {
        relay.restart(&env.client).await?;
        Ok(relay)
    };
    run_tool(
        env,
        CrashTool::Walrelay,
        target,
        first_seq,
        settings,
        rng,
        start,
    )
    .await
}

/// Debezium, tuned: `debezium` on a standalone worker (at least once),
/// `debezium_eos` on a distributed worker with Kafka Connect's
/// exactly-once source support (KIP-618). Each has its own slot and
/// message topic; the Event Router's outbox topic is shared, each read
/// from its own start offsets.
async fn debezium_run(
    env: &BenchEnv,
    tool: CrashTool,
    first_seq: u64,
    settings: &Settings,
    rng: &mut Rng,
) -> Result<run::ToolRun> {
    let (slot, name, prefix, delivery) = match tool {
        CrashTool::DebeziumEos => (
            "crash_de",
            "crash-de",
            "crash.de",
            ConnectDelivery::ExactlyOnce,
        ),
        _ => (
            "crash_dt",
            "crash-dt",
            "crash.dt",
            ConnectDelivery::AtLeastOnce,
        ),
    };
    let mut opts = crate::debezium::options(Variant::Tuned, name, slot, prefix);
    opts.delivery = delivery;
    opts.start_timeout = Duration::from_secs(600);
    let msg = format!("{prefix}.message");
    let outbox = crate::debezium::OUTBOX_TOPIC.to_owned();
    env.create_slot(slot).await?;
    env.create_topic(&msg)?;
    env.create_topic(&outbox)?;
    let target = Target {
        slot: slot.to_owned(),
        topics: vec![(msg, Kind::Messages), (outbox, Kind::Outbox)],
        writer: Writer::Debezium,
    };
    let start = async {
        let w = DebeziumWorker::start(&env.cluster, &env.bootstrap(), opts).await?;
        Ok(Relay::Debezium(Box::new(w)))
    };
    run_tool(env, tool, target, first_seq, settings, rng, start).await
}

/// walrelay's configuration: the slot, the bench's publication, the raw
/// route of the bench's messages and the outbox table; every other
/// setting (the status and publication-check intervals, the producer,
/// `relay.fence`) at its default.
fn write_config(path: &Path, env: &BenchEnv, slot: &str, msg: &str, outbox: &str) -> Result<()> {
    let text = format!(
        r#"[postgres]
url = "{url}"
slot = "{slot}"
publication = "{PUBLICATION}"

[kafka]
bootstrap_servers = "{bootstrap}"

[[messages]]
prefix = "{PREFIX}"
topic = "{msg}"

[[outbox]]
table = "{OUTBOX_TABLE}"
topic = "{outbox}"
"#,
        url = env.url(),
        bootstrap = env.bootstrap(),
    );
    std::fs::write(path, text).with_context(|| format!("writing {path:?}"))
}
