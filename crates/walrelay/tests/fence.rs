//! The tail fence against a real PostgreSQL and a real broker (Tansu, or
//! Apache Kafka with WALRELAY_BROKER=kafka): a replay after
//! `kill -9` writes nothing twice, other sources' records and empty
//! partitions are handled, a changed layout (partitions added, a route
//! moved) never skips an event that is not in Kafka, and with the fence
//! off the duplicates come back.

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use futures_util::SinkExt;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use support::{key_of, spawn_relay, Env, WAIT};
use walrelay::config::KeylessPlacement;
use walrelay::engine::key::EventKey;
use walrelay::engine::partition::partition_for_keyless;
use walrelay_testkit::{
    await_condition, read_topics, read_until_quiet, relay_headers, ConsumedRecord, TestBroker,
};

const OUTBOX_TOPIC: &str = "outbox.event.order";

/// The outbox table, a raw route, logs at INFO (the fence's lines).
fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "--outbox-table",
        "public.outbox",
        "--route",
        "orders=orders",
        "--log",
        "info",
    ];
    a.extend_from_slice(extra);
    a
}

/// Status updates so rare that a relay confirms nothing before it is
/// killed: everything it wrote is replayed by the next one.
const NEVER_CONFIRM: &[&str] = &["--status-interval", "30s"];

/// The event's identity, which every workload here puts in the value as
/// `{"id": ...}`.
fn event_id(r: &ConsumedRecord) -> String {
    let value: serde_json::Value =
        serde_json::from_slice(r.value.as_deref().unwrap_or_default()).unwrap_or_default();
    value["id"].as_str().unwrap_or_default().to_owned()
}

/// `n` transactions, each with 5 raw `orders` messages and 2 outbox rows,
/// ids `<tag>-<tx>-<i>`. Returns the ids.
async fn write_transactions(env: &Env, tag: &str, n: usize) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for t in 0..n {
        env.client
            .batch_execute(&format!(
                "BEGIN;
                 SELECT pg_logical_emit_message(true, 'orders', jsonb_build_object('id', '{tag}-{t}-m' || g)::text) FROM generate_series(1, 5) g;
                 INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
                   SELECT '{tag}-{t}-o' || g, 'order', 'order-' || g, 'Created', jsonb_build_object('id', '{tag}-{t}-o' || g) FROM generate_series(1, 2) g;
                 COMMIT;"
            ))
            .await?;
        ids.extend((1..=5).map(|g| format!("{tag}-{t}-m{g}")));
        ids.extend((1..=2).map(|g| format!("{tag}-{t}-o{g}")));
    }
    Ok(ids)
}

fn kill_9(relay: &mut Child) -> Result<()> {
    relay.kill()?;
    relay.wait()?;
    Ok(())
}

/// SIGTERM, and the clean exit that follows.
fn stop(relay: &mut Child, log: &Path) -> Result<()> {
    ensure!(Command::new("kill")
        .args(["-TERM", &relay.id().to_string()])
        .status()?
        .success());
    let exit = relay.wait()?;
    ensure!(
        exit.success(),
        "graceful stop exits 0, got {exit:?}: {}",
        std::fs::read_to_string(log)?
    );
    Ok(())
}

/// Starts a relay and waits until the slot confirmed the current WAL
/// position (everything committed so far is in Kafka), then stops it.
async fn relay_to_the_end(env: &Env, bootstrap: &str, log: &Path, extra: &[&str]) -> Result<()> {
    relay_slot_to_the_end(env, bootstrap, log, extra, "walrelay").await
}

async fn relay_slot_to_the_end(
    env: &Env,
    bootstrap: &str,
    log: &Path,
    extra: &[&str],
    slot: &str,
) -> Result<()> {
    let end = env.current_wal_lsn().await?;
    let mut relay = spawn_relay(env, bootstrap, log, &args(extra))?;
    await_condition(WAIT, Duration::from_millis(50), || async {
        Ok(env.confirmed_flush_lsn(slot).await? >= end)
    })
    .await
    .with_context(|| std::fs::read_to_string(log).unwrap_or_default())?;
    stop(&mut relay, log)
}

/// Starts a relay that confirms nothing, waits until Kafka holds
/// `expect` records of `topics`, and kills it with `kill -9`.
async fn write_unconfirmed_and_kill(
    env: &Env,
    bootstrap: &str,
    log: &Path,
    topics: &[&str],
    expect: usize,
    extra: &[&str],
) -> Result<()> {
    let confirmed = env.confirmed_flush_lsn("walrelay").await?;
    let mut all = NEVER_CONFIRM.to_vec();
    all.extend_from_slice(extra);
    let mut relay = spawn_relay(env, bootstrap, log, &args(&all))?;
    let records = read_topics(bootstrap, topics, expect, WAIT).await?;
    kill_9(&mut relay)?;
    ensure!(
        records.len() == expect,
        "expected {expect} records before the kill, read {}: {}",
        records.len(),
        std::fs::read_to_string(log)?
    );
    ensure!(
        env.confirmed_flush_lsn("walrelay").await? == confirmed,
        "the killed relay confirmed something: the replay would not cover its records"
    );
    Ok(())
}

/// Per (source, key) of walrelay's records (those with a
/// `walrelay-source`): how many times it is in Kafka.
fn count_keys(records: &[ConsumedRecord]) -> BTreeMap<(String, EventKey), usize> {
    let mut counts: BTreeMap<(String, EventKey), usize> = BTreeMap::new();
    for r in records {
        if let Some(source) = r.header_str("walrelay-source") {
            *counts.entry((source.to_owned(), key_of(r))).or_default() += 1;
        }
    }
    counts
}

/// [`count_keys`], after checking that each partition's keys of each
/// source strictly increase in offset order (no duplicate, nothing out of
/// order).
fn check_wire(records: &[ConsumedRecord]) -> Result<BTreeMap<(String, EventKey), usize>> {
    let mut last: HashMap<(String, i32, String), (i64, EventKey)> = HashMap::new();
    let mut ordered: Vec<&ConsumedRecord> = records.iter().collect();
    ordered
        .sort_by(|a, b| (&a.topic, a.partition, a.offset).cmp(&(&b.topic, b.partition, b.offset)));
    for r in ordered {
        let Some(source) = r.header_str("walrelay-source") else {
            continue;
        };
        let key = key_of(r);
        let slot = (r.topic.clone(), r.partition, source.to_owned());
        if let Some((offset, prev)) = last.get(&slot) {
            ensure!(
                key > *prev,
                "{}/{} offset {}: key {key} of {source} does not follow {prev} (offset {offset})",
                r.topic,
                r.partition,
                r.offset
            );
        }
        last.insert(slot, (r.offset, key));
    }
    Ok(count_keys(records))
}

/// Every id exactly once among `records` (of one source).
fn check_each_once(records: &[&ConsumedRecord], expected: &[String]) -> Result<()> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in records {
        *seen.entry(event_id(r)).or_default() += 1;
    }
    let missing: Vec<_> = expected
        .iter()
        .filter(|id| !seen.contains_key(*id))
        .collect();
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    ensure!(
        missing.is_empty() && twice.is_empty(),
        "missing {} (e.g. {:?}), more than once {} (e.g. {:?})",
        missing.len(),
        missing.iter().take(5).collect::<Vec<_>>(),
        twice.len(),
        twice.iter().take(5).collect::<Vec<_>>()
    );
    ensure!(
        seen.len() == expected.len(),
        "{} events in Kafka, {} committed",
        seen.len(),
        expected.len()
    );
    Ok(())
}

fn producer(bootstrap: &str) -> Result<FutureProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .create()?)
}

/// Writes a record of another source (its own key and layout headers,
/// a key far above walrelay's) to `partition`.
async fn write_foreign(p: &FutureProducer, topic: &str, partition: i32) -> Result<()> {
    let key = EventKey(u128::MAX - u128::from(partition.unsigned_abs())).to_hex();
    let headers = relay_headers(&key, "another-database", None);
    p.send(
        FutureRecord::<(), str>::to(topic)
            .partition(partition)
            .payload(r#"{"id":"foreign"}"#)
            .headers(headers),
        Duration::from_secs(10),
    )
    .await
    .map_err(|(e, _)| e)?;
    Ok(())
}

fn log_text(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_after_kill_9_writes_nothing_twice_past_other_sources_and_empty_partitions(
) -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    // Keyless messages go to one partition per transaction: with three
    // transactions, most of the eight partitions stay empty.
    env.broker.as_ref().unwrap().create_topic("orders", 8)?;
    env.create_topics(&[OUTBOX_TOPIC])?;
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    let topics = ["orders", OUTBOX_TOPIC];

    let mut ids = write_transactions(&env, "a", 3).await?;
    write_unconfirmed_and_kill(&env, &bootstrap, &log, &topics, ids.len(), &[]).await?;
    // Another source writes last to every partition walrelay wrote to.
    let before = read_until_quiet(&bootstrap, &topics, Duration::from_secs(1), WAIT).await?;
    let used: HashSet<i32> = before
        .iter()
        .filter(|r| r.topic == "orders")
        .map(|r| r.partition)
        .collect();
    let p = producer(&bootstrap)?;
    for &partition in &used {
        write_foreign(&p, "orders", partition).await?;
    }

    ids.extend(write_transactions(&env, "b", 2).await?);
    relay_to_the_end(&env, &bootstrap, &log, &[]).await?;

    let records = read_until_quiet(&bootstrap, &topics, Duration::from_secs(1), WAIT).await?;
    let counts = check_wire(&records)?;
    let ours: Vec<&ConsumedRecord> = records
        .iter()
        .filter(|r| r.header_str("walrelay-source") != Some("another-database"))
        .collect();
    check_each_once(&ours, &ids)?;
    ensure!(
        counts.values().all(|n| *n == 1),
        "a key twice on the wire: {:?}",
        counts
            .iter()
            .filter(|(_, n)| **n > 1)
            .take(5)
            .collect::<Vec<_>>()
    );
    ensure!(
        records.len() == ids.len() + used.len(),
        "{} records for {} events and {} foreign records",
        records.len(),
        ids.len(),
        used.len()
    );
    let text = log_text(&log);
    ensure!(
        text.contains("fence_key=") && text.contains("nothing to skip"),
        "the fence logs its key per partition, and the empty ones: {text}"
    );
    ensure!(
        text.contains("the replay caught up with the partition"),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_fence_off_a_replay_writes_its_duplicates_again() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    env.create_topics(&["orders", OUTBOX_TOPIC])?;
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    let config = dir.path().join("walrelay.toml");
    std::fs::write(&config, "[relay]\nfence = false\n")?;
    let config = config.to_str().unwrap();
    let topics = ["orders", OUTBOX_TOPIC];

    let ids = write_transactions(&env, "a", 3).await?;
    write_unconfirmed_and_kill(&env, &bootstrap, &log, &topics, ids.len(), &["-c", config]).await?;
    relay_to_the_end(&env, &bootstrap, &log, &["-c", config]).await?;

    let records = read_until_quiet(&bootstrap, &topics, Duration::from_secs(1), WAIT).await?;
    let counts = count_keys(&records);
    ensure!(
        counts.len() == ids.len() && counts.values().all(|n| *n == 2),
        "every event twice without the fence: {} keys, {} records",
        counts.len(),
        records.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sources_in_one_topic_each_fence_on_their_own_keys() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    env.create_topics(&["orders", OUTBOX_TOPIC])?;
    let mut b_config = env.config(&bootstrap);
    b_config.postgres.slot = "other".into();
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    walrelay::commands::setup::setup(&b_config).await?;
    let dir = tempfile::tempdir()?;
    let (log_a, log_b) = (dir.path().join("a.log"), dir.path().join("b.log"));
    let topics = ["orders", OUTBOX_TOPIC];
    let a = ["--source-id", "source-a"];
    let b = ["--source-id", "source-b", "--slot", "other"];

    // Both relay the same events into the same topics, unconfirmed, and
    // are killed; each then replays everything.
    let mut ids = write_transactions(&env, "a", 3).await?;
    let (start_a, start_b) = (
        env.confirmed_flush_lsn("walrelay").await?,
        env.confirmed_flush_lsn("other").await?,
    );
    let mut relays = Vec::new();
    for (extra, log) in [(&a[..], &log_a), (&b[..], &log_b)] {
        let mut all = NEVER_CONFIRM.to_vec();
        all.extend_from_slice(extra);
        relays.push(spawn_relay(&env, &bootstrap, log, &args(&all))?);
    }
    let before = read_topics(&bootstrap, &topics, 2 * ids.len(), WAIT).await?;
    for r in &mut relays {
        kill_9(r)?;
    }
    ensure!(
        before.len() == 2 * ids.len(),
        "{}",
        log_text(&log_a) + &log_text(&log_b)
    );
    ensure!(env.confirmed_flush_lsn("walrelay").await? == start_a);
    ensure!(env.confirmed_flush_lsn("other").await? == start_b);

    ids.extend(write_transactions(&env, "b", 2).await?);
    relay_slot_to_the_end(&env, &bootstrap, &log_a, &a, "walrelay").await?;
    relay_slot_to_the_end(&env, &bootstrap, &log_b, &b, "other").await?;

    let records = read_until_quiet(&bootstrap, &topics, Duration::from_secs(1), WAIT).await?;
    let counts = check_wire(&records)?;
    ensure!(counts.values().all(|n| *n == 1), "a key twice on the wire");
    for source in ["source-a", "source-b"] {
        let of: Vec<&ConsumedRecord> = records
            .iter()
            .filter(|r| r.header_str("walrelay-source") == Some(source))
            .collect();
        check_each_once(&of, &ids).with_context(|| source.to_owned())?;
    }
    Ok(())
}

/// Tansu cannot add partitions, so the topic is recreated with six and
/// the records copied back where they were, headers and all: what the
/// fence sees after `kafka-topics --alter --partitions 6`. The records
/// that were in flight at the crash are the last ones of the fullest
/// partition: they are left out, so the replay must write them.
async fn recreate_with_six_partitions(
    broker: &TestBroker,
    bootstrap: &str,
    written: &[ConsumedRecord],
) -> Result<()> {
    let mut by_partition: BTreeMap<i32, Vec<&ConsumedRecord>> = BTreeMap::new();
    for r in written {
        by_partition.entry(r.partition).or_default().push(r);
    }
    let (&fullest, _) = by_partition
        .iter()
        .max_by_key(|(_, rs)| rs.len())
        .context("records")?;
    let lost_in_flight: Vec<String> = by_partition[&fullest]
        .iter()
        .rev()
        .take(2)
        .map(|r| event_id(r))
        .collect();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    for result in admin
        .delete_topics(&["orders"], &AdminOptions::new())
        .await?
    {
        if let Err((topic, code)) = result {
            bail!("deleting {topic}: {code}");
        }
    }
    broker.create_topic("orders", 6)?;
    let p = producer(bootstrap)?;
    for (partition, rs) in &by_partition {
        for r in rs {
            if *partition == fullest && lost_in_flight.contains(&event_id(r)) {
                continue;
            }
            let mut headers = OwnedHeaders::new();
            for (k, v) in &r.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v),
                });
            }
            p.send(
                FutureRecord::<(), [u8]>::to("orders")
                    .partition(*partition)
                    .payload(r.value.as_deref().unwrap_or_default())
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_whose_partitions_grew_is_not_fenced_and_loses_nothing() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let broker = env.broker.as_ref().unwrap();
    broker.create_topic("orders", 4)?;
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");

    // Six transactions of raw messages only.
    let mut ids = Vec::new();
    for t in 0..6 {
        env.client
            .batch_execute(&format!(
                "SELECT pg_logical_emit_message(true, 'orders', jsonb_build_object('id', 'a-{t}-m' || g)::text) FROM generate_series(1, 5) g"
            ))
            .await?;
        ids.extend((1..=5).map(|g| format!("a-{t}-m{g}")));
    }
    write_unconfirmed_and_kill(&env, &bootstrap, &log, &["orders"], ids.len(), &[]).await?;
    let written = read_until_quiet(&bootstrap, &["orders"], Duration::from_secs(1), WAIT).await?;

    let fenced_by_status = || -> Result<(bool, String)> {
        let global = [
            "--bootstrap-servers",
            bootstrap.as_str(),
            "--outbox-table",
            "public.outbox",
            "--route",
            "orders=orders",
        ];
        let (_, json) =
            support::walrelay_status(&env, &global, &["--kafka", "--topic", "orders", "--json"])?;
        let v: serde_json::Value = serde_json::from_str(&json).context(json.clone())?;
        // The source record: `setup` wrote it, and the killed relay may
        // have recorded an acknowledged event before the kill.
        let record = &v["source_record"];
        ensure!(
            record["topic"] == "walrelay.sources"
                && record["problem"].is_null()
                && (record["state"] == "no_event_yet"
                    || (record["state"] == "recorded"
                        && record["key"].as_str().is_some_and(|k| k.len() == 32))),
            "status --kafka reports the source record: {json}"
        );
        let t = &v["kafka"]["topics"][0];
        Ok((
            t["fenced"] == true,
            t["unfenced_because"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ))
    };
    let (fenced, why) = fenced_by_status()?;
    ensure!(
        fenced,
        "status --kafka: fenced before the change, got {why}"
    );

    if broker.can_add_partitions() {
        // Apache Kafka: what `kafka-topics --alter --partitions 6` does.
        broker.add_partitions("orders", 6)?;
    } else {
        recreate_with_six_partitions(broker, &bootstrap, &written).await?;
    }
    // `status --kafka` says what the next session will decide.
    let (fenced, why) = fenced_by_status()?;
    ensure!(
        !fenced && why.contains("had 4 partitions") && why.contains("has 6 now"),
        "status --kafka after the partitions grew: fenced {fenced}, {why}"
    );

    ids.extend(
        write_transactions(&env, "b", 1)
            .await?
            .into_iter()
            .filter(|id| id.contains("-m")),
    );
    relay_to_the_end(&env, &bootstrap, &log, &[]).await?;

    let records = read_until_quiet(&bootstrap, &["orders"], Duration::from_secs(1), WAIT).await?;
    let present: HashSet<String> = records.iter().map(event_id).collect();
    for id in &ids {
        ensure!(
            present.contains(id),
            "{id} is not in Kafka: {}",
            log_text(&log)
        );
    }
    let text = log_text(&log);
    ensure!(
        text.contains("tail fence off for this topic")
            && text.contains("had 4 partitions")
            && text.contains("has 6 now"),
        "a WARN names the topic and both counts: {text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_moved_to_another_topic_never_skips_an_event_missing_there() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");

    // First `first` goes to topic x, then `second` to topic y.
    for (prefix, id) in [("first", "e1"), ("second", "e2")] {
        env.client
            .batch_execute(&format!(
                "SELECT pg_logical_emit_message(true, '{prefix}', '{{\"id\": \"{id}\"}}')"
            ))
            .await?;
    }
    let before = ["--route", "first=x", "--route", "second=y"];
    write_unconfirmed_and_kill(&env, &bootstrap, &log, &["x", "y"], 2, &before).await?;

    // Now `first` goes to y too: e1 was never written to y, and y's tail
    // holds e2, a later key. The replay must write e1 to y.
    let after = ["--route", "first=y", "--route", "second=y"];
    relay_to_the_end(&env, &bootstrap, &log, &after).await?;
    let y = read_until_quiet(&bootstrap, &["y"], Duration::from_secs(1), WAIT).await?;
    let ids: Vec<String> = y.iter().map(event_id).collect();
    ensure!(
        ids.iter().any(|id| id == "e1"),
        "e1 is missing from y: {ids:?}\n{}",
        log_text(&log)
    );
    ensure!(
        log_text(&log).contains("another routing configuration"),
        "{}",
        log_text(&log)
    );
    Ok(())
}

/// One unit of the mixed workload: its ids (what committed), by kind.
async fn workload_unit(
    client: &tokio_postgres::Client,
    unit: usize,
    rng: &mut u64,
) -> Result<Vec<String>> {
    // xorshift: deterministic per seed, no dependency.
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let id = |i: usize| format!("u{unit}-{i}");
    Ok(match *rng % 10 {
        // One event.
        0..=3 => {
            client
                .batch_execute(&format!(
                    "SELECT pg_logical_emit_message(true, 'orders', '{{\"id\": \"{}\"}}')",
                    id(0)
                ))
                .await?;
            vec![id(0)]
        }
        // 10,000 events in one transaction.
        4 => {
            client
                .batch_execute(&format!(
                    "SELECT count(walrelay.emit('events', 'k-' || (g % 7), jsonb_build_object('id', 'u{unit}-' || g))) FROM generate_series(0, 9999) g"
                ))
                .await?;
            (0..10_000).map(id).collect()
        }
        // COPY into the outbox: rows that may share one LSN.
        5 | 6 => {
            let sink = client
                .copy_in("COPY outbox (id, aggregatetype, aggregateid, type, payload) FROM STDIN")
                .await?;
            let mut rows = String::new();
            for i in 0..500 {
                rows.push_str(&format!(
                    "{}\torder\torder-{}\tCreated\t{{\"id\": \"{}\"}}\n",
                    id(i),
                    i % 5,
                    id(i)
                ));
            }
            futures_util::pin_mut!(sink);
            sink.send(bytes::Bytes::from(rows)).await?;
            sink.finish().await?;
            (0..500).map(id).collect()
        }
        // Savepoints: what is rolled back to one is not an event.
        7 | 8 => {
            client
                .batch_execute(&format!(
                    "BEGIN;
                     SELECT pg_logical_emit_message(true, 'orders', '{{\"id\": \"{a}\"}}');
                     SAVEPOINT s;
                     SELECT pg_logical_emit_message(true, 'orders', '{{\"id\": \"{b}\"}}');
                     INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('{b}o', 'order', 'x', 'Created', '{{\"id\": \"{b}o\"}}');
                     ROLLBACK TO SAVEPOINT s;
                     INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('{c}', 'order', 'x', 'Created', '{{\"id\": \"{c}\"}}');
                     COMMIT;",
                    a = id(0),
                    b = id(1),
                    c = id(2)
                ))
                .await?;
            vec![id(0), id(2)]
        }
        // A non-transactional message.
        _ => {
            client
                .batch_execute(&format!(
                    "SELECT pg_logical_emit_message(false, 'orders', '{{\"id\": \"{}\"}}')",
                    id(0)
                ))
                .await?;
            vec![id(0)]
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_kill_9_during_a_mixed_workload_leave_every_event_exactly_once_on_the_wire(
) -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let topics = ["orders", "events", OUTBOX_TOPIC];
    env.create_topics(&topics)?;
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");

    // The workload runs on its own connection for the whole test.
    let client = env.cluster.client().await?;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let workload = tokio::spawn(async move {
        let mut ids: Vec<String> = Vec::new();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut unit = 0;
        while !*stop_rx.borrow_and_update() {
            ids.extend(workload_unit(&client, unit, &mut rng).await?);
            unit += 1;
        }
        anyhow::Ok(ids)
    });

    // kill -9 at pseudo-random moments, 200-1,200 ms after each start,
    // with status updates every 500 ms: most kills leave records in Kafka
    // that the slot has not confirmed, and the next session replays them.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let kills = 20;
    for _ in 0..kills {
        let mut relay = spawn_relay(
            &env,
            &bootstrap,
            &log,
            &args(&["--status-interval", "500ms"]),
        )?;
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(200 + seed % 1000)).await;
        kill_9(&mut relay)?;
    }
    stop_tx.send(true)?;
    let expected = workload.await??;
    relay_to_the_end(&env, &bootstrap, &log, &["--status-interval", "200ms"]).await?;

    let records = read_until_quiet(&bootstrap, &topics, Duration::from_secs(1), WAIT).await?;
    let counts = check_wire(&records)?;
    let twice = counts.values().filter(|n| **n > 1).count();
    let all: Vec<&ConsumedRecord> = records.iter().collect();
    check_each_once(&all, &expected)?;
    ensure!(twice == 0, "{twice} keys more than once on the wire");
    // Each line: a partition where a session's replay overlapped what
    // Kafka had.
    let text = log_text(&log);
    let caught_up = text
        .matches("the replay caught up with the partition")
        .count();
    println!(
        "{kills} kills: {} events, {} records, {caught_up} partition replays skipped records",
        expected.len(),
        records.len()
    );
    ensure!(
        caught_up >= 3,
        "only {caught_up} replays had anything to skip: the kills landed nowhere useful"
    );

    // `walrelay verify` agrees: no replayed duplicates, nothing out of
    // order, no gaps (the first record after each fence names the fence
    // key, which is in the partition, as its predecessor).
    verify_clean(&bootstrap, &topics, expected.len()).await
}

/// `walrelay verify` over `topics` finds `distinct` keys and no
/// duplicate, nothing out of order and no gap.
async fn verify_clean(bootstrap: &str, topics: &[&str], distinct: usize) -> Result<()> {
    let mut verify = Command::new(env!("CARGO_BIN_EXE_walrelay"));
    verify.args([
        "--bootstrap-servers",
        bootstrap,
        "verify",
        "--json",
        "--idle-timeout",
        "2s",
    ]);
    for t in topics {
        verify.args(["--topic", t]);
    }
    let out =
        tokio::task::spawn_blocking(move || verify.env("WALRELAY_LOG", "warn").output()).await??;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let totals = &doc["totals"];
    ensure!(
        out.status.code() == Some(0)
            && totals["duplicates"] == 0
            && totals["out_of_order"] == 0
            && totals["gaps"] == 0
            && totals["distinct"] == distinct,
        "walrelay verify: {doc:#}"
    );
    Ok(())
}

/// `relay.headers` switched between sessions, each time over a crash
/// whose replay the next session fences: both header sets carry what the
/// fence reads (key, source, layout, previous key), so every switch keeps
/// the fence, the topic holds records of both sets, each event once, and
/// `walrelay verify` reads it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_the_header_set_between_sessions_keeps_the_fence() -> Result<()> {
    let (env, bootstrap, dir) = switching_env().await?;
    let log = dir.path().join("relay.log");
    let topics = ["orders", OUTBOX_TOPIC];
    const FULL: &[&str] = &["--headers", "full"];

    // Full, killed; then the default (lean) fences its replay.
    let mut ids = write_transactions(&env, "full", 3).await?;
    write_unconfirmed_and_kill(&env, &bootstrap, &log, &topics, ids.len(), FULL).await?;
    let lean = write_transactions(&env, "lean", 3).await?;
    ids.extend(lean.iter().cloned());
    write_unconfirmed_and_kill(&env, &bootstrap, &log, &topics, ids.len(), &[]).await?;
    // Back to full over the lean session's crash.
    ids.extend(write_transactions(&env, "again", 2).await?);
    relay_to_the_end(&env, &bootstrap, &log, FULL).await?;

    let records = each_once_on_the_wire(
        &bootstrap,
        &topics,
        &ids,
        "a switch of the header set wrote a replay again",
    )
    .await?;
    for r in &records {
        let id = event_id(r);
        let full = [
            "walrelay-commit-lsn",
            "walrelay-lsn",
            "walrelay-xid",
            "walrelay-commit-time",
        ];
        let has: Vec<bool> = full.iter().map(|h| r.header(h).is_some()).collect();
        let want = !id.starts_with("lean-");
        ensure!(
            has.iter().all(|h| *h == want),
            "{id}: full-set headers {has:?}, expected all {want}"
        );
        for h in ["idempotency-key", "walrelay-source", "walrelay-layout"] {
            ensure!(r.header(h).is_some(), "{id}: no {h}");
        }
        // The previous key: 32 hex digits in the full set, HIGH/LOW in the
        // lean one (the first lean record's predecessor is a full one's).
        let (prev, other) = if want {
            ("walrelay-prev-key", "walrelay-prev")
        } else {
            ("walrelay-prev", "walrelay-prev-key")
        };
        ensure!(
            r.header(prev).is_some() && r.header(other).is_none(),
            "{id}: the previous key is not in {prev} alone"
        );
        if let Some(text) = r.header_str("walrelay-prev").filter(|t| !t.is_empty()) {
            EventKey::from_compact(text)?;
        }
    }
    let text = log_text(&log);
    ensure!(
        !text.contains("tail fence off"),
        "a switch of the header set unfenced a topic: {text}"
    );
    ensure!(
        text.matches("the replay caught up with the partition")
            .count()
            >= 2,
        "both replays skipped what Kafka had: {text}"
    );
    verify_clean(&bootstrap, &topics, ids.len()).await
}

/// A source whose relay sessions the switching tests crash: the `orders`
/// and outbox topics created, the source record set up, and a folder for
/// the sessions' log.
async fn switching_env() -> Result<(Env, String, tempfile::TempDir)> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    env.create_topics(&["orders", OUTBOX_TOPIC])?;
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    Ok((env, bootstrap, tempfile::tempdir()?))
}

/// Reads `topics` whole and checks that each of `ids` is on the wire
/// exactly once and nothing else is (`replayed`: what a second copy means).
async fn each_once_on_the_wire(
    bootstrap: &str,
    topics: &[&str],
    ids: &[String],
    replayed: &str,
) -> Result<Vec<ConsumedRecord>> {
    let records = read_until_quiet(bootstrap, topics, Duration::from_secs(1), WAIT).await?;
    let counts = check_wire(&records)?;
    let all: Vec<&ConsumedRecord> = records.iter().collect();
    check_each_once(&all, ids)?;
    ensure!(
        counts.values().all(|n| *n == 1) && records.len() == ids.len(),
        "{} records for {} events: {replayed}",
        records.len(),
        ids.len()
    );
    Ok(records)
}

/// `relay.keyless_placement` switched between sessions over crashes: a
/// session whose replay holds records placed by the earlier rule keeps
/// that rule (each replayed record lands where its first copy is, so the
/// fence skips it), and the first session with nothing of it to replay
/// switches. Each keyless record sits where its layout's rule puts it,
/// each event once, and `walrelay verify` reads the topics whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_the_keyless_placement_between_sessions_keeps_every_replay_where_it_was(
) -> Result<()> {
    let (env, bootstrap, dir) = switching_env().await?;
    let log = dir.path().join("relay.log");
    let topics = ["orders", OUTBOX_TOPIC];
    const COMMIT: &[&str] = &["--keyless-placement", "commit"];

    // By commit, killed; the default (wal-range) replays it by commit,
    // killed too; then to the end, still by commit (its replay starts
    // where the first one did).
    let mut ids = write_transactions(&env, "commit", 3).await?;
    write_unconfirmed_and_kill(&env, &bootstrap, &log, &topics, ids.len(), COMMIT).await?;
    ids.extend(write_transactions(&env, "kept", 3).await?);
    write_unconfirmed_and_kill(&env, &bootstrap, &log, &topics, ids.len(), &[]).await?;
    relay_to_the_end(&env, &bootstrap, &log, &[]).await?;
    let deferred = log_text(&log);
    // Nothing placed by commit is replayed any more: wal-range from here.
    ids.extend(write_transactions(&env, "ranges", 3).await?);
    relay_to_the_end(&env, &bootstrap, &log, &[]).await?;

    let records = each_once_on_the_wire(
        &bootstrap,
        &topics,
        &ids,
        "a replay went to another partition",
    )
    .await?;
    let partitions = u32::try_from(support::PARTITIONS)?;
    let mut keyless = [0usize; 2];
    for r in &records {
        let id = event_id(r);
        let layout = r.header_str("walrelay-layout").unwrap_or_default();
        let by_ranges = layout.ends_with("/wal20");
        ensure!(
            by_ranges == id.starts_with("ranges-"),
            "{id}: layout {layout}, placed by the wrong rule"
        );
        if r.key.is_none() {
            let rule = if by_ranges {
                KeylessPlacement::WalRange
            } else {
                KeylessPlacement::Commit
            };
            keyless[usize::from(by_ranges)] += 1;
            let expected = partition_for_keyless(key_of(r), partitions, rule);
            ensure!(
                u32::try_from(r.partition)? == expected,
                "{id}: in partition {}, its layout {layout} places it in {expected}",
                r.partition
            );
        }
    }
    ensure!(
        keyless == [30, 15],
        "keyless records by commit and by range: {keyless:?}"
    );
    ensure!(
        deferred.matches("stay placed by the rule").count() >= 2,
        "the sessions replaying records placed by commit did not keep it: {deferred}"
    );
    let text = log_text(&log);
    ensure!(
        text.contains("placed by relay.keyless_placement from this session on"),
        "the last session did not switch: {text}"
    );
    ensure!(
        !text.contains("tail fence off"),
        "a switch of the keyless placement unfenced a topic: {text}"
    );
    verify_clean(&bootstrap, &topics, ids.len()).await
}

/// Every header of `r`, as a copy of it carries them.
fn headers_of(r: &ConsumedRecord) -> OwnedHeaders {
    r.headers
        .iter()
        .fold(OwnedHeaders::new(), |headers, (k, v)| {
            headers.insert(Header {
                key: k,
                value: Some(v.as_slice()),
            })
        })
}

/// Copies `r` (value and every header, as a re-drive or a mirror would)
/// into `partition` of `topic` on `bootstrap`; returns its offset.
async fn copy_record(
    bootstrap: &str,
    r: &ConsumedRecord,
    topic: &str,
    partition: i32,
) -> Result<i64> {
    let headers = headers_of(r);
    let delivery = producer(bootstrap)?
        .send(
            FutureRecord::<(), [u8]>::to(topic)
                .partition(partition)
                .payload(r.value.as_deref().unwrap_or_default())
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;
    Ok(delivery.offset)
}

/// A second broker (a Tansu of its own: the shared Kafka node is leased
/// to one test at a time) for a mirror, topic `orders` with `partitions`
/// partitions on both, and two slots: `walrelay` for the relay, `other`
/// for a second relay of the same WAL into the mirror.
async fn with_a_mirror(env: &Env, partitions: i32) -> Result<walrelay_testkit::TestBroker> {
    let bootstrap = env.bootstrap();
    let mirror = tokio::task::spawn_blocking(|| {
        walrelay_testkit::TestBroker::start_kind(walrelay_testkit::BrokerKind::Tansu)
    })
    .await??;
    for broker in [env.broker(), &mirror] {
        broker.create_topic("orders", partitions)?;
    }
    let mut other = env.config(&bootstrap);
    other.postgres.slot = "other".into();
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    walrelay::commands::setup::setup(&other).await?;
    Ok(mirror)
}

/// Records of this source copied to a partition's tail (a re-drive, a
/// mirror, a forwarded record) carry its headers and a key far above the
/// partition's own: trusted as fence keys, they would make the replay skip
/// every event of the partition below them. Here the copies come from a
/// second relay of the same WAL under the same source id into another
/// cluster (a mirror), which relayed further: one was routed to another
/// partition, the other to the same partition number but follows records
/// the first cluster never had. Neither may fence, and every event ends up
/// in Kafka once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_record_at_a_partition_tail_never_makes_the_replay_skip() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let mirror = with_a_mirror(&env, 3).await?;
    let mirror_bootstrap = mirror.bootstrap_servers();
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    // By commit, so that a few transactions reach every partition (by
    // ranges of WAL they would all share one).
    let main = ["--source-id", "one-source", "--keyless-placement", "commit"];
    let copier = [
        "--source-id",
        "one-source",
        "--slot",
        "other",
        "--keyless-placement",
        "commit",
    ];

    let mut ids = write_transactions(&env, "a", 3).await?;
    relay_slot_to_the_end(&env, &bootstrap, &log, &main, "walrelay").await?;
    ids.extend(write_transactions(&env, "b", 6).await?);
    relay_slot_to_the_end(&env, &mirror_bootstrap, &log, &copier, "other").await?;

    // The mirror's highest key overall (partition x) goes to partition
    // x + 1 of the relay's cluster; the mirror's highest key of partition
    // x + 2 goes to the same partition there.
    let mirrored =
        read_until_quiet(&mirror_bootstrap, &["orders"], Duration::from_secs(1), WAIT).await?;
    let top = |p: Option<i32>| {
        mirrored
            .iter()
            .filter(|r| p.is_none_or(|p| r.partition == p))
            .max_by_key(|r| key_of(r))
            .cloned()
            .context("mirrored records")
    };
    let highest = top(None)?;
    let (x, y, z) = (
        highest.partition,
        (highest.partition + 1) % 3,
        (highest.partition + 2) % 3,
    );
    let same_number = top(Some(z))?;
    let copies = [
        (y, copy_record(&bootstrap, &highest, "orders", y).await?),
        (z, copy_record(&bootstrap, &same_number, "orders", z).await?),
    ];

    relay_slot_to_the_end(&env, &bootstrap, &log, &main, "walrelay").await?;
    let records = read_until_quiet(
        &bootstrap,
        &["orders", OUTBOX_TOPIC],
        Duration::from_secs(1),
        WAIT,
    )
    .await?;
    let ours: Vec<&ConsumedRecord> = records
        .iter()
        .filter(|r| !copies.contains(&(r.partition, r.offset)) || r.topic != "orders")
        .collect();
    check_each_once(&ours, &ids)?;
    let text = log_text(&log);
    ensure!(
        text.contains(&format!("was routed to partition {x}: a copy"))
            && text.contains("which is not in the partition before it"),
        "both copies are named: {text}"
    );
    Ok(())
}

/// An aborted transactional copy of records of this source (the same
/// partition, a continuous chain of previous keys: everything else about
/// it would be trusted) must never become a fence key, even when the
/// user's Kafka properties ask for `read_uncommitted`: the fence reader
/// pins `read_committed`. Needs transaction isolation, so Apache Kafka.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_transactional_copy_never_becomes_a_fence_key() -> Result<()> {
    let env = Env::start_on(walrelay_testkit::BrokerKind::Kafka).await?;
    let bootstrap = env.bootstrap();
    let mirror = with_a_mirror(&env, 1).await?;
    let mirror_bootstrap = mirror.bootstrap_servers();
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    let main = [
        "--source-id",
        "one-source",
        "--kafka-property",
        "isolation.level=read_uncommitted",
    ];
    let copier = ["--source-id", "one-source", "--slot", "other"];

    let mut ids = write_transactions(&env, "a", 2).await?;
    relay_slot_to_the_end(&env, &bootstrap, &log, &main, "walrelay").await?;
    ids.extend(write_transactions(&env, "b", 3).await?);
    relay_slot_to_the_end(&env, &mirror_bootstrap, &log, &copier, "other").await?;

    // The mirror's records of "b" continue the relay's chain exactly;
    // written to the relay's partition in a transaction that aborts.
    let relayed = read_until_quiet(&bootstrap, &["orders"], Duration::from_secs(1), WAIT).await?;
    let last = relayed.iter().map(key_of).max().context("relayed")?;
    let mut mirrored =
        read_until_quiet(&mirror_bootstrap, &["orders"], Duration::from_secs(1), WAIT).await?;
    mirrored.retain(|r| key_of(r) > last);
    mirrored.sort_by_key(|r| r.offset);
    ensure!(!mirrored.is_empty());
    ensure!(
        mirrored[0].header_str("walrelay-prev") == Some(last.to_compact().as_str()),
        "the copies continue the partition's chain"
    );
    let transactional: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("transactional.id", "walrelay-test-copier")
        .create()?;
    let timeout = Duration::from_secs(30);
    transactional.init_transactions(timeout)?;
    transactional.begin_transaction()?;
    for r in &mirrored {
        let headers = headers_of(r);
        transactional
            .send(
                rdkafka::producer::BaseRecord::<(), [u8]>::to("orders")
                    .partition(0)
                    .payload(r.value.as_deref().unwrap_or_default())
                    .headers(headers),
            )
            .map_err(|(e, _)| e)?;
    }
    transactional.flush(timeout)?;
    transactional.abort_transaction(timeout)?;

    relay_slot_to_the_end(&env, &bootstrap, &log, &main, "walrelay").await?;
    // Read committed: the aborted copies are not there for any reader.
    let records = read_until_quiet(
        &bootstrap,
        &["orders", OUTBOX_TOPIC],
        Duration::from_secs(1),
        WAIT,
    )
    .await?;
    let ours: Vec<&ConsumedRecord> = records.iter().collect();
    check_each_once(&ours, &ids)
}
