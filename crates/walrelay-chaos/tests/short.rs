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
use walrelay_chaos::{Mode, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_chaos_run_loses_nothing_and_processes_everything_once() -> Result<()> {
    let seed = walrelay_chaos::seed_from_env();
    let report = walrelay_chaos::run(Options {
        mode: Mode::Short,
        seed,
        relay_bin: walrelay_chaos::relay_binary_for_tests()?,
        chaos_bin: PathBuf::from(env!("CARGO_BIN_EXE_walrelay-chaos")),
        events: None,
        relay_kills: None,
        keep: false,
        fence: true,
        brokers: 1,
        python: None,
    })
    .await?;
    println!("{}", report.table);
    assert!(
        report.passed(),
        "chaos run failed (seed {seed}; rerun with WALRELAY_CHAOS_SEED={seed}):\n{}\n{}",
        report.failures.join("\n"),
        report.table
    );
    Ok(())
}
