//! Failover: a second `walrelay run` on the same slot stands by (PostgreSQL
//! allows one walsender per slot) and takes over within a few seconds when
//! the active one dies, without losing anything.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use support::{apply_high_water_marks, spawn_relay, Env, WAIT};
use walrelay_testkit::{await_condition, read_until_quiet};

/// A slow status interval (unconfirmed events at the kill) and info logs
/// (the test waits for the "standing by" line), with the relay's debug
/// lines to count the standby's polls.
const STANDBY_ARGS: &[&str] = &[
    "--status-interval",
    "5s",
    "--log",
    "info,walrelay::pipeline=debug",
];

async fn active_pid(env: &Env) -> Result<Option<i32>> {
    Ok(env
        .client
        .query_one(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'walrelay'",
            &[],
        )
        .await?
        .get(0))
}

async fn emit(env: &Env, from: usize, n: usize) -> Result<()> {
    for t in from..from + n {
        env.client
            .batch_execute(&format!(
                "SELECT count(walrelay.emit('events', 'k-' || (g % 7), jsonb_build_object('id', '{t}-' || g))) FROM generate_series(1, 100) g"
            ))
            .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_relay_takes_over_within_seconds_without_loss() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    walrelay::setup::setup(&env.config(&bootstrap)).await?;
    let dir = tempfile::tempdir()?;
    let (log_a, log_b) = (dir.path().join("a.log"), dir.path().join("b.log"));

    let mut a = spawn_relay(&env, &bootstrap, &log_a, STANDBY_ARGS)?;
    await_condition(WAIT, Duration::from_millis(50), || async {
        Ok(active_pid(&env).await?.is_some())
    })
    .await?;
    let first = active_pid(&env).await?;
    let mut b = spawn_relay(&env, &bootstrap, &log_b, STANDBY_ARGS)?;
    await_condition(WAIT, Duration::from_millis(50), || async {
        Ok(std::fs::read_to_string(&log_b)?.contains("standing by"))
    })
    .await
    .context("the second relay should report that it stands by")?;
    assert_eq!(
        active_pid(&env).await?,
        first,
        "the standby must not take the slot from the active relay"
    );
    // A standby connects once a second: its INFO log does not say so each
    // time (it did, twice a second with sslmode=prefer).
    await_condition(WAIT, Duration::from_millis(100), || async {
        let log = std::fs::read_to_string(&log_b)?;
        Ok(log
            .matches("the slot is still in use; polling again")
            .count()
            >= 4)
    })
    .await
    .context("the standby polls the slot")?;
    let log = std::fs::read_to_string(&log_b)?;
    let established = log.matches("replication connection established").count();
    assert_eq!(established, 1, "{log}");

    emit(&env, 0, 20).await?;
    // Kill the active relay with acknowledged but (5 s status interval)
    // unconfirmed events: the standby replays them.
    a.kill()?;
    a.wait()?;
    let killed = Instant::now();
    await_condition(WAIT, Duration::from_millis(50), || async {
        Ok(matches!(active_pid(&env).await?, Some(pid) if Some(pid) != first))
    })
    .await
    .with_context(|| std::fs::read_to_string(&log_b).unwrap_or_default())?;
    let takeover = killed.elapsed();
    emit(&env, 20, 20).await?;
    let end = env.current_wal_lsn().await?;
    await_condition(WAIT, Duration::from_millis(100), || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= end)
    })
    .await?;
    let stopped = Command::new("kill")
        .args(["-TERM", &b.id().to_string()])
        .status()?;
    assert!(stopped.success());
    assert!(b.wait()?.success());

    let records = read_until_quiet(&bootstrap, &["events"], Duration::from_secs(1), WAIT).await?;
    let (fresh, duplicates) = apply_high_water_marks(&records)?;
    assert_eq!(
        fresh.values().map(Vec::len).sum::<usize>(),
        4000,
        "nothing lost across the takeover"
    );
    println!("standby took over {takeover:.1?} after the kill; {duplicates} replayed duplicates");
    assert_eq!(
        duplicates, 0,
        "the standby's tail fence keeps the killed relay's unconfirmed records off the wire"
    );
    assert!(
        takeover < Duration::from_secs(15),
        "takeover took {takeover:?}"
    );
    Ok(())
}
