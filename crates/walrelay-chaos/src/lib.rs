//! A randomized chaos harness for walrelay (issue #5).
//!
//! A mixed workload ([`workload`]) runs against a source PostgreSQL while
//! faults ([`faults`]) hit the relay (`kill -9`, SIGTERM), PostgreSQL
//! (`pg_terminate_backend` of the walsender, immediate restart), the
//! broker (outages longer than the producer's message timeout, through a
//! [`proxy`]) and the consumer (killed between its database commit and its
//! offset commit). At the end the whole history ([`history`]) is checked
//! ([`checker`]): every committed event processed exactly once, in commit
//! order per partition, nothing rolled back processed, nothing confirmed
//! to PostgreSQL before Kafka acknowledged it. See `docs/chaos.md`.
//!
//! Everything random comes from one seed, printed at the start: a failing
//! run's fault sequence and workload can be replayed with `--seed`
//! (timing still varies).

pub mod broker_faults;
pub mod checker;
pub mod consumer;
pub mod event;
pub mod faults;
pub mod history;
pub mod proxy;
pub mod services;
pub mod workload;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use tokio::sync::watch;
use walrelay_testkit::await_condition;

use faults::{FaultKind, FaultLog, Schedule};
use services::{Services, Supervised, GROUP, MESSAGE_TIMEOUT, RAW_PREFIX, RAW_TOPIC, SLOT, TOPICS};
use workload::{Progress, Workload, WorkloadConfig};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// A few minutes, several faults of every kind (CI).
    Short,
    /// A soak run: at least 100 relay kill -9 and 1,000,000 events.
    Long,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub mode: Mode,
    pub seed: u64,
    /// The `walrelay` binary under test.
    pub relay_bin: PathBuf,
    /// The `walrelay-chaos` binary (runs the consumer).
    pub chaos_bin: PathBuf,
    /// Events to commit at least (default by mode).
    pub events: Option<u64>,
    /// Relay kill -9 at least (long mode; default 100).
    pub relay_kills: Option<u32>,
    /// Keep the working directory (logs, trace).
    pub keep: bool,
    /// Run the relay with its tail fence (the default). Off, replayed
    /// duplicates on the wire are expected and do not fail the run.
    pub fence: bool,
    /// 1: one broker behind the fault proxy (Tansu, or Apache Kafka with
    /// WALRELAY_BROKER=kafka); 3: three Apache Kafka nodes and the
    /// cluster's faults ([`broker_faults`]).
    pub brokers: usize,
    /// A Python interpreter with the `walrelay_consumer` package: runs the
    /// Python consumer beside the Rust one, checked the same way.
    pub python: Option<PathBuf>,
}

/// The seed of a test run: `WALRELAY_CHAOS_SEED` (to replay one), else
/// from the clock.
#[must_use]
pub fn seed_from_env() -> u64 {
    std::env::var("WALRELAY_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

impl Options {
    /// The short mode as a test runs it: the seed from
    /// [`seed_from_env`], the relay of [`relay_binary_for_tests`], the
    /// fence on.
    pub fn short_test(
        chaos_bin: PathBuf,
        brokers: usize,
        python: Option<PathBuf>,
    ) -> Result<Options> {
        Ok(Options {
            mode: Mode::Short,
            seed: seed_from_env(),
            relay_bin: relay_binary_for_tests()?,
            chaos_bin,
            events: None,
            relay_kills: None,
            keep: false,
            fence: true,
            brokers,
            python,
        })
    }
}

/// The `walrelay` binary of the profile a test binary was built with:
/// `target/<profile>/deps/<test>-<hash>` → `target/<profile>/walrelay`
/// (`scripts/test.sh` builds it before the tests).
pub fn relay_binary_for_tests() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .and_then(std::path::Path::parent)
        .context("the test binary is not under target/<profile>/deps")?
        .join("walrelay");
    ensure!(
        path.is_file(),
        "{} is missing: scripts/test.sh builds it (cargo build --workspace --bins --examples)",
        path.display()
    );
    Ok(path)
}

/// The Python consumer's group, and its script (in this crate's source).
pub const PYTHON_GROUP: &str = "chaos-py";
const PYTHON_CONSUMER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/chaos_consumer.py");

/// The result of a run.
pub struct Report {
    pub seed: u64,
    pub table: String,
    pub failures: Vec<String>,
    pub elapsed: Duration,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

struct Plan {
    events: u64,
    schedule: Schedule,
    workload: WorkloadConfig,
    /// The kinds of fault this run injects.
    kinds: &'static [FaultKind],
    /// Each kind at least this often (short mode checks it).
    min_each: u32,
}

fn plan(o: &Options) -> Plan {
    use FaultKind::*;
    if o.brokers == 3 {
        return three_broker_plan(o);
    }
    match o.mode {
        Mode::Short => {
            let counts = [
                (RelayKill9, 4),
                (RelaySigterm, 2),
                (TerminateWalsender, 3),
                (PgImmediateRestart, 2),
                (BrokerRefuse, 2),
                (BrokerStall, 2),
                (ConsumerKill, 3),
            ];
            Plan {
                events: o.events.unwrap_or(20_000),
                schedule: Schedule::fixed(
                    o.seed,
                    &counts,
                    (Duration::from_millis(1000), Duration::from_millis(3000)),
                ),
                workload: WorkloadConfig {
                    rate: 600.0,
                    max_backlog: 8_000,
                    max_tx_events: 10_000,
                    sizes: [0.7, 0.25, 0.04, 0.01],
                },
                kinds: &FaultKind::ONE_BROKER,
                min_each: 2,
            }
        }
        Mode::Long => Plan {
            events: o.events.unwrap_or(1_000_000),
            schedule: Schedule::weighted(
                o.seed,
                &[
                    (RelayKill9, 10),
                    (RelaySigterm, 1),
                    (TerminateWalsender, 2),
                    (PgImmediateRestart, 1),
                    (BrokerRefuse, 1),
                    (BrokerStall, 1),
                    (ConsumerKill, 2),
                ],
                o.relay_kills.unwrap_or(100),
                (Duration::from_millis(1500), Duration::from_millis(5000)),
            ),
            workload: WorkloadConfig {
                rate: 1_500.0,
                max_backlog: 60_000,
                max_tx_events: 10_000,
                sizes: [0.55, 0.27, 0.14, 0.04],
            },
            kinds: &FaultKind::ONE_BROKER,
            min_each: 1,
        },
    }
}

/// Three brokers: every cluster fault, with fewer of the others (each
/// broker fault waits for the cluster to recover, a JVM restart or more).
fn three_broker_plan(o: &Options) -> Plan {
    use FaultKind::*;
    let workload = |rate: f64, max_backlog: u64| WorkloadConfig {
        rate,
        max_backlog,
        max_tx_events: 10_000,
        sizes: [0.6, 0.3, 0.08, 0.02],
    };
    match o.mode {
        Mode::Short => Plan {
            events: o.events.unwrap_or(20_000),
            schedule: Schedule::fixed(
                o.seed,
                &[
                    (RelayKill9, 2),
                    (RelaySigterm, 1),
                    (TerminateWalsender, 1),
                    (PgImmediateRestart, 1),
                    (ConsumerKill, 2),
                    (LeaderKill, 2),
                    (RollingRestart, 1),
                    (Reassignment, 1),
                    (ControllerRestart, 1),
                    (CoordinatorKill, 1),
                    (RelayKillInElection, 2),
                    (BelowMinIsr, 1),
                ],
                (Duration::from_millis(1000), Duration::from_millis(3000)),
            ),
            workload: workload(600.0, 8_000),
            kinds: &FaultKind::THREE_BROKERS,
            min_each: 1,
        },
        Mode::Long => Plan {
            events: o.events.unwrap_or(1_000_000),
            schedule: Schedule::weighted(
                o.seed,
                &[
                    (RelayKill9, 6),
                    (RelaySigterm, 1),
                    (TerminateWalsender, 1),
                    (PgImmediateRestart, 1),
                    (ConsumerKill, 2),
                    (LeaderKill, 3),
                    (RollingRestart, 1),
                    (Reassignment, 2),
                    (ControllerRestart, 2),
                    (CoordinatorKill, 2),
                    (RelayKillInElection, 3),
                    (BelowMinIsr, 1),
                ],
                o.relay_kills.unwrap_or(100),
                (Duration::from_millis(1500), Duration::from_millis(5000)),
            ),
            workload: workload(1_500.0, 60_000),
            kinds: &FaultKind::THREE_BROKERS,
            min_each: 1,
        },
    }
}

fn relay_args(s: &Services, config: &std::path::Path, trace: &std::path::Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "--config",
        &config.display().to_string(),
        "--postgres-url",
        &s.source_url(),
        "--bootstrap-servers",
        &s.bootstrap(),
        "--route",
        &format!("{RAW_PREFIX}={RAW_TOPIC}"),
        "--outbox-table",
        "public.outbox",
        "--status-interval",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // One broker: its outages (through the proxy) must outlast the
    // producer's timeout, so it is short. Three brokers: the relay's
    // default (30 s), as in production, which a leader failover stays
    // well within (a session that ends on a timeout leaves records of its
    // producer in flight, and the next session writes them again).
    if s.proxy().is_some() {
        args.extend([
            "--kafka-property".to_owned(),
            format!("message.timeout.ms={}", MESSAGE_TIMEOUT.as_millis()),
        ]);
    }
    // The trace file last: `setup` is run with the arguments before it.
    args.extend([
        "--log".to_owned(),
        "warn".to_owned(),
        "--trace-file".to_owned(),
        trace.display().to_string(),
    ]);
    args
}

async fn slot_confirmed(url: &str) -> Result<u64> {
    let c = workload::connect(url).await?;
    let row = c
        .query_one(
            "SELECT (confirmed_flush_lsn - '0/0')::bigint, (pg_current_wal_lsn() - '0/0')::bigint
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT],
        )
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

async fn current_lsn(url: &str) -> Result<u64> {
    let c = workload::connect(url).await?;
    let row = c
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

async fn applied_count(dsn: &str, table: &str) -> Result<u64> {
    let c = workload::connect(dsn).await?;
    let row = c
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

/// Runs the harness once; `Err` only when the harness itself could not
/// run (the system's failures are in [`Report::failures`]).
pub async fn run(o: Options) -> Result<Report> {
    let started = Instant::now();
    println!(
        "walrelay-chaos: mode {:?}, seed {} (rerun with --seed {})",
        o.mode, o.seed, o.seed
    );
    let mut plan = plan(&o);
    for bin in [&o.relay_bin, &o.chaos_bin] {
        ensure!(
            bin.is_file(),
            "{} is missing: build it first (cargo build --bins, with --release for the long mode)",
            bin.display()
        );
    }
    let s = Services::start(o.keep, o.brokers).await?;
    println!("walrelay-chaos: working directory {}", s.dir.display());
    let config = s.path("walrelay.toml");
    // Reconnect quickly after faults (the default backoff grows to 30 s).
    std::fs::write(
        &config,
        format!(
            "[relay]\nmax_backoff = \"1s\"\nstandby_poll = \"200ms\"\nfence = {}\n",
            o.fence
        ),
    )?;
    let trace = s.path("trace.jsonl");
    let args = relay_args(&s, &config, &trace);
    let setup = tokio::process::Command::new(&o.relay_bin)
        .args(&args[..args.len() - 2])
        .arg("setup")
        .output()
        .await?;
    ensure!(
        setup.status.success(),
        "walrelay setup failed: {}",
        String::from_utf8_lossy(&setup.stderr)
    );
    let mut auditor = history::Auditor::new(s.source_url());
    auditor.create_slot().await?;

    let mut relay = Supervised::new(
        "relay",
        o.relay_bin.clone(),
        [args.clone(), vec!["run".into()]].concat(),
        s.path("relay.log"),
    );
    let mut consumer_args = vec![
        "consumer".to_string(),
        "--bootstrap".into(),
        s.bootstrap(),
        "--dsn".into(),
        s.service_dsn(),
        "--group".into(),
        GROUP.into(),
    ];
    for (t, _) in TOPICS {
        consumer_args.extend(["--topic".into(), t.into()]);
    }
    let mut consumer = Supervised::new(
        "consumer",
        o.chaos_bin.clone(),
        consumer_args,
        s.path("consumer.log"),
    );
    let mut python = o.python.as_ref().map(|interpreter| {
        let mut args = vec![
            PYTHON_CONSUMER.to_string(),
            "--bootstrap".into(),
            s.bootstrap(),
            "--dsn".into(),
            s.service_dsn(),
            "--group".into(),
            PYTHON_GROUP.into(),
        ];
        for (t, _) in TOPICS {
            args.extend(["--topic".into(), t.into()]);
        }
        Supervised::new(
            "Python consumer",
            interpreter.clone(),
            args,
            s.path("consumer-py.log"),
        )
    });
    relay.start()?;
    consumer.start()?;
    if let Some(p) = &mut python {
        p.start()?;
    }

    let progress = Arc::new(Progress::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let poller = {
        let progress = Arc::clone(&progress);
        let dsn = s.service_dsn();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut client = None;
            while !*stop.borrow() {
                if client.is_none() {
                    client = workload::connect(&dsn).await.ok();
                }
                if let Some(c) = &client {
                    match c
                        .query_one("SELECT coalesce(max(seq), 0) FROM chaos_applied", &[])
                        .await
                    {
                        Ok(r) => progress
                            .applied
                            .store(r.get::<_, i64>(0) as u64, Ordering::Relaxed),
                        Err(_) => client = None,
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = stop.changed() => {}
                }
            }
        })
    };
    let workload = tokio::spawn(
        Workload::new(o.seed, plan.workload.clone(), s.source_url())
            .run(stop_rx.clone(), Arc::clone(&progress)),
    );

    // Faults, until the schedule is done and enough events committed.
    let mut log = FaultLog::default();
    let mut last_report = Instant::now();
    loop {
        let gap = plan.schedule.next_gap();
        let until = Instant::now() + gap;
        while Instant::now() < until {
            relay.ensure_running()?;
            consumer.ensure_running()?;
            if let Some(p) = &mut python {
                p.ensure_running()?;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if workload.is_finished() {
            break;
        }
        let committed = progress.committed_events.load(Ordering::Relaxed);
        let kind = plan.schedule.next(&log);
        if kind.is_none() && committed >= plan.events {
            break;
        }
        if let Some(kind) = kind {
            let rng = plan.schedule.rng();
            let mut rng = rand::SeedableRng::seed_from_u64(rand::RngExt::random(rng));
            faults::inject(
                kind,
                &s,
                &mut relay,
                &mut consumer,
                python.as_mut(),
                &mut rng,
                &mut log,
            )
            .await?;
        }
        let _ = auditor.drain().await;
        if last_report.elapsed() > Duration::from_secs(20) {
            last_report = Instant::now();
            println!(
                "walrelay-chaos: {:>5.0}s  {} faults ({} relay kill -9)  {} events committed, {} applied",
                started.elapsed().as_secs_f64(),
                log.total(),
                log.count(FaultKind::RelayKill9),
                committed,
                progress.applied.load(Ordering::Relaxed)
            );
        }
    }
    stop_tx.send_replace(true);
    let units = workload.await?.context("the workload failed")?;
    poller.await?;
    println!(
        "walrelay-chaos: {:.0}s: workload stopped after {} units; draining",
        started.elapsed().as_secs_f64(),
        units.len()
    );

    // Let everything catch up, with every service up.
    relay.ensure_running()?;
    consumer.ensure_running()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = auditor.drain().await {
        ensure!(Instant::now() < deadline, "draining the audit slot: {e:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let end = current_lsn(&s.source_url()).await?;
    let url = s.source_url();
    let drained = await_condition(
        Duration::from_secs(300),
        Duration::from_millis(250),
        || async { Ok(slot_confirmed(&url).await? >= end) },
    )
    .await;
    let mut failures = Vec::new();
    if let Err(e) = drained {
        failures.push(format!(
            "the slot never confirmed the end of the workload: {e:#}\n{}",
            services::tail(relay.log_path(), 20)
        ));
    }
    let ledger = history::ledger(&s.source_url()).await?;
    let expected = ledger.values().map(|n| *n as u64).sum::<u64>() + auditor.non_tx.len() as u64;
    let dsn = s.service_dsn();
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut caught_up = false;
    while Instant::now() < deadline {
        consumer.ensure_running()?;
        if let Some(p) = &mut python {
            p.ensure_running()?;
        }
        if applied_count(&dsn, "chaos_applied").await.unwrap_or(0) >= expected
            && (python.is_none()
                || applied_count(&dsn, "chaos_applied_py").await.unwrap_or(0) >= expected)
        {
            caught_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if !caught_up {
        failures.push(format!(
            "the consumers did not apply {expected} events in time:\n{}\n{}",
            services::tail(consumer.log_path(), 20),
            python
                .as_ref()
                .map(|p| services::tail(p.log_path(), 20))
                .unwrap_or_default()
        ));
    }
    // Any late double application would show up now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    match consumer
        .signal_and_wait("TERM", Duration::from_secs(30))
        .await
    {
        Ok(st) if st.success() => {}
        other => failures.push(format!("consumer graceful stop: {other:?}")),
    }
    if let Some(p) = &mut python {
        match p.signal_and_wait("TERM", Duration::from_secs(30)).await {
            Ok(st) if st.success() => {}
            other => failures.push(format!(
                "Python consumer graceful stop: {other:?}\n{}",
                services::tail(p.log_path(), 20)
            )),
        }
    }
    match relay.signal_and_wait("TERM", Duration::from_secs(45)).await {
        Ok(st) if st.success() => {}
        other => failures.push(format!(
            "relay graceful stop: {other:?}\n{}",
            services::tail(relay.log_path(), 20)
        )),
    }

    println!(
        "walrelay-chaos: {:.0}s: reading back the wire and the history",
        started.elapsed().as_secs_f64()
    );
    let bootstrap = s.bootstrap();
    let wire = tokio::task::spawn_blocking(move || {
        history::read_wire(
            &bootstrap,
            expected as usize,
            Duration::from_secs(3),
            Duration::from_secs(600),
        )
    })
    .await??;
    let applied = history::applied(&s.service_dsn(), "chaos_applied").await?;
    let trace_summary = history::check_trace(&trace)?;
    let mut verdict = checker::check(&units, &ledger, &auditor.non_tx, &applied, &wire);
    verdict.duplicates_allowed = !o.fence;
    // The Python consumer's applications, checked like the Rust one's.
    let python_verdict = match &python {
        Some(_) => {
            let applied = history::applied(&s.service_dsn(), "chaos_applied_py").await?;
            let mut v = checker::check(&units, &ledger, &auditor.non_tx, &applied, &wire);
            v.duplicates_allowed = !o.fence;
            Some(v)
        }
        None => None,
    };
    // Its own applications only: the wire is the Rust check's.
    if let Some(v) = python_verdict.as_ref().filter(|v| {
        v.lost
            + v.double_processed
            + v.rolled_back_applied
            + v.unexpected_applied
            + v.order_violations
            > 0
    }) {
        failures.push(format!(
            "history check of the Python consumer failed; examples:\n  {}",
            v.examples.join("\n  ")
        ));
    }

    if o.fence && verdict.wire_duplicates > 0 {
        failures.push(format!(
            "{} replayed duplicates on the wire with the tail fence on (see the relay log's \"tail fence\" lines)",
            verdict.wire_duplicates
        ));
    }
    if !verdict.passed() {
        failures.push(format!(
            "history check failed; examples:\n  {}\nledger: {:?}",
            verdict.examples.join("\n  "),
            verdict.ledger_anomalies.iter().take(10).collect::<Vec<_>>()
        ));
    }
    if trace_summary.violation_count > 0 {
        failures.push(format!(
            "confirmed before acknowledged: {:?}",
            trace_summary.violations
        ));
    }
    if trace_summary.confirmations == 0 || trace_summary.acked == 0 {
        failures.push("the trace shows no acknowledgements or confirmations".into());
    }
    // A killed relay leaves at most one partial line.
    if trace_summary.malformed > u64::from(relay.starts) {
        failures.push(format!(
            "{} malformed trace lines for {} relay processes",
            trace_summary.malformed, relay.starts
        ));
    }
    for f in &log.sigterm_failures {
        failures.push(format!("relay SIGTERM did not exit 0: {f}"));
    }
    for e in relay
        .unexpected_exits
        .iter()
        .chain(&consumer.unexpected_exits)
        .chain(python.iter().flat_map(|p| &p.unexpected_exits))
    {
        failures.push(format!("unexpected exit: {e}"));
    }
    if !auditor.malformed.is_empty() {
        failures.push(format!(
            "unparsable audit rows: {:?}",
            &auditor.malformed[..1]
        ));
    }
    for &k in plan.kinds {
        if log.count(k) < plan.min_each {
            failures.push(format!("only {} × {k}", log.count(k)));
        }
    }
    if log.count(FaultKind::ConsumerKill) > 0 && log.consumer_in_window == 0 {
        failures.push(
            "no consumer kill was shown to land between the database commit and the offset commit"
                .into(),
        );
    }
    if plan.schedule.remaining() > 0 {
        failures.push(format!(
            "{} scheduled faults never ran",
            plan.schedule.remaining()
        ));
    }
    if verdict.expected_tx_events as u64 + (verdict.expected_non_tx as u64) < plan.events {
        failures.push(format!(
            "only {} events committed, fewer than the {} planned",
            verdict.expected_tx_events + verdict.expected_non_tx,
            plan.events
        ));
    }
    let elapsed = started.elapsed();
    let mut extra = vec![(
        "brokers".to_string(),
        match o.brokers {
            3 => "three Apache Kafka nodes (RF 3, min.insync.replicas 2)".to_string(),
            _ => "one, behind the fault proxy".to_string(),
        },
    )];
    if let Some(v) = &python_verdict {
        extra.push((
            "Python consumer: applications / lost / double-processed / order violations".into(),
            format!(
                "{} / {} / {} / {}",
                v.applications, v.lost, v.double_processed, v.order_violations
            ),
        ));
    }
    extra.extend([
        (
            "consumer kills without a new record (plain kill -9)".to_string(),
            log.consumer_idle_kills.to_string(),
        ),
        (
            "walsender terminations that found none (relay reconnecting)".to_string(),
            log.walsender_absent.to_string(),
        ),
        (
            "workload statements failed by faults".to_string(),
            progress.errors.load(Ordering::Relaxed).to_string(),
        ),
        (
            "relay / consumer processes started".to_string(),
            format!("{} / {}", relay.starts, consumer.starts),
        ),
        (
            "wall time".to_string(),
            format!("{:.0} s", elapsed.as_secs_f64()),
        ),
    ]);
    let table = checker::table(&verdict, &trace_summary, &log, &extra);
    Ok(Report {
        seed: o.seed,
        table,
        failures,
        elapsed,
    })
}
