//! The cut-over from Debezium's Outbox Event Router to walrelay on the same
//! outbox table (issue 24), as docs/operations.md ("Moving from Debezium's
//! Outbox Event Router") tells an operator to do it, with outbox rows
//! committed all along:
//!
//! 1. Debezium (tuned variant of `bench/debezium/`, its own slot and
//!    publication) relays the outbox; two writers commit rows.
//! 2. `walrelay setup` with no `[[outbox]]`: walrelay's publication
//!    without tables and walrelay's slot. Rows keep coming, and Debezium
//!    keeps relaying them; walrelay's slot sees them but will not publish
//!    them.
//! 3. One switch transaction, under `LOCK TABLE outbox IN EXCLUSIVE
//!    MODE`: a marker row, then the outbox table leaves Debezium's
//!    publication and joins walrelay's. PostgreSQL decides, per
//!    transaction, by the switch's place in the WAL which relay gets it.
//! 4. Once Debezium's marker record is in Kafka, Debezium is stopped
//!    (SIGTERM) and walrelay starts. Rows keep coming all along; those
//!    after the switch wait in walrelay's slot until it runs.
//! 5. And back: outbox writes held by the lock until walrelay has
//!    confirmed past them, walrelay stopped, the table back in Debezium's
//!    publication, Debezium started again on its own offsets.
//!
//! Then every record of the outbox topics is read back: each committed
//! row exactly once; each writer's rows all Debezium's, then all
//! walrelay's, then all Debezium's again, never a transaction split; the
//! marker once, from Debezium; in every partition the relays' records in
//! that order and an aggregate on one partition; walrelay's records in
//! the same topic with the same key, `id` and `type` headers and value as
//! Debezium's, plus walrelay's increasing idempotency keys.
//!
//! Apache Kafka only (`WALRELAY_BROKER=kafka`, `WALRELAY_KAFKA_HOME`) and
//! Debezium's install (`scripts/install-debezium.sh`, or
//! `WALRELAY_DEBEZIUM_HOME`); skipped, saying so, on other brokers.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use tokio::sync::watch;
use walrelay::config::{Config, OutboxConfig};
use walrelay::engine::key::EventKey;
use walrelay::engine::pipeline;
use walrelay_testkit::{
    await_condition, read_topics, read_until_quiet, BrokerKind, ConsumedRecord, DebeziumOptions,
    DebeziumWorker, Variant,
};

use support::Env;

/// The aggregate types the writers use, so the topics both relays write.
const TYPES: [&str; 2] = ["order", "invoice"];
/// The marker row's aggregate type: its own topic, which no consumer of
/// the real topics reads and walrelay never writes.
const MARKER_TYPE: &str = "walrelay_cutover";
const MARKER_ID: &str = "cutover-marker-1";
/// Bounded waits (a JVM on a busy 2-core machine is slow).
const WAIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(100);
/// Rows each phase must see committed before the test moves on, so that
/// every phase (Debezium alone, both slots, walrelay, Debezium again) has
/// rows.
const ROWS_PER_PHASE: usize = 30;

/// The switch: one transaction that waits for the outbox's in-flight
/// writers, keeps new ones out until it commits, and moves the table from
/// Debezium's publication to walrelay's. The marker row is inserted
/// before the move, so it is Debezium's last event.
const SWITCH_SQL: &str = "
BEGIN;
SET LOCAL lock_timeout = '10s';
LOCK TABLE public.outbox IN EXCLUSIVE MODE;
INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload)
     VALUES ('cutover-marker-1', 'walrelay_cutover', 'cutover', 'CutoverMarker',
             '{\"from\": \"debezium\", \"to\": \"walrelay\"}');
ALTER PUBLICATION debezium DROP TABLE public.outbox;
ALTER PUBLICATION walrelay ADD TABLE public.outbox;
COMMIT;";

/// Which relay wrote a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Relay {
    Debezium,
    Walrelay,
}

/// One outbox row as committed.
#[derive(Clone, Debug)]
struct Row {
    id: String,
    aggregatetype: String,
    aggregateid: String,
    event_type: String,
    payload: Value,
}

impl Row {
    fn insert(&self) -> String {
        format!(
            "INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ('{}', '{}', '{}', '{}', '{}');",
            self.id,
            self.aggregatetype,
            self.aggregateid,
            self.event_type,
            self.payload.to_string().replace('\'', "''")
        )
    }
}

/// A writer's committed transactions, in commit order.
type Committed = Vec<Vec<Row>>;

/// Commits outbox transactions until `stop`: writer `a` one or two rows
/// per transaction; writer `b` writes another table first and sleeps
/// before its outbox row, so that some of its transactions are open (with
/// an xid) when the switch takes its lock and wait for it.
async fn write(
    client: tokio_postgres::Client,
    name: &'static str,
    mut stop: watch::Receiver<bool>,
    count: Arc<AtomicUsize>,
) -> Result<Committed> {
    let mut committed = Vec::new();
    let mut n = 0u32;
    while !*stop.borrow() {
        let rows: Vec<Row> = (0..if name == "a" { 1 + n % 2 } else { 1 })
            .map(|i| {
                let aggregatetype = TYPES[(n as usize + i as usize) % TYPES.len()];
                Row {
                    id: format!("{name}-{n}-{i}"),
                    aggregatetype: aggregatetype.into(),
                    aggregateid: format!("{aggregatetype}-{}", n % 5),
                    event_type: "Changed".into(),
                    payload: json!({"writer": name, "n": n, "i": i, "lines": [{"sku": "x", "qty": 2}], "note": "ünïcode"}),
                }
            })
            .collect();
        let mut sql = String::from("BEGIN;");
        if name == "b" {
            sql += "INSERT INTO busy (v) VALUES ('before the outbox row'); SELECT pg_sleep(0.02);";
        }
        for row in &rows {
            sql += &row.insert();
        }
        sql += "COMMIT;";
        client
            .batch_execute(&sql)
            .await
            .with_context(|| format!("writer {name}, transaction {n}"))?;
        count.fetch_add(rows.len(), Ordering::SeqCst);
        committed.push(rows);
        n += 1;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            _ = stop.changed() => {}
        }
    }
    Ok(committed)
}

/// Waits until `count` is at least `target`.
async fn await_count(count: &AtomicUsize, target: usize, what: &str) -> Result<()> {
    await_condition(WAIT, POLL, || async {
        Ok(count.load(Ordering::SeqCst) >= target)
    })
    .await
    .with_context(|| format!("waiting for {target} committed rows ({what})"))
}

/// walrelay's configuration for Event Router-compatible output: the
/// defaults already are (topic `outbox.event.{aggregatetype}`, key
/// `aggregateid`, headers `id` and `type`, value `payload`).
fn walrelay_config(env: &Env) -> Config {
    let mut c = Config::default();
    c.postgres.url = format!(
        "{}?sslmode=disable",
        env.cluster.url("postgres", "postgres")
    );
    c.postgres.status_interval = Duration::from_millis(200);
    c.kafka.bootstrap_servers = env.bootstrap();
    c.relay.max_backoff = Duration::from_millis(500);
    c.outbox.push(OutboxConfig {
        table: "public.outbox".into(),
        topic: "outbox.event.{aggregatetype}".into(),
        columns: Default::default(),
    });
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutover_from_debezium_event_router_loses_and_duplicates_nothing() -> Result<()> {
    if BrokerKind::from_env()? != BrokerKind::Kafka {
        eprintln!("skipped: Apache Kafka only (WALRELAY_BROKER=kafka, scripts/test.sh)");
        return Ok(());
    }
    let began = Instant::now();
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    println!("PostgreSQL and Apache Kafka up in {:?}", began.elapsed());
    // Four partitions each (Apache Kafka's num.partitions is 1), so that
    // the test sees both relays pick an aggregate's partition.
    let topics: Vec<String> = TYPES.iter().map(|t| format!("outbox.event.{t}")).collect();
    let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    env.create_topics(&topic_refs)?;
    let mut debezium = DebeziumWorker::start(
        &env.cluster,
        &bootstrap,
        DebeziumOptions {
            variant: Variant::Tuned,
            ..DebeziumOptions::default()
        },
    )
    .await?;
    println!(
        "Debezium streaming {:?} after the test began",
        began.elapsed()
    );

    // 1. Writers, Debezium alone.
    let (stop_writers, stop_rx) = watch::channel(false);
    let count = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for name in ["a", "b"] {
        let client = env.cluster.client().await?;
        writers.push(tokio::spawn(write(
            client,
            name,
            stop_rx.clone(),
            count.clone(),
        )));
    }
    read_topics(&bootstrap, &topic_refs, ROWS_PER_PHASE, WAIT)
        .await
        .context("Debezium's first records")?;

    // 2. walrelay's publication (no tables) and slot, Debezium still
    // relaying; rows committed after the slot exists.
    // The command docs/operations.md gives: flags only, no [[outbox]].
    let setup = tokio::process::Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .env_remove("WALRELAY_CONFIG")
        .args(["--postgres-url", &walrelay_config(&env).postgres.url])
        .args(["--slot", "walrelay", "--publication", "walrelay", "setup"])
        .output()
        .await?;
    ensure!(
        setup.status.success(),
        "walrelay setup: {}{}",
        String::from_utf8_lossy(&setup.stdout),
        String::from_utf8_lossy(&setup.stderr)
    );
    print!(
        "walrelay setup:\n{}{}",
        String::from_utf8_lossy(&setup.stdout),
        String::from_utf8_lossy(&setup.stderr)
    );
    let slot_at = env.confirmed_flush_lsn("walrelay").await?;
    await_count(
        &count,
        count.load(Ordering::SeqCst) + ROWS_PER_PHASE,
        "both slots",
    )
    .await?;

    // 3. The switch.
    let switch = Instant::now();
    env.client
        .batch_execute(SWITCH_SQL)
        .await
        .context("the switch")?;
    let switched_at = env.current_wal_lsn().await?;
    println!(
        "switch committed in {:?}; walrelay's slot from {slot_at}, switch before {switched_at}",
        switch.elapsed()
    );

    // 4. Debezium stops once its marker is in Kafka; then walrelay runs,
    // so no walrelay record comes before a Debezium record in any
    // partition. Rows keep coming all along: walrelay's slot keeps them.
    let marker_topic = format!("outbox.event.{MARKER_TYPE}");
    let marker = read_topics(&bootstrap, &[marker_topic.as_str()], 1, WAIT)
        .await
        .with_context(|| format!("Debezium's marker record\n{}", debezium.log_tail(30)))?;
    ensure!(
        marker.len() == 1 && marker[0].header_str("id") == Some(MARKER_ID),
        "marker topic holds {marker:?}"
    );
    let marker_seen = switch.elapsed();
    ensure!(
        debezium.stop()?,
        "Debezium did not stop on SIGTERM\n{}",
        debezium.log_tail(30)
    );
    println!(
        "marker read {marker_seen:?} after the switch; Debezium stopped {:?} after the switch",
        switch.elapsed()
    );
    let (stop_relay, relay_rx) = watch::channel(false);
    let relay = tokio::spawn(pipeline::run(walrelay_config(&env), relay_rx, None));
    await_count(
        &count,
        count.load(Ordering::SeqCst) + ROWS_PER_PHASE,
        "walrelay",
    )
    .await?;

    // 5. And back (docs/operations.md, "Rolling back"): outbox writes held
    // by a lock while walrelay confirms past them and stops, the table
    // back in Debezium's publication, Debezium started again.
    let back = Instant::now();
    let hold = env.cluster.client().await?;
    hold.batch_execute(
        "BEGIN; SET LOCAL lock_timeout = '10s'; LOCK TABLE public.outbox IN EXCLUSIVE MODE;",
    )
    .await?;
    let held_at: String = hold
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0);
    // A commit record after it, so the walsender moves past it at once
    // (an idle database's next WAL record may be 15 s away).
    env.client
        .batch_execute("SELECT pg_current_xact_id()")
        .await?;
    let (client, lsn) = (&env.client, held_at.as_str());
    await_condition(WAIT, POLL, move || async move {
        let row = client
            .query_one(
                "SELECT confirmed_flush_lsn >= $1::text::pg_lsn FROM pg_replication_slots \
                 WHERE slot_name = 'walrelay'",
                &[&lsn],
            )
            .await?;
        Ok(row.get::<_, bool>(0))
    })
    .await
    .with_context(|| format!("walrelay confirming past {held_at}"))?;
    stop_relay.send(true)?;
    relay.await??;
    hold.batch_execute(
        "ALTER PUBLICATION walrelay DROP TABLE public.outbox;
         ALTER PUBLICATION debezium ADD TABLE public.outbox;
         COMMIT;",
    )
    .await?;
    println!("way back: outbox writes held {:?}", back.elapsed());
    let restarted = debezium.restart().await?;
    println!(
        "Debezium streaming again {:?} after its restart",
        restarted.streaming
    );
    await_count(
        &count,
        count.load(Ordering::SeqCst) + ROWS_PER_PHASE,
        "Debezium again",
    )
    .await?;
    stop_writers.send(true)?;
    let mut committed = Vec::new();
    for w in writers {
        committed.push(w.await??);
    }
    let rows: Vec<&Row> = committed.iter().flatten().flatten().collect();
    println!("{} rows committed by the writers", rows.len());

    // Every record of the outbox topics, then a quiet read from the start
    // again, so a late duplicate would be counted too.
    let mut all_topics = topic_refs.clone();
    all_topics.push(marker_topic.as_str());
    read_topics(&bootstrap, &all_topics, rows.len() + 1, WAIT)
        .await
        .context("every committed row")?;
    let records = read_until_quiet(&bootstrap, &all_topics, Duration::from_secs(2), WAIT).await?;
    ensure!(
        debezium.stop()?,
        "Debezium did not stop on SIGTERM\n{}",
        debezium.log_tail(30)
    );

    check(
        &committed,
        &records,
        &[Relay::Debezium, Relay::Walrelay, Relay::Debezium],
    )?;
    println!("done {:?} after the test began", began.elapsed());
    Ok(())
}

/// The test's assertions over the writers' transactions and every record
/// read back.
fn check(committed: &[Committed], records: &[ConsumedRecord], phases: &[Relay]) -> Result<()> {
    let marker = Row {
        id: MARKER_ID.into(),
        aggregatetype: MARKER_TYPE.into(),
        aggregateid: "cutover".into(),
        event_type: "CutoverMarker".into(),
        payload: json!({"from": "debezium", "to": "walrelay"}),
    };
    let mut expected: BTreeMap<&str, &Row> = committed
        .iter()
        .flatten()
        .flatten()
        .map(|r| (r.id.as_str(), r))
        .collect();
    expected.insert(MARKER_ID, &marker);

    // Exactly once, by event id, and as an Event Router consumer reads it.
    let mut by_id: BTreeMap<&str, Relay> = BTreeMap::new();
    for r in records {
        let id = r
            .header_str("id")
            .with_context(|| format!("a record without an id header: {r:?}"))?;
        let row = expected
            .get(id)
            .with_context(|| format!("record of an event never committed: {r:?}"))?;
        let relay = relay_of(r)?;
        if let Some(first) = by_id.insert(row.id.as_str(), relay) {
            bail!(
                "event {id} arrived twice: from {first:?}, then from {relay:?} ({} partition {} offset {})",
                r.topic,
                r.partition,
                r.offset
            );
        }
        check_shape(row, r).with_context(|| format!("{relay:?}'s record of {id}"))?;
    }
    let missing: Vec<&&str> = expected
        .keys()
        .filter(|id| !by_id.contains_key(*id))
        .collect();
    ensure!(missing.is_empty(), "events lost: {missing:?}");
    ensure!(
        by_id[MARKER_ID] == Relay::Debezium,
        "the marker came from walrelay"
    );

    // Per writer (commit order): all of a transaction from one relay, and
    // the relays in the order of the phases, each phase with transactions.
    for writer in committed {
        let relays: Vec<Relay> = writer
            .iter()
            .map(|tx| {
                let first = by_id[tx[0].id.as_str()];
                ensure!(
                    tx.iter().all(|r| by_id[r.id.as_str()] == first),
                    "a transaction split between the relays: {:?}",
                    tx.iter()
                        .map(|r| (&r.id, by_id[r.id.as_str()]))
                        .collect::<Vec<_>>()
                );
                Ok(first)
            })
            .collect::<Result<_>>()?;
        let runs = runs(&relays);
        ensure!(
            runs.iter().map(|(r, _)| *r).eq(phases.iter().copied()),
            "a writer's transactions went {runs:?}, not through {phases:?} in turn"
        );
        println!("writer: {} transactions: {runs:?}", relays.len());
    }

    // Both relays hash the key with murmur2 (Kafka's Java producer and
    // walrelay alike): an aggregate stays on its partition across the
    // switch, so its events stay in order for its consumers.
    let mut partition_of: BTreeMap<(&str, &[u8]), i32> = BTreeMap::new();
    for r in records {
        let key = r.key.as_deref().unwrap_or_default();
        let p = *partition_of
            .entry((r.topic.as_str(), key))
            .or_insert(r.partition);
        ensure!(
            p == r.partition,
            "key {:?} of {} in partitions {p} and {} ({:?})",
            String::from_utf8_lossy(key),
            r.topic,
            r.partition,
            relay_of(r)?
        );
    }

    // In every partition the relays' records come in the order of the
    // phases: an aggregate's events stay in commit order across a switch.
    let mut ordered: Vec<&ConsumedRecord> = records.iter().collect();
    ordered.sort_by_key(|r| (r.topic.clone(), r.partition, r.offset));
    for partition in ordered.chunk_by(|a, b| (&a.topic, a.partition) == (&b.topic, b.partition)) {
        let relays: Vec<Relay> = partition
            .iter()
            .map(|r| relay_of(r))
            .collect::<Result<_>>()?;
        let runs = runs(&relays);
        let mut rest = phases.iter();
        ensure!(
            runs.iter().all(|(r, _)| rest.any(|p| p == r)),
            "{} partition {}: the relays' records went {runs:?}, not in the order {phases:?}",
            partition[0].topic,
            partition[0].partition
        );
    }

    // walrelay's keys increase within each partition: what a consumer's
    // high-water mark relies on.
    let mut last: BTreeMap<(&str, i32), EventKey> = BTreeMap::new();
    for r in ordered
        .into_iter()
        .filter(|r| relay_of(r).ok() == Some(Relay::Walrelay))
    {
        let key = support::key_of(r);
        if let Some(prev) = last.insert((r.topic.as_str(), r.partition), key) {
            ensure!(key > prev, "walrelay key {key} after {prev} in {}", r.topic);
        }
    }
    Ok(())
}

/// Runs of the same relay: (relay, length).
fn runs(relays: &[Relay]) -> Vec<(Relay, usize)> {
    relays
        .chunk_by(|a, b| a == b)
        .map(|run| (run[0], run.len()))
        .collect()
}

/// walrelay's records carry its idempotency key; Debezium's do not.
fn relay_of(r: &ConsumedRecord) -> Result<Relay> {
    match (r.header("idempotency-key"), r.header("walrelay-source")) {
        (Some(_), Some(_)) => Ok(Relay::Walrelay),
        (None, None) => Ok(Relay::Debezium),
        _ => bail!("half of walrelay's headers: {r:?}"),
    }
}

/// What an Event Router consumer reads: the topic of the aggregate type,
/// the aggregate id as the key, the event id and type as headers, the
/// payload as a JSON value.
fn check_shape(row: &Row, r: &ConsumedRecord) -> Result<()> {
    ensure!(
        r.topic == format!("outbox.event.{}", row.aggregatetype),
        "topic {}",
        r.topic
    );
    ensure!(
        r.key.as_deref() == Some(row.aggregateid.as_bytes()),
        "key {:?}",
        r.key.as_deref().map(String::from_utf8_lossy)
    );
    ensure!(
        r.header_str("type") == Some(row.event_type.as_str()),
        "type header {:?}",
        r.header_str("type")
    );
    let value: Value = serde_json::from_slice(r.value.as_deref().unwrap_or_default())
        .with_context(|| format!("value {:?} is not JSON", r.value))?;
    ensure!(
        value == row.payload,
        "value {value}, committed {}",
        row.payload
    );
    Ok(())
}
