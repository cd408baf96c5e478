//! The consumer loop under failure, against a real Tansu broker and a real
//! PostgreSQL: poison records (parked or stopping their partition, the
//! other partitions going on), records without walrelay headers, and the
//! service database restarting in the middle of batches.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::Transaction;
use walrelay_consumer::{
    metrics::PartitionLabels, Delivery, LoopError, OnPoison, RetryPolicy, Settings,
};
use walrelay_contract::EventKey;
use walrelay_testkit::await_condition;

use support::*;

/// The effect of one record, unless the record is `poison` and the
/// handler is still broken.
async fn insert_effect(
    tx: &Transaction<'_>,
    record: &Delivery<'_>,
    name: &str,
) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        "INSERT INTO effects (event_key, partition, consumer) VALUES ($1, $2, $3)",
        &[&record.meta.key.to_hex(), &record.position.partition, &name],
    )
    .await
    .map(|_| ())
}

#[derive(Debug)]
struct Poisoned(EventKey);

impl std::fmt::Display for Poisoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "poison: cannot apply {}", self.0)
    }
}

#[derive(Debug)]
enum HandlerError {
    Poison(Poisoned),
    Db(tokio_postgres::Error),
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandlerError::Poison(p) => p.fmt(f),
            HandlerError::Db(e) => e.fmt(f),
        }
    }
}

fn settings(on_poison: OnPoison, base: Duration) -> Settings {
    Settings {
        max_batch_records: 7,
        retry: RetryPolicy {
            attempts: 3,
            base,
            cap: base * 4,
        },
        on_poison,
        commit_interval: Duration::from_millis(200),
        ..Settings::default()
    }
}

#[tokio::test]
async fn a_poison_record_is_parked_with_its_mark_and_redriven_once() -> anyhow::Result<()> {
    let topic = "parking";
    let group = "parker";
    let env = env(topic, 2).await?;
    let mut relay = Relay::new(&env.broker.bootstrap_servers(), topic)?;
    let first: Vec<(i32, u64)> = (1..=15).flat_map(|s| [(0, s), (1, s)]).collect();
    relay.send(&first).await?;
    relay.send_raw(1, "not a walrelay record").await?;
    let rest: Vec<(i32, u64)> = (16..=30).flat_map(|s| [(0, s), (1, s)]).collect();
    relay.send(&rest).await?;
    let poison = Relay::key(0, 13);

    let consumer = env.consumer(
        group,
        topic,
        settings(OnPoison::Park, Duration::from_millis(300)),
    )?;
    let counters = consumer.counters();
    let metrics = consumer.metrics();
    let (stop, shutdown) = watch::channel(false);
    // A batch handler: it cannot say which record failed, so the loop
    // finds it by applying the failing batch one record per transaction.
    let handle = tokio::spawn(consumer.run_batches(
        async move |tx: &Transaction<'_>, batch: &[Delivery<'_>]| {
            if batch.iter().any(|d| d.meta.key == poison) {
                return Err(HandlerError::Poison(Poisoned(poison)));
            }
            for d in batch {
                insert_effect(tx, d, "a").await.map_err(HandlerError::Db)?;
            }
            Ok(())
        },
        shutdown,
    ));
    await_count(&env.client, "SELECT count(*) FROM effects", 59).await?;
    await_count(
        &env.client,
        "SELECT count(*) FROM walrelay_consumer_parked",
        2,
    )
    .await?;
    stop.send(true)?;
    handle.await??;

    // Everything but the poison record, once; marks past it.
    assert_eq!(
        count(&env.client, "SELECT count(*) FROM effects").await?,
        59
    );
    assert_eq!(
        count(
            &env.client,
            &format!(
                "SELECT count(*) FROM effects WHERE event_key = '{}'",
                poison.to_hex()
            )
        )
        .await?,
        0
    );
    check_marks(&env, group, topic, &relay).await?;
    let c = counters.snapshot();
    assert_eq!((c.processed, c.parked), (59, 2), "{c:?}");
    // 2 failed batch attempts + 3 failed attempts of the record alone.
    assert!(metrics.retries.get() >= 5, "{}", metrics.retries.get());

    // The parked rows: the poison with its error and attempts; the record
    // without headers with no key.
    let rows = env
        .client
        .query(
            "SELECT partition, idempotency_key, error, attempts, payload \
             FROM walrelay_consumer_parked ORDER BY partition",
            &[],
        )
        .await?;
    let (p0, p1) = (&rows[0], &rows[1]);
    assert_eq!(p0.get::<_, i32>(0), 0);
    assert_eq!(p0.get::<_, Option<String>>(1), Some(poison.to_hex()));
    assert!(p0.get::<_, String>(2).contains("poison: cannot apply"));
    assert_eq!(p0.get::<_, i32>(3), 3);
    assert_eq!(p1.get::<_, i32>(0), 1);
    assert_eq!(p1.get::<_, Option<String>>(1), None);
    assert!(p1.get::<_, String>(2).contains("idempotency-key"));
    assert_eq!(
        p1.get::<_, Option<Vec<u8>>>(4).as_deref(),
        Some(&b"not a walrelay record"[..])
    );

    // The other partition never waited for the poison: all of partition
    // 1 was applied before the poison was parked.
    let row = env
        .client
        .query_one(
            "SELECT (SELECT max(applied_at) FROM effects WHERE partition = 1) \
                  < (SELECT parked_at FROM walrelay_consumer_parked WHERE partition = 0)",
            &[],
        )
        .await?;
    assert!(row.get::<_, bool>(0), "partition 1 waited for partition 0");

    // Re-drive (the handler is fixed): applied once, removed; the record
    // without headers stays for a person. A second re-drive does nothing.
    let mut client = env.cluster.client().await?;
    let report = walrelay_consumer::redrive(&mut client, group, async |tx, d| {
        insert_effect(tx, d, "redrive").await
    })
    .await?;
    assert_eq!((report.applied, report.failed, report.unusable), (1, 0, 1));
    let again = walrelay_consumer::redrive(&mut client, group, async |tx, d| {
        insert_effect(tx, d, "redrive").await
    })
    .await?;
    assert_eq!((again.applied, again.unusable), (0, 1));
    assert_eq!(
        count(&env.client, "SELECT count(*) FROM effects").await?,
        60
    );
    assert_eq!(
        count(
            &env.client,
            "SELECT count(*) FROM walrelay_consumer_parked WHERE idempotency_key IS NOT NULL"
        )
        .await?,
        0
    );
    Ok(())
}

#[tokio::test]
async fn a_poison_record_stops_only_its_partition() -> anyhow::Result<()> {
    let topic = "stopping";
    let group = "stopper";
    let env = env(topic, 2).await?;
    let mut relay = Relay::new(&env.broker.bootstrap_servers(), topic)?;
    let records: Vec<(i32, u64)> = (1..=20).flat_map(|s| [(0, s), (1, s)]).collect();
    relay.send(&records).await?;
    let poison = Relay::key(0, 5);
    let broken = Arc::new(AtomicBool::new(true));

    let start = |broken: Arc<AtomicBool>| -> anyhow::Result<_> {
        let consumer = env.consumer(
            group,
            topic,
            settings(OnPoison::Stop, Duration::from_millis(10)),
        )?;
        let metrics = consumer.metrics();
        let (stop, shutdown) = watch::channel(false);
        // A per-record handler: it says which record failed.
        let handle = tokio::spawn(consumer.run(
            async move |tx: &Transaction<'_>, d: &Delivery<'_>| {
                if broken.load(Ordering::SeqCst) && d.meta.key == poison {
                    return Err(HandlerError::Poison(Poisoned(poison)));
                }
                insert_effect(tx, d, "a").await.map_err(HandlerError::Db)
            },
            shutdown,
        ));
        Ok((handle, stop, metrics))
    };
    let (handle, stop, metrics) = start(Arc::clone(&broken))?;
    let p1 = "SELECT count(*) FROM effects WHERE partition = 1";
    await_count(&env.client, p1, 20).await?;
    let labels = PartitionLabels {
        topic: topic.into(),
        partition: 0,
    };
    await_condition(TIMEOUT, POLL, || async {
        Ok(metrics.stopped.get_or_create(&labels).get() == 1)
    })
    .await?;
    // The loop goes on serving partition 1.
    relay.send(&[(1, 21), (1, 22)]).await?;
    await_count(&env.client, p1, 22).await?;
    assert_eq!(
        count(
            &env.client,
            "SELECT count(*) FROM effects WHERE partition = 0"
        )
        .await?,
        4,
        "partition 0 stops right before the poison record"
    );
    assert!(!handle.is_finished());
    stop.send(true)?;
    match handle.await? {
        Err(LoopError::Stopped(stopped)) => {
            assert_eq!(stopped.len(), 1, "{stopped:?}");
            assert_eq!(
                (stopped[0].topic.as_str(), stopped[0].partition),
                (topic, 0)
            );
            assert!(
                stopped[0].error.contains("offset 4 failed 3 times"),
                "{}",
                stopped[0].error
            );
            let text = LoopError::Stopped(stopped).to_string();
            assert!(text.contains("restart"), "{text}");
        }
        other => panic!("expected a stopped partition, got {other:?}"),
    }

    // Fixed and restarted: partition 0 goes on from the poison record.
    broken.store(false, Ordering::SeqCst);
    let (handle, stop, _) = start(broken)?;
    await_count(&env.client, "SELECT count(*) FROM effects", 42).await?;
    stop.send(true)?;
    handle.await??;
    assert_eq!(
        count(&env.client, "SELECT count(*) FROM effects").await?,
        42
    );
    check_marks(&env, group, topic, &relay).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_mid_batch_loses_and_repeats_nothing() -> anyhow::Result<()> {
    let topic = "outage";
    let group = "survivor";
    let env = env(topic, 2).await?;
    let mut relay = Relay::new(&env.broker.bootstrap_servers(), topic)?;
    let records: Vec<(i32, u64)> = (1..=300).flat_map(|s| [(0, s), (1, s)]).collect();
    relay.send(&records).await?;

    let consumer = env.consumer(
        group,
        topic,
        Settings {
            max_batch_records: 10,
            retry: RetryPolicy {
                attempts: 3,
                base: Duration::from_millis(50),
                cap: Duration::from_millis(500),
            },
            ..Settings::default()
        },
    )?;
    let counters = consumer.counters();
    let metrics = consumer.metrics();
    let (stop, shutdown) = watch::channel(false);
    // Slow batches (20 ms each), so that the crash lands inside some.
    let handle = tokio::spawn(consumer.run_batches(
        async |tx: &Transaction<'_>, batch: &[Delivery<'_>]| {
            tx.execute("SELECT pg_sleep(0.02)", &[]).await?;
            for d in batch {
                insert_effect(tx, d, "a").await?;
            }
            Ok::<(), tokio_postgres::Error>(())
        },
        shutdown,
    ));
    await_count(&env.client, "SELECT count(*) FROM effects", 100).await?;
    let cluster = &env.cluster;
    tokio::task::block_in_place(|| -> anyhow::Result<()> {
        cluster.stop_immediate()?;
        cluster.start_stopped()
    })?;
    let client = env.cluster.client().await?;
    // effects' primary key turns a second application into a handler
    // error, which would stop the partition (never reaching 600).
    await_count(&client, "SELECT count(*) FROM effects", 600).await?;
    assert!(!handle.is_finished(), "the loop carried on");
    stop.send(true)?;
    handle.await??;
    assert_eq!(count(&client, "SELECT count(*) FROM effects").await?, 600);
    assert!(metrics.retries.get() > 0, "the crash met a batch");
    let c = counters.snapshot();
    assert_eq!(c.processed, 600, "{c:?}");
    let env = Env { client, ..env };
    check_marks(&env, group, topic, &relay).await?;
    Ok(())
}

/// The loop prepares its statements on the marks once per connection. A
/// handler that drops them (`DEALLOCATE ALL`, as a pooler in transaction
/// mode would lose them) costs one retried batch: the loop goes on with
/// statements sent unnamed, every record applied once.
#[tokio::test]
async fn a_handler_that_drops_the_prepared_statements_costs_one_retry() -> anyhow::Result<()> {
    let topic = "prepared";
    let group = "preparer";
    let env = env(topic, 2).await?;
    let mut relay = Relay::new(&env.broker.bootstrap_servers(), topic)?;
    let records: Vec<(i32, u64)> = (1..=100).flat_map(|s| [(0, s), (1, s)]).collect();
    relay.send(&records).await?;

    let consumer = env.consumer(
        group,
        topic,
        settings(OnPoison::Stop, Duration::from_millis(10)),
    )?;
    let counters = consumer.counters();
    let metrics = consumer.metrics();
    let (stop, shutdown) = watch::channel(false);
    // The most statements a handler saw prepared in its session, and
    // whether the next batch drops them.
    let prepared = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let drop_next = Arc::new(AtomicBool::new(true));
    let handle = {
        let (prepared, drop_next) = (Arc::clone(&prepared), Arc::clone(&drop_next));
        tokio::spawn(consumer.run_batches(
            async move |tx: &Transaction<'_>, batch: &[Delivery<'_>]| {
                let row = tx
                    .query_one("SELECT count(*) FROM pg_prepared_statements", &[])
                    .await?;
                prepared.fetch_max(row.get(0), Ordering::SeqCst);
                if drop_next.swap(false, Ordering::SeqCst) {
                    tx.batch_execute("DEALLOCATE ALL").await?;
                }
                for d in batch {
                    insert_effect(tx, d, "a").await?;
                }
                Ok::<(), tokio_postgres::Error>(())
            },
            shutdown,
        ))
    };
    // effects' primary key turns a second application into a handler
    // error, which would stop the partition (never reaching 200).
    await_count(&env.client, "SELECT count(*) FROM effects", 200).await?;
    assert!(!handle.is_finished(), "the loop carried on");
    stop.send(true)?;
    handle.await??;
    assert_eq!(
        count(&env.client, "SELECT count(*) FROM effects").await?,
        200
    );
    assert!(
        prepared.load(Ordering::SeqCst) >= 4,
        "the batch statements were prepared on the loop's connection"
    );
    assert!(
        !drop_next.load(Ordering::SeqCst),
        "the handler dropped them"
    );
    assert!(
        metrics.retries.get() >= 1,
        "the batch that dropped them was retried"
    );
    let c = counters.snapshot();
    assert_eq!(c.processed, 200, "{c:?}");
    check_marks(&env, group, topic, &relay).await?;
    Ok(())
}

/// Issue 25, item 5: a record without walrelay headers has nothing but its
/// offset to identify it. The dead-letter table already holds a different
/// such record at offset 0 (an earlier incarnation of the topic): the loop
/// refuses to guess, parks nothing and stops the partition, naming the
/// cause and the fix; the same record delivered again would be taken as
/// parked before.
#[tokio::test]
async fn a_record_without_headers_at_a_reused_offset_stops_its_partition() -> anyhow::Result<()> {
    let topic = "reused";
    let group = "reuser";
    let env = env(topic, 1).await?;
    env.client
        .execute(
            "INSERT INTO walrelay_consumer_parked (consumer_group, topic, partition, \
             kafka_offset, payload, header_names, header_values, error, attempts) \
             VALUES ($1, $2, 0, 0, 'an earlier record', '{}', '{}', 'no headers', 1)",
            &[&group, &topic],
        )
        .await?;
    let mut relay = Relay::new(&env.broker.bootstrap_servers(), topic)?;
    relay.send_raw(0, "a new record").await?;
    relay.send(&[(0, 1)]).await?;
    let consumer = env.consumer(
        group,
        topic,
        settings(OnPoison::Park, Duration::from_millis(10)),
    )?;
    let metrics = consumer.metrics();
    let (stop, shutdown) = watch::channel(false);
    let handle = tokio::spawn(consumer.run(
        async move |tx: &Transaction<'_>, d: &Delivery<'_>| {
            insert_effect(tx, d, "a").await.map_err(HandlerError::Db)
        },
        shutdown,
    ));
    let labels = PartitionLabels {
        topic: topic.into(),
        partition: 0,
    };
    await_condition(TIMEOUT, POLL, || async {
        Ok(metrics.stopped.get_or_create(&labels).get() == 1)
    })
    .await?;
    stop.send(true)?;
    match handle.await? {
        Err(LoopError::Stopped(stopped)) => {
            assert_eq!(stopped.len(), 1, "{stopped:?}");
            assert!(
                stopped[0].error.contains("offsets were reused")
                    && stopped[0].error.contains("kafka_offset = 0"),
                "{}",
                stopped[0].error
            );
        }
        other => panic!("expected a stopped partition, got {other:?}"),
    }
    assert_eq!(
        count(&env.client, "SELECT count(*) FROM walrelay_consumer_parked").await?,
        1,
        "nothing parked over the earlier row"
    );
    assert_eq!(
        count(&env.client, "SELECT count(*) FROM effects").await?,
        0,
        "nothing after the refused record is applied"
    );
    Ok(())
}

/// Issue 25, item 8, the other half: a partition stopped by a poison record
/// is paused in librdkafka. A rebalance that gives it back to the same
/// member (member B joins the group for another topic) starts it over and
/// resumes it, so the record is tried again (the handler is fixed by
/// then). The loop used to act on the assignment only with the next
/// record, which a paused partition never brings: with no other partition
/// to bring one, the member stalled.
#[tokio::test]
async fn a_stopped_partition_assigned_again_is_tried_again_without_another_record(
) -> anyhow::Result<()> {
    let topic = "reassigned";
    let other = "reassigned-other";
    let group = "reassigner";
    let env = env(topic, 1).await?;
    // Creating a topic blocks (admin client): not on the runtime's thread.
    std::thread::scope(|scope| scope.spawn(|| env.broker.create_topic(other, 1)).join())
        .map_err(|_| anyhow::anyhow!("creating the topic panicked"))??;
    let mut relay = Relay::new(&env.broker.bootstrap_servers(), topic)?;
    relay
        .send(&(1..=5).map(|s| (0, s)).collect::<Vec<_>>())
        .await?;
    let poison = Relay::key(0, 3);
    let broken = Arc::new(AtomicBool::new(true));
    let consumer = env.consumer(
        group,
        topic,
        settings(OnPoison::Stop, Duration::from_millis(10)),
    )?;
    let metrics = consumer.metrics();
    let (stop, shutdown) = watch::channel(false);
    let handle = {
        let broken = Arc::clone(&broken);
        tokio::spawn(consumer.run(
            async move |tx: &Transaction<'_>, d: &Delivery<'_>| {
                if broken.load(Ordering::SeqCst) && d.meta.key == poison {
                    return Err(HandlerError::Poison(Poisoned(poison)));
                }
                insert_effect(tx, d, "a").await.map_err(HandlerError::Db)
            },
            shutdown,
        ))
    };
    let labels = PartitionLabels {
        topic: topic.into(),
        partition: 0,
    };
    await_condition(TIMEOUT, POLL, || async {
        Ok(metrics.stopped.get_or_create(&labels).get() == 1)
    })
    .await?;
    assert_eq!(count(&env.client, "SELECT count(*) FROM effects").await?, 2);

    broken.store(false, Ordering::SeqCst);
    let (handle_b, stop_b, _) = start(&env, group, other, "b", Mode::Batch).await?;
    await_condition(Duration::from_secs(30), POLL, || async {
        Ok(count(&env.client, "SELECT count(*) FROM effects").await? == 5)
    })
    .await?;
    stop_b.send(true)?;
    handle_b.await??;
    stop.send(true)?;
    // It was stopped once: the loop says so at the end.
    match handle.await? {
        Err(LoopError::Stopped(stopped)) => assert_eq!(stopped.len(), 1, "{stopped:?}"),
        other => panic!("expected the earlier stop to be reported, got {other:?}"),
    }
    check_marks(&env, group, topic, &relay).await?;
    Ok(())
}
