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

mod cli;
mod consumer;
mod crash;
mod debezium;
mod drain;
mod env;
mod install;
mod kafka;
mod latency;
mod polling;
/// CPU time and peak memory from `/proc`, shared with the test kit's
/// process handles.
pub(crate) use walrelay_testkit::procstat;
mod report;
mod runs;
mod svg;
mod workload;
mod workload_drain;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::Parser;

use crate::cli::{broker_description, command_line, BenchCommand, Cli};
use crate::env::BenchEnv;
use crate::polling::PollingOptions;
use crate::runs::{Machine, Mode, Results};
use crate::workload::Workload;
use crate::workload_drain::{drain_workload, warm_up_broker, Binaries, DrainOptions};
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

/// The run's settings, from the command line with quick mode's defaults.
struct Run {
    quick: bool,
    repeats: u32,
    latency_secs: f64,
    rates: Vec<Option<u64>>,
    workloads: Vec<Workload>,
    walrelay_bin: PathBuf,
    kafka_properties: Vec<(String, String)>,
    polling: PollingOptions,
    debezium_variants: Vec<Variant>,
    debezium_note: Option<String>,
    /// The Python consumer rows and the Python relay are skipped: their
    /// virtualenv could not be installed.
    no_python_consumers: bool,
    /// Whether the Python relay drains (with the references).
    python_relay: bool,
    /// The sections skipped for an install that failed.
    install_notes: Vec<String>,
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
        return crash::main(crash_installed(args)?, Path::new(WORKSPACE)).await;
    }
    let installed = install::prepare(install::Wants::of(&cli))?;
    let run = settings(&cli, &installed)?;
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .replace(':', "-");
    let run_dir = cli.out.join(&stamp);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {run_dir:?}"))?;
    // Scratch space (pg_recvlogical output, walrelay config and logs).
    let scratch_dir = tempfile::Builder::new()
        .prefix("walrelay-bench-")
        .tempdir()?;

    tracing::info!("starting PostgreSQL and {}", cli.broker);
    let mut env = BenchEnv::start(cli.broker, cli.broker_jvm.jvm()).await?;
    let mut results = new_results(&cli, &run, &env);
    let mut first_seq = 1u64;
    if !cli.no_drain {
        first_seq = drains(
            &cli,
            &run,
            &mut env,
            scratch_dir.path(),
            &run_dir,
            &mut results,
        )
        .await?;
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
        latencies(
            &cli,
            &run,
            scratch_dir.path(),
            &mut env,
            &run_dir,
            &mut results,
        )
        .await?;
    }
    if !cli.no_consumer {
        if !cli.no_drain && cli.no_latency {
            // As for the latency runs: not on the cluster the drains filled.
            drop(env);
            env = BenchEnv::start(cli.broker, cli.broker_jvm.jvm())
                .await
                .context("starting PostgreSQL and the broker for the consumer runs")?;
        }
        consumers(&cli, &run, &mut env, first_seq, &mut results).await?;
        write_outputs(&run_dir, &cli.out, &results)?;
    }
    results.finished = Some(humantime::format_rfc3339_seconds(SystemTime::now()).to_string());
    write_outputs(&run_dir, &cli.out, &results)?;
    println!("{}", results.markdown(None));
    println!("results: {}", run_dir.display());
    Ok(())
}

/// The crash comparison's installs: PostgreSQL, Kafka and, for its
/// Debezium tools, Debezium; without Debezium those tools are left out
/// (named in its report's notes).
fn crash_installed(mut args: crash::CrashArgs) -> Result<crash::CrashArgs> {
    let debezium = args.tools.iter().any(|t| *t != crash::CrashTool::Walrelay);
    let installed = install::prepare(install::Wants {
        broker: BrokerKind::Kafka,
        debezium,
        python: false,
    })?;
    if installed.skips(install::Prerequisite::Debezium) {
        args.tools.retain(|t| *t == crash::CrashTool::Walrelay);
    }
    args.note.extend(installed.notes());
    Ok(args)
}

/// What the command line asks for, with quick mode's defaults; refuses
/// what cannot run (a missing binary, an unknown workload).
fn settings(cli: &Cli, installed: &install::Prepared) -> Result<Run> {
    let quick = cli.quick;
    let events = cli.events.unwrap_or(if quick { 5_000 } else { 1_000_000 });
    let large = cli
        .large_events
        .unwrap_or(if quick { 2_000 } else { 250_000 });
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
    let (debezium_variants, debezium_note) = if installed.skips(install::Prerequisite::Debezium) {
        (Vec::new(), None)
    } else {
        debezium_variants(cli)?
    };
    Ok(Run {
        quick,
        repeats: cli.repeats.unwrap_or(if quick { 1 } else { 3 }).max(1),
        latency_secs: cli
            .latency_seconds
            .unwrap_or(if quick { 1.0 } else { 10.0 }),
        rates,
        workloads,
        walrelay_bin,
        kafka_properties,
        polling: PollingOptions {
            batch: cli.poll_batch,
            interval: cli.poll_interval,
        },
        debezium_variants,
        debezium_note,
        no_python_consumers: installed.skips(install::Prerequisite::PythonVenv),
        python_relay: !cli.no_references && !installed.skips(install::Prerequisite::PythonVenv),
        install_notes: installed.notes(),
    })
}

/// Debezium's variants to run, or why none run.
fn debezium_variants(cli: &Cli) -> Result<(Vec<Variant>, Option<String>)> {
    if cli.no_debezium {
        return Ok((Vec::new(), None));
    }
    if cli.broker != BrokerKind::Kafka {
        return Ok((
            Vec::new(),
            Some(format!(
                "no Debezium rows: Debezium runs on Apache Kafka only (this run: {})",
                cli.broker
            )),
        ));
    }
    // Found as the broker's install is, before anything starts.
    let home = DebeziumHome::find()?;
    tracing::info!("Debezium from {}", home.dir().display());
    let names = if cli.debezium_variants.is_empty() {
        if cli.quick {
            vec!["tuned".to_owned()]
        } else {
            vec!["tuned".to_owned(), "defaults".to_owned()]
        }
    } else {
        cli.debezium_variants.clone()
    };
    Ok((debezium::parse_variants(&names)?, None))
}

/// The report's header and notes, before any run.
fn new_results(cli: &Cli, run: &Run, env: &BenchEnv) -> Results {
    let mut results = Results {
        command: command_line(),
        mode: if run.quick { "quick" } else { "full" }.into(),
        started: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        finished: None,
        machine: Machine::detect(
            env.cluster.version(),
            broker_description(cli.broker, cli.broker_jvm),
        ),
        repeats: run.repeats,
        latency_seconds: run.latency_secs,
        polling_batch: run.polling.batch,
        polling_interval_ms: run.polling.interval.as_millis() as u64,
        workloads: run.workloads.clone(),
        drain: Vec::new(),
        latency: Vec::new(),
        consumer: Vec::new(),
        consumer_latency: Vec::new(),
        restarts: Vec::new(),
        notes: cli.note.clone(),
    };
    results.notes.extend(run.debezium_note.clone());
    results.notes.extend(run.install_notes.iter().cloned());
    if !run.debezium_variants.is_empty() {
        results.notes.push(format!(
            "Debezium {} on Kafka Connect {KAFKA_VERSION} (standalone), variants {:?} (bench/debezium/); its drains are timed from the moment the connector streams (its walsender holds the slot) until the records of every event are in Kafka (the topics' end offsets, then read back and counted by event), its CPU is the worker JVM's over the same time (what it used to start is in the start table)",
            walrelay_testkit::debezium::DEBEZIUM_VERSION,
            run.debezium_variants.iter().map(|v| v.name()).collect::<Vec<_>>()
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
    if !run.kafka_properties.is_empty() {
        results.notes.push(format!(
            "walrelay producer properties added: {:?}",
            run.kafka_properties
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
    results
}

/// Every workload's drains; returns the next free sequence number.
async fn drains(
    cli: &Cli,
    run: &Run,
    env: &mut BenchEnv,
    scratch: &Path,
    run_dir: &Path,
    results: &mut Results,
) -> Result<u64> {
    let mut first_seq = 1u64;
    // The virtualenv brought up to date (psycopg2 for the Python relay).
    let python = match run.python_relay {
        true => Some(consumer::python::venv_python().await?),
        false => None,
    };
    for w in &run.workloads {
        let options = DrainOptions {
            repeats: run.repeats,
            first_seq,
            bins: Binaries {
                walrelay: &run.walrelay_bin,
                baseline: cli.baseline_bin.as_deref(),
                references: !cli.no_references,
                python: python.as_deref(),
                // Every Debezium drain and restart is a JVM start (5-30
                // s): quick mode, a path check in CI, drains one
                // workload of each kind and restarts on the first.
                debezium: if !run.quick || QUICK_DEBEZIUM_WORKLOADS.contains(&w.id.as_str()) {
                    &run.debezium_variants
                } else {
                    &[]
                },
                debezium_restart: !run.quick || w.id == QUICK_DEBEZIUM_WORKLOADS[0],
            },
            walrelay_args: &cli.walrelay_args,
            kafka_properties: &run.kafka_properties,
            polling: run.polling,
            scratch,
        };
        drain_workload(env, w, &options, results)
            .await
            .with_context(|| format!("workload {}", w.id))?;
        // Two more: the events of the start and restart runs.
        first_seq += w.events + 2;
        write_outputs(run_dir, &cli.out, results)?;
    }
    Ok(first_seq)
}

/// The latency modes to run: `--latency-modes`, or all of them, the
/// tuned Debezium only when Debezium runs, and the binaries' A/B pair only
/// with `--baseline-bin`.
fn latency_modes(cli: &Cli, run: &Run) -> Result<Vec<Mode>> {
    if let Some(t) = cli
        .latency_modes
        .iter()
        .find(|t| !Mode::ALL.iter().any(|m| m.tag() == t.as_str()))
    {
        let all: Vec<&str> = Mode::ALL.iter().map(|m| m.tag()).collect();
        bail!("--latency-modes: no mode {t:?} ({})", all.join(", "));
    }
    let chosen = |m: &Mode| {
        if cli.latency_modes.is_empty() {
            match m {
                Mode::DebeziumOutbox => !run.debezium_variants.is_empty(),
                Mode::WalrelayBinary | Mode::BaselineBinary => cli.baseline_bin.is_some(),
                _ => true,
            }
        } else {
            cli.latency_modes.iter().any(|t| t == m.tag())
                && (*m != Mode::DebeziumOutbox || !run.debezium_variants.is_empty())
        }
    };
    let modes: Vec<Mode> = Mode::ALL.into_iter().filter(chosen).collect();
    if modes.contains(&Mode::BaselineBinary) && cli.baseline_bin.is_none() {
        bail!("--latency-modes wr_base needs --baseline-bin");
    }
    let binary = modes
        .iter()
        .any(|m| matches!(m, Mode::WalrelayBinary | Mode::BaselineBinary));
    if binary && !run.walrelay_bin.is_file() {
        bail!(
            "the binaries' latency modes run {} (--walrelay-bin): build it first (cargo build --release -p walrelay)",
            run.walrelay_bin.display()
        );
    }
    Ok(modes)
}

/// The latency runs: each mode at each rate, on a fresh broker.
async fn latencies(
    cli: &Cli,
    run: &Run,
    scratch: &Path,
    env: &mut BenchEnv,
    run_dir: &Path,
    results: &mut Results,
) -> Result<()> {
    let latency_modes = latency_modes(cli, run)?;
    let options = latency::LatencyOptions {
        rates: run.rates.clone(),
        duration: Duration::from_secs_f64(run.latency_secs),
        polling: run.polling,
        payload_size: 200,
        kafka_properties: run.kafka_properties.clone(),
        warmup: Duration::from_secs_f64(cli.latency_warmup_seconds.unwrap_or(if run.quick {
            1.0
        } else {
            latency::DEFAULT_WARMUP_SECONDS
        })),
        walrelay_bin: run.walrelay_bin.clone(),
        baseline_bin: cli.baseline_bin.clone(),
        scratch: scratch.to_owned(),
    };
    for r in 0..run.repeats {
        // The A/B pair runs back to back, which of the two goes first
        // alternating by repeat (as the drains' pairs do).
        let mut order = latency_modes.clone();
        if r % 2 == 1 {
            if let (Some(a), Some(b)) = (
                order.iter().position(|m| *m == Mode::WalrelayBinary),
                order.iter().position(|m| *m == Mode::BaselineBinary),
            ) {
                order.swap(a, b);
            }
        }
        for mode in order {
            // A fresh broker per mode: a broker holding the previous
            // runs' records answers measurably slower (Tansu's memory
            // storage only grows).
            env.fresh_broker().await?;
            // A JVM broker's first seconds of load are slow (it
            // compiles its produce path): not part of a latency.
            warm_up_broker(env, &Workload::new(mode.kind(), 1, 200, 100_000)).await?;
            let runs = latency::run_mode(env, mode, r, &options)
                .await
                .with_context(|| format!("latency, {}", mode.label()))?;
            results.latency.extend(runs);
            write_outputs(run_dir, &cli.out, results)?;
        }
    }
    Ok(())
}

/// The consumer runs.
async fn consumers(
    cli: &Cli,
    run: &Run,
    env: &mut BenchEnv,
    first_seq: u64,
    results: &mut Results,
) -> Result<()> {
    let options = consumer::ConsumerOptions {
        only: cli.consumers.clone(),
        no_python: run.no_python_consumers,
        no_java: false,
        records: cli
            .consumer_records
            .unwrap_or(if run.quick { 3_000 } else { 300_000 }),
        repeats: run.repeats,
        rates: cli
            .consumer_rates
            .iter()
            .copied()
            .filter(|r| *r > 0)
            .collect(),
        latency_duration: Duration::from_secs_f64(run.latency_secs),
        latency_warmup: Duration::from_secs_f64(
            cli.latency_warmup_seconds
                .unwrap_or(if run.quick { 1.0 } else { 5.0 }),
        ),
        broker_warmup: Duration::from_secs_f64(if run.quick {
            1.0
        } else {
            latency::DEFAULT_WARMUP_SECONDS
        }),
        live_partitions: cli.consumer_partitions.clone(),
    };
    let (runs, latency, notes) = consumer::run(env, &options, first_seq)
        .await
        .context("consumer runs")?;
    results.notes.extend(notes);
    results.consumer = runs;
    results.consumer_latency = latency;
    Ok(())
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
