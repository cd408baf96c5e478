//! `ConsumerLoop` against a real Tansu broker and a real PostgreSQL.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Transaction};
use walrelay::key::EventKey;
use walrelay::record::header;
use walrelay_consumer::{
    migrate, ConfigError, ConsumerLoop, Counters, Database, Delivery, LoopError, PgHwmStore,
    Position, Settings,
};
use walrelay_testkit::{await_condition, ClusterOptions, PgCluster, TansuBroker};

const SOURCE: &str = "7312/app/walrelay";
const TIMEOUT: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(50);

struct Env {
    cluster: PgCluster,
    broker: TansuBroker,
    client: Client,
}

/// Logs to the test output with `RUST_LOG` (e.g. `walrelay_consumer=debug`).
fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

async fn env(topic: &str, partitions: i32) -> anyhow::Result<Env> {
    init_tracing();
    let cluster = tokio::task::spawn_blocking(|| PgCluster::start(ClusterOptions::default()));
    let topic = topic.to_owned();
    let broker = tokio::task::spawn_blocking(move || -> anyhow::Result<TansuBroker> {
        let broker = TansuBroker::start()?;
        broker.create_topic(&topic, partitions)?;
        Ok(broker)
    });
    let cluster = cluster.await??;
    let broker = broker.await??;
    let client = cluster.client().await?;
    migrate(&client).await?;
    client
        .batch_execute(
            "CREATE TABLE effects (
                 event_key text PRIMARY KEY,
                 partition int NOT NULL,
                 consumer text NOT NULL
             )",
        )
        .await?;
    Ok(Env {
        cluster,
        broker,
        client,
    })
}

fn kafka(bootstrap: &str, group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
        .set("reconnect.backoff.ms", "20")
        .set("reconnect.backoff.max.ms", "500");
    config
}

fn producer(bootstrap: &str) -> anyhow::Result<FutureProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2")
        .set("message.timeout.ms", "20000")
        .create()?)
}

/// Produces walrelay-style records; remembers per partition what a relay
/// would: the last key of this "session" (for `walrelay-prev-key`).
struct Relay {
    producer: FutureProducer,
    topic: String,
    /// Every key produced, per partition, in order (with replays).
    produced: BTreeMap<i32, Vec<EventKey>>,
    prev: BTreeMap<i32, EventKey>,
}

impl Relay {
    fn new(bootstrap: &str, topic: &str) -> anyhow::Result<Relay> {
        Ok(Relay {
            producer: producer(bootstrap)?,
            topic: topic.to_owned(),
            produced: BTreeMap::new(),
            prev: BTreeMap::new(),
        })
    }

    /// Key `seq` of partition `partition`: increasing in `seq`.
    fn key(partition: i32, seq: u64) -> EventKey {
        EventKey::new(0x100 + seq, u64::try_from(partition).unwrap_or(0))
    }

    /// A new relay session: the next record of each partition has an
    /// empty prev-key.
    fn restart(&mut self) {
        self.prev.clear();
    }

    /// Produces the given (partition, seq) records, in order, and waits for
    /// all deliveries.
    async fn send(&mut self, records: &[(i32, u64)]) -> anyhow::Result<()> {
        let mut deliveries = Vec::new();
        for &(partition, seq) in records {
            let key = Relay::key(partition, seq);
            let prev = self.prev.insert(partition, key).map(|k| k.to_hex());
            let hex = key.to_hex();
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: header::IDEMPOTENCY_KEY,
                    value: Some(hex.as_str()),
                })
                .insert(Header {
                    key: header::SOURCE,
                    value: Some(SOURCE),
                })
                .insert(Header {
                    key: header::PREV_KEY,
                    value: Some(prev.as_deref().unwrap_or("")),
                });
            let payload = format!("event {hex}");
            let record = FutureRecord::to(&self.topic)
                .partition(partition)
                .payload(&payload)
                .key(&hex)
                .headers(headers);
            let delivery = self
                .producer
                .send_result(record)
                .map_err(|(e, _)| anyhow::anyhow!("enqueueing: {e}"))?;
            deliveries.push(delivery);
            self.produced.entry(partition).or_default().push(key);
        }
        for delivery in deliveries {
            delivery
                .await?
                .map_err(|(e, _)| anyhow::anyhow!("delivery failed: {e}"))?;
        }
        Ok(())
    }

    fn distinct(&self) -> usize {
        self.produced
            .values()
            .map(|keys| keys.iter().collect::<std::collections::BTreeSet<_>>().len())
            .sum()
    }

    fn last_keys(&self) -> BTreeMap<i32, EventKey> {
        self.produced
            .iter()
            .map(|(p, keys)| (*p, keys.iter().copied().max().unwrap_or_default()))
            .collect()
    }
}

type RunHandle = JoinHandle<Result<(), LoopError>>;

fn database(cluster: &PgCluster) -> Database {
    Database::new(
        cluster.client_config("postgres", cluster.superuser_password(), "postgres"),
        tokio_postgres::NoTls,
    )
}

/// The handler shapes.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// One multi-row insert per batch.
    Batch,
    /// One insert per record, inside the batch transaction.
    Record,
}

/// Starts a loop named `name` whose handler records which consumer applied
/// each event (the primary key refuses a second application).
async fn start(
    env: &Env,
    group: &str,
    topic: &str,
    name: &'static str,
    mode: Mode,
) -> anyhow::Result<(RunHandle, watch::Sender<bool>, Arc<Counters>)> {
    let consumer = ConsumerLoop::new(
        kafka(&env.broker.bootstrap_servers(), group),
        &[topic],
        PgHwmStore::new(),
        database(&env.cluster),
    )?
    .with_settings(Settings {
        // Small batches: several per run, so batches meet replays.
        max_batch_records: 7,
        commit_interval: Duration::from_millis(200),
        ..Settings::default()
    });
    let counters = consumer.counters();
    let (stop, shutdown) = watch::channel(false);
    let handle = match mode {
        Mode::Record => tokio::spawn(consumer.run(
            async move |tx: &Transaction<'_>, record: &Delivery<'_>| {
                tx.execute(
                    "INSERT INTO effects (event_key, partition, consumer) VALUES ($1, $2, $3)",
                    &[&record.meta.key.to_hex(), &record.position.partition, &name],
                )
                .await?;
                Ok::<(), tokio_postgres::Error>(())
            },
            shutdown,
        )),
        Mode::Batch => tokio::spawn(consumer.run_batches(
            async move |tx: &Transaction<'_>, records: &[Delivery<'_>]| {
                let keys: Vec<String> = records.iter().map(|r| r.meta.key.to_hex()).collect();
                let partitions: Vec<i32> = records.iter().map(|r| r.position.partition).collect();
                tx.execute(
                    "INSERT INTO effects (event_key, partition, consumer) \
                     SELECT k, p, $3 FROM unnest($1::text[], $2::int4[]) AS u(k, p)",
                    &[&keys, &partitions, &name],
                )
                .await?;
                Ok::<(), tokio_postgres::Error>(())
            },
            shutdown,
        )),
    };
    Ok((handle, stop, counters))
}

async fn count(client: &Client, sql: &str) -> anyhow::Result<i64> {
    Ok(client.query_one(sql, &[]).await?.get(0))
}

async fn await_count(client: &Client, sql: &str, at_least: i64) -> anyhow::Result<()> {
    await_condition(TIMEOUT, POLL, || async {
        Ok(count(client, sql).await? >= at_least)
    })
    .await
}

async fn check_marks(env: &Env, group: &str, topic: &str, relay: &Relay) -> anyhow::Result<()> {
    let store = PgHwmStore::new();
    for (partition, last) in relay.last_keys() {
        let pos = Position::new(group, topic, partition);
        assert_eq!(
            store
                .hwm(&env.client, &pos, SOURCE)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?,
            Some(last),
            "partition {partition}"
        );
    }
    Ok(())
}

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
