//! `walrelay-bench`: walrelay end to end against its limits.
//!
//! It starts its own PostgreSQL and Tansu broker and, per workload,
//! creates one slot per tool and repeat, writes one committed backlog, and
//! drains it with walrelay (the release binary, a subprocess),
//! `pg_recvlogical` (the decode limit), a plain rdkafka producer (the
//! produce limit) and, for outbox workloads, a polling outbox relay. Then
//! it measures latency under live load. Results go to
//! `bench/results/<time>/` (`results.md`, `results.svg`, `results.json`)
//! and `bench/results/latest.md`. See `docs/benchmarks.md`.

mod consumer;
mod crash;
mod debezium;
mod drain;
mod env;
mod kafka;
mod latency;
mod polling;
/// CPU time and peak memory from `/proc`, shared with the test kit's
/// process handles.
pub(crate) use walrelay_testkit::procstat;
mod report;
mod svg;
mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::Parser;

use crate::drain::ScratchFile;
use crate::env::BenchEnv;
use crate::latency::Mode;
use crate::polling::{PollingOptions, PollingRelay};
use crate::report::{Machine, Results, Tool, ToolRun};
use crate::workload::{Kind, Workload};
use walrelay_testkit::{BrokerKind, DebeziumHome, Variant, KAFKA_VERSION};

/// The workloads Debezium drains in quick mode: logical messages (its op
/// `m` records) and outbox rows (its Event Router), one each.
const QUICK_DEBEZIUM_WORKLOADS: [&str; 2] = ["msg-100tx-200b", "outbox-1tx-200b"];

/// The allocator the `walrelay` binary uses (replacing `malloc` for
/// librdkafka too), so that the in-process measurements (walrelay in the
/// latency runs, the plain rdkafka producer, the polling relay) run on the
/// same allocator as the drained binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

#[derive(Parser, Debug)]
#[command(
    name = "walrelay-bench",
    about = "End-to-end benchmark: walrelay against the decode limit (pg_recvlogical), the produce limit (rdkafka) and a polling outbox relay; drain, latency, cost"
)]
struct Cli {
    /// The broker every run uses: `kafka` (a single Apache Kafka 4.x KRaft
    /// node, from scripts/install-kafka.sh) or `tansu` (memory storage).
    #[arg(long, default_value = "kafka", value_parser = parse_broker)]
    broker: BrokerKind,
    /// The Kafka node's collector: `g1` as Kafka's start scripts run it,
    /// or `zgc` (pauses under a millisecond), for an A/B of what the
    /// broker's pauses add to a latency.
    #[arg(long, value_enum, default_value_t = BrokerJvm::G1)]
    broker_jvm: BrokerJvm,
    /// Small counts, one repeat, short latency phases (a CI smoke test,
    /// well under a minute).
    #[arg(long)]
    quick: bool,
    /// Backlog size of the 200-byte workloads [default: 1000000; quick: 5000].
    #[arg(long)]
    events: Option<u64>,
    /// Backlog size of the 4 KB workloads [default: 250000; quick: 2000].
    #[arg(long)]
    large_events: Option<u64>,
    /// Repeats of every measurement [default: 3; quick: 1].
    #[arg(long)]
    repeats: Option<u32>,
    /// Seconds of live load per rate [default: 10; quick: 1].
    #[arg(long)]
    latency_seconds: Option<f64>,
    /// Seconds of live load at the first rate before each latency mode's
    /// measured rates, not counted [default: 5; quick: 1].
    #[arg(long)]
    latency_warmup_seconds: Option<f64>,
    /// Rates for the latency runs, events/s; "max" is as fast as the
    /// generator can.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,20000,max")]
    rates: Vec<String>,
    /// Only these latency modes: plain, dual, wr_msg, wr_outbox, wr_msg_l20,
    /// poll_outbox, dbz (default all).
    #[arg(long, value_delimiter = ',')]
    latency_modes: Vec<String>,
    /// Only these workloads (ids such as msg-100tx-200b; default all).
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Skip the drain runs.
    #[arg(long)]
    no_drain: bool,
    /// Skip the latency runs.
    #[arg(long)]
    no_latency: bool,
    /// Skip Debezium (its drain rows, its restart and its latency mode
    /// `dbz`). Debezium runs on Apache Kafka only, from
    /// scripts/install-debezium.sh (or `$WALRELAY_DEBEZIUM_HOME`).
    #[arg(long)]
    no_debezium: bool,
    /// Debezium's set-ups drained: `tuned`, `defaults` (bench/debezium/)
    /// [default: tuned,defaults; quick: tuned].
    #[arg(long, value_delimiter = ',')]
    debezium_variants: Vec<String>,
    /// Skip the consumer runs (walrelay's exactly-once consumer against
    /// the inbox-table consumer).
    #[arg(long)]
    no_consumer: bool,
    /// Records the consumers apply [default: 300000; quick: 3000].
    #[arg(long)]
    consumer_records: Option<u64>,
    /// Only these consumers: wr_batch, wr_record, apply_limit,
    /// inbox_careful, inbox_500, inbox_1, read, py_batch, py_record (default all; the Python ones run the
    /// Python package from the pinned virtualenv of
    /// scripts/install-python-venv.sh, which the bench runs).
    #[arg(long, value_delimiter = ',')]
    consumers: Vec<String>,
    /// Rates of the consumers' latency runs, events/s (0: none).
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    consumer_rates: Vec<u64>,
    /// Where results go: a new folder per run, and `latest.md`.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/results"))]
    out: PathBuf,
    /// The walrelay binary to drain with [default: target/release/walrelay].
    #[arg(long, env = "WALRELAY_BENCH_BIN")]
    walrelay_bin: Option<PathBuf>,
    /// A second walrelay binary (e.g. the previous commit's) drained in the
    /// same repeats as `--walrelay-bin`, back to back, which goes first
    /// alternating: the report gives this build's drain over the
    /// baseline's, pair by pair.
    #[arg(long, env = "WALRELAY_BENCH_BASELINE_BIN")]
    baseline_bin: Option<PathBuf>,
    /// Drain with walrelay only: skip the decode limit, the produce limit
    /// and the polling relay (for a quick old-vs-new comparison).
    #[arg(long)]
    no_references: bool,
    /// Extra librdkafka property for walrelay's producer, NAME=VALUE
    /// (repeatable; for tuning experiments).
    #[arg(long = "kafka-property", value_name = "NAME=VALUE")]
    kafka_properties: Vec<String>,
    /// Extra argument for the drained `walrelay` binary, given before
    /// `run` (repeatable), e.g. `--walrelay-arg=--max-in-flight-bytes=16777216`.
    #[arg(long = "walrelay-arg", value_name = "ARG", allow_hyphen_values = true)]
    walrelay_args: Vec<String>,
    /// Rows per poll of the polling relay.
    #[arg(long, default_value_t = 1000)]
    poll_batch: i64,
    /// Sleep of the polling relay after a poll that found fewer rows than
    /// the batch.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    poll_interval: Duration,
    /// A note for the report (repeatable), e.g. what else ran.
    #[arg(long)]
    note: Vec<String>,
    #[command(subcommand)]
    command: Option<BenchCommand>,
}

/// Runs other than the benchmark's (which runs without a subcommand).
#[derive(clap::Subcommand, Debug)]
enum BenchCommand {
    /// Issue 24's crash comparison: a live mixed workload while each tool
    /// (walrelay; Debezium) is killed with kill -9 and restarted, then
    /// what each put on the wire: lost, duplicated, out of order.
    Crash(crash::CrashArgs),
}

/// `--broker-jvm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum BrokerJvm {
    G1,
    Zgc,
}

impl BrokerJvm {
    fn jvm(self) -> walrelay_testkit::Jvm {
        match self {
            BrokerJvm::G1 => walrelay_testkit::Jvm::Stock,
            BrokerJvm::Zgc => walrelay_testkit::Jvm::StockZgc,
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WALRELAY_BENCH_LOG")
                .unwrap_or_else(|_| "walrelay_bench=info,warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Some(BenchCommand::Crash(args)) = cli.command {
        return crash::main(args, Path::new(WORKSPACE)).await;
    }
    let quick = cli.quick;
    let events = cli.events.unwrap_or(if quick { 5_000 } else { 1_000_000 });
    let large = cli
        .large_events
        .unwrap_or(if quick { 2_000 } else { 250_000 });
    let repeats = cli.repeats.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let latency_secs = cli
        .latency_seconds
        .unwrap_or(if quick { 1.0 } else { 10.0 });
    let rates = cli
        .rates
        .iter()
        .map(|r| match r.trim() {
            "max" => Ok(None),
            n => n
                .parse::<u64>()
                .map(Some)
                .with_context(|| format!("rate {n:?}")),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut workloads = workload::standard(events, large);
    if !cli.workloads.is_empty() {
        workloads.retain(|w| cli.workloads.contains(&w.id));
        if workloads.is_empty() {
            bail!("no workload matches {:?}", cli.workloads);
        }
    }
    let walrelay_bin = cli
        .walrelay_bin
        .clone()
        .unwrap_or_else(|| Path::new(WORKSPACE).join("target/release/walrelay"));
    if let Some(b) = &cli.baseline_bin {
        if !b.is_file() {
            bail!("--baseline-bin {}: no such file", b.display());
        }
    }
    if !cli.no_drain && !walrelay_bin.is_file() {
        bail!(
            "{} not found: build it first (cargo build --release -p walrelay) or pass --walrelay-bin",
            walrelay_bin.display()
        );
    }
    let kafka_properties = cli
        .kafka_properties
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .with_context(|| format!("--kafka-property {p:?}: expected NAME=VALUE"))
        })
        .collect::<Result<Vec<_>>>()?;
    let polling = PollingOptions {
        batch: cli.poll_batch,
        interval: cli.poll_interval,
    };
    let mut debezium_note = None;
    let debezium_variants: Vec<Variant> = if cli.no_debezium {
        Vec::new()
    } else if cli.broker != BrokerKind::Kafka {
        debezium_note = Some(format!(
            "no Debezium rows: Debezium runs on Apache Kafka only (this run: {})",
            cli.broker
        ));
        Vec::new()
    } else {
        // Found as the broker's install is, before anything starts.
        let home = DebeziumHome::find()?;
        tracing::info!("Debezium from {}", home.dir().display());
        let names = if cli.debezium_variants.is_empty() {
            if quick {
                vec!["tuned".to_owned()]
            } else {
                vec!["tuned".to_owned(), "defaults".to_owned()]
            }
        } else {
            cli.debezium_variants.clone()
        };
        debezium::parse_variants(&names)?
    };

    let stamp = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .replace(':', "-");
    let run_dir = cli.out.join(&stamp);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {run_dir:?}"))?;
    // Scratch space (pg_recvlogical output, walrelay config and logs).
    let scratch_dir = tempfile::Builder::new()
        .prefix("walrelay-bench-")
        .tempdir()?;
    let scratch = scratch_dir.path().to_path_buf();

    tracing::info!("starting PostgreSQL and {}", cli.broker);
    let mut env = BenchEnv::start(cli.broker, cli.broker_jvm.jvm()).await?;
    let mut results = Results {
        command: command_line(),
        mode: if quick { "quick" } else { "full" }.into(),
        started: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        finished: None,
        machine: Machine::detect(
            env.cluster.version(),
            broker_description(cli.broker, cli.broker_jvm),
        ),
        repeats,
        latency_seconds: latency_secs,
        polling_batch: polling.batch,
        polling_interval_ms: polling.interval.as_millis() as u64,
        workloads: workloads.clone(),
        drain: Vec::new(),
        latency: Vec::new(),
        consumer: Vec::new(),
        consumer_latency: Vec::new(),
        restarts: Vec::new(),
        notes: cli.note.clone(),
    };
    results.notes.extend(debezium_note);
    if !debezium_variants.is_empty() {
        results.notes.push(format!(
            "Debezium {} on Kafka Connect {KAFKA_VERSION} (standalone), variants {:?} (bench/debezium/); its drains are timed from the moment the connector streams (its walsender holds the slot) until the records of every event are in Kafka (the topics' end offsets, then read back and counted by event), its CPU is the worker JVM's over the same time (what it used to start is in the start table)",
            walrelay_testkit::debezium::DEBEZIUM_VERSION,
            debezium_variants.iter().map(|v| v.name()).collect::<Vec<_>>()
        ));
    }
    results.notes.push(format!(
        "walrelay drains with `status_interval` and `publication_check_interval` of {}ms; the drain ends when the slot's confirmed_flush_lsn reaches the backlog's end",
        drain::STATUS_INTERVAL.as_millis()
    ));
    if !cli.walrelay_args.is_empty() {
        results.notes.push(format!(
            "walrelay drained with extra arguments {:?}",
            cli.walrelay_args
        ));
    }
    if !kafka_properties.is_empty() {
        results.notes.push(format!(
            "walrelay producer properties added: {kafka_properties:?}"
        ));
    }

    if let Some(b) = &cli.baseline_bin {
        results.notes.push(format!(
            "baseline binary drained beside this build: {} (`walrelay, baseline binary` rows)",
            b.display()
        ));
    }
    if cli.no_references {
        results.notes.push(
            "drained with walrelay only (--no-references): no decode limit, produce limit or polling relay rows"
                .into(),
        );
    }
    let mut first_seq = 1u64;
    if !cli.no_drain {
        for w in &workloads {
            drain_workload(
                &mut env,
                w,
                repeats,
                first_seq,
                Binaries {
                    walrelay: &walrelay_bin,
                    baseline: cli.baseline_bin.as_deref(),
                    references: !cli.no_references,
                    // Every Debezium drain and restart is a JVM start (5-30
                    // s): quick mode, a path check in CI, drains one
                    // workload of each kind and restarts on the first.
                    debezium: if !quick || QUICK_DEBEZIUM_WORKLOADS.contains(&w.id.as_str()) {
                        &debezium_variants
                    } else {
                        &[]
                    },
                    debezium_restart: !quick || w.id == QUICK_DEBEZIUM_WORKLOADS[0],
                },
                &cli.walrelay_args,
                &kafka_properties,
                polling,
                &scratch,
                &mut results,
            )
            .await
            .with_context(|| format!("workload {}", w.id))?;
            // Two more: the events of the start and restart runs.
            first_seq += w.events + 2;
            write_outputs(&run_dir, &cli.out, &results)?;
        }
    }
    if !cli.no_latency {
        if !cli.no_drain {
            // A fresh PostgreSQL for the live load: after the drains the
            // cluster holds gigabytes of WAL and tables with millions of
            // dead rows, which autovacuum and checkpoints work through on
            // the same two cores while the latency is measured.
            drop(env);
            env = BenchEnv::start(cli.broker, cli.broker_jvm.jvm())
                .await
                .context("starting PostgreSQL and the broker for the latency runs")?;
        }
        let latency_modes: Vec<Mode> = Mode::ALL
            .into_iter()
            .filter(|m| {
                cli.latency_modes.is_empty() || cli.latency_modes.iter().any(|t| t == m.tag())
            })
            // Debezium's tuned variant, unless it is not run at all.
            .filter(|m| *m != Mode::DebeziumOutbox || !debezium_variants.is_empty())
            .collect();
        if let Some(t) = cli
            .latency_modes
            .iter()
            .find(|t| !Mode::ALL.iter().any(|m| m.tag() == t.as_str()))
        {
            bail!("--latency-modes: no mode {t:?} (plain, dual, wr_msg, wr_outbox, wr_msg_l20, poll_outbox, dbz)");
        }
        let options = latency::LatencyOptions {
            rates: rates.clone(),
            duration: Duration::from_secs_f64(latency_secs),
            polling,
            payload_size: 200,
            kafka_properties: kafka_properties.clone(),
            warmup: Duration::from_secs_f64(cli.latency_warmup_seconds.unwrap_or(if cli.quick {
                1.0
            } else {
                5.0
            })),
        };
        for r in 0..repeats {
            for mode in latency_modes.iter().copied() {
                // A fresh broker per mode: a broker holding the previous
                // runs' records answers measurably slower (Tansu's memory
                // storage only grows).
                env.fresh_broker().await?;
                // A JVM broker's first seconds of load are slow (it
                // compiles its produce path): not part of a latency.
                warm_up_broker(&env, &Workload::new(mode.kind(), 1, 200, 100_000)).await?;
                let runs = latency::run_mode(&env, mode, r, &options)
                    .await
                    .with_context(|| format!("latency, {}", mode.label()))?;
                results.latency.extend(runs);
                write_outputs(&run_dir, &cli.out, &results)?;
            }
        }
    }
    if !cli.no_consumer {
        if !cli.no_drain && cli.no_latency {
            // As for the latency runs: not on the cluster the drains filled.
            drop(env);
            env = BenchEnv::start(cli.broker, cli.broker_jvm.jvm())
                .await
                .context("starting PostgreSQL and the broker for the consumer runs")?;
        }
        let options = consumer::ConsumerOptions {
            only: cli.consumers.clone(),
            records: cli
                .consumer_records
                .unwrap_or(if quick { 3_000 } else { 300_000 }),
            repeats,
            rates: cli
                .consumer_rates
                .iter()
                .copied()
                .filter(|r| *r > 0)
                .collect(),
            latency_duration: Duration::from_secs_f64(latency_secs),
        };
        let (runs, latency) = consumer::run(&mut env, &options, first_seq)
            .await
            .context("consumer runs")?;
        results.consumer = runs;
        results.consumer_latency = latency;
        write_outputs(&run_dir, &cli.out, &results)?;
    }
    results.finished = Some(humantime::format_rfc3339_seconds(SystemTime::now()).to_string());
    write_outputs(&run_dir, &cli.out, &results)?;
    println!("{}", results.markdown(None));
    println!("results: {}", run_dir.display());
    Ok(())
}

fn parse_broker(s: &str) -> Result<BrokerKind> {
    s.parse()
}

/// The broker as the report names it (`machine.broker`).
fn broker_description(kind: BrokerKind, jvm: BrokerJvm) -> String {
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

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!(
        "cargo run --release -p walrelay-bench -- {}",
        args.join(" ")
    )
    .trim_end()
    .to_owned()
}

fn write_outputs(run_dir: &Path, out: &Path, results: &Results) -> Result<()> {
    std::fs::write(
        run_dir.join("results.json"),
        serde_json::to_string_pretty(results)?,
    )?;
    std::fs::write(run_dir.join("results.svg"), svg::drain_chart(results))?;
    std::fs::write(
        run_dir.join("results.md"),
        results.markdown(Some("results.svg")),
    )?;
    let folder = run_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    std::fs::write(
        out.join("latest.md"),
        results.markdown(Some(&format!("{folder}/results.svg"))),
    )?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn drain_workload(
    env: &mut BenchEnv,
    w: &Workload,
    repeats: u32,
    first_seq: u64,
    bins: Binaries<'_>,
    walrelay_args: &[String],
    kafka_properties: &[(String, String)],
    polling: PollingOptions,
    scratch: &Path,
    results: &mut Results,
) -> Result<()> {
    tracing::info!("workload {} ({} events)", w.id, w.events);
    env.fresh_broker().await?;
    warm_up_broker(env, w).await?;
    // The broker's own idle CPU, subtracted from every run's below (a
    // moment after the warm-up, whose last requests it may still finish).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let broker_idle = env
        .broker_idle_cpu_per_s(Duration::from_secs(3))
        .await
        .unwrap_or(0.0);
    results.notes.push(format!(
        "{}: the broker's idle CPU, {:.3} s per s, is subtracted from its CPU per event",
        w.id, broker_idle
    ));
    env.client
        .batch_execute("TRUNCATE bench_outbox, bench_outbox_copy")
        .await?;
    let slot = |tool: &str, r: u32| format!("{tool}_{}_{r}", w.id.replace('-', "_"));
    let walrelays = bins.walrelays();
    if !bins.debezium.is_empty() {
        // Before the slots and the backlog (see the debezium module).
        debezium::ensure_publication(env).await?;
    }
    // The warm-up drain's slot (see below).
    env.create_slot(&slot("warmup", 0)).await?;
    for r in 0..repeats {
        for (_, name, _, _, _) in &walrelays {
            env.create_slot(&slot(name, r)).await?;
        }
        if bins.references {
            env.create_slot(&slot("rl", r)).await?;
        }
        for v in bins.debezium {
            env.create_slot(&debezium::slot(*v, &w.id, r)).await?;
        }
    }
    let took = workload::generate_backlog(&env.client, w, first_seq).await?;
    let (end, end_text) = env.current_lsn().await?;
    tracing::info!(
        "  backlog written in {:.1} s, ends at {end_text}",
        took.as_secs_f64()
    );
    if w.kind == Kind::Outbox {
        env.client
            .batch_execute("INSERT INTO bench_outbox_copy SELECT * FROM bench_outbox")
            .await?;
    }
    let timeout = Duration::from_secs(900);
    let bootstrap = env.bootstrap();
    let push = |results: &mut Results, tool, r, d: drain::DrainRun, n: Option<kafka::Counted>| {
        results.drain.push(ToolRun {
            tool,
            workload: w.id.clone(),
            repeat: r,
            events: w.events,
            seconds: d.seconds,
            events_per_s: w.events as f64 / d.seconds,
            cpu_seconds: d.cpu_seconds,
            db_cpu_seconds: Some(d.db_cpu_seconds),
            peak_rss_bytes: d.peak_rss_bytes,
            records_in_broker: n.map(|n| n.records),
            broker_cpu_seconds: d.broker_cpu_seconds,
            kafka_bytes: d.kafka_bytes,
            walrelay_header_bytes: n.map(|n| n.walrelay_header_bytes),
            fence: d.fence,
            startup: None,
            duplicates: None,
        });
        tracing::info!(
            "  {} #{r}: {:.0} events/s, cpu {:.2} s, db cpu {:.2} s{}",
            tool_name(tool),
            w.events as f64 / d.seconds,
            d.cpu_seconds,
            d.db_cpu_seconds,
            d.peak_rss_bytes
                .map(|b| format!(", peak rss {:.1} MB", b as f64 / 1e6))
                .unwrap_or_default()
        );
    };
    // A warm-up drain of the whole backlog, not counted: the first drain
    // after the backlog was written ran up to a third slower than the
    // next ones (the server's checkpoint after the bulk write, the
    // broker's JIT), a penalty on whichever row drained first (see
    // `drain_order`).
    {
        let (_, name, fence, bin, extra) = &walrelays[0];
        let topic = format!("bench.{}.warmup", w.id);
        let (config, args) = prepare_walrelay(
            env,
            scratch,
            &slot("warmup", 0),
            &topic,
            *fence,
            kafka_properties,
            walrelay_args,
            extra,
        )?;
        let log = scratch.join(format!("walrelay-{}-{name}-warmup.log", w.id));
        let d = drain::walrelay(
            env,
            bin,
            &args,
            &config,
            &slot("warmup", 0),
            end,
            &log,
            timeout,
        )
        .await?;
        tracing::info!(
            "  warm-up drain (not counted): {:.0} events/s",
            w.events as f64 / d.seconds
        );
        env.drop_slot(&slot("warmup", 0)).await?;
    }
    for r in 0..repeats {
        // walrelay with its tail fence (the default), without it, with the
        // full header set, and the baseline binary if any, in the order
        // `drain_order` gives (each compared pair adjacent, which of the
        // two goes first alternating).
        let order: Vec<WalrelayRun<'_>> = drain_order(walrelays.len(), r)
            .into_iter()
            .map(|i| walrelays[i])
            .collect();
        for (tool, name, fence, walrelay_bin, extra) in order {
            let topic = format!("bench.{}.{name}{r}", w.id);
            let (config, args) = prepare_walrelay(
                env,
                scratch,
                &slot(name, r),
                &topic,
                fence,
                kafka_properties,
                walrelay_args,
                extra,
            )?;
            let log = scratch.join(format!("walrelay-{}-{name}-{r}.log", w.id));
            let broker_cpu = env.broker_cpu_window();
            let mut d = drain::walrelay(
                env,
                walrelay_bin,
                &args,
                &config,
                &slot(name, r),
                end,
                &log,
                timeout,
            )
            .await?;
            d.broker_cpu_seconds = broker_cpu.finish(env, broker_idle);
            d.kafka_bytes = env.topic_log_bytes(&topic);
            let (b, t, n) = (bootstrap.clone(), topic.clone(), w.events);
            let counted = tokio::task::spawn_blocking(move || {
                kafka::count_records(&b, &t, n, Duration::from_secs(15), Duration::from_secs(300))
            })
            .await??;
            if counted.records > w.events {
                bail!(
                    "walrelay: {} records in {topic}, {} expected",
                    counted.records,
                    w.events
                );
            }
            if counted.records < w.events {
                // The drain itself is proven by the confirmed position
                // (walrelay confirms only what Kafka acknowledged); reading
                // the topic back is a cross-check, and Tansu's memory
                // storage can stall serving a topic of a million records.
                let note = format!(
                    "{} repeat {r} ({}): read back {} of {} records from walrelay's topic before the reader went quiet (a cross-check only; the drain is confirmed by the slot position)",
                    w.id,
                    tool.label(),
                    counted.records,
                    w.events
                );
                tracing::warn!("{note}");
                results.notes.push(note);
            }
            push(results, tool, r, d, Some(counted));
        }

        if !bins.references {
            continue;
        }
        // pg_recvlogical.
        let file = ScratchFile(scratch.join(format!("recv-{}-{r}.out", w.id)));
        let d = drain::pg_recvlogical(env, &slot("rl", r), &end_text, &file.0, timeout).await?;
        drop(file);
        push(results, Tool::PgRecvlogical, r, d, None);

        // The produce limit.
        let topic = format!("bench.{}.producer{r}", w.id);
        env.create_topic(&topic)?;
        let (b, t, wl) = (bootstrap.clone(), topic.clone(), w.clone());
        let db = env.db_cpu_window()?;
        let broker_cpu = env.broker_cpu_window();
        let p = tokio::task::spawn_blocking(move || kafka::produce_limit(&b, &t, &wl)).await??;
        let d = drain::DrainRun {
            seconds: p.seconds,
            cpu_seconds: p.cpu_seconds,
            db_cpu_seconds: db.finish().await?,
            broker_cpu_seconds: broker_cpu.finish(env, broker_idle),
            kafka_bytes: env.topic_log_bytes(&topic),
            ..Default::default()
        };
        push(results, Tool::Producer, r, d, None);
    }
    for r in 0..repeats {
        for (_, name, _, _, _) in &walrelays {
            env.drop_slot(&slot(name, r)).await?;
        }
        if bins.references {
            env.drop_slot(&slot("rl", r)).await?;
        }
    }
    // Debezium after every other drain of the backlog: its restart commits
    // one more event, which no other tool's drain may see.
    if !bins.debezium.is_empty() {
        // walrelay's start and restart beside Debezium's, where those run.
        let walrelay_start = debezium::WalrelayStart {
            bin: bins.walrelay.to_path_buf(),
            scratch: scratch.to_path_buf(),
        };
        debezium::drain_workload(
            env,
            w,
            repeats,
            first_seq,
            bins.debezium,
            bins.debezium_restart,
            Some(&walrelay_start),
            broker_idle,
            results,
        )
        .await?;
    }
    if w.kind == Kind::Outbox && bins.references {
        for r in 0..repeats {
            if r > 0 {
                env.client
                    .batch_execute("INSERT INTO bench_outbox SELECT * FROM bench_outbox_copy")
                    .await?;
            }
            env.client
                .batch_execute("VACUUM ANALYZE bench_outbox")
                .await?;
            let topic = format!("bench.{}.poll{r}", w.id);
            env.create_topic(&topic)?;
            let mut relay =
                PollingRelay::new(env.new_client().await?, &bootstrap, &topic, polling)?;
            let db = env.db_cpu_window()?;
            let cpu0 = procstat::self_cpu_seconds()?;
            let t0 = std::time::Instant::now();
            let n = relay.drain().await?;
            let seconds = t0.elapsed().as_secs_f64();
            if n != w.events {
                bail!("polling relay relayed {n} rows, {} expected", w.events);
            }
            let d = drain::DrainRun {
                seconds,
                cpu_seconds: procstat::self_cpu_seconds()? - cpu0,
                db_cpu_seconds: db.finish().await?,
                ..Default::default()
            };
            push(results, Tool::Polling, r, d, None);
        }
    }
    Ok(())
}

/// Sends a fresh broker records like `w`'s (up to 100,000, with the plain
/// producer) before anything is measured on it, so that the first run of a
/// workload does not pay for the broker's start (a JVM compiles its produce
/// path in the first seconds: a few thousand events would otherwise show
/// ten times the broker CPU per event of the runs after them).
async fn warm_up_broker(env: &BenchEnv, w: &Workload) -> Result<()> {
    let topic = "bench.warm-up";
    env.create_topic(topic)?;
    let warm = Workload {
        events: w.events.min(100_000),
        ..w.clone()
    };
    let b = env.bootstrap();
    tokio::task::spawn_blocking(move || kafka::produce_limit(&b, topic, &warm)).await??;
    Ok(())
}

/// One walrelay drained ([`Binaries::walrelays`]).
type WalrelayRun<'a> = (Tool, &'static str, bool, &'a Path, &'static [&'static str]);

/// The binaries a drain runs.
#[derive(Debug, Clone, Copy)]
struct Binaries<'a> {
    walrelay: &'a Path,
    /// `--baseline-bin`.
    baseline: Option<&'a Path>,
    /// Whether the reference tools (decode and produce limits, the
    /// polling relay) drain too.
    references: bool,
    /// Debezium's variants drained (none: `--no-debezium`).
    debezium: &'a [Variant],
    /// Whether Debezium's workers are restarted after their drains.
    debezium_restart: bool,
}

impl<'a> Binaries<'a> {
    /// The walrelay drains of one repeat: tool, slot and topic name, tail
    /// fence on, binary.
    /// Each walrelay drained: its tool, slot and topic tag, whether its
    /// fence is on, its binary and its extra arguments.
    fn walrelays(&self) -> Vec<WalrelayRun<'a>> {
        let mut v = vec![
            (Tool::Walrelay, "wr", true, self.walrelay, &[][..]),
            (Tool::WalrelayNoFence, "wn", false, self.walrelay, &[][..]),
            (
                Tool::WalrelayFullHeaders,
                "wf",
                true,
                self.walrelay,
                &["--headers", "full"][..],
            ),
        ];
        if let Some(b) = self.baseline {
            v.push((Tool::WalrelayBaseline, "wb", true, b, &[][..]));
        }
        v
    }
}

/// Creates a walrelay drain's topic and writes its configuration (slot,
/// topic, fence, the bench's producer properties): the configuration's
/// path and the binary's arguments (the bench's, then the row's own).
#[allow(clippy::too_many_arguments)]
fn prepare_walrelay(
    env: &BenchEnv,
    scratch: &Path,
    slot: &str,
    topic: &str,
    fence: bool,
    kafka_properties: &[(String, String)],
    walrelay_args: &[String],
    extra: &[&str],
) -> Result<(PathBuf, Vec<String>)> {
    env.create_topic(topic)?;
    let config = scratch.join("walrelay.toml");
    drain::write_walrelay_config(&config, env, slot, topic, topic, kafka_properties, fence)?;
    let args = walrelay_args
        .iter()
        .cloned()
        .chain(extra.iter().map(|a| a.to_string()))
        .collect();
    Ok((config, args))
}

/// The order of repeat `r`'s walrelay drains, as indices into
/// [`Binaries::walrelays`] (0 this build, 1 fence off, 2 full header set,
/// 3 the baseline binary if any).
///
/// Drains speed up over a workload's first minute or two (the fresh
/// broker's JIT, the server after the bulk write), so a ratio between two
/// drains is biased towards the later one. An A/A run (the baseline the
/// same binary) showed 0.89x with the old rotation of all four, which
/// never put the baseline first in three repeats. So the pairs the report
/// compares (this build against fence off, and against the baseline) run
/// back to back with this build in the middle, in alternating direction;
/// the full header set, compared on bytes rather than speed, runs last.
fn drain_order(len: usize, r: u32) -> Vec<usize> {
    let mut core: Vec<usize> = [1, 0, 3].into_iter().filter(|&i| i < len).collect();
    if r % 2 == 1 {
        core.reverse();
    }
    core.extend((2..3).filter(|&i| i < len));
    core
}

fn tool_name(t: Tool) -> &'static str {
    match t {
        Tool::Walrelay => "walrelay",
        Tool::WalrelayNoFence => "walrelay (fence off)",
        Tool::WalrelayFullHeaders => "walrelay (full header set)",
        Tool::WalrelayBaseline => "walrelay (baseline binary)",
        Tool::PgRecvlogical => "pg_recvlogical",
        Tool::Producer => "rdkafka producer",
        Tool::Polling => "polling relay",
        Tool::Debezium => "Debezium (defaults)",
        Tool::DebeziumTuned => "Debezium (tuned)",
    }
}

#[cfg(test)]
mod tests {
    use super::drain_order;

    #[test]
    fn compared_drains_run_back_to_back_in_alternating_direction() {
        // Without a baseline: fence off and this build adjacent, swapping
        // who goes first; the full header set last.
        assert_eq!(drain_order(3, 0), vec![1, 0, 2]);
        assert_eq!(drain_order(3, 1), vec![0, 1, 2]);
        // With one: this build between its two comparisons.
        assert_eq!(drain_order(4, 0), vec![1, 0, 3, 2]);
        assert_eq!(drain_order(4, 1), vec![3, 0, 1, 2]);
        assert_eq!(drain_order(4, 2), vec![1, 0, 3, 2]);
        for r in 0..4 {
            let mut o = drain_order(4, r);
            o.sort_unstable();
            assert_eq!(o, vec![0, 1, 2, 3], "every run once");
        }
    }
}
