//! Broker faults on three Apache Kafka brokers (replication factor 3):
//! what the relay does while a partition's in-sync set is below
//! `min.insync.replicas`.
//!
//! Kafka only (three KRaft nodes of the pinned version, started by the
//! test).

mod support;

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use support::{apply_high_water_marks, spawn_relay, Env};
use walrelay_testkit::{
    await_condition, read_until_quiet, ClusterOptions, KafkaCluster, KafkaOptions,
};

const TOPIC: &str = "events";

async fn emit(env: &Env, from: usize, transactions: usize) -> Result<()> {
    for t in from..from + transactions {
        env.client
            .batch_execute(&format!(
                "SELECT count(walrelay.emit('{TOPIC}', 'k-' || (g % 7), jsonb_build_object('id', '{t}-' || g))) \
                 FROM generate_series(1, 100) g"
            ))
            .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_min_isr_the_relay_confirms_nothing_and_resumes_by_itself() -> Result<()> {
    let began = Instant::now();
    let mut kafka = tokio::task::spawn_blocking(|| {
        KafkaCluster::start(
            KafkaOptions {
                nodes: 3,
                ..KafkaOptions::default()
            }
            .quick_to_notice_failures(),
        )
    })
    .await??;
    println!("three Kafka nodes ready in {:?}", began.elapsed());
    let bootstrap = kafka.bootstrap_servers();
    // Every replica must be in sync for a write: one broker down is below.
    kafka.create_topic_with(TOPIC, 1, 3, &[("min.insync.replicas", "3")])?;

    let env = Env::postgres_only(ClusterOptions::default()).await?;
    walrelay::setup::setup(&env.config(&bootstrap)).await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    let mut relay = spawn_relay(&env, &bootstrap, &log, &["--log", "info"])?;
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    emit(&env, 0, 5).await?;
    let first = env.current_wal_lsn().await?;
    await_condition(
        Duration::from_secs(90),
        Duration::from_millis(100),
        || async { Ok(env.confirmed_flush_lsn("walrelay").await? >= first) },
    )
    .await
    .with_context(log_text)?;

    // A follower dies: the set shrinks to two, below min ISR.
    let follower = kafka.kill_a_follower(TOPIC, 0)?;
    kafka.await_partition(
        TOPIC,
        0,
        Duration::from_secs(30),
        "the killed follower out of the in-sync set",
        |_, isr| !isr.contains(&follower),
    )?;
    emit(&env, 5, 5).await?;
    let second = env.current_wal_lsn().await?;

    // The relay reports why Kafka does not acknowledge (after
    // message.timeout.ms, 30 s: librdkafka retries NOT_ENOUGH_REPLICAS
    // until then and reports the timeout, whose text names this cause) and
    // confirms nothing of the new events.
    let reported = await_condition(
        Duration::from_secs(90),
        Duration::from_millis(200),
        || async { Ok(log_text().contains("fewer in-sync replicas than")) },
    )
    .await;
    let confirmed = env.confirmed_flush_lsn("walrelay").await?;
    reported.with_context(log_text)?;
    ensure!(
        confirmed < second,
        "nothing past an unacknowledged event is confirmed (confirmed {confirmed}, events up to {second})"
    );
    let text = log_text();
    let said = text
        .lines()
        .rev()
        .find(|l| l.contains("fewer in-sync replicas than"))
        .unwrap_or_default()
        .to_owned();
    println!("while below min ISR the relay said: {said}");

    // The broker returns: the relay resumes by itself.
    let returned = Instant::now();
    let kafka = tokio::task::spawn_blocking(move || {
        kafka
            .restart_node(usize::try_from(follower)?)
            .map(|()| kafka)
    })
    .await??;
    kafka.await_partition(
        TOPIC,
        0,
        Duration::from_secs(60),
        "all three in sync again",
        |_, isr| isr.len() == 3,
    )?;
    await_condition(
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async { Ok(env.confirmed_flush_lsn("walrelay").await? >= second) },
    )
    .await
    .with_context(log_text)?;
    println!(
        "confirmed everything {:?} after the broker returned",
        returned.elapsed()
    );
    relay.kill()?;
    relay.wait()?;

    let records = read_until_quiet(
        &bootstrap,
        &[TOPIC],
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await?;
    let (fresh, duplicates) = apply_high_water_marks(&records)?;
    let applied: usize = fresh.values().map(Vec::len).sum();
    ensure!(applied == 1000, "every event once: {applied} of 1000");
    println!(
        "{} records on the wire, {duplicates} duplicates",
        records.len()
    );
    // Records the leader appended but could not make visible while under
    // min ISR (or while the returning follower caught up) are above the
    // high watermark when a later session's fence reads the tail, so its
    // replay writes them again: duplicates, at most the events of the
    // outage (docs/contract.md, "What remains").
    ensure!(
        duplicates <= 500,
        "duplicates only of what was written while below min ISR: {duplicates}"
    );
    Ok(())
}
