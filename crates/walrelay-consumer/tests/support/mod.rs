//! Test support shared by the consumer-loop suites: a PostgreSQL and Tansu
//! per test, a fake relay that produces walrelay-style records, and loops
//! with a handler that records who applied what.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Transaction};
use walrelay_consumer::{
    migrate, ConsumerLoop, Counters, Database, Delivery, GroupProtocol, LoopError, PgHwmStore,
    Position, Settings,
};
use walrelay_contract::header;
use walrelay_contract::EventKey;
use walrelay_testkit::{await_condition, ClusterOptions, PgCluster, TansuBroker};

pub const SOURCE: &str = "7312/app/walrelay";
pub const TIMEOUT: Duration = Duration::from_secs(90);
pub const POLL: Duration = Duration::from_millis(50);

pub struct Env {
    pub cluster: PgCluster,
    pub broker: TansuBroker,
    pub client: Client,
}

impl Env {
    /// A loop of `group` on `topic` with `settings`, on this broker and
    /// database, keeping its marks in `walrelay_consumer_hwm`.
    pub fn consumer(
        &self,
        group: &str,
        topic: &str,
        settings: Settings,
    ) -> anyhow::Result<ConsumerLoop> {
        Ok(ConsumerLoop::new(
            kafka(&self.broker.bootstrap_servers(), group),
            &[topic],
            PgHwmStore::new(),
            database(&self.cluster),
        )?
        .with_settings(settings))
    }
}

/// Logs to the test output with `RUST_LOG` (e.g. `walrelay_consumer=debug`).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

pub async fn env(topic: &str, partitions: i32) -> anyhow::Result<Env> {
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
                 consumer text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
             )",
        )
        .await?;
    Ok(Env {
        cluster,
        broker,
        client,
    })
}

pub fn kafka(bootstrap: &str, group: &str) -> ClientConfig {
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

/// Environment variable naming the consumer group protocols a suite plays
/// its consumers with: `classic` (the default), `consumer`, or both,
/// comma-separated (`classic,consumer`), one after the other on the same
/// broker.
pub const GROUP_PROTOCOL_ENV: &str = "WALRELAY_GROUP_PROTOCOL";

/// The protocols `$WALRELAY_GROUP_PROTOCOL` names.
pub fn group_protocols() -> anyhow::Result<Vec<GroupProtocol>> {
    let value = std::env::var(GROUP_PROTOCOL_ENV).unwrap_or_default();
    if value.trim().is_empty() {
        return Ok(vec![GroupProtocol::Classic]);
    }
    value.split(',').map(|p| parse_protocol(p.trim())).collect()
}

pub fn parse_protocol(name: &str) -> anyhow::Result<GroupProtocol> {
    match name {
        "classic" => Ok(GroupProtocol::Classic),
        "consumer" => Ok(GroupProtocol::Consumer),
        other => anyhow::bail!(
            "{GROUP_PROTOCOL_ENV}: {other:?} is no group protocol (classic or consumer)"
        ),
    }
}

pub fn protocol_name(protocol: GroupProtocol) -> &'static str {
    match protocol {
        GroupProtocol::Classic => "classic",
        GroupProtocol::Consumer => "consumer",
    }
}

/// [`kafka`] under `protocol`: with the consumer protocol, the session
/// timeout and heartbeat interval are the broker's (the test brokers'
/// `group.consumer.*`), so the client sets neither.
pub fn kafka_for(bootstrap: &str, group: &str, protocol: GroupProtocol) -> ClientConfig {
    let mut config = kafka(bootstrap, group);
    if protocol == GroupProtocol::Consumer {
        config
            .set("group.protocol", "consumer")
            .remove("session.timeout.ms");
        config.remove("heartbeat.interval.ms");
    }
    config
}

pub fn producer(bootstrap: &str) -> anyhow::Result<FutureProducer> {
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
pub struct Relay {
    producer: FutureProducer,
    topic: String,
    /// Every key produced, per partition, in order (with replays).
    pub produced: BTreeMap<i32, Vec<EventKey>>,
    prev: BTreeMap<i32, EventKey>,
}

impl Relay {
    pub fn new(bootstrap: &str, topic: &str) -> anyhow::Result<Relay> {
        Ok(Relay {
            producer: producer(bootstrap)?,
            topic: topic.to_owned(),
            produced: BTreeMap::new(),
            prev: BTreeMap::new(),
        })
    }

    /// Key `seq` of partition `partition`: increasing in `seq`.
    pub fn key(partition: i32, seq: u64) -> EventKey {
        EventKey::new(0x100 + seq, u64::try_from(partition).unwrap_or(0))
    }

    /// A new relay session: the next record of each partition has an
    /// empty prev-key.
    pub fn restart(&mut self) {
        self.prev.clear();
    }

    /// Produces the given (partition, seq) records, in order, and waits for
    /// all deliveries.
    pub async fn send(&mut self, records: &[(i32, u64)]) -> anyhow::Result<()> {
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

    /// Produces one record without any walrelay header (not from a
    /// relay: a misconfigured producer, a bridge that drops headers).
    pub async fn send_raw(&mut self, partition: i32, payload: &str) -> anyhow::Result<()> {
        let record = FutureRecord::<str, str>::to(&self.topic)
            .partition(partition)
            .payload(payload);
        self.producer
            .send(record, Duration::from_secs(20))
            .await
            .map_err(|(e, _)| anyhow::anyhow!("delivery failed: {e}"))?;
        Ok(())
    }

    pub fn distinct(&self) -> usize {
        self.produced
            .values()
            .map(|keys| keys.iter().collect::<std::collections::BTreeSet<_>>().len())
            .sum()
    }

    pub fn last_keys(&self) -> BTreeMap<i32, EventKey> {
        self.produced
            .iter()
            .map(|(p, keys)| (*p, keys.iter().copied().max().unwrap_or_default()))
            .collect()
    }
}

pub type RunHandle = JoinHandle<Result<(), LoopError>>;

pub fn database(cluster: &PgCluster) -> Database {
    Database::new(
        cluster.client_config("postgres", cluster.superuser_password(), "postgres"),
        tokio_postgres::NoTls,
    )
}

/// The handler shapes.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// One multi-row insert per batch.
    Batch,
    /// One insert per record, inside the batch transaction.
    Record,
}

/// Starts a loop named `name` whose handler records which consumer applied
/// each event (the primary key refuses a second application).
pub async fn start(
    env: &Env,
    group: &str,
    topic: &str,
    name: &'static str,
    mode: Mode,
) -> anyhow::Result<(RunHandle, watch::Sender<bool>, Arc<Counters>)> {
    let consumer = env.consumer(
        group,
        topic,
        Settings {
            // Small batches: several per run, so batches meet replays.
            max_batch_records: 7,
            commit_interval: Duration::from_millis(200),
            ..Settings::default()
        },
    )?;
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

pub async fn count(client: &Client, sql: &str) -> anyhow::Result<i64> {
    Ok(client.query_one(sql, &[]).await?.get(0))
}

pub async fn await_count(client: &Client, sql: &str, at_least: i64) -> anyhow::Result<()> {
    await_condition(TIMEOUT, POLL, || async {
        Ok(count(client, sql).await? >= at_least)
    })
    .await
}

pub async fn check_marks(env: &Env, group: &str, topic: &str, relay: &Relay) -> anyhow::Result<()> {
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
