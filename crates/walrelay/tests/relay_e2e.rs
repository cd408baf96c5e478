//! The relay end to end: a real PostgreSQL, a real broker over TCP (Tansu,
//! or Apache Kafka with WALRELAY_BROKER=kafka), the relay in-process with
//! its audit trace.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use futures_util::SinkExt;
use support::{apply_high_water_marks, check_confirmations_follow_acks, key_of, Env, WAIT};
use tokio::sync::{mpsc, watch};
use walrelay::commands::setup::{self, Step};
use walrelay::config::KeylessPlacement;
use walrelay::engine::partition::{partition_for_key, partition_for_keyless};
use walrelay::engine::pipeline::{self, Trace};
use walrelay_testkit::{
    await_condition, partition_count, read_topics, read_until_quiet, ConsumedRecord,
};

struct Running {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), pipeline::RelayError>>,
    trace: mpsc::UnboundedReceiver<Trace>,
}

fn start_relay(config: walrelay::config::Config) -> Running {
    let (stop, stop_rx) = watch::channel(false);
    let (trace_tx, trace) = mpsc::unbounded_channel();
    let task = tokio::spawn(pipeline::run(config, stop_rx, Some(trace_tx)));
    Running { stop, task, trace }
}

impl Running {
    async fn stop(mut self) -> Result<Vec<Trace>> {
        self.stop.send(true)?;
        self.task.await??;
        let mut out = Vec::new();
        while let Ok(t) = self.trace.try_recv() {
            out.push(t);
        }
        Ok(out)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_every_committed_event_with_topic_partition_key_value_and_headers() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let mut config = env.config(&bootstrap);
    // The full header set, whose LSNs are checked against the key below
    // (the lean default is a subset: tests/fence.rs switches between them).
    config.relay.headers = walrelay::config::HeaderSet::Full;

    let steps = setup::setup(&config).await?;
    assert!(steps.iter().any(|s| matches!(s, Step::Created(t) if t.contains("publication walrelay for public.outbox"))), "{steps:?}");
    assert!(
        steps
            .iter()
            .any(|s| matches!(s, Step::Created(t) if t.contains("replication slot walrelay"))),
        "{steps:?}"
    );
    // Idempotent: the second run creates nothing.
    let again = setup::setup(&config).await?;
    assert!(
        again.iter().all(|s| matches!(s, Step::Existed(_))),
        "{again:?}"
    );

    // Four partitions per topic on either broker, so that the partitioning
    // rule is checked below.
    let topics = [
        "payments",
        "orders",
        "outbox.event.order",
        "outbox.event.customer",
        "bulk",
    ];
    env.create_topics(&topics)?;

    let relay = start_relay(config.clone());
    let c = &env.client;
    // Envelope messages through the SQL helpers: jsonb, bytea (byte-exact),
    // an untyped literal (the text overload), a tombstone.
    c.batch_execute(
        "SELECT walrelay.emit('payments', 'p-1', '{\"amount\": 5}'::jsonb, '{\"trace\": \"t1\"}');
         SELECT walrelay.emit('payments', 'p-2', '\\x00ff00de'::bytea);
         SELECT walrelay.emit('payments', 'p-3', '{\"a\": 1}');
         SELECT walrelay.emit('payments', 'p-4', NULL::jsonb);",
    )
    .await?;
    // Raw messages and outbox rows mixed in one transaction.
    c.batch_execute(
        "BEGIN;
         SELECT pg_logical_emit_message(true, 'orders', 'raw-1');
         INSERT INTO outbox VALUES ('e-1', 'order', 'o-1', 'OrderCreated', '{\"total\": 42}', '{\"tenant\": \"acme\"}');
         INSERT INTO outbox VALUES ('e-2', 'customer', 'c-1', 'CustomerSignedUp', '{}', NULL);
         SELECT pg_logical_emit_message(true, 'orders', 'raw-2');
         COMMIT;",
    )
    .await?;
    // COPY: rows sharing one LSN.
    let sink = c
        .copy_in("COPY outbox (id, aggregatetype, aggregateid, type, payload) FROM STDIN")
        .await?;
    let mut sink = std::pin::pin!(sink);
    sink.send(Bytes::from_static(b"k1\torder\to-2\tOrderPaid\t{}\nk2\torder\to-3\tOrderPaid\t{}\nk3\torder\to-4\tOrderPaid\t{}\n"))
        .await?;
    sink.finish().await?;
    // Rolled back: never published.
    c.batch_execute(
        "BEGIN;
         SELECT walrelay.emit('payments', 'never', '{}'::jsonb);
         INSERT INTO outbox VALUES ('rb', 'order', 'never', 'X', '{}', NULL);
         SELECT pg_logical_emit_message(true, 'orders', 'never');
         ROLLBACK;",
    )
    .await?;
    // A non-transactional message, then a bulk of 2,000 events in 20
    // transactions.
    c.batch_execute("SELECT pg_logical_emit_message(false, 'orders', 'nontx');")
        .await?;
    for t in 0..20 {
        c.batch_execute(&format!(
            "SELECT count(walrelay.emit('bulk', 'b-' || g, jsonb_build_object('t', {t}, 'g', g))) FROM generate_series(1, 100) g"
        ))
        .await?;
    }
    let end_of_workload = env.current_wal_lsn().await?;

    let expected = 4 + 4 + 3 + 1 + 2000;
    let records = read_topics(&bootstrap, &topics, expected, WAIT).await?;
    assert_eq!(
        records.len(),
        expected,
        "every committed event once, nothing else"
    );

    // Nothing rolled back arrived.
    assert!(!records
        .iter()
        .any(|r| r.key_str() == Some("never") || r.value_str() == Some("never")));

    // Values, keys and headers.
    let find = |topic: &str, key: Option<&str>, value: Option<&[u8]>| -> &ConsumedRecord {
        records
            .iter()
            .find(|r| {
                r.topic == topic
                    && r.key_str() == key
                    && value.is_none_or(|v| r.value.as_deref() == Some(v))
            })
            .unwrap_or_else(|| panic!("no record {topic}/{key:?}/{value:?}"))
    };
    let p1 = find("payments", Some("p-1"), None);
    assert_eq!(p1.value_str(), Some("{\"amount\": 5}"));
    assert_eq!(p1.header_str("trace"), Some("t1"));
    assert_eq!(
        find("payments", Some("p-2"), None).value.as_deref(),
        Some(&b"\x00\xff\x00\xde"[..])
    );
    assert_eq!(
        find("payments", Some("p-3"), None).value_str(),
        Some("{\"a\": 1}")
    );
    assert_eq!(
        find("payments", Some("p-4"), None).value,
        None,
        "NULL payload is a tombstone"
    );
    let raw = find("orders", None, Some(b"raw-1"));
    assert!(raw.header_str("walrelay-xid").is_some());
    let o1 = find("outbox.event.order", Some("o-1"), None);
    assert_eq!(o1.value_str(), Some("{\"total\": 42}"));
    assert_eq!(o1.header_str("id"), Some("e-1"));
    assert_eq!(o1.header_str("type"), Some("OrderCreated"));
    assert_eq!(o1.header_str("tenant"), Some("acme"));
    assert_eq!(
        find("outbox.event.customer", Some("c-1"), None).header_str("type"),
        Some("CustomerSignedUp")
    );
    let nontx = find("orders", None, Some(b"nontx"));
    assert_eq!(nontx.header_str("walrelay-commit-lsn"), None);
    assert_eq!(nontx.header_str("walrelay-xid"), None);

    let source = format!("{}/postgres/walrelay", env.system_identifier().await?);
    let mut partitions = BTreeMap::new();
    for r in &records {
        assert_eq!(r.header_str("walrelay-source"), Some(source.as_str()));
        let key = key_of(r);
        assert_eq!(
            r.header_str("idempotency-key").unwrap(),
            key.to_hex(),
            "32 lowercase hex digits"
        );
        let lsn: walrelay_pgoutput::Lsn = r
            .header_str("walrelay-lsn")
            .context("lsn header")?
            .parse()?;
        if let Some(commit) = r.header_str("walrelay-commit-lsn") {
            let commit: walrelay_pgoutput::Lsn = commit.parse()?;
            assert_eq!(key.high(), commit.0, "high 64 bits are the commit LSN");
            assert!(
                key.low() >= lsn.0,
                "low 64 bits are the position, raised only upwards"
            );
            assert!(r
                .header_str("walrelay-commit-time")
                .is_some_and(|t| t.ends_with('Z')));
        }
        // Deterministic partitioning: the documented rule, recomputed.
        let n = match partitions.get(&r.topic) {
            Some(n) => *n,
            None => {
                let n = partition_count(&bootstrap, &r.topic)? as u32;
                assert_eq!(n, support::PARTITIONS as u32, "{}", r.topic);
                partitions.insert(r.topic.clone(), n);
                n
            }
        };
        let expected_partition = match &r.key {
            Some(k) => partition_for_key(k, n),
            None => partition_for_keyless(key, n, KeylessPlacement::WalRange),
        };
        assert_eq!(
            r.partition as u32,
            expected_partition,
            "{}: {:?}",
            r.topic,
            r.key_str()
        );
    }
    // Gap detection: within a session each record names the key sent
    // before it to the same partition (empty for the first).
    let mut by_partition: BTreeMap<(String, i32), Vec<&ConsumedRecord>> = BTreeMap::new();
    for r in &records {
        by_partition
            .entry((r.topic.clone(), r.partition))
            .or_default()
            .push(r);
    }
    for rs in by_partition.values_mut() {
        rs.sort_by_key(|r| r.offset);
        let mut prev = String::new();
        for r in rs.iter() {
            assert_eq!(r.header_str("walrelay-prev-key"), Some(prev.as_str()));
            prev = key_of(r).to_hex();
        }
    }
    // walrelay's headers first, each once, then the application's
    // (docs/relay.md): prev-key too, although the pipeline adds it last.
    for r in &records {
        let reserved: Vec<bool> = r
            .headers
            .iter()
            .map(|(k, _)| walrelay::engine::record::header::is_reserved(k))
            .collect();
        let own = reserved.iter().take_while(|r| **r).count();
        assert!(
            reserved[own..].iter().all(|r| !r),
            "a walrelay header after the application's: {:?}",
            r.headers
        );
        let mut names: Vec<&str> = r.headers[..own].iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names.last(), Some(&"walrelay-prev-key"), "{:?}", r.headers);
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "each walrelay header once: {:?}", r.headers);
    }
    // Keys strictly increase per partition, and are unique.
    let (fresh, duplicates) = apply_high_water_marks(&records)?;
    assert_eq!(duplicates, 0, "one session, no replay: no duplicates");
    assert_eq!(fresh.values().map(Vec::len).sum::<usize>(), expected);
    let all: HashSet<_> = records.iter().map(key_of).collect();
    assert_eq!(all.len(), expected);

    // The slot moves past the whole workload once Kafka has it all.
    await_condition(WAIT, Duration::from_millis(100), || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= end_of_workload)
    })
    .await?;
    let trace = relay.stop().await?;
    let confirmations = check_confirmations_follow_acks(&trace)?;
    assert!(confirmations > 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_flush_lsn_advances_while_the_publication_is_idle() -> Result<()> {
    let env = Env::start().await?;
    let config = env.config(&env.bootstrap());
    setup::setup(&config).await?;
    let relay = start_relay(config);
    // Busy tables outside the publication: WAL grows, nothing is relayed.
    for _ in 0..3 {
        env.client
            .batch_execute(
                "INSERT INTO busy (v) SELECT repeat('x', 100) FROM generate_series(1, 500)",
            )
            .await?;
    }
    let target = env.current_wal_lsn().await?;
    await_condition(WAIT, Duration::from_millis(100), || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= target)
    })
    .await
    .context("the slot must not hold WAL for tables walrelay does not publish")?;
    relay.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_explains_a_missing_slot_and_a_table_outside_the_outbox_config() -> Result<()> {
    let env = Env::start().await?;
    let mut config = env.config(&env.bootstrap());
    // No setup: the slot is missing.
    let (_stop, stop_rx) = watch::channel(false);
    let err = pipeline::run(config.clone(), stop_rx, None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("does not exist") && err.contains("walrelay setup"),
        "{err}"
    );

    // A table in the publication that is not an outbox: stop, say which.
    env.client
        .batch_execute("CREATE TABLE other (id int PRIMARY KEY); CREATE PUBLICATION walrelay FOR TABLE outbox, other;")
        .await?;
    let steps = setup::setup(&config).await?;
    assert!(
        steps
            .iter()
            .any(|s| matches!(s, Step::Warning(w) if w.contains("public.other"))),
        "{steps:?}"
    );
    let before = env.current_wal_lsn().await?;
    env.client
        .batch_execute("INSERT INTO other VALUES (1)")
        .await?;
    let after = env.current_wal_lsn().await?;
    config.relay.max_backoff = Duration::from_millis(100);
    let (_stop, stop_rx) = watch::channel(false);
    let err = tokio::time::timeout(WAIT, pipeline::run(config, stop_rx, None))
        .await?
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("public.other") && err.contains("not a configured outbox table"),
        "{err}"
    );
    // The INSERT's own position, not the Relation message's 0/0.
    let at: walrelay_pgoutput::Lsn = err
        .split("change to table public.other at ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .with_context(|| format!("no LSN in {err:?}"))?
        .parse()?;
    assert!(
        before <= at && at < after,
        "{before} <= {at} < {after}: {err}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_postgres_loss_and_ignores_outbox_deletes() -> Result<()> {
    let mut env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let config = env.config(&bootstrap);
    setup::setup(&config).await?;
    let mut relay = start_relay(config);

    // The delete-in-the-same-transaction pattern: one record. (An UPDATE
    // is bad input: tests/bad_input.rs.)
    env.client
        .batch_execute(
            "BEGIN;
             INSERT INTO outbox VALUES ('u-1', 'order', 'o-1', 'Created', '{\"v\": 1}', NULL);
             DELETE FROM outbox WHERE id = 'u-1';
             COMMIT;",
        )
        .await?;

    // The walsender is terminated: the session ends, the relay reconnects.
    env.client
        .batch_execute("SELECT walrelay.emit('events', 'a', '{\"n\": 1}'::jsonb)")
        .await?;
    let mut trace = Vec::new();
    let sessions = |trace: &mut Vec<Trace>, relay: &mut Running| {
        while let Ok(t) = relay.trace.try_recv() {
            trace.push(t);
        }
        trace
            .iter()
            .filter(|t| matches!(t, Trace::SessionStarted { .. }))
            .count()
    };
    await_condition(WAIT, Duration::from_millis(50), || {
        let started = sessions(&mut trace, &mut relay);
        async move { Ok(started >= 1) }
    })
    .await?;
    env.client
        .batch_execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'walrelay'")
        .await?;
    env.client
        .batch_execute("SELECT walrelay.emit('events', 'b', '{\"n\": 2}'::jsonb)")
        .await?;
    await_condition(WAIT, Duration::from_millis(50), || {
        let started = sessions(&mut trace, &mut relay);
        async move { Ok(started >= 2) }
    })
    .await?;

    // An immediate-mode restart (a crash) of PostgreSQL.
    let cluster = env.cluster;
    let cluster = tokio::task::spawn_blocking(move || -> Result<_> {
        cluster.stop_immediate()?;
        cluster.restart()?;
        Ok(cluster)
    })
    .await??;
    env.cluster = cluster;
    env.client = env.cluster.client().await?;
    env.client
        .batch_execute("SELECT walrelay.emit('events', 'c', '{\"n\": 3}'::jsonb)")
        .await?;
    let end = env.current_wal_lsn().await?;
    await_condition(WAIT, Duration::from_millis(100), || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= end)
    })
    .await?;
    let mut all = trace;
    all.extend(relay.stop().await?);
    assert!(
        all.iter()
            .filter(|t| matches!(t, Trace::SessionStarted { .. }))
            .count()
            >= 3
    );
    check_confirmations_follow_acks(&all)?;

    let records = read_until_quiet(
        &bootstrap,
        &["events", "outbox.event.order"],
        Duration::from_secs(1),
        WAIT,
    )
    .await?;
    let (fresh, _duplicates) = apply_high_water_marks(&records)?;
    assert_eq!(
        fresh.values().map(Vec::len).sum::<usize>(),
        4,
        "{records:?}"
    );
    let order: Vec<_> = records
        .iter()
        .filter(|r| r.topic == "outbox.event.order")
        .collect();
    assert!(
        order.iter().all(|r| r.value_str() == Some("{\"v\": 1}")),
        "only the INSERT is published, not the DELETE"
    );
    Ok(())
}

/// `pg_ctl restart -m fast` while the relay streams a backlog: the
/// walsender ends the copy (CommandComplete "COPY 0") and exits. That is
/// PostgreSQL going away cleanly, not a protocol violation: the relay
/// reconnects with backoff and every event arrives exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_postgres_restart_mid_stream_reconnects_and_loses_nothing() -> Result<()> {
    restart_mid_stream(ShutdownMode::Fast).await
}

/// `pg_ctl stop -m smart` while the relay streams: PostgreSQL refuses new
/// connections and waits for every session to end by itself. Neither the
/// replication connection nor the publication check's connection may
/// keep it waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smart_shutdown_mid_stream_is_not_held_by_the_relay() -> Result<()> {
    restart_mid_stream(ShutdownMode::Smart).await
}

#[derive(Debug, Clone, Copy)]
enum ShutdownMode {
    Fast,
    Smart,
}

impl ShutdownMode {
    fn flag(self) -> &'static str {
        match self {
            ShutdownMode::Fast => "fast",
            ShutdownMode::Smart => "smart",
        }
    }
}

async fn restart_mid_stream(mode: ShutdownMode) -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let config = env.config(&bootstrap);
    setup::setup(&config).await?;
    let start = env.confirmed_flush_lsn("walrelay").await?;
    let (batches, per_batch) = (40, 500);
    for b in 0..batches {
        env.client
            .batch_execute(&format!(
                "SELECT count(walrelay.emit('events', 'k-' || (g % 7), jsonb_build_object('b', {b}, 'g', g))) FROM generate_series(1, {per_batch}) g"
            ))
            .await?;
    }
    let mut relay = start_relay(config);
    // Restart once the relay confirmed part of the backlog: it is streaming.
    await_condition(WAIT, Duration::from_millis(5), || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? > start)
    })
    .await?;
    // An event just before the stop: the relay has it acknowledged by
    // Kafka but not yet vouched for by a publication check, so it cannot
    // confirm it, and a stopping walsender waits for its client to confirm
    // everything it sent. The relay must end its session instead of
    // holding the shutdown (pg_ctl gives up after 60 s).
    env.client
        .batch_execute("SELECT walrelay.emit('events', 'before', '{\"before\": true}'::jsonb)")
        .await?;
    // This test's own session would hold a smart shutdown: it ends first.
    let Env {
        cluster,
        client,
        broker,
    } = env;
    drop(client);
    let cluster = tokio::task::spawn_blocking(move || -> Result<_> {
        match mode {
            ShutdownMode::Fast => cluster.stop_fast(),
            ShutdownMode::Smart => cluster.stop_smart(),
        }
        .with_context(|| {
            format!(
                "pg_ctl stop -m {} while the relay streams (did the relay hold the shutdown?)",
                mode.flag()
            )
        })?;
        cluster.start_stopped()?;
        Ok(cluster)
    })
    .await??;
    let client = cluster.client().await?;
    let env = Env {
        cluster,
        client,
        broker,
    };
    env.client
        .batch_execute("SELECT walrelay.emit('events', 'after', '{\"after\": true}'::jsonb)")
        .await?;
    let end = env.current_wal_lsn().await?;
    await_condition(WAIT, Duration::from_millis(100), || async {
        anyhow::ensure!(
            !relay.task.is_finished(),
            "the relay stopped after a clean PostgreSQL restart"
        );
        Ok(env.confirmed_flush_lsn("walrelay").await? >= end)
    })
    .await
    .map_err(|e| e.context(format!("relay task finished: {}", relay.task.is_finished())))?;
    let mut all = Vec::new();
    while let Ok(t) = relay.trace.try_recv() {
        all.push(t);
    }
    all.extend(relay.stop().await?);
    let ended: Vec<_> = all
        .iter()
        .filter_map(|t| match t {
            Trace::SessionEnded { error: Some(e) } => Some(e.clone()),
            _ => None,
        })
        .collect();
    assert!(
        ended
            .iter()
            .any(|e| e.contains("ended the replication stream")
                || e.contains("PostgreSQL is shutting down or restarting")
                || e.contains("57P01")
                || e.contains("closed the connection")),
        "the restart ended a session: {ended:?}"
    );
    println!("sessions ended by the {} restart: {ended:?}", mode.flag());
    check_confirmations_follow_acks(&all)?;

    let records = read_until_quiet(&bootstrap, &["events"], Duration::from_secs(1), WAIT).await?;
    let (fresh, _duplicates) = apply_high_water_marks(&records)?;
    assert_eq!(
        fresh.values().map(Vec::len).sum::<usize>(),
        batches * per_batch + 2,
        "every event exactly once after high-water-mark dedup"
    );
    Ok(())
}
