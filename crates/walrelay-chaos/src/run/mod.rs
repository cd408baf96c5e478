//! One run of the harness, phase by phase: start the services and the
//! processes ([`start`]), run the workload while the schedule injects
//! faults ([`inject`]), let everything catch up and stop ([`drain`],
//! [`stop`]), then check the history ([`check`]) and write the report
//! (`summary`: whether the run did what it planned, and the report's
//! rows besides the verdict's).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use tokio::sync::watch;
use walrelay_testkit::await_condition;

use crate::checker::{self, Verdict};

mod others;
mod summary;
use crate::faults::{self, FaultKind, FaultLog};
use crate::history::{self, Auditor, TraceSummary};
use crate::services::{self, Services, Supervised, GROUP, TOPICS};
use crate::workload::{self, Progress, Unit, Workload};
use crate::{applied_count, current_lsn, plan, relay_args, slot_confirmed, Options, Plan, Report};
use others::Other;
use summary::{extra_rows, harness_failures};

/// The supervised processes: the relay and the consumers.
struct Procs {
    relay: Supervised,
    consumer: Supervised,
    /// The Python and the Java consumer, as asked for.
    others: Vec<Other>,
    /// The relay's trace of acknowledgements and confirmations.
    trace: PathBuf,
}

impl Procs {
    /// Restarts whichever died (a fault's victim comes back).
    fn ensure_running(&mut self) -> Result<()> {
        self.relay.ensure_running()?;
        self.consumer.ensure_running()?;
        self.others
            .iter_mut()
            .try_for_each(|o| o.proc.ensure_running())
    }
}

/// What the drain found: every committed event's count, and how many
/// events are expected once each.
struct Drained {
    ledger: HashMap<u64, u32>,
    expected: u64,
}

/// What the fault phase leaves behind.
struct Injected {
    units: Vec<Unit>,
    log: FaultLog,
    progress: Arc<Progress>,
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
    let s = Services::start(o.keep, o.brokers, o.pg_failover).await?;
    println!("walrelay-chaos: working directory {}", s.dir.display());
    let (mut procs, mut auditor) = start(&o, &s).await?;
    let injected = inject(o.seed, &s, &mut plan, &mut procs, &mut auditor, started).await?;
    println!(
        "walrelay-chaos: {:.0}s: workload stopped after {} units; draining",
        started.elapsed().as_secs_f64(),
        injected.units.len()
    );
    let mut failures = Vec::new();
    let drained = drain(&s, &mut procs, &mut auditor, &mut failures).await?;
    stop(&mut procs, &mut failures).await;
    println!(
        "walrelay-chaos: {:.0}s: reading back the wire and the history",
        started.elapsed().as_secs_f64()
    );
    let (verdict, other_verdicts, trace_summary) =
        check(&o, &s, &procs, &auditor, &injected, &drained, &mut failures).await?;
    harness_failures(
        &plan,
        &procs,
        &auditor,
        &injected.log,
        &verdict,
        &mut failures,
    );
    let elapsed = started.elapsed();
    let failovers = s.source.is_pair().then(|| s.source.failovers());
    let extra = extra_rows(&o, &procs, &injected, &other_verdicts, failovers, elapsed);
    let table = checker::table(&verdict, &trace_summary, &injected.log, &extra);
    Ok(Report {
        seed: o.seed,
        table,
        failures,
        elapsed,
    })
}

/// `walrelay setup`, the audit slot, and the relay and consumers started.
async fn start(o: &Options, s: &Services) -> Result<(Procs, Auditor)> {
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
    let args = relay_args(s, &config, &trace);
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
    let mut auditor = Auditor::new(s.source_url());
    auditor.create_slot(s.source.is_pair()).await?;

    let relay = Supervised::new(
        "relay",
        o.relay_bin.clone(),
        [args, vec!["run".into()]].concat(),
        s.path("relay.log"),
    );
    let consumer = Supervised::new(
        "consumer",
        o.chaos_bin.clone(),
        consumer_args("consumer", s, GROUP),
        s.path("consumer.log"),
    );
    let mut procs = Procs {
        relay,
        consumer,
        others: others::others(o, s),
        trace,
    };
    procs.relay.start()?;
    procs.consumer.start()?;
    for other in &mut procs.others {
        other.proc.start()?;
    }
    await_standby(s, &mut auditor).await?;
    Ok((procs, auditor))
}

/// A consumer's arguments: `first` (the subcommand, the Python script or
/// the Java main class), the broker, the database, the group and every topic.
fn consumer_args(first: &str, s: &Services, group: &str) -> Vec<String> {
    let mut args = vec![
        first.to_string(),
        "--bootstrap".into(),
        s.bootstrap(),
        "--dsn".into(),
        s.service_dsn(),
        "--group".into(),
        group.into(),
    ];
    for (t, _) in TOPICS {
        args.extend(["--topic".into(), t.into()]);
    }
    args
}

/// The workload runs while the schedule injects its faults, until the
/// schedule is done and enough events committed.
async fn inject(
    seed: u64,
    s: &Services,
    plan: &mut Plan,
    procs: &mut Procs,
    auditor: &mut Auditor,
    started: Instant,
) -> Result<Injected> {
    let progress = Arc::new(Progress::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let poller = tokio::spawn(poll_applied(
        s.service_dsn(),
        Arc::clone(&progress),
        stop_rx.clone(),
    ));
    let workload = tokio::spawn(
        Workload::new(seed, plan.workload.clone(), s.source_url())
            .run(stop_rx.clone(), Arc::clone(&progress)),
    );
    let mut log = FaultLog::default();
    let mut last_report = Instant::now();
    loop {
        let until = Instant::now() + plan.schedule.next_gap();
        while Instant::now() < until {
            procs.ensure_running()?;
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
                s,
                &mut procs.relay,
                &mut procs.consumer,
                procs.others.iter_mut().map(|o| &mut o.proc),
                &mut rng,
                &mut log,
            )
            .await?;
        }
        let _ = auditor.drain().await;
        if kind == Some(FaultKind::PgFailover) {
            await_standby(s, auditor).await?;
        }
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
    Ok(Injected {
        units,
        log,
        progress,
    })
}

/// With `--pg-failover`, waits until the standby holds synchronized,
/// persistent copies of the relay's and the audit slot, so that the next
/// failover keeps both (the audit slot is drained meanwhile: its copy
/// becomes persistent only once the primary's moves on). Without a
/// standby, returns at once.
async fn await_standby(s: &Services, auditor: &mut Auditor) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let _ = auditor.drain().await;
        match s.source.standby_ready().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => tracing::debug!("standby not ready yet: {e:#}"),
        }
        ensure!(
            Instant::now() < deadline,
            "the standby held no synchronized, persistent copy of the slots {} and {} \
             120 s after it started",
            services::SLOT,
            services::AUDIT_SLOT
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Keeps [`Progress::applied`] up to date from the consumer's table, twice
/// a second, until `stop`.
async fn poll_applied(dsn: String, progress: Arc<Progress>, mut stop: watch::Receiver<bool>) {
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
}

/// Everything catches up with every service up: the audit slot, the
/// relay's slot, the consumers. Returns the ledger and the number of
/// events expected once each.
async fn drain(
    s: &Services,
    procs: &mut Procs,
    auditor: &mut Auditor,
    failures: &mut Vec<String>,
) -> Result<Drained> {
    procs.relay.ensure_running()?;
    procs.consumer.ensure_running()?;
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
    if let Err(e) = drained {
        failures.push(format!(
            "the slot never confirmed the end of the workload: {e:#}\n{}",
            services::tail(procs.relay.log_path(), 20)
        ));
    }
    let ledger = history::ledger(&s.source_url()).await?;
    let expected = ledger.values().map(|n| *n as u64).sum::<u64>() + auditor.non_tx.len() as u64;
    let dsn = s.service_dsn();
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut caught_up = false;
    while Instant::now() < deadline {
        procs.consumer.ensure_running()?;
        let mut behind = applied_count(&dsn, "chaos_applied").await.unwrap_or(0) < expected;
        for other in &mut procs.others {
            other.proc.ensure_running()?;
            behind |= applied_count(&dsn, other.table).await.unwrap_or(0) < expected;
        }
        if !behind {
            caught_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if !caught_up {
        failures.push(format!(
            "the consumers did not apply {expected} events in time:\n{}\n{}",
            services::tail(procs.consumer.log_path(), 20),
            procs
                .others
                .iter()
                .map(|o| services::tail(o.proc.log_path(), 20))
                .collect::<Vec<_>>()
                .join("\n")
        ));
    }
    Ok(Drained { ledger, expected })
}

/// Graceful stops, each of which must exit 0.
async fn stop(procs: &mut Procs, failures: &mut Vec<String>) {
    // Any late double application would show up now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    match procs
        .consumer
        .signal_and_wait("TERM", Duration::from_secs(30))
        .await
    {
        Ok(st) if st.success() => {}
        other => failures.push(format!("consumer graceful stop: {other:?}")),
    }
    for o in &mut procs.others {
        match o
            .proc
            .signal_and_wait("TERM", Duration::from_secs(30))
            .await
        {
            Ok(st) if st.success() => {}
            other => failures.push(format!(
                "{} consumer graceful stop: {other:?}\n{}",
                o.label,
                services::tail(o.proc.log_path(), 20)
            )),
        }
    }
    match procs
        .relay
        .signal_and_wait("TERM", Duration::from_secs(45))
        .await
    {
        Ok(st) if st.success() => {}
        other => failures.push(format!(
            "relay graceful stop: {other:?}\n{}",
            services::tail(procs.relay.log_path(), 20)
        )),
    }
}

/// The history checks: the wire, the Rust and the other consumers'
/// applications, the relay's trace of acknowledgements and confirmations.
async fn check(
    o: &Options,
    s: &Services,
    procs: &Procs,
    auditor: &Auditor,
    injected: &Injected,
    drained: &Drained,
    failures: &mut Vec<String>,
) -> Result<(Verdict, Vec<(&'static str, Verdict)>, TraceSummary)> {
    let (units, ledger, expected) = (&injected.units, &drained.ledger, drained.expected);
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
    let trace_summary = history::check_trace(&procs.trace)?;
    let mut verdict = checker::check(units, ledger, &auditor.non_tx, &applied, &wire);
    verdict.duplicates_allowed = !o.fence;
    let other_verdicts = others::check(
        &procs.others,
        &s.service_dsn(),
        o.fence,
        |applied| checker::check(units, ledger, &auditor.non_tx, applied, &wire),
        failures,
    )
    .await?;
    if o.fence && verdict.wire_duplicates > 0 {
        failures.push(format!(
            "{} replayed duplicates on the wire with the tail fence on (see the relay log's \"tail fence\" lines):\n  {}",
            verdict.wire_duplicates,
            verdict.duplicate_examples.join("\n  ")
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
    if trace_summary.malformed > u64::from(procs.relay.starts) {
        failures.push(format!(
            "{} malformed trace lines for {} relay processes",
            trace_summary.malformed, procs.relay.starts
        ));
    }
    Ok((verdict, other_verdicts, trace_summary))
}
