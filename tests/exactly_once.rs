//! Exactly once, end to end: PostgreSQL → walrelay (killed -9 and restarted)
//! → a broker (Tansu, or Apache Kafka with WALRELAY_BROKER=kafka) → the
//! example consumer service (killed -9 and restarted), with a
//! workload running throughout. At the end every committed event is
//! applied exactly once, nothing rolled back is, and each partition's
//! high-water mark equals the last key in that partition.
//!
//! Uses the real binaries: `target/<profile>/walrelay` and
//! `target/<profile>/examples/apply_events`, which `scripts/test.sh` builds
//! (`cargo build --workspace --bins --examples`) before running tests.
//!
//! The Java example consumer (java/examples/plain-consumer's `ApplyEvents`,
//! started with `java -cp`, built by scripts/test.sh's `java` stage) goes
//! through the same: killed -9 while it applies a relayed topic, restarted,
//! every event applied exactly once (Apache Kafka only).

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use walrelay::config::Config;
use walrelay::engine::key::EventKey;
use walrelay_suite::binary;
use walrelay_testkit::{
    await_condition, java_classpath, read_until_quiet, BrokerKind, ClusterOptions, PgCluster,
    TestBroker,
};

const WAIT: Duration = Duration::from_secs(120);
const TOPIC: &str = "events";

struct Services {
    cluster: PgCluster,
    broker: TestBroker,
    dir: tempfile::TempDir,
}

impl Services {
    fn source_url(&self) -> String {
        format!(
            "{}?sslmode=disable",
            self.cluster.url("postgres", "postgres")
        )
    }

    fn log(&self, name: &str) -> Result<std::fs::File> {
        Ok(std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(name))?)
    }

    fn read_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    /// The relay runs without its tail fence, so that its kills put
    /// replays on the wire: the consumer must drop them by its high-water
    /// marks (the fence itself is tested in crates/walrelay/tests/fence.rs).
    fn spawn_relay(&self) -> Result<Child> {
        let log = self.log("relay.log")?;
        let config = self.dir.path().join("relay.toml");
        std::fs::write(&config, "[relay]\nfence = false\n")?;
        Ok(Command::new(binary("walrelay")?)
            .arg("--config")
            .arg(&config)
            .args(["--postgres-url", &self.source_url()])
            .args(["--bootstrap-servers", &self.broker.bootstrap_servers()])
            .args(["--status-interval", "10s", "--log", "warn", "run"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?)
    }

    fn spawn_consumer(&self) -> Result<Child> {
        let log = self.log("consumer.log")?;
        Ok(Command::new(binary("examples/apply_events")?)
            .args([
                "--bootstrap",
                &self.broker.bootstrap_servers(),
                "--topic",
                TOPIC,
            ])
            .args([
                "--dsn",
                &format!(
                    "host=127.0.0.1 port={} user=postgres dbname=service",
                    self.cluster.port()
                ),
            ])
            .args(["--group", "apply-events"])
            // Tansu joins groups in about half the session timeout (Apache
            // Kafka at once: group.initial.rebalance.delay.ms=0).
            .args(["--kafka-property", "session.timeout.ms=6000"])
            .args(["--kafka-property", "heartbeat.interval.ms=1000"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?)
    }
}

impl Services {
    /// The Java example consumer, as `group`'s static member `java-1` (a
    /// restarted process gets its partitions back at once), committing
    /// offsets every 2 s: a wide window between its database commits and
    /// its offset commits for the kills to land in.
    fn spawn_java_consumer(&self, classpath: &str, topic: &str, db: &str) -> Result<Child> {
        let log = self.log("java-consumer.log")?;
        let url = format!(
            "jdbc:postgresql://127.0.0.1:{}/{db}?user=postgres",
            self.cluster.port()
        );
        Ok(Command::new("java")
            .args(["-cp", classpath, "io.walrelay.example.ApplyEvents"])
            .args(["--bootstrap", &self.broker.bootstrap_servers()])
            .args([
                "--jdbc-url",
                &url,
                "--group",
                "java-apply",
                "--topic",
                topic,
            ])
            .args(["--instance-id", "java-1", "--commit-interval-ms", "2000"])
            .args(["--kafka-property", "session.timeout.ms=6000"])
            .args(["--kafka-property", "heartbeat.interval.ms=1000"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?)
    }
}

fn kill9(child: &mut Child) -> Result<()> {
    child.kill()?;
    child.wait()?;
    Ok(())
}

fn sigterm(child: &mut Child) -> Result<std::process::ExitStatus> {
    ensure!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?
        .success());
    Ok(child.wait()?)
}

/// Transactions `ts` of 200 `walrelay.emit` events each on `topic`, with
/// the ids `{tag}-{t}-{g}`; every fifth is rolled back. The committed ids.
async fn write_round(
    source: &tokio_postgres::Client,
    topic: &str,
    tag: &str,
    ts: std::ops::Range<u32>,
) -> Result<Vec<String>> {
    let mut committed = Vec::new();
    for t in ts {
        let commit = t % 5 != 4;
        source
            .batch_execute(&format!(
                "BEGIN;
                 SELECT count(walrelay.emit('{topic}', 'agg-' || (g % 13), jsonb_build_object('id', '{tag}-{t}-' || g))) FROM generate_series(1, 200) g;
                 {};",
                if commit { "COMMIT" } else { "ROLLBACK" }
            ))
            .await?;
        if commit {
            committed.extend((1..=200).map(|g| format!("{tag}-{t}-{g}")));
        }
    }
    Ok(committed)
}

async fn applied(service: &tokio_postgres::Client) -> Result<i64> {
    Ok(service
        .query_one("SELECT count(*) FROM applied_events", &[])
        .await
        .map(|r| r.get(0))
        .unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_event_is_applied_exactly_once_through_relay_and_consumer_crashes(
) -> Result<()> {
    let cluster =
        tokio::task::spawn_blocking(|| PgCluster::start(ClusterOptions::default())).await??;
    let broker = tokio::task::spawn_blocking(TestBroker::start).await??;
    broker.create_topic(TOPIC, 3)?;
    let s = Services {
        cluster,
        broker,
        dir: tempfile::tempdir()?,
    };
    let source = s.cluster.client().await?;
    source.batch_execute("CREATE DATABASE service").await?;
    let service = s.cluster.client_as("postgres", None, "service").await?;

    let mut config = Config::default();
    config.postgres.url = s.source_url();
    walrelay::commands::setup::setup(&config).await?;

    let mut relay = s.spawn_relay()?;
    let mut consumer = s.spawn_consumer()?;

    // Workload and chaos interleaved: each round commits 8 transactions of
    // 200 events (and rolls 2 back), waits until the consumer has applied
    // most of it, then kill -9s the relay (even rounds) or the consumer
    // (odd rounds) and starts it again. The relay reports its position
    // only every 10 s, so each relay kill leaves acknowledged but
    // unconfirmed events that PostgreSQL replays; each consumer kill loses
    // up to 1 s of offset commits, so Kafka redelivers records it applied.
    let mut expected = Vec::new();
    for round in 0..6 {
        expected.extend(write_round(&source, TOPIC, "e", round * 10..round * 10 + 10).await?);
        let target = expected.len() as i64 - 200;
        await_condition(WAIT, Duration::from_millis(20), || async {
            Ok(applied(&service).await? >= target)
        })
        .await
        .with_context(|| {
            format!(
                "round {round}: no progress\nrelay:\n{}\nconsumer:\n{}",
                s.read_log("relay.log"),
                s.read_log("consumer.log")
            )
        })?;
        if round % 2 == 0 {
            kill9(&mut relay)?;
            relay = s.spawn_relay()?;
        } else {
            kill9(&mut consumer)?;
            consumer = s.spawn_consumer()?;
        }
    }

    let end = walrelay_testkit::db::current_wal_lsn(&source).await?;
    await_condition(WAIT, Duration::from_millis(100), || async {
        Ok(walrelay_testkit::db::confirmed_flush_lsn(&source, "walrelay").await? >= Some(end))
    })
    .await?;
    await_condition(WAIT, Duration::from_millis(100), || async {
        Ok(applied(&service).await? >= expected.len() as i64)
    })
    .await
    .with_context(|| s.read_log("consumer.log"))?;

    let exit = sigterm(&mut consumer)?;
    assert!(
        exit.success(),
        "consumer graceful stop: {exit:?}\n{}",
        s.read_log("consumer.log")
    );
    let exit = sigterm(&mut relay)?;
    assert!(
        exit.success(),
        "relay graceful stop: {exit:?}\n{}",
        s.read_log("relay.log")
    );

    // Every committed event applied exactly once; nothing rolled back.
    let rows = service
        .query(
            "SELECT payload::jsonb ->> 'id', count(*) FROM applied_events GROUP BY 1",
            &[],
        )
        .await?;
    let counts: HashMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    let missing: Vec<_> = expected
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "never applied: {missing:?}");
    assert_eq!(
        counts.len(),
        expected.len(),
        "nothing else (no rolled-back event) applied"
    );

    // The HWM of each partition equals the last key in that partition.
    let records = read_until_quiet(
        &s.broker.bootstrap_servers(),
        &[TOPIC],
        Duration::from_secs(1),
        WAIT,
    )
    .await?;
    let mut last: BTreeMap<i32, EventKey> = BTreeMap::new();
    for r in &records {
        let key: EventKey = r
            .header_str("idempotency-key")
            .context("key header")?
            .parse()?;
        let e = last.entry(r.partition).or_insert(key);
        *e = (*e).max(key);
    }
    let hwms = service
        .query("SELECT partition, hwm FROM walrelay_consumer_hwm WHERE consumer_group = 'apply-events' AND topic = $1", &[&TOPIC])
        .await?;
    let hwms: BTreeMap<i32, EventKey> = hwms
        .iter()
        .map(|r| Ok((r.get::<_, i32>(0), r.get::<_, String>(1).parse()?)))
        .collect::<Result<_>>()?;
    assert_eq!(
        hwms, last,
        "high-water marks equal each partition's last key"
    );
    let duplicates = records.len() - expected.len();
    assert!(
        duplicates > 0,
        "the relay kills (fence off) were meant to put replays on the wire"
    );
    println!(
        "exactly once: {} events applied once each; {} records in Kafka ({duplicates} replayed duplicates) after 3 relay and 3 consumer kill -9",
        expected.len(),
        records.len()
    );

    // The operator's check agrees: no key out of order, no gap.
    let out = Command::new(binary("walrelay")?)
        .args([
            "--bootstrap-servers",
            &s.broker.bootstrap_servers(),
            "verify",
            "--topic",
            TOPIC,
        ])
        .output()?;
    assert!(
        out.status.success(),
        "walrelay verify: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sources_in_one_topic_keep_separate_high_water_marks() -> Result<()> {
    use tokio::sync::watch;
    use walrelay_consumer::{ConsumerLoop, Database, Delivery, PgHwmStore};

    let broker = tokio::task::spawn_blocking(TestBroker::start).await??;
    broker.create_topic("shared", 2)?;
    let mut sources = Vec::new();
    let mut relays = Vec::new();
    let (stop, stop_rx) = watch::channel(false);
    for name in ["east", "west"] {
        let cluster =
            tokio::task::spawn_blocking(|| PgCluster::start(ClusterOptions::default())).await??;
        let mut config = Config::default();
        config.postgres.url = format!("{}?sslmode=disable", cluster.url("postgres", "postgres"));
        config.postgres.status_interval = Duration::from_millis(200);
        config.kafka.bootstrap_servers = broker.bootstrap_servers();
        walrelay::commands::setup::setup(&config).await?;
        relays.push(tokio::spawn(walrelay::engine::pipeline::run(
            config,
            stop_rx.clone(),
            None,
        )));
        let client = cluster.client().await?;
        // Same keys from both sources: same partitions, overlapping LSNs.
        for t in 0..5 {
            client
                .batch_execute(&format!(
                    "SELECT count(walrelay.emit('shared', 'agg-' || (g % 3), jsonb_build_object('id', '{name}-{t}-' || g))) FROM generate_series(1, 100) g"
                ))
                .await?;
        }
        sources.push((cluster, client));
    }

    let (cluster, _) = &sources[0];
    let admin = cluster.client().await?;
    admin.batch_execute("CREATE DATABASE service").await?;
    let service = cluster.client_as("postgres", None, "service").await?;
    walrelay_consumer::migrate(&service).await?;
    service
        .batch_execute("CREATE TABLE applied (id text NOT NULL, source text NOT NULL)")
        .await?;
    let mut kafka = rdkafka::ClientConfig::new();
    kafka
        .set("bootstrap.servers", broker.bootstrap_servers())
        .set("group.id", "two-sources")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000");
    let database = Database::new(
        cluster.client_config("postgres", None, "service"),
        tokio_postgres::NoTls,
    );
    let consumer = ConsumerLoop::new(kafka, &["shared"], PgHwmStore::new(), database)?;
    let counters = consumer.counters();
    let (consumer_stop, consumer_stop_rx) = watch::channel(false);
    let running = tokio::spawn(consumer.run(
        async |tx: &tokio_postgres::Transaction<'_>, d: &Delivery<'_>| {
            let v: serde_json::Value =
                serde_json::from_slice(d.payload().unwrap_or_default()).unwrap_or_default();
            tx.execute(
                "INSERT INTO applied (id, source) VALUES ($1, $2)",
                &[&v["id"].as_str().unwrap_or_default(), &d.meta.source],
            )
            .await
            .map(|_| ())
        },
        consumer_stop_rx,
    ));
    await_condition(WAIT, Duration::from_millis(100), || async {
        let n: i64 = service
            .query_one("SELECT count(*) FROM applied", &[])
            .await?
            .get(0);
        Ok(n >= 1000)
    })
    .await?;
    consumer_stop.send(true)?;
    running.await?.map_err(|e| anyhow::anyhow!("{e}"))?;
    stop.send(true)?;
    for r in relays {
        r.await??;
    }

    let row = service
        .query_one(
            "SELECT count(*), count(DISTINCT id), count(DISTINCT source) FROM applied",
            &[],
        )
        .await?;
    let (n, distinct, sources_seen): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        (n, distinct, sources_seen),
        (1000, 1000, 2),
        "every event of both sources once"
    );
    let hwm_sources: i64 = service
        .query_one("SELECT count(DISTINCT source) FROM walrelay_consumer_hwm WHERE consumer_group = 'two-sources'", &[])
        .await?
        .get(0);
    assert_eq!(hwm_sources, 2, "one high-water mark per source");
    assert_eq!(counters.snapshot().processed, 1000);
    Ok(())
}

/// Records the Java consumer's marks dropped, summed over its lives (each
/// life prints its counters when they change, checked every 50 ms; a
/// killed life's last 50 ms are not counted).
fn java_duplicates(log: &str) -> u64 {
    let values = log.lines().filter_map(|l| {
        l.split_once("duplicates=")
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<u64>().ok())
    });
    let (mut total, mut last) = (0, 0);
    for v in values {
        if v < last {
            total += last;
        }
        last = v;
    }
    total + last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_java_consumer_applies_every_event_exactly_once_through_kill_9() -> Result<()> {
    if BrokerKind::from_env()? != BrokerKind::Kafka {
        eprintln!("skipped: the Java consumer runs on Apache Kafka only (WALRELAY_BROKER=kafka, scripts/test.sh)");
        return Ok(());
    }
    let Some(classpath) = java_classpath("examples/plain-consumer")? else {
        return Ok(());
    };
    let topic = "java-events";
    let cluster =
        tokio::task::spawn_blocking(|| PgCluster::start(ClusterOptions::default())).await??;
    let broker = tokio::task::spawn_blocking(TestBroker::start).await??;
    broker.create_topic(topic, 3)?;
    let s = Services {
        cluster,
        broker,
        dir: tempfile::tempdir()?,
    };
    let source = s.cluster.client().await?;
    source.batch_execute("CREATE DATABASE java_service").await?;
    let service = s
        .cluster
        .client_as("postgres", None, "java_service")
        .await?;
    let mut config = Config::default();
    config.postgres.url = s.source_url();
    walrelay::commands::setup::setup(&config).await?;
    let mut relay = s.spawn_relay()?;
    let mut consumer = s.spawn_java_consumer(&classpath, topic, "java_service")?;
    let count = || async {
        Ok::<i64, anyhow::Error>(
            service
                .query_one("SELECT count(*) FROM java_applied_events", &[])
                .await
                .map_or(0, |r| r.get::<_, i64>(0)),
        )
    };
    let logs = || {
        format!(
            "relay:\n{}\njava consumer:\n{}",
            s.read_log("relay.log"),
            s.read_log("java-consumer.log")
        )
    };

    // Each round commits 4 transactions of 200 events (and rolls one back),
    // waits until most of it is applied, and kills -9 the consumer (and, in
    // the first round, the relay too: replays on the wire, fence off).
    let mut expected = Vec::new();
    for round in 0..4 {
        expected.extend(write_round(&source, topic, "j", round * 5..round * 5 + 5).await?);
        let target = expected.len() as i64 - 200;
        await_condition(WAIT, Duration::from_millis(20), || async {
            Ok(count().await? >= target)
        })
        .await
        .with_context(|| format!("round {round}: no progress\n{}", logs()))?;
        kill9(&mut consumer)?;
        if round == 0 {
            kill9(&mut relay)?;
            relay = s.spawn_relay()?;
        }
        consumer = s.spawn_java_consumer(&classpath, topic, "java_service")?;
    }
    await_condition(WAIT, Duration::from_millis(100), || async {
        Ok(count().await? >= expected.len() as i64)
    })
    .await
    .with_context(logs)?;
    // SIGTERM before the JVM handles it would kill it: wait for the last
    // life's `started` (five lives).
    await_condition(WAIT, Duration::from_millis(50), || async {
        Ok(s.read_log("java-consumer.log").matches("started\n").count() >= 5)
    })
    .await
    .with_context(logs)?;
    let exit = sigterm(&mut consumer)?;
    assert!(
        exit.success(),
        "Java consumer's graceful stop: {exit:?}\n{}",
        logs()
    );
    let exit = sigterm(&mut relay)?;
    assert!(exit.success(), "relay graceful stop: {exit:?}\n{}", logs());

    let rows = service
        .query(
            "SELECT payload::jsonb ->> 'id', count(*) FROM java_applied_events GROUP BY 1",
            &[],
        )
        .await?;
    let counts: HashMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    let missing: Vec<_> = expected
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "never applied: {missing:?}");
    assert_eq!(counts.len(), expected.len(), "nothing rolled back applied");
    println!(
        "Java consumer, exactly once: {} events applied once each after 4 consumer kill -9 and 1 relay kill -9; \
         {} redelivered records dropped by the marks",
        expected.len(),
        java_duplicates(&s.read_log("java-consumer.log"))
    );
    Ok(())
}
