//! `walrelay-chaos`: the chaos harness (see the library docs and
//! `docs/chaos.md`).
//!
//! ```text
//! cargo build --release --bins
//! cargo run --release -p walrelay-chaos -- --mode long --seed 42
//! ```

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use walrelay_chaos::{consumer, Mode, Options};

#[derive(Debug, Parser)]
#[command(name = "walrelay-chaos", max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// `short` (a few minutes, for CI) or `long` (a soak run).
    #[arg(long, value_enum, default_value_t = Mode::Short)]
    mode: Mode,
    /// Seed of every random choice [default: from the clock, printed].
    #[arg(long)]
    seed: Option<u64>,
    /// Commit at least this many events [default: 20000 short, 1000000 long].
    #[arg(long)]
    events: Option<u64>,
    /// Long mode: kill -9 the relay at least this often [default: 100].
    #[arg(long)]
    relay_kills: Option<u32>,
    /// The walrelay binary [default: next to this one].
    #[arg(long)]
    relay_bin: Option<PathBuf>,
    /// Keep the working directory (logs, relay trace).
    #[arg(long)]
    keep: bool,
    /// Run the relay with `relay.fence = false`: replayed duplicates on
    /// the wire are then expected and do not fail the run.
    #[arg(long)]
    no_fence: bool,
    /// 1: one broker behind a fault proxy (WALRELAY_BROKER picks Tansu or
    /// Apache Kafka); 3: three Apache Kafka nodes, with leader kills,
    /// rolling restarts, reassignments, controller and coordinator kills.
    #[arg(long, default_value_t = 1)]
    brokers: usize,
    /// Also run the Python consumer (this interpreter must import
    /// `walrelay_consumer`, e.g. the virtualenv of
    /// scripts/install-python-venv.sh) [default: $WALRELAY_PYTHON].
    #[arg(long, env = "WALRELAY_PYTHON")]
    python: Option<PathBuf>,
    /// Also run the Java consumer with this classpath (java/
    /// chaos-consumer's `target/classes` and the jars its
    /// `target/classpath.txt` lists, as `mvn package` writes them)
    /// [default: $WALRELAY_JAVA_CLASSPATH].
    #[arg(long, env = "WALRELAY_JAVA_CLASSPATH")]
    java: Option<String>,
    /// The source is a primary and a failover standby, and the schedule
    /// fails over between them (kill -9 of the primary, promotion, the old
    /// primary rebuilt as the standby). Needs PostgreSQL 17 or later
    /// (WALRELAY_PG_BIN).
    #[arg(long)]
    pg_failover: bool,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// The harness's consumer process (started by the harness).
    #[command(hide = true)]
    Consumer(consumer::ConsumerArgs),
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "walrelay_chaos=info,warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Some(Sub::Consumer(args)) = cli.command {
        return consumer::run(args).await;
    }
    let me = std::env::current_exe()?;
    let dir = me.parent().context("executable directory")?;
    let seed = cli.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let report = walrelay_chaos::run(Options {
        mode: cli.mode,
        seed,
        relay_bin: cli.relay_bin.unwrap_or_else(|| dir.join("walrelay")),
        chaos_bin: me.clone(),
        events: cli.events,
        relay_kills: cli.relay_kills,
        keep: cli.keep,
        fence: !cli.no_fence,
        brokers: cli.brokers,
        python: cli.python,
        java: cli.java,
        pg_failover: cli.pg_failover,
    })
    .await?;
    println!("\n{}", report.table);
    if report.passed() {
        println!("walrelay-chaos: PASSED (seed {})", report.seed);
        Ok(())
    } else {
        for f in &report.failures {
            println!("FAILURE: {f}");
        }
        println!("walrelay-chaos: FAILED (seed {})", report.seed);
        std::process::exit(1);
    }
}
