//! The short chaos mode, as a test: a mixed workload of about 20,000
//! events under several faults of every kind (relay kill -9 and SIGTERM,
//! walsender terminated, PostgreSQL immediate restart, broker outages
//! longer than the producer's message timeout, consumer killed between its
//! database commit and its offset commit), then the full history check.
//! About 1.5 minutes on 2 cores.
//!
//! Runs the real binaries: `target/<profile>/walrelay` (which
//! `scripts/test.sh` builds with `cargo build --workspace --bins
//! --examples` before the tests) and this crate's `walrelay-chaos`.
//! `WALRELAY_CHAOS_SEED` replays a seed.

use std::path::PathBuf;

use anyhow::Result;
use walrelay_chaos::Options;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_chaos_run_loses_nothing_and_processes_everything_once() -> Result<()> {
    let options =
        Options::short_test(PathBuf::from(env!("CARGO_BIN_EXE_walrelay-chaos")), 1, None)?;
    let seed = options.seed;
    let report = walrelay_chaos::run(options).await?;
    println!("{}", report.table);
    assert!(
        report.passed(),
        "chaos run failed (seed {seed}; rerun with WALRELAY_CHAOS_SEED={seed}):\n{}\n{}",
        report.failures.join("\n"),
        report.table
    );
    Ok(())
}
