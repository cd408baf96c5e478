//! `ConsumerLoop` against a real Tansu broker and a real PostgreSQL.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use tokio::sync::watch;
use tokio_postgres::Transaction;
use walrelay_consumer::{ConfigError, ConsumerLoop, Delivery, PgHwmStore, Settings};
use walrelay_contract::EventKey;
use walrelay_testkit::{await_condition, ClusterOptions, PgCluster};

use support::*;

#[tokio::test]
async fn every_event_is_applied_once_and_marks_follow_per_record() -> anyhow::Result<()> {
    every_event_is_applied_once_and_marks_follow(Mode::Record).await
}

#[tokio::test]
async fn every_event_is_applied_once_and_marks_follow_in_batches() -> anyhow::Result<()> {
    every_event_is_applied_once_and_marks_follow(Mode::Batch).await
}

async fn every_event_is_applied_once_and_marks_follow(mode: Mode) -> anyhow::Result<()> {
    let topic = "orders";
    let env = env(topic, 2).await?;
    let mut relay = Relay::new(&env.broker.bootstrap_servers(), topic)?;
    // Session 1: 1..=30 on both partitions.
    let batch: Vec<(i32, u64)> = (1..=30).flat_map(|s| [(0, s), (1, s)]).collect();
    relay.send(&batch).await?;
    // The relay restarts and replays 21..=30, then goes on to 40.
    relay.restart();
    let replay: Vec<(i32, u64)> = (21..=40).flat_map(|s| [(0, s), (1, s)]).collect();
    relay.send(&replay).await?;
    let total: usize = relay.produced.values().map(Vec::len).sum();

    let (handle, stop, counters) = start(&env, "billing", topic, "a", mode).await?;
    let distinct = i64::try_from(relay.distinct())?;
    await_count(&env.client, "SELECT count(*) FROM effects", distinct).await?;
    await_condition(TIMEOUT, POLL, || async {
        let c = counters.snapshot();
        Ok(c.processed + c.duplicates >= u64::try_from(total)?)
    })
    .await?;
    stop.send(true)?;
    handle.await??;

    let c = counters.snapshot();
    assert_eq!(c.processed, 80);
    assert_eq!(c.duplicates, 20);
    assert_eq!((c.gaps, c.errors), (0, 0));
    assert_eq!(
        count(&env.client, "SELECT count(*) FROM effects").await?,
        distinct
    );
    check_marks(&env, "billing", topic, &relay).await?;

    // A second run of the same group resumes after the committed offsets:
    // it sees only what is new.
    relay.send(&[(0, 41), (1, 41)]).await?;
    let (handle, stop, counters) = start(&env, "billing", topic, "a2", mode).await?;
    await_count(&env.client, "SELECT count(*) FROM effects", distinct + 2).await?;
    stop.send(true)?;
    handle.await??;
    let c = counters.snapshot();
    assert_eq!((c.processed, c.errors), (2, 0), "{c:?}");
    // Offsets were committed synchronously at shutdown: nothing comes
    // again.
    assert_eq!(c.duplicates, 0, "{c:?}");
    check_marks(&env, "billing", topic, &relay).await?;
    Ok(())
}

#[tokio::test]
async fn two_consumers_racing_over_rebalances_apply_each_event_once_in_batches(
) -> anyhow::Result<()> {
    let topic = "payments";
    let group = "ledger";
    let env = env(topic, 2).await?;
    let mut relay = Relay::new(&env.broker.bootstrap_servers(), topic)?;
    let mut seq = 0u64;
    let mut replays = 0u64;
    // One step: 10 new records per partition, then (a relay restart) a
    // replay of the last 3 of them.
    let mut step = async |relay: &mut Relay| -> anyhow::Result<()> {
        let fresh: Vec<(i32, u64)> = (seq + 1..=seq + 10)
            .flat_map(|s| [(0, s), (1, s)])
            .collect();
        seq += 10;
        relay.send(&fresh).await?;
        relay.restart();
        let replay: Vec<(i32, u64)> = (seq - 2..=seq).flat_map(|s| [(0, s), (1, s)]).collect();
        relay.send(&replay).await?;
        replays += 6;
        Ok(())
    };
    let applied = "SELECT count(*) FROM effects";

    let (handle_a, stop_a, counters_a) = start(&env, group, topic, "a", Mode::Batch).await?;
    step(&mut relay).await?;
    await_count(&env.client, applied, 20).await?;

    // B joins: a rebalance while records keep coming.
    let (handle_b, stop_b, counters_b) = start(&env, group, topic, "b", Mode::Batch).await?;
    let mut rounds = 0;
    loop {
        step(&mut relay).await?;
        rounds += 1;
        let b = count(
            &env.client,
            "SELECT count(*) FROM effects WHERE consumer = 'b'",
        )
        .await?;
        if b > 0 {
            break;
        }
        // Let the consumers catch up before producing more.
        let produced = i64::try_from(relay.distinct())?;
        await_count(&env.client, applied, produced).await?;
        assert!(rounds < 200, "consumer b never got a partition");
    }
    step(&mut relay).await?;

    // A leaves (another rebalance) while records keep coming.
    let leaving = tokio::spawn(async move {
        stop_a.send(true)?;
        handle_a.await??;
        anyhow::Ok(())
    });
    step(&mut relay).await?;
    step(&mut relay).await?;
    leaving.await??;
    // A has left: everything after this is B's alone.
    let last_before_stop = relay.last_keys();
    step(&mut relay).await?;
    step(&mut relay).await?;

    // B ends up with both partitions and applies everything.
    let distinct = i64::try_from(relay.distinct())?;
    await_count(&env.client, applied, distinct).await?;
    stop_b.send(true)?;
    handle_b.await??;

    // Every distinct event exactly once (the primary key would have made a
    // second application fail the loop), none missing.
    let rows = env
        .client
        .query("SELECT event_key, partition FROM effects", &[])
        .await?;
    let mut seen: BTreeMap<i32, Vec<EventKey>> = BTreeMap::new();
    for row in rows {
        let key = EventKey::from_hex(row.get(0))?;
        seen.entry(row.get(1)).or_default().push(key);
    }
    for (partition, keys) in &relay.produced {
        let mut want: Vec<EventKey> = keys.clone();
        want.sort();
        want.dedup();
        let mut got = seen.remove(partition).unwrap_or_default();
        got.sort();
        assert_eq!(got, want, "partition {partition}");
    }
    assert!(seen.is_empty(), "{seen:?}");
    check_marks(&env, group, topic, &relay).await?;
    for (partition, last) in &last_before_stop {
        let row = env
            .client
            .query_one(
                "SELECT count(*) FILTER (WHERE consumer = 'b'), count(*) FILTER (WHERE consumer <> 'b') \
                 FROM effects WHERE partition = $1 AND event_key > $2",
                &[partition, &last.to_hex()],
            )
            .await?;
        let (by_b, by_others): (i64, i64) = (row.get(0), row.get(1));
        assert!(
            by_b > 0 && by_others == 0,
            "partition {partition} after A left: {by_b} by b, {by_others} by others"
        );
    }

    let (a, b) = (counters_a.snapshot(), counters_b.snapshot());
    assert_eq!(
        a.processed + b.processed,
        u64::try_from(distinct)?,
        "{a:?} {b:?}"
    );
    assert!(a.processed > 0 && b.processed > 0, "{a:?} {b:?}");
    assert!(a.duplicates + b.duplicates >= replays, "{a:?} {b:?}");
    assert_eq!(a.errors + b.errors + a.gaps + b.gaps, 0, "{a:?} {b:?}");
    Ok(())
}

#[tokio::test]
async fn conflicting_settings_are_refused() -> anyhow::Result<()> {
    let cluster =
        tokio::task::spawn_blocking(|| PgCluster::start(ClusterOptions::default())).await??;
    let db = || database(&cluster);
    let mut config = kafka("127.0.0.1:1", "g");
    config.set("enable.auto.commit", "true");
    let err = ConsumerLoop::new(config, &["t"], PgHwmStore::new(), db()).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Conflict {
                key: "enable.auto.commit",
                ..
            }
        ),
        "{err}"
    );
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", "127.0.0.1:1");
    let err = ConsumerLoop::new(config, &["t"], PgHwmStore::new(), db()).unwrap_err();
    assert!(matches!(err, ConfigError::MissingGroupId), "{err}");
    let err =
        ConsumerLoop::new(kafka("127.0.0.1:1", "g"), &[], PgHwmStore::new(), db()).unwrap_err();
    assert!(matches!(err, ConfigError::NoTopics), "{err}");
    Ok(())
}

/// Issue 25, item 8: the loop acted on rebalance events only when `recv()`
/// returned a record, so a member whose partition was revoked (and that
/// got no record since) went on applying the partition's queued records.
/// Member A's first batch blocks in its handler (on an advisory lock the
/// test holds); member B joins and takes the only partition (its client id
/// sorts first, so the range assignor gives it to B); once B waits for the
/// mark row that A's batch holds, A's handler is let go. A must apply
/// nothing more of the partition: its batch in flight is the last.
#[tokio::test]
async fn a_revoked_partition_gets_no_batch_after_the_revocation() -> anyhow::Result<()> {
    let topic = "revoked";
    let group = "revoked-group";
    let env = env(topic, 1).await?;
    let mut relay = Relay::new(&env.broker.bootstrap_servers(), topic)?;
    relay
        .send(&(1..=10).map(|s| (0, s)).collect::<Vec<_>>())
        .await?;
    env.client
        .execute("SELECT pg_advisory_lock(25008)", &[])
        .await?;

    let member = |client_id: &str, blocks: bool, calls: Arc<AtomicUsize>| {
        let mut config = kafka(&env.broker.bootstrap_servers(), group);
        config.set("client.id", client_id);
        let consumer =
            ConsumerLoop::new(config, &[topic], PgHwmStore::new(), database(&env.cluster))?
                .with_settings(Settings {
                    max_batch_records: 1,
                    commit_interval: Duration::from_millis(100),
                    ..Settings::default()
                });
        let (stop, shutdown) = watch::channel(false);
        let name = if blocks { "a" } else { "b" };
        let handle = tokio::spawn(consumer.run(
            async move |tx: &Transaction<'_>, record: &Delivery<'_>| {
                calls.fetch_add(1, Ordering::SeqCst);
                if blocks {
                    tx.execute("SELECT pg_advisory_xact_lock(25008)", &[])
                        .await?;
                }
                tx.execute(
                    "INSERT INTO effects (event_key, partition, consumer) VALUES ($1, $2, $3)",
                    &[&record.meta.key.to_hex(), &record.position.partition, &name],
                )
                .await?;
                Ok::<(), tokio_postgres::Error>(())
            },
            shutdown,
        ));
        anyhow::Ok((handle, stop))
    };
    let a_calls = Arc::new(AtomicUsize::new(0));
    let (handle_a, stop_a) = member("z-member-a", true, Arc::clone(&a_calls))?;
    await_condition(TIMEOUT, POLL, || async {
        Ok(a_calls.load(Ordering::SeqCst) == 1)
    })
    .await?;

    let (handle_b, stop_b) = member("a-member-b", false, Arc::new(AtomicUsize::new(0)))?;
    // B owns the partition once its batch waits for the row A's holds.
    await_count(
        &env.client,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND query NOT LIKE '%advisory%'",
        1,
    )
    .await?;
    env.client
        .execute("SELECT pg_advisory_unlock(25008)", &[])
        .await?;
    await_count(&env.client, "SELECT count(*) FROM effects", 10).await?;
    stop_b.send(true)?;
    handle_b.await??;
    stop_a.send(true)?;
    handle_a.await??;

    let by_a = count(
        &env.client,
        "SELECT count(*) FROM effects WHERE consumer = 'a'",
    )
    .await?;
    assert_eq!(
        (a_calls.load(Ordering::SeqCst), by_a),
        (1, 1),
        "member A ran its handler {} times and applied {by_a} records after its only partition \
         was revoked mid-batch: it must apply only the batch in flight",
        a_calls.load(Ordering::SeqCst)
    );
    check_marks(&env, group, topic, &relay).await?;
    Ok(())
}
