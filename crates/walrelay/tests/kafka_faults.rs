//! Broker faults and durability settings on three Apache Kafka brokers
//! (replication factor 3): what the relay does while a partition's
//! in-sync set is below `min.insync.replicas`, and what `walrelay status
//! --kafka` and the relay do when the relay's principal may not describe
//! a topic's configuration.
//!
//! Kafka only: three KRaft nodes of the pinned version, started once for
//! this binary's tests (which take turns), with a SASL_SSL listener for a
//! least-privilege principal besides the PLAINTEXT one (a super user).

mod support;

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context, Result};
use support::{apply_high_water_marks, spawn_relay, walrelay_status, Env};
use walrelay_testkit::{
    await_condition, read_until_quiet, AclOperation, AclResource, ClusterOptions, KafkaCluster,
    KafkaOptions, KafkaSecurity, ScramUser, TestCa,
};

const TOPIC: &str = "events";
/// The least-privilege principal (SASL_SSL, SCRAM-SHA-512).
const RELAY_USER: &str = "relay";
const RELAY_PASSWORD: &str = "relay-scram-pw-4b1f0c2e9a7d";

/// The three nodes, and the files a SASL_SSL client needs.
struct Cluster {
    kafka: Mutex<KafkaCluster>,
    plaintext: String,
    secure: String,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Result<Cluster> {
        let began = Instant::now();
        let ca = TestCa::new("walrelay test Kafka CA")?;
        let kafka = KafkaCluster::start(
            KafkaOptions {
                nodes: 3,
                security: Some(KafkaSecurity::new(
                    &ca,
                    vec![ScramUser::new(RELAY_USER, RELAY_PASSWORD)],
                )?),
                ..KafkaOptions::default()
            }
            .quick_to_notice_failures(),
        )?;
        println!("three Kafka nodes ready in {:?}", began.elapsed());
        let dir = tempfile::tempdir()?;
        ca.write_cert(&dir.path().join("ca.pem"))?;
        std::fs::write(dir.path().join("relay.password"), RELAY_PASSWORD)?;
        Ok(Cluster {
            plaintext: kafka.bootstrap_servers(),
            secure: kafka.secure_bootstrap_servers()?,
            kafka: Mutex::new(kafka),
            dir,
        })
    }

    fn kafka(&self) -> Result<std::sync::MutexGuard<'_, KafkaCluster>> {
        self.kafka
            .lock()
            .map_err(|_| anyhow!("an earlier test panicked holding the cluster"))
    }

    /// walrelay's `--kafka-property` flags for the least-privilege
    /// principal (the password as a `file:` reference).
    fn relay_flags(&self) -> Vec<String> {
        let path = |name: &str| -> PathBuf { self.dir.path().join(name) };
        [
            "security.protocol=SASL_SSL".to_owned(),
            "sasl.mechanism=SCRAM-SHA-512".to_owned(),
            format!("sasl.username={RELAY_USER}"),
            format!("sasl.password=file:{}", path("relay.password").display()),
            format!("ssl.ca.location={}", path("ca.pem").display()),
        ]
        .into_iter()
        .flat_map(|p| ["--kafka-property".to_owned(), p])
        .collect()
    }
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
/// One test at a time on the cluster.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The shared cluster (started by the first test) and the turn to use it.
async fn cluster() -> Result<(tokio::sync::MutexGuard<'static, ()>, &'static Cluster)> {
    let turn = TURN.lock().await;
    if CLUSTER.get().is_none() {
        let started = tokio::task::spawn_blocking(Cluster::start).await??;
        let _ = CLUSTER.set(started);
    }
    Ok((turn, CLUSTER.get().expect("set above")))
}

async fn emit_to(env: &Env, topic: &str, from: usize, transactions: usize) -> Result<()> {
    for t in from..from + transactions {
        env.client
            .batch_execute(&format!(
                "SELECT count(walrelay.emit('{topic}', 'k-' || (g % 7), jsonb_build_object('id', '{t}-' || g))) \
                 FROM generate_series(1, 100) g"
            ))
            .await?;
    }
    Ok(())
}

async fn emit(env: &Env, from: usize, transactions: usize) -> Result<()> {
    emit_to(env, TOPIC, from, transactions).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_min_isr_the_relay_confirms_nothing_and_resumes_by_itself() -> Result<()> {
    let (_turn, cluster) = cluster().await?;
    let bootstrap = cluster.plaintext.clone();
    // Every replica must be in sync for a write: one broker down is below.
    cluster
        .kafka()?
        .create_topic_with(TOPIC, 1, 3, &[("min.insync.replicas", "3")])?;

    let env = Env::postgres_only(ClusterOptions::default()).await?;
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    let metrics_addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let metrics_flag = metrics_addr.to_string();
    let mut relay = spawn_relay(
        &env,
        &bootstrap,
        &log,
        &["--log", "info", "--metrics-addr", &metrics_flag],
    )?;
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    emit(&env, 0, 5).await?;
    let first = env.current_wal_lsn().await?;
    await_condition(
        Duration::from_secs(90),
        Duration::from_millis(100),
        || async { Ok(env.confirmed_flush_lsn("walrelay").await? >= first) },
    )
    .await
    .with_context(log_text)?;

    // A follower dies: the set shrinks to two, below min ISR.
    let follower = cluster.kafka()?.kill_a_follower(TOPIC, 0)?;
    cluster.kafka()?.await_partition(
        TOPIC,
        0,
        Duration::from_secs(30),
        "the killed follower out of the in-sync set",
        |_, isr| !isr.contains(&follower),
    )?;
    emit(&env, 5, 5).await?;
    let second = env.current_wal_lsn().await?;

    // The relay reports why Kafka does not acknowledge (after
    // message.timeout.ms, 30 s: librdkafka retries NOT_ENOUGH_REPLICAS
    // until the session's delivery deadline, whose text names this cause) and
    // confirms nothing of the new events.
    let reported = await_condition(
        Duration::from_secs(90),
        Duration::from_millis(200),
        || async { Ok(log_text().contains("fewer in-sync replicas than")) },
    )
    .await;
    let confirmed = env.confirmed_flush_lsn("walrelay").await?;
    reported.with_context(log_text)?;
    ensure!(
        confirmed < second,
        "nothing past an unacknowledged event is confirmed (confirmed {confirmed}, events up to {second})"
    );
    let text = log_text();
    let said = text
        .lines()
        .rev()
        .find(|l| l.contains("fewer in-sync replicas than"))
        .unwrap_or_default()
        .to_owned();
    println!("while below min ISR the relay said: {said}");
    // Readiness and the metrics say so too: /readyz is 503 while Kafka
    // acknowledges nothing (or the session failed), and the delivery
    // timeout is counted.
    let mut readyz = None;
    await_condition(Duration::from_secs(30), Duration::from_millis(200), || {
        readyz = support::http_get(metrics_addr, "/readyz").ok();
        let not_ready = readyz.as_ref().is_some_and(|(status, _)| *status == 503);
        async move { Ok(not_ready) }
    })
    .await
    .with_context(|| format!("/readyz while below min ISR: {readyz:?}"))?;
    println!("/readyz while below min ISR: {readyz:?}");
    let (_, metrics) = support::http_get(metrics_addr, "/metrics")?;
    ensure!(
        metrics.lines().any(|l| l.starts_with(
            "walrelay_kafka_errors_total{kind=\"delivery\",code=\"MessageTimedOut\"}"
        )),
        "the delivery timeout is counted:\n{metrics}"
    );

    // The broker returns: the relay resumes by itself.
    let returned = Instant::now();
    tokio::task::spawn_blocking(move || cluster.kafka()?.restart_node(usize::try_from(follower)?))
        .await??;
    cluster.kafka()?.await_partition(
        TOPIC,
        0,
        Duration::from_secs(60),
        "all three in sync again",
        |_, isr| isr.len() == 3,
    )?;
    await_condition(
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async { Ok(env.confirmed_flush_lsn("walrelay").await? >= second) },
    )
    .await
    .with_context(log_text)?;
    println!(
        "confirmed everything {:?} after the broker returned",
        returned.elapsed()
    );
    relay.kill()?;
    relay.wait()?;

    let records = read_until_quiet(
        &bootstrap,
        &[TOPIC],
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await?;
    let (fresh, duplicates) = apply_high_water_marks(&records)?;
    let applied: usize = fresh.values().map(Vec::len).sum();
    ensure!(applied == 1000, "every event once: {applied} of 1000");
    println!(
        "{} records on the wire, {duplicates} duplicates",
        records.len()
    );
    // Records the leader appended while under min ISR are above the high
    // watermark until the follower is back: the fence of each later
    // session waits for them to become readable (kafka/requests/readable.rs), so it
    // skips them instead of writing them again.
    ensure!(
        duplicates == 0,
        "no duplicate of what was written while below min ISR: {duplicates}\n{}",
        log_text()
    );
    if log_text().contains("below its log end") {
        println!(
            "a session's fence waited out relay.fence_timeout for them, and the next one read them"
        );
    }
    Ok(())
}

/// `walrelay status --kafka` reads each topic's durability settings; a
/// principal denied DescribeConfigs gets them as unknown with the ACL to
/// grant, and the relay, running as that principal, leaves the replicated
/// topic unfenced (a replay duplicates rather than skips) and relays
/// everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_describe_configs_a_replicated_topic_is_unfenced_and_the_acl_is_named() -> Result<()>
{
    const GUARDED: &str = "guarded";
    let (_turn, cluster) = cluster().await?;
    {
        let kafka = cluster.kafka()?;
        kafka.create_topic_with(
            GUARDED,
            1,
            3,
            &[
                ("min.insync.replicas", "2"),
                ("unclean.leader.election.enable", "false"),
            ],
        )?;
        kafka.await_fully_replicated(GUARDED, Duration::from_secs(60))?;
        // What the relay needs to produce and fence, and nothing else.
        kafka.grant(
            &format!("User:{RELAY_USER}"),
            &AclResource::topic(GUARDED),
            &[AclOperation::Write, AclOperation::Read],
        )?;
    }
    let env = Env::postgres_only(ClusterOptions::default()).await?;
    walrelay::commands::setup::setup(&env.config(&cluster.plaintext)).await?;
    let topic_of = |json: &serde_json::Value, topic: &str| -> Result<serde_json::Value> {
        json["kafka"]["topics"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["topic"] == topic))
            .cloned()
            .with_context(|| format!("{topic} in {json:#}"))
    };

    // The super user reads everything: Kafka 4.1 holds the high watermark
    // under min ISR (asked on the PLAINTEXT listener), so the fence is on.
    let (code, out) = walrelay_status(
        &env,
        &["--bootstrap-servers", &cluster.plaintext],
        &["--kafka", "--topic", GUARDED, "--json"],
    )?;
    ensure!(
        code == 0,
        "status exits 0 with a healthy slot: {code}\n{out}"
    );
    let json: serde_json::Value = serde_json::from_str(&out)?;
    ensure!(json["kafka"]["strict_min_isr"] == "yes", "{json:#}");
    let guarded = topic_of(&json, GUARDED)?;
    ensure!(
        guarded["replication_factor"] == 3
            && guarded["min_insync_replicas"] == 2
            && guarded["unclean_leader_election"] == false
            && guarded["fenced"] == true
            && guarded["risks"].as_array().is_some_and(Vec::is_empty),
        "the settings as created, fence on, no risk: {guarded:#}"
    );
    let (_, text) = walrelay_status(
        &env,
        &["--bootstrap-servers", &cluster.plaintext],
        &["--topic", GUARDED],
    )?;
    ensure!(
        text.contains("topic guarded: replication factor 3, min.insync.replicas 2, unclean.leader.election.enable false, tail fence on"),
        "the text form: {text}"
    );

    // The least-privilege principal may not describe configs.
    let flags = cluster.relay_flags();
    let mut global: Vec<&str> = vec!["--bootstrap-servers", &cluster.secure];
    global.extend(flags.iter().map(String::as_str));
    let (_, out) = walrelay_status(&env, &global, &["--kafka", "--topic", GUARDED, "--json"])?;
    let json: serde_json::Value = serde_json::from_str(&out)?;
    let guarded = topic_of(&json, GUARDED)?;
    let unknown = guarded["min_insync_replicas_unknown"]
        .as_str()
        .unwrap_or_default();
    let because = guarded["unfenced_because"].as_str().unwrap_or_default();
    ensure!(
        guarded["replication_factor"] == 3
            && guarded["min_insync_replicas"].is_null()
            && unknown.contains("DescribeConfigs")
            && unknown.contains("not authorized")
            && guarded["fenced"] == false
            && because.contains("grant the relay's principal DescribeConfigs"),
        "denied DescribeConfigs: unknown, unfenced, the ACL named: {guarded:#}"
    );
    println!("denied DescribeConfigs, status says: {unknown}; fence off: {because}");

    // The relay as that principal: it runs, warns, and relays everything.
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    let mut args: Vec<&str> = vec!["--log", "info"];
    args.extend(flags.iter().map(String::as_str));
    let mut relay = spawn_relay(&env, &cluster.secure, &log, &args)?;
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    emit_to(&env, GUARDED, 0, 3).await?;
    let end = env.current_wal_lsn().await?;
    await_condition(
        Duration::from_secs(90),
        Duration::from_millis(100),
        || async { Ok(env.confirmed_flush_lsn("walrelay").await? >= end) },
    )
    .await
    .with_context(log_text)?;
    relay.kill()?;
    relay.wait()?;
    let text = log_text();
    ensure!(
        text.lines()
            .any(|l| l.contains("tail fence off for this topic")
                && l.contains(GUARDED)
                && l.contains("grant the relay's principal DescribeConfigs")),
        "the relay's WARN names the ACL:\n{text}"
    );
    let records = read_until_quiet(
        &cluster.plaintext,
        &[GUARDED],
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await?;
    let (fresh, duplicates) = apply_high_water_marks(&records)?;
    let applied: usize = fresh.values().map(Vec::len).sum();
    ensure!(
        applied == 300 && duplicates == 0,
        "every event once: {applied} of 300, {duplicates} duplicates"
    );
    Ok(())
}
