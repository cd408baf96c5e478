//! The short chaos mode on three Apache Kafka brokers (replication factor
//! 3, `min.insync.replicas=2`): the mixed workload under the cluster's
//! faults (a partition leader killed, a rolling restart, a partition
//! reassigned away from its leader and back, the active controller and
//! the consumers' group coordinator killed, the relay killed while a
//! leader election is under way) besides relay, PostgreSQL and consumer
//! faults, with the Rust, the Python and the Java consumer applying
//! every event;
//! then the full history check. About four minutes on 2 cores.
//!
//! Kafka only: it runs in `scripts/test.sh`'s Apache Kafka stage
//! (WALRELAY_BROKER=kafka, WALRELAY_PYTHON, and java/chaos-consumer built
//! by its `java` stage), skipped elsewhere, saying so; the Java
//! consumer is skipped, saying so, when its build or `java` is missing,
//! except under CI=true (`walrelay_testkit::java_classpath`).
//! `WALRELAY_CHAOS_SEED` replays a seed.

use std::path::PathBuf;

use anyhow::Result;
use walrelay_chaos::Options;
use walrelay_testkit::{java_classpath, python_interpreter, BrokerKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_broker_chaos_run_loses_nothing_and_every_consumer_applies_everything_once(
) -> Result<()> {
    if BrokerKind::from_env()? != BrokerKind::Kafka {
        eprintln!("skipped: Apache Kafka only (WALRELAY_BROKER=kafka, scripts/test.sh)");
        return Ok(());
    }
    let mut options = Options::short_test(
        PathBuf::from(env!("CARGO_BIN_EXE_walrelay-chaos")),
        3,
        python_interpreter()?,
    )?;
    options.java = java_classpath("chaos-consumer")?;
    let seed = options.seed;
    let report = walrelay_chaos::run(options).await?;
    println!("{}", report.table);
    assert!(
        report.passed(),
        "chaos run on three brokers failed (seed {seed}; rerun with WALRELAY_CHAOS_SEED={seed}):\n{}\n{}",
        report.failures.join("\n"),
        report.table
    );
    Ok(())
}
