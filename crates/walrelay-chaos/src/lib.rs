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
pub mod fault_kind;
pub mod faults;
pub mod history;
pub mod proxy;
mod run;
pub mod services;
pub mod source;
pub mod workload;

pub use run::run;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use faults::{FaultKind, Schedule};
use services::{Services, MESSAGE_TIMEOUT, RAW_PREFIX, RAW_TOPIC, SLOT};
use workload::WorkloadConfig;

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
    /// The Java consumer's classpath (java/chaos-consumer, as
    /// `walrelay_testkit::java_classpath` finds it): runs its
    /// `ChaosConsumer` beside the Rust one, checked the same way.
    pub java: Option<String>,
    /// The source is a primary and a failover standby (PostgreSQL 17 or
    /// later), and the schedule fails over between them
    /// ([`FaultKind::PgFailover`]).
    pub pg_failover: bool,
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
            java: None,
            pg_failover: false,
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
pub(crate) const PYTHON_CONSUMER: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/python/chaos_consumer.py");

/// The Java consumer's group, and its main class (in
/// java/chaos-consumer).
pub const JAVA_GROUP: &str = "chaos-java";
pub(crate) const JAVA_CONSUMER: &str = "io.walrelay.chaos.ChaosConsumer";

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

pub(crate) struct Plan {
    pub(crate) events: u64,
    pub(crate) schedule: Schedule,
    pub(crate) workload: WorkloadConfig,
    /// The kinds of fault this run injects.
    pub(crate) kinds: Vec<FaultKind>,
    /// Each kind at least this often (short mode checks it).
    pub(crate) min_each: u32,
}

pub(crate) fn plan(o: &Options) -> Plan {
    let mut plan = if o.brokers == 3 {
        three_broker_plan(o)
    } else {
        one_broker_plan(o)
    };
    if o.pg_failover {
        with_failovers(&mut plan, o);
    }
    plan
}

/// `--pg-failover` adds failovers to the plan: three in short mode; in
/// long mode a weight of 2 (each rebuilds a standby from a base backup,
/// a few seconds).
fn with_failovers(plan: &mut Plan, o: &Options) {
    plan.kinds.push(FaultKind::PgFailover);
    match o.mode {
        Mode::Short => plan.schedule.add(FaultKind::PgFailover, 3),
        Mode::Long => plan.schedule.add(FaultKind::PgFailover, 2),
    }
}

fn one_broker_plan(o: &Options) -> Plan {
    use FaultKind::*;
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
                kinds: FaultKind::ONE_BROKER.to_vec(),
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
            kinds: FaultKind::ONE_BROKER.to_vec(),
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
            kinds: FaultKind::THREE_BROKERS.to_vec(),
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
            kinds: FaultKind::THREE_BROKERS.to_vec(),
            min_each: 1,
        },
    }
}

pub(crate) fn relay_args(
    s: &Services,
    config: &std::path::Path,
    trace: &std::path::Path,
) -> Vec<String> {
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
    if s.source.is_pair() {
        args.push("--slot-failover".to_owned());
    }
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

pub(crate) async fn slot_confirmed(url: &str) -> Result<u64> {
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

pub(crate) async fn current_lsn(url: &str) -> Result<u64> {
    let c = workload::connect(url).await?;
    let row = c
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

pub(crate) async fn applied_count(dsn: &str, table: &str) -> Result<u64> {
    let c = workload::connect(dsn).await?;
    let row = c
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}
