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
    "info,walrelay::engine::pipeline=debug",
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
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
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

/// A TCP proxy to PostgreSQL at `upstream` that holds back plain SQL
/// connections (startup packets that do not ask for replication) while
/// `hold` is true; `held` counts those it held.
async fn sql_holding_proxy(
    upstream: std::net::SocketAddr,
    hold: tokio::sync::watch::Receiver<bool>,
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> Result<std::net::SocketAddr> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let (mut hold, held) = (hold.clone(), held.clone());
            tokio::spawn(async move {
                let len = client.read_i32().await?;
                let mut startup = vec![0; usize::try_from(len).unwrap_or(8).saturating_sub(4)];
                client.read_exact(&mut startup).await?;
                let replication = startup.windows(12).any(|w| w == b"replication\0");
                if !replication && *hold.borrow() {
                    held.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    while *hold.borrow_and_update() {
                        hold.changed().await?;
                    }
                }
                let mut server = tokio::net::TcpStream::connect(upstream).await?;
                server.write_i32(len).await?;
                server.write_all(&startup).await?;
                tokio::io::copy_bidirectional(&mut client, &mut server).await?;
                anyhow::Ok(())
            });
        }
    });
    Ok(addr)
}

/// A standby that read the server's WAL position while the active relay
/// still ran, whose checks then took long (here, a proxy holds its SQL
/// connection) while the active relay wrote past that position and died,
/// takes over without calling it a WAL that went back: the position it
/// checks Kafka's keys against is read once the slot is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_slow_to_take_over_does_not_take_newer_keys_for_a_restore() -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    let dir = tempfile::tempdir()?;
    let log_a = dir.path().join("a.log");
    let mut a = spawn_relay(&env, &bootstrap, &log_a, STANDBY_ARGS)?;
    await_condition(WAIT, Duration::from_millis(50), || async {
        Ok(active_pid(&env).await?.is_some())
    })
    .await?;

    let (hold, hold_rx) = tokio::sync::watch::channel(true);
    let held = std::sync::Arc::new(AtomicUsize::new(0));
    let port = env.cluster.port();
    let proxy =
        sql_holding_proxy(format!("127.0.0.1:{port}").parse()?, hold_rx, held.clone()).await?;
    // Routed as the active relay is (no routes, no outbox table), so
    // that its fence trusts what the active relay wrote.
    let mut config = env.config(&bootstrap);
    config.messages.clear();
    config.outbox.clear();
    config.postgres.url = config
        .postgres
        .url
        .replace(&format!(":{port}/"), &format!(":{}/", proxy.port()));
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let mut standby = tokio::spawn(walrelay::engine::pipeline::run(config, stop_rx, None));
    // The standby read the WAL position and waits for its check.
    await_condition(WAIT, Duration::from_millis(20), || async {
        Ok(held.load(Ordering::SeqCst) > 0)
    })
    .await?;

    // The active relay writes past that position, and dies.
    emit(&env, 0, 5).await?;
    walrelay_testkit::read_topics(&bootstrap, &["events"], 500, WAIT)
        .await
        .with_context(|| std::fs::read_to_string(&log_a).unwrap_or_default())?;
    a.kill()?;
    a.wait()?;
    await_condition(WAIT, Duration::from_millis(50), || async {
        Ok(active_pid(&env).await?.is_none())
    })
    .await?;
    hold.send_replace(false);

    emit(&env, 5, 1).await?;
    let end = env.current_wal_lsn().await?;
    let took_over = await_condition(WAIT, Duration::from_millis(100), || async {
        Ok(standby.is_finished() || env.confirmed_flush_lsn("walrelay").await? >= end)
    })
    .await;
    if standby.is_finished() {
        let ended = (&mut standby).await?;
        anyhow::bail!("the standby stopped: {ended:?}");
    }
    took_over?;
    stop.send_replace(true);
    standby.await??;

    let records = read_until_quiet(&bootstrap, &["events"], Duration::from_secs(1), WAIT).await?;
    let (fresh, duplicates) = apply_high_water_marks(&records)?;
    assert_eq!(
        fresh.values().map(Vec::len).sum::<usize>(),
        600,
        "nothing lost"
    );
    assert_eq!(duplicates, 0, "the fence kept the replay off the wire");
    Ok(())
}
