//! `PgHwmStore` against a real, throwaway PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_postgres::{Client, Transaction};
use walrelay_consumer::{
    migrate, CountersSnapshot, HwmRow, HwmStore, Outcome, PgHwmStore, Position, ProcessError,
    RecordMeta, MIGRATION,
};
use walrelay_contract::EventKey;
use walrelay_testkit::{await_condition, ClusterOptions, PgCluster};

const SOURCE: &str = "7312/app/walrelay";

/// A fresh cluster with the migration and a side-effect table.
async fn setup() -> anyhow::Result<(PgCluster, Client)> {
    let cluster =
        tokio::task::spawn_blocking(|| PgCluster::start(ClusterOptions::default())).await??;
    let client = cluster.client().await?;
    migrate(&client).await?;
    client
        .batch_execute("CREATE TABLE effects (event_key text NOT NULL, note text)")
        .await?;
    Ok((cluster, client))
}

fn meta(key: u128, source: &str, prev: Option<u128>) -> RecordMeta {
    RecordMeta {
        key: EventKey(key),
        source: source.to_owned(),
        lsn: None,
        commit_lsn: None,
        prev_key: prev.map(EventKey),
    }
}

async fn insert_effect(
    tx: &Transaction<'_>,
    meta: &RecordMeta,
) -> Result<u64, tokio_postgres::Error> {
    tx.execute(
        "INSERT INTO effects (event_key) VALUES ($1)",
        &[&meta.key.to_hex()],
    )
    .await
}

async fn effects(client: &Client) -> anyhow::Result<Vec<String>> {
    Ok(client
        .query("SELECT event_key FROM effects ORDER BY event_key", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

#[tokio::test]
async fn migration_is_idempotent_and_checks_the_mark() -> anyhow::Result<()> {
    let (_cluster, client) = setup().await?;
    migrate(&client).await?;
    client.batch_execute(MIGRATION).await?;
    let bad = client
        .execute(
            "INSERT INTO walrelay_consumer_hwm (consumer_group, topic, partition, source, hwm) \
             VALUES ('g', 't', 0, 's', 'ABC')",
            &[],
        )
        .await;
    assert!(
        bad.is_err(),
        "the CHECK constraint must refuse a non-key mark"
    );
    // Text order is key order.
    let row = client
        .query_one(
            "SELECT $1::text < $2::text",
            &[&EventKey(0x0fff).to_hex(), &EventKey(0x1000).to_hex()],
        )
        .await?;
    assert!(row.get::<_, bool>(0));
    Ok(())
}

#[tokio::test]
async fn first_duplicate_lower_and_higher_keys() -> anyhow::Result<()> {
    let (_cluster, mut client) = setup().await?;
    let store = PgHwmStore::new();
    let pos = Position::new("g", "orders", 0);
    let k = 0x0153_1f10_u128 << 64 | 0x0153_2000;

    let first = meta(k, SOURCE, None);
    let out = store
        .process(&mut client, &pos, &first, async |tx| {
            insert_effect(tx, &first).await
        })
        .await?;
    assert_eq!(out, Outcome::Processed(1));
    assert_eq!(store.hwm(&client, &pos, SOURCE).await?, Some(EventKey(k)));

    // The same record again, and a lower one: duplicates, handler not run.
    for key in [k, k - 1, 1] {
        let m = meta(key, SOURCE, None);
        let out = store
            .process(
                &mut client,
                &pos,
                &m,
                async |_tx| -> Result<(), tokio_postgres::Error> {
                    panic!("the handler must not run for a duplicate")
                },
            )
            .await?;
        assert_eq!(out, Outcome::Duplicate { hwm: EventKey(k) });
    }

    let higher = meta(k + 1, SOURCE, Some(k));
    let out = store
        .process(&mut client, &pos, &higher, async |tx| {
            insert_effect(tx, &higher).await
        })
        .await?;
    assert!(out.is_processed());
    assert_eq!(
        store.hwm(&client, &pos, SOURCE).await?,
        Some(EventKey(k + 1))
    );
    assert_eq!(
        effects(&client).await?,
        vec![EventKey(k).to_hex(), EventKey(k + 1).to_hex()]
    );
    assert_eq!(
        store.counters().snapshot(),
        CountersSnapshot {
            processed: 2,
            duplicates: 3,
            gaps: 0,
            errors: 0,
            parked: 0,
        }
    );

    // Other partitions and groups have their own marks.
    for other in [
        Position::new("g", "orders", 1),
        Position::new("h", "orders", 0),
    ] {
        let out = store
            .process(&mut client, &other, &first, async |_tx| Ok::<_, ()>(()))
            .await
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        assert!(out.is_processed(), "{other:?}");
    }
    // Through the trait, and load().
    let rows = HwmStore::load(
        &store,
        &client,
        "g",
        &[
            ("orders".to_owned(), 0),
            ("orders".to_owned(), 1),
            ("other".to_owned(), 0),
        ],
    )
    .await?;
    assert_eq!(
        rows,
        vec![
            HwmRow {
                topic: "orders".into(),
                partition: 0,
                source: SOURCE.into(),
                hwm: EventKey(k + 1)
            },
            HwmRow {
                topic: "orders".into(),
                partition: 1,
                source: SOURCE.into(),
                hwm: EventKey(k)
            },
        ]
    );
    let out = HwmStore::process(&store, &mut client, &pos, &higher, async |_tx| {
        Ok::<_, ()>(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    assert!(out.is_duplicate());
    Ok(())
}

#[tokio::test]
async fn handler_error_rolls_back_everything() -> anyhow::Result<()> {
    let (_cluster, mut client) = setup().await?;
    let store = PgHwmStore::new();
    let pos = Position::new("g", "orders", 0);
    let m1 = meta(10, SOURCE, None);
    store
        .process(&mut client, &pos, &m1, async |tx| {
            insert_effect(tx, &m1).await
        })
        .await?;

    let m2 = meta(20, SOURCE, Some(10));
    let err = store
        .process(&mut client, &pos, &m2, async |tx| {
            insert_effect(tx, &m2).await.map_err(|e| e.to_string())?;
            Err::<(), _>("boom".to_owned())
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProcessError::Handler { source: m, .. } if m == "boom"),
        "{err:?}"
    );
    assert!(err.to_string().contains("boom"), "{err}");
    assert_eq!(store.hwm(&client, &pos, SOURCE).await?, Some(EventKey(10)));
    assert_eq!(effects(&client).await?, vec![EventKey(10).to_hex()]);

    // A handler statement that fails aborts the transaction: a database
    // error, rolled back as well.
    let err = store
        .process(&mut client, &pos, &m2, async |tx| {
            insert_effect(tx, &m2).await?;
            tx.execute("SELECT 1/0", &[]).await
        })
        .await
        .unwrap_err();
    assert!(matches!(err, ProcessError::Handler { .. }), "{err:?}");
    assert_eq!(store.hwm(&client, &pos, SOURCE).await?, Some(EventKey(10)));
    assert_eq!(effects(&client).await?.len(), 1);

    // The redelivery is processed normally.
    let out = store
        .process(&mut client, &pos, &m2, async |tx| {
            insert_effect(tx, &m2).await
        })
        .await?;
    assert!(out.is_processed());
    assert_eq!(store.hwm(&client, &pos, SOURCE).await?, Some(EventKey(20)));
    assert_eq!(effects(&client).await?.len(), 2);
    let c = store.counters().snapshot();
    assert_eq!((c.processed, c.errors, c.gaps), (2, 2, 0), "{c:?}");
    Ok(())
}

#[tokio::test]
async fn sources_keep_separate_marks() -> anyhow::Result<()> {
    let (_cluster, mut client) = setup().await?;
    let store = PgHwmStore::new();
    let pos = Position::new("g", "orders", 0);
    let a = meta(1000, "cluster-a/app/slot", None);
    let b = meta(5, "cluster-b/app/slot", None);
    assert!(store
        .process(&mut client, &pos, &a, async |tx| insert_effect(tx, &a)
            .await)
        .await?
        .is_processed());
    // Lower key, other source: still new.
    assert!(store
        .process(&mut client, &pos, &b, async |tx| insert_effect(tx, &b)
            .await)
        .await?
        .is_processed());
    assert_eq!(
        store.hwm(&client, &pos, "cluster-a/app/slot").await?,
        Some(EventKey(1000))
    );
    assert_eq!(
        store.hwm(&client, &pos, "cluster-b/app/slot").await?,
        Some(EventKey(5))
    );
    assert!(store
        .process(&mut client, &pos, &b, async |tx| insert_effect(tx, &b)
            .await)
        .await?
        .is_duplicate());
    assert_eq!(effects(&client).await?.len(), 2);
    Ok(())
}

#[tokio::test]
async fn gap_detection_counts_a_missed_record() -> anyhow::Result<()> {
    let (_cluster, mut client) = setup().await?;
    let store = PgHwmStore::new();
    let pos = Position::new("g", "orders", 0);
    let noop = async |_tx: &Transaction<'_>| Ok::<_, tokio_postgres::Error>(());

    // The first record a group sees for a partition: no gap reported even
    // with a prev-key (the initial mark is not compared).
    store
        .process(&mut client, &pos, &meta(100, SOURCE, Some(90)), noop)
        .await?;
    // prev == hwm: contiguous.
    store
        .process(&mut client, &pos, &meta(110, SOURCE, Some(100)), noop)
        .await?;
    // Session start (no prev-key): nothing to compare.
    store
        .process(&mut client, &pos, &meta(120, SOURCE, None), noop)
        .await?;
    // prev < hwm: its predecessor was processed long ago (replay overlap).
    store
        .process(&mut client, &pos, &meta(130, SOURCE, Some(115)), noop)
        .await?;
    assert_eq!(store.counters().snapshot().gaps, 0);

    // 140 was never seen: 150 says it came after 140.
    let out = store
        .process(&mut client, &pos, &meta(150, SOURCE, Some(140)), noop)
        .await?;
    assert!(
        out.is_processed(),
        "a record after a gap is still processed"
    );
    assert_eq!(store.hwm(&client, &pos, SOURCE).await?, Some(EventKey(150)));
    assert_eq!(store.counters().snapshot().gaps, 1);

    // A gap on a record that then fails is not counted (it is counted when
    // the record commits).
    let err = store
        .process(
            &mut client,
            &pos,
            &meta(170, SOURCE, Some(160)),
            async |_tx| Err::<(), _>("no"),
        )
        .await;
    assert!(err.is_err());
    assert_eq!(store.counters().snapshot().gaps, 1);
    store
        .process(&mut client, &pos, &meta(170, SOURCE, Some(160)), noop)
        .await?;
    assert_eq!(store.counters().snapshot().gaps, 2);
    Ok(())
}

#[tokio::test]
async fn concurrent_deliveries_of_one_record_apply_once() -> anyhow::Result<()> {
    const TASKS: usize = 8;
    let (cluster, client) = setup().await?;
    let monitor = Arc::new(client);
    let store = PgHwmStore::new();
    let pos = Position::new("g", "orders", 3);
    let record = meta(0x42 << 64 | 7, SOURCE, None);

    let mut clients = Vec::new();
    for _ in 0..TASKS {
        clients.push(cluster.client().await?);
    }
    let mut tasks = Vec::new();
    for mut client in clients {
        let (store, pos, record, monitor) = (
            store.clone(),
            pos.clone(),
            record.clone(),
            Arc::clone(&monitor),
        );
        tasks.push(tokio::spawn(async move {
            store
                .process(&mut client, &pos, &record, async |tx| {
                    // Whoever gets here first holds the mark row (or its
                    // uncommitted insert): wait until every other delivery
                    // is blocked on it, so they really race.
                    await_condition(Duration::from_secs(60), Duration::from_millis(20), || {
                        let monitor = Arc::clone(&monitor);
                        async move {
                            let row = monitor
                                .query_one(
                                    "SELECT count(*) FROM pg_stat_activity \
                                     WHERE wait_event_type = 'Lock'",
                                    &[],
                                )
                                .await?;
                            Ok(row.get::<_, i64>(0) >= (TASKS as i64 - 1))
                        }
                    })
                    .await?;
                    insert_effect(tx, &record).await?;
                    Ok::<_, anyhow::Error>(())
                })
                .await
        }));
    }
    let mut processed = 0;
    let mut duplicates = 0;
    for task in tasks {
        match task.await?.map_err(|e| anyhow::anyhow!("{e}"))? {
            Outcome::Processed(()) => processed += 1,
            Outcome::Duplicate { hwm } => {
                assert_eq!(hwm, record.key);
                duplicates += 1;
            }
        }
    }
    assert_eq!((processed, duplicates), (1, TASKS - 1));
    assert_eq!(effects(&monitor).await?, vec![record.key.to_hex()]);
    let c = store.counters().snapshot();
    assert_eq!((c.processed, c.duplicates, c.errors), (1, 7, 0), "{c:?}");
    drop(cluster);
    Ok(())
}

#[tokio::test]
async fn corrupt_mark_is_an_error() -> anyhow::Result<()> {
    let (_cluster, mut client) = setup().await?;
    client
        .batch_execute(
            "ALTER TABLE walrelay_consumer_hwm DROP CONSTRAINT walrelay_consumer_hwm_hwm_check;
             INSERT INTO walrelay_consumer_hwm (consumer_group, topic, partition, source, hwm)
             VALUES ('g', 'orders', 0, 's', 'not-a-key')",
        )
        .await
        .context("breaking the table")?;
    let store = PgHwmStore::new();
    let m = meta(1, "s", None);
    let err = store
        .process(
            &mut client,
            &Position::new("g", "orders", 0),
            &m,
            async |_tx| Ok::<_, ()>(()),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProcessError::CorruptHwm { ref value, .. } if value == "not-a-key"),
        "{err:?}"
    );
    Ok(())
}

/// A batch of one partition that mixes a relay replay (lower keys after
/// higher ones), two sources and a gap: only the new records reach the
/// handler, in order; each source's mark ends at its highest key; the gap
/// is counted; a failing handler rolls the whole batch back.
#[tokio::test]
async fn a_mixed_batch_applies_only_new_records() -> anyhow::Result<()> {
    use rdkafka::message::OwnedMessage;
    use rdkafka::Timestamp;
    use walrelay_consumer::{BatchError, Delivery};

    let (_cluster, mut client) = setup().await?;
    let store = PgHwmStore::new();
    let position = Position::new("g", "orders", 3);
    // Marks before the batch: a at 10, b never seen.
    let seed = [meta(10, "a", None)];
    let message = |offset: i64| {
        OwnedMessage::new(
            None,
            None,
            "orders".into(),
            Timestamp::NotAvailable,
            3,
            offset,
            None,
        )
    };
    let deliveries =
        |metas: &[RecordMeta], messages: &[OwnedMessage]| -> Vec<(RecordMeta, OwnedMessage)> {
            metas
                .iter()
                .cloned()
                .zip(messages.iter().cloned())
                .collect()
        };
    let seed_messages = [message(0)];
    let owned = deliveries(&seed, &seed_messages);
    let batch: Vec<Delivery<'_>> = owned
        .iter()
        .map(|(m, msg)| Delivery {
            message: msg,
            meta: m,
            position: &position,
        })
        .collect();
    store
        .process_batch(&mut client, &position, &batch, async |_, _| {
            Ok::<(), std::convert::Infallible>(())
        })
        .await?;

    let metas = [
        meta(9, "a", None),      // below the mark: duplicate
        meta(11, "a", Some(10)), // new
        meta(12, "a", Some(11)), // new
        meta(5, "b", None),      // new source
        meta(11, "a", Some(10)), // replayed: duplicate
        meta(12, "a", Some(11)), // replayed: duplicate
        meta(15, "a", Some(14)), // new, gap (13, 14 never seen)
        meta(6, "b", Some(5)),   // new
    ];
    let messages: Vec<OwnedMessage> = (1..=8).map(message).collect();
    let owned = deliveries(&metas, &messages);
    let batch: Vec<Delivery<'_>> = owned
        .iter()
        .map(|(m, msg)| Delivery {
            message: msg,
            meta: m,
            position: &position,
        })
        .collect();

    // A failing handler: nothing moves.
    let err = store
        .process_batch(&mut client, &position, &batch, async |tx, new| {
            for d in new {
                insert_effect(tx, d.meta).await?;
            }
            Err::<(), anyhow::Error>(anyhow::anyhow!("broken"))
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, BatchError::Handler { index: None, .. }),
        "{err}"
    );
    assert!(effects(&client).await?.is_empty());
    assert_eq!(
        store.hwm(&client, &position, "a").await?,
        Some(EventKey(10))
    );
    assert_eq!(store.hwm(&client, &position, "b").await?, None);

    let mut seen = Vec::new();
    let outcome = store
        .process_batch(&mut client, &position, &batch, async |tx, new| {
            for d in new {
                seen.push((d.meta.source.clone(), d.meta.key.0, d.offset()));
                insert_effect(tx, d.meta).await?;
            }
            Ok::<(), tokio_postgres::Error>(())
        })
        .await?;
    assert_eq!(
        seen,
        vec![
            ("a".to_owned(), 11, 2),
            ("a".to_owned(), 12, 3),
            ("b".to_owned(), 5, 4),
            ("a".to_owned(), 15, 7),
            ("b".to_owned(), 6, 8),
        ]
    );
    assert_eq!(
        (outcome.applied, outcome.duplicates, outcome.gaps),
        (5, 3, 1)
    );
    assert_eq!(
        store.hwm(&client, &position, "a").await?,
        Some(EventKey(15))
    );
    assert_eq!(store.hwm(&client, &position, "b").await?, Some(EventKey(6)));
    assert_eq!(effects(&client).await?.len(), 5);
    let c = store.counters().snapshot();
    assert_eq!((c.processed, c.duplicates, c.gaps), (6, 3, 1), "{c:?}");

    // The same batch again: all duplicates, the handler is not called.
    let mut calls = 0;
    let outcome = store
        .process_batch(&mut client, &position, &batch, async |_, _| {
            calls += 1;
            Ok::<(), tokio_postgres::Error>(())
        })
        .await?;
    assert_eq!((outcome.applied, outcome.duplicates, calls), (0, 8, 0));
    Ok(())
}

/// Issue 25, item 5: a table created by the earlier migration had parked
/// rows unique on (group, topic, partition, offset). The migration drops
/// that constraint, creates the unique indexes on the event, keeps the
/// rows, and stays idempotent.
#[tokio::test]
async fn the_migration_upgrades_the_parked_table_of_the_earlier_version() -> anyhow::Result<()> {
    let cluster =
        tokio::task::spawn_blocking(|| PgCluster::start(ClusterOptions::default())).await??;
    let client = cluster.client().await?;
    client
        .batch_execute(include_str!(
            "../../../conformance/fixtures/walrelay_consumer_before_parked_event_unique.sql"
        ))
        .await?;
    let insert = "INSERT INTO walrelay_consumer_parked (consumer_group, topic, partition, \
                  kafka_offset, idempotency_key, source, header_names, header_values, error, \
                  attempts) VALUES ('g', 't', 0, 4, $1, 's', '{}', '{}', 'boom', 3)";
    client.execute(insert, &[&EventKey(5).to_hex()]).await?;
    migrate(&client).await?;
    migrate(&client).await?;
    let unique = client
        .query(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
             WHERE conrelid = 'walrelay_consumer_parked'::regclass AND contype = 'u'",
            &[],
        )
        .await?;
    assert!(unique.is_empty(), "the offset constraint is left");
    let indexes: Vec<String> = client
        .query(
            "SELECT indexname::text FROM pg_indexes WHERE tablename = 'walrelay_consumer_parked' \
             ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        indexes.contains(&"walrelay_consumer_parked_event".to_owned())
            && indexes.contains(&"walrelay_consumer_parked_unkeyed".to_owned()),
        "{indexes:?}"
    );
    // Another event at the same offset (the topic recreated) now fits.
    client.execute(insert, &[&EventKey(9).to_hex()]).await?;
    // The same event twice does not.
    assert!(client
        .execute(insert, &[&EventKey(9).to_hex()])
        .await
        .is_err());
    Ok(())
}

/// Issue 25, item 7: real errors of a real server, told apart. An outage
/// (the connection terminated by the server, nothing listening) is retried
/// without counting; a deferred constraint failing at COMMIT or a statement
/// run after a swallowed failure is the batch's own error.
#[tokio::test]
async fn outages_and_errors_of_the_batch_are_told_apart() -> anyhow::Result<()> {
    use walrelay_consumer::outage::is_outage;
    let (cluster, mut client) = setup().await?;
    client
        .batch_execute(
            "CREATE TABLE d (id int, CONSTRAINT d_unique UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)",
        )
        .await?;

    let tx = client.transaction().await?;
    tx.execute("INSERT INTO d VALUES (1), (1)", &[]).await?;
    let at_commit = tx
        .commit()
        .await
        .expect_err("the deferred constraint fails");
    assert!(!is_outage(&at_commit), "{at_commit}");

    let tx = client.transaction().await?;
    assert!(tx.execute("SELECT 1 / 0", &[]).await.is_err());
    let swallowed = tx
        .execute("SELECT 1", &[])
        .await
        .expect_err("the transaction is aborted");
    assert!(!is_outage(&swallowed), "{swallowed}");
    drop(tx);

    // A parameter the client cannot encode: no SQLSTATE, the connection
    // fine, and the same batch fails the same way every time.
    let encode = client
        .execute("SELECT $1::int", &[&"not a number"])
        .await
        .expect_err("a text for an int parameter");
    assert!(encode.code().is_none(), "{encode}");
    assert!(!is_outage(&encode), "{encode}");

    let victim = cluster.client().await?;
    let pid: i32 = victim
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    client
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await?;
    let terminated = victim
        .execute("SELECT 1", &[])
        .await
        .expect_err("the connection is gone");
    assert!(is_outage(&terminated), "{terminated}");

    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?.port()
    };
    let Err(refused) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=postgres connect_timeout=5"),
        tokio_postgres::NoTls,
    )
    .await
    else {
        panic!("connected to a port nothing listens on");
    };
    assert!(is_outage(&refused), "{refused}");
    Ok(())
}

/// Issue 35, item 1: a handler that swallows a failed statement leaves the
/// transaction aborted, and PostgreSQL answers its COMMIT with ROLLBACK
/// and no error; one that ends the transaction itself commits (or rolls
/// back) apart from the marks. Neither may pass for a commit. A savepoint
/// used the right way works.
#[tokio::test]
async fn a_handler_that_swallows_an_error_or_ends_the_transaction_is_caught() -> anyhow::Result<()>
{
    use rdkafka::message::OwnedMessage;
    use rdkafka::Timestamp;
    use walrelay_consumer::{BatchError, Delivery};

    let (_cluster, mut client) = setup().await?;
    let store = PgHwmStore::new();
    let position = Position::new("g", "orders", 0);
    let metas: Vec<RecordMeta> = (1..=3).map(|k| meta(k, SOURCE, None)).collect();
    let messages: Vec<OwnedMessage> = (0..3)
        .map(|offset| {
            OwnedMessage::new(
                None,
                None,
                "orders".into(),
                Timestamp::NotAvailable,
                0,
                offset,
                None,
            )
        })
        .collect();
    let batch: Vec<Delivery<'_>> = metas
        .iter()
        .zip(&messages)
        .map(|(meta, message)| Delivery {
            message,
            meta,
            position: &position,
        })
        .collect();

    // Inserts its effects, then ignores a failed statement.
    let err = store
        .process_batch(&mut client, &position, &batch, async |tx, new| {
            for d in new {
                insert_effect(tx, d.meta).await?;
            }
            let _ = tx.execute("SELECT 1 / 0", &[]).await;
            Ok::<(), tokio_postgres::Error>(())
        })
        .await
        .unwrap_err();
    assert!(matches!(err, BatchError::HandlerSwallowedError), "{err}");
    assert!(
        err.to_string()
            .contains("aborted by an error it did not return"),
        "{err}"
    );
    assert!(effects(&client).await?.is_empty());
    // Not even the mark row that the batch created is left.
    assert_eq!(store.hwm(&client, &position, SOURCE).await?, None);
    // The connection is usable afterwards (outside a transaction).
    client.execute("SELECT 1", &[]).await?;

    // Commits its effects itself: the marks went with them, but the loop
    // must learn that atomicity was broken.
    let err = store
        .process_batch(&mut client, &position, &batch[..1], async |tx, new| {
            insert_effect(tx, new[0].meta).await?;
            tx.batch_execute("COMMIT").await
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, BatchError::HandlerEndedTransaction { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("atomicity was broken"), "{err}");
    // Rolls back itself, then writes outside any transaction.
    let err = store
        .process_batch(&mut client, &position, &batch[1..2], async |tx, new| {
            tx.batch_execute("ROLLBACK").await?;
            insert_effect(tx, new[0].meta).await.map(drop)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, BatchError::HandlerEndedTransaction { .. }),
        "{err}"
    );
    client.execute("SELECT 1", &[]).await?;

    // A savepoint around the statement that may fail: applied.
    let outcome = store
        .process_batch(&mut client, &position, &batch[2..], async |tx, new| {
            tx.batch_execute("SAVEPOINT s").await?;
            if tx.execute("SELECT 1 / 0", &[]).await.is_err() {
                tx.batch_execute("ROLLBACK TO SAVEPOINT s").await?;
            }
            insert_effect(tx, new[0].meta).await.map(drop)
        })
        .await?;
    assert_eq!(outcome.applied, 1);
    assert_eq!(
        store.hwm(&client, &position, SOURCE).await?,
        Some(EventKey(3))
    );
    Ok(())
}
