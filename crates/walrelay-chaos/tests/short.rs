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

use std::path::{Path, PathBuf};

use anyhow::{ensure, Result};
use walrelay_chaos::{Mode, Options};

fn relay_binary() -> Result<PathBuf> {
    // target/<profile>/deps/short-<hash> → target/<profile>/walrelay
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .join("walrelay");
    ensure!(
        path.is_file(),
        "{} is missing: scripts/test.sh builds it (cargo build --workspace --bins --examples)",
        path.display()
    );
    Ok(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_chaos_run_loses_nothing_and_processes_everything_once() -> Result<()> {
    let seed = std::env::var("WALRELAY_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    let report = walrelay_chaos::run(Options {
        mode: Mode::Short,
        seed,
        relay_bin: relay_binary()?,
        chaos_bin: PathBuf::from(env!("CARGO_BIN_EXE_walrelay-chaos")),
        events: None,
        relay_kills: None,
        keep: false,
        fence: true,
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
