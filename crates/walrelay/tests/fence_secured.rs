//! The tail fence on the recommended production set-up: three Apache
//! Kafka nodes whose clients connect over SASL_SSL (SCRAM-SHA-512, a
//! certificate from a test CA), topics of three replicas with
//! `min.insync.replicas=2`. walrelay's own requests (the ApiVersions probe
//! that tells Kafka 3.7+, the log-end wait) go over the producer's TLS
//! and SASL settings, so the topics are fenced and a `kill -9` leaves no
//! duplicate on the wire (docs/contract.md, "Visible is not durable").
//! And the log-end wait reads the replicas' high watermark, not the last
//! stable offset another producer's open transaction holds back.
//!
//! Kafka-only: runs with `WALRELAY_BROKER=kafka` (the Apache Kafka stage
//! of `scripts/test.sh`); the tests share one cluster, one at a time.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use support::{key_of, spawn_relay, Env, WAIT};
use walrelay_testkit::{
    await_condition, read_topics, read_until_quiet, BrokerKind, ClusterOptions, KafkaCluster,
    KafkaOptions, KafkaSecurity, ScramUser, TestCa,
};

const RELAY: &str = "relay";
const RELAY_PASSWORD: &str = "relay-scram-pw-5be0cd19137e2179";
const POLL: Duration = Duration::from_millis(50);

/// The secured cluster and the files its clients use.
struct Cluster {
    kafka: KafkaCluster,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Result<Cluster> {
        let began = Instant::now();
        let ca = TestCa::new("walrelay test Kafka CA")?;
        let mut security = KafkaSecurity::new(&ca, vec![ScramUser::new(RELAY, RELAY_PASSWORD)])?;
        // ACLs are kafka_security.rs's subject; here the relay may do
        // everything, DescribeConfigs included.
        security.super_users.push(format!("User:{RELAY}"));
        let kafka = KafkaCluster::start(KafkaOptions {
            nodes: 3,
            security: Some(security),
            ..KafkaOptions::default()
        })?;
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("ca.pem"), kafka.ca_pem().expect("secured"))?;
        std::fs::write(dir.path().join("relay.password"), RELAY_PASSWORD)?;
        println!("three secured Kafka nodes ready in {:?}", began.elapsed());
        Ok(Cluster { kafka, dir })
    }

    fn secure(&self) -> String {
        self.kafka
            .secure_bootstrap_servers()
            .expect("started secured")
    }

    /// The admin path (PLAINTEXT, a super user): topics, reading back.
    fn admin(&self) -> String {
        self.kafka.bootstrap_servers()
    }

    /// `--kafka-property` flags of the relay user, the password as a
    /// `file:` reference.
    fn relay_flags(&self) -> Vec<String> {
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        [
            "security.protocol=SASL_SSL".to_owned(),
            "sasl.mechanism=SCRAM-SHA-512".to_owned(),
            format!("sasl.username={RELAY}"),
            format!("sasl.password=file:{}", path("relay.password")),
            format!("ssl.ca.location={}", path("ca.pem")),
        ]
        .into_iter()
        .flat_map(|p| ["--kafka-property".to_owned(), p])
        .collect()
    }

    /// A topic of three replicas that needs two in sync.
    fn create_topic(&self, name: &str, partitions: i32) -> Result<()> {
        self.kafka
            .create_topic_with(name, partitions, 3, &[("min.insync.replicas", "2")])
    }
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
/// One test at a time on the cluster.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The shared cluster, started by the first test, and the turn to use it;
/// `None` when the tests do not run on Apache Kafka.
async fn cluster() -> Result<Option<(tokio::sync::MutexGuard<'static, ()>, &'static Cluster)>> {
    if BrokerKind::from_env()? != BrokerKind::Kafka {
        eprintln!("skipped: Apache Kafka only (WALRELAY_BROKER=kafka, scripts/test.sh)");
        return Ok(None);
    }
    let turn = SERIAL.lock().await;
    if CLUSTER.get().is_none() {
        let cluster = tokio::task::spawn_blocking(Cluster::start).await??;
        let _ = CLUSTER.set(cluster);
    }
    Ok(Some((turn, CLUSTER.get().expect("set above"))))
}

/// A relay over SASL_SSL routing raw `orders` messages to `topic`, logging
/// at INFO (the fence's lines); `extra` flags after the others.
fn relay(env: &Env, cluster: &Cluster, topic: &str, log: &Path, extra: &[&str]) -> Result<Child> {
    relay_on(
        env,
        &cluster.secure(),
        cluster.relay_flags(),
        topic,
        log,
        extra,
    )
}

/// [`relay`] on `bootstrap` with the connection flags `connection`.
fn relay_on(
    env: &Env,
    bootstrap: &str,
    connection: Vec<String>,
    topic: &str,
    log: &Path,
    extra: &[&str],
) -> Result<Child> {
    let mut args: Vec<String> = ["--route", &format!("orders={topic}"), "--log", "info"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    args.extend(connection);
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn_relay(env, bootstrap, log, &args)
}

/// `n` transactions of 5 raw `orders` messages, values `<tag>-<tx>-<i>`.
async fn emit(env: &Env, tag: &str, n: usize) -> Result<usize> {
    for t in 0..n {
        env.client
            .batch_execute(&format!(
                "SELECT pg_logical_emit_message(true, 'orders', '{tag}-{t}-' || g) FROM generate_series(1, 5) g"
            ))
            .await?;
    }
    Ok(5 * n)
}

fn text(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

fn sigterm(relay: &mut Child, log: &Path) -> Result<()> {
    ensure!(std::process::Command::new("kill")
        .args(["-TERM", &relay.id().to_string()])
        .status()?
        .success());
    let exit = relay.wait()?;
    ensure!(
        exit.success(),
        "graceful stop exits 0, got {exit:?}: {}",
        text(log)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_sasl_ssl_replicated_topics_are_fenced_and_a_kill_9_writes_nothing_twice() -> Result<()>
{
    let Some((_turn, cluster)) = cluster().await? else {
        return Ok(());
    };
    let topic = "secured-orders";
    cluster.create_topic(topic, 3)?;
    let env = Env::postgres_only(ClusterOptions::default()).await?;
    walrelay::commands::setup::setup(&env.config(&cluster.secure())).await?;
    let dir = tempfile::tempdir()?;
    let log: PathBuf = dir.path().join("relay.log");

    // A relay that confirms nothing is killed once Kafka holds its
    // records: the next one replays them all.
    let mut written = emit(&env, "a", 4).await?;
    let confirmed = env.confirmed_flush_lsn("walrelay").await?;
    let mut first = relay(&env, cluster, topic, &log, &["--status-interval", "30s"])?;
    let before = read_topics(&cluster.admin(), &[topic], written, WAIT).await;
    first.kill()?;
    first.wait()?;
    let before = before.with_context(|| text(&log))?;
    ensure!(
        before.len() == written,
        "{} records before the kill",
        before.len()
    );
    ensure!(
        env.confirmed_flush_lsn("walrelay").await? == confirmed,
        "the killed relay confirmed something: the replay would not cover its records"
    );

    written += emit(&env, "b", 2).await?;
    let end = env.current_wal_lsn().await?;
    let mut second = relay(&env, cluster, topic, &log, &[])?;
    await_condition(WAIT, POLL, || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= end)
    })
    .await
    .with_context(|| text(&log))?;
    sigterm(&mut second, &log)?;

    let records =
        read_until_quiet(&cluster.admin(), &[topic], Duration::from_secs(1), WAIT).await?;
    let mut counts: BTreeMap<_, usize> = BTreeMap::new();
    for r in &records {
        *counts.entry(key_of(r)).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    let log_text = text(&log);
    ensure!(
        twice.is_empty() && counts.len() == written && records.len() == written,
        "{written} events, {} keys, {} records, twice: {:?}; log:\n{log_text}",
        counts.len(),
        records.len(),
        twice.iter().take(5).collect::<Vec<_>>()
    );
    ensure!(
        log_text.contains("strict_min_isr=yes"),
        "the brokers were asked over TLS: {log_text}"
    );
    ensure!(
        log_text.contains("fence_key=")
            && log_text.contains("the replay caught up with the partition"),
        "the topic was fenced: {log_text}"
    );
    Ok(())
}

/// Another producer's transaction, begun on `topic` and left open: it
/// holds the partition's last stable offset at its first record.
fn hanging_transaction(bootstrap: &str, topic: &str) -> Result<rdkafka::producer::BaseProducer> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", "another-application")
        .set("transaction.timeout.ms", "600000")
        .create()?;
    producer.init_transactions(WAIT)?;
    producer.begin_transaction()?;
    for partition in 0..3 {
        producer
            .send(
                BaseRecord::<str, str>::to(topic)
                    .partition(partition)
                    .payload("uncommitted"),
            )
            .map_err(|(e, _)| e)?;
    }
    producer.flush(WAIT)?;
    Ok(producer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_producers_open_transaction_does_not_hold_the_fence_wait() -> Result<()> {
    let Some((_turn, cluster)) = cluster().await? else {
        return Ok(());
    };
    let topic = "secured-open-transaction";
    cluster.create_topic(topic, 3)?;
    let open = hanging_transaction(&cluster.admin(), topic)?;
    let env = Env::postgres_only(ClusterOptions::default()).await?;
    walrelay::commands::setup::setup(&env.config(&cluster.admin())).await?;
    let dir = tempfile::tempdir()?;
    let log: PathBuf = dir.path().join("relay.log");
    let config = dir.path().join("walrelay.toml");
    std::fs::write(
        &config,
        "[relay]\nfence_timeout = \"3s\"\nmax_backoff = \"1s\"\n",
    )?;

    let written = emit(&env, "t", 3).await?;
    let end = env.current_wal_lsn().await?;
    // On the PLAINTEXT listener: the watermark is the subject here, and
    // before walrelay spoke TLS it waited on plaintext listeners only.
    let mut relay = relay_on(
        &env,
        &cluster.admin(),
        Vec::new(),
        topic,
        &log,
        &["--config", config.to_str().unwrap()],
    )?;
    // The replicas hold everything: the wait ends at once. Reading the
    // last stable offset instead, it would wait behind the transaction
    // until relay.fence_timeout, session after session, blaming the
    // in-sync replicas.
    let confirmed = await_condition(WAIT, POLL, || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= end
            || text(&log).contains("to make what they hold readable"))
    })
    .await;
    let log_text = text(&log);
    sigterm(&mut relay, &log)?;
    confirmed.with_context(|| log_text.clone())?;
    ensure!(
        !log_text.contains("to make what they hold readable"),
        "the fence waited behind another producer's open transaction:\n{log_text}"
    );
    {
        use rdkafka::producer::Producer;
        open.abort_transaction(WAIT)?;
    }
    let records =
        read_until_quiet(&cluster.admin(), &[topic], Duration::from_secs(1), WAIT).await?;
    ensure!(
        records.len() == written,
        "{} records read (read_committed) for {written} events",
        records.len()
    );
    Ok(())
}

/// Moves the WAL position on by about `segments` × 16 MB.
async fn write_wal(env: &Env, segments: usize) -> Result<()> {
    for _ in 0..segments {
        env.client
            .batch_execute("INSERT INTO busy (v) VALUES ('x'); SELECT pg_switch_wal();")
            .await?;
    }
    Ok(())
}

/// A restore from a base backup on the recommended set-up, with the WAL
/// written past the old keys before the relay runs again: the replay does
/// not reproduce the topic's tail, so the relay refuses and confirms
/// nothing. (Before walrelay's own requests spoke TLS, these topics were
/// unfenced and the restore passed unseen.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_whose_wal_passed_the_old_keys_is_refused_over_sasl_ssl() -> Result<()> {
    let Some((_turn, cluster)) = cluster().await? else {
        return Ok(());
    };
    let topic = "secured-restored";
    cluster.create_topic(topic, 1)?;
    let mut env = Env::postgres_only(ClusterOptions::default()).await?;
    walrelay::commands::setup::setup(&env.config(&cluster.secure())).await?;
    let backup = env.cluster.dir().join("backup");
    env.cluster.base_backup(&backup)?;
    write_wal(&env, 7).await?;
    let dir = tempfile::tempdir()?;
    let log: PathBuf = dir.path().join("relay.log");
    emit(&env, "before", 10).await?;
    let end = env.current_wal_lsn().await?;
    let mut first = relay(&env, cluster, topic, &log, &[])?;
    await_condition(WAIT, POLL, || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= end)
    })
    .await
    .with_context(|| text(&log))?;
    sigterm(&mut first, &log)?;

    env.cluster.restore_base_backup(&backup)?;
    env.client = env.cluster.client().await?;
    // A slot made by hand (setup refuses, see restore.rs), new events,
    // and WAL past the old keys before the relay runs.
    env.client
        .batch_execute("SELECT pg_create_logical_replication_slot('walrelay', 'pgoutput')")
        .await?;
    let start = env.confirmed_flush_lsn("walrelay").await?;
    emit(&env, "after", 4).await?;
    write_wal(&env, 9).await?;
    let mut second = relay(&env, cluster, topic, &log, &[])?;
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = second.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            second.kill()?;
            anyhow::bail!("the relay kept running: {}", text(&log));
        }
        tokio::time::sleep(POLL).await;
    };
    let log_text = text(&log);
    ensure!(!status.success(), "the relay must refuse: {log_text}");
    ensure!(
        log_text.contains("the replay reached") && log_text.contains("set relay.source_id"),
        "{log_text}"
    );
    ensure!(
        env.confirmed_flush_lsn("walrelay").await? == start,
        "nothing is confirmed under a sequence that went back"
    );
    Ok(())
}
