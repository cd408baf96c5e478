//! `walrelay_slot_lag_bytes` must grow exactly when walrelay stops
//! confirming: with Kafka down the relay stops reading the stream, so the
//! stream's own `wal_end` stands still; the gauge must follow the server's
//! current WAL position instead. Real PostgreSQL and Tansu (stopped and
//! restarted: a test broker of its own whichever WALRELAY_BROKER says).

mod support;

use std::time::Duration;

use anyhow::{Context, Result};
use support::{Env, WAIT};
use tokio::sync::watch;
use walrelay::engine::pipeline;
use walrelay::metrics::Metrics;
use walrelay_testkit::{await_condition, read_topics, BrokerKind, TestBroker};

fn gauge(metrics: &Metrics, name: &str) -> Option<u64> {
    metrics
        .encode()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_gauge_grows_while_kafka_is_down_and_shrinks_after() -> Result<()> {
    let mut env = Env::start_on(BrokerKind::Tansu).await?;
    let bootstrap = env.bootstrap();
    let mut config = env.config(&bootstrap);
    // One record in flight fills the relay: with Kafka down it stops
    // reading the stream at once.
    config.relay.max_in_flight_events = 1;
    walrelay::commands::setup::setup(&config).await?;
    let metrics = Metrics::new();
    let (stop, stop_rx) = watch::channel(false);
    let relay = tokio::spawn(pipeline::run_with(
        config,
        stop_rx,
        None,
        Some(metrics.clone()),
    ));
    let c = &env.client;
    c.batch_execute("INSERT INTO outbox VALUES ('e-1', 'order', 'o-1', 'Created', '{}', NULL)")
        .await?;
    read_topics(&bootstrap, &["outbox.event.order"], 1, WAIT).await?;

    let broker = env
        .broker
        .as_mut()
        .and_then(TestBroker::as_tansu_mut)
        .context("a Tansu broker")?;
    tokio::task::block_in_place(|| broker.stop())?;
    c.batch_execute(
        "INSERT INTO outbox VALUES ('e-2', 'order', 'o-2', 'Created', '{}', NULL);
         INSERT INTO outbox VALUES ('e-3', 'order', 'o-3', 'Created', '{}', NULL);
         INSERT INTO busy (v) SELECT repeat('x', 1000) FROM generate_series(1, 4000);",
    )
    .await?;
    let written = env.current_wal_lsn().await?;
    let confirmed = env.confirmed_flush_lsn("walrelay").await?;
    let server_lag = written.0 - confirmed.0;
    assert!(server_lag > 4_000_000, "PostgreSQL's own lag: {server_lag}");
    // Well within one outage: PostgreSQL's lag shows up in the gauge.
    await_condition(Duration::from_secs(30), Duration::from_millis(100), || {
        let m = metrics.clone();
        async move {
            let end = gauge(&m, "walrelay_server_wal_end_lsn").unwrap_or(0);
            let lag = gauge(&m, "walrelay_slot_lag_bytes").unwrap_or(0);
            Ok(end >= written.0 && lag >= server_lag)
        }
    })
    .await
    .with_context(|| {
        format!(
            "walrelay_slot_lag_bytes = {:?}, walrelay_server_wal_end_lsn = {:?}, while PostgreSQL \
             shows {server_lag} bytes of lag up to {written}",
            gauge(&metrics, "walrelay_slot_lag_bytes"),
            gauge(&metrics, "walrelay_server_wal_end_lsn"),
        )
    })?;

    // Kafka back: the relay catches up and the gauge falls back.
    let broker = env
        .broker
        .as_mut()
        .and_then(TestBroker::as_tansu_mut)
        .context("a Tansu broker")?;
    tokio::task::block_in_place(|| broker.restart())?;
    await_condition(WAIT, Duration::from_millis(200), || {
        let m = metrics.clone();
        async move {
            let lag = gauge(&m, "walrelay_slot_lag_bytes").unwrap_or(u64::MAX);
            Ok(lag < 1_000_000)
        }
    })
    .await
    .with_context(|| {
        format!(
            "the lag stayed at {:?} after Kafka came back",
            gauge(&metrics, "walrelay_slot_lag_bytes")
        )
    })?;
    stop.send(true)?;
    relay.await??;
    Ok(())
}
