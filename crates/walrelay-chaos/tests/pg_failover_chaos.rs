//! The short chaos mode with PostgreSQL failovers (issue 38): the source
//! is a primary and a failover standby behind one host list, and besides
//! the one-broker faults the schedule fails over three times (`kill -9`
//! of the primary's postmaster, the standby promoted, the old primary
//! rebuilt as the new standby), while the same relay process follows the
//! primary and the Rust, the Python and the Java consumer apply every
//! event; then the full history check (nothing lost, nothing applied
//! twice, no phantom: an event on the wire whose transaction the new
//! primary lacks counts as a rolled-back event published).
//!
//! Failover slots came with PostgreSQL 17: `scripts/test.sh` runs this in
//! its PostgreSQL 17 stage on Apache Kafka (WALRELAY_PG_BIN,
//! WALRELAY_BROKER=kafka, WALRELAY_PYTHON, java/chaos-consumer built by
//! its `java` stage). On an older server it is skipped, saying
//! so, except under CI=true, where it fails. The Java consumer is skipped,
//! saying so, when its build or `java` is missing, except under CI=true.
//! `WALRELAY_CHAOS_SEED` replays a seed.

use std::path::PathBuf;

use anyhow::{bail, Result};
use walrelay_chaos::Options;
use walrelay_testkit::{java_classpath, python_interpreter, PgBin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_run_with_postgresql_failovers_loses_nothing_and_publishes_no_phantom() -> Result<()>
{
    let major = PgBin::discover()?.major();
    if major < 17 {
        let why = format!(
            "PostgreSQL {major} has no failover slots: point WALRELAY_PG_BIN at 17 or later \
             (scripts/install-postgres-wheels.sh 17; scripts/test.sh's PostgreSQL 17 stage)"
        );
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            bail!("{why}");
        }
        eprintln!("skipped: {why}");
        return Ok(());
    }
    let mut options = Options::short_test(
        PathBuf::from(env!("CARGO_BIN_EXE_walrelay-chaos")),
        1,
        python_interpreter()?,
    )?;
    options.java = java_classpath("chaos-consumer")?;
    options.pg_failover = true;
    let seed = options.seed;
    let report = walrelay_chaos::run(options).await?;
    println!("{}", report.table);
    assert!(
        report.passed(),
        "chaos run with PostgreSQL failovers failed (seed {seed}; rerun with \
         WALRELAY_CHAOS_SEED={seed}):\n{}\n{}",
        report.failures.join("\n"),
        report.table
    );
    Ok(())
}
