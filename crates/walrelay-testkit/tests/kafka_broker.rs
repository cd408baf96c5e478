//! Runs real Apache Kafka nodes (the jars `scripts/install-kafka.sh`
//! installs, or `$WALRELAY_KAFKA_HOME`).

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use walrelay_testkit::{
    partition_count, read_topics, BrokerKind, KafkaCluster, KafkaOptions, SharedKafka,
};

const TIMEOUT: Duration = Duration::from_secs(30);

fn producer(bootstrap: &str) -> anyhow::Result<FutureProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "20000")
        .create()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_starts_in_seconds_keeps_real_high_watermarks_and_adds_partitions(
) -> anyhow::Result<()> {
    let began = Instant::now();
    let kafka =
        tokio::task::spawn_blocking(|| KafkaCluster::start(KafkaOptions::default())).await??;
    println!(
        "Apache Kafka node ready in {:?} ({:?} in start)",
        began.elapsed(),
        kafka.started_in()
    );
    let bootstrap = kafka.bootstrap_servers();
    assert_eq!(kafka.nodes().len(), 1);
    assert_eq!(bootstrap, format!("127.0.0.1:{}", kafka.nodes()[0].port()));
    kafka.create_topic("orders", 3)?;
    kafka.create_topic("orders", 3)?; // an existing topic of that size
    assert_eq!(partition_count(&bootstrap, "orders")?, 3);

    let p = producer(&bootstrap)?;
    for i in 0..10 {
        p.send(
            FutureRecord::to("orders")
                .partition(1)
                .key(&format!("k{i}"))
                .payload("v"),
            Duration::from_secs(20),
        )
        .await
        .map_err(|(e, _)| e)?;
    }
    let records = read_topics(&bootstrap, &["orders"], 10, TIMEOUT).await?;
    assert_eq!(records.len(), 10);
    // The high watermark is the offset after the last record (Tansu's is
    // the start of the last batch).
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    let (low, high) = consumer.fetch_watermarks("orders", 1, Duration::from_secs(10))?;
    assert_eq!((low, high), (0, 10));

    kafka.add_partitions("orders", 5)?;
    assert_eq!(partition_count(&bootstrap, "orders")?, 5);
    kafka.delete_topics(&["orders"])?;
    assert!(partition_count(&bootstrap, "orders").is_err());

    let dir = kafka.dir().to_path_buf();
    let pid = kafka.nodes()[0].pid().expect("running");
    drop(kafka);
    assert!(!dir.exists(), "{} removed on drop", dir.display());
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the JVM is gone"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_hands_the_node_back_without_the_tests_topics() -> anyhow::Result<()> {
    let first = tokio::task::spawn_blocking(SharedKafka::lease).await??;
    let bootstrap = first.bootstrap_servers();
    first.create_topic("leftover", 2)?;
    drop(first);
    let second = tokio::task::spawn_blocking(SharedKafka::lease).await??;
    assert_eq!(second.bootstrap_servers(), bootstrap, "the same node");
    assert!(
        partition_count(&bootstrap, "leftover").is_err(),
        "the first lease's topic is gone"
    );
    // A topic of the same name can be made again at once.
    second.create_topic("leftover", 4)?;
    assert_eq!(partition_count(&bootstrap, "leftover")?, 4);
    Ok(())
}

#[test]
fn broker_kinds_parse() {
    assert_eq!("kafka".parse::<BrokerKind>().unwrap(), BrokerKind::Kafka);
    assert_eq!("Tansu".parse::<BrokerKind>().unwrap(), BrokerKind::Tansu);
    let err = "redpanda".parse::<BrokerKind>().unwrap_err().to_string();
    assert!(err.contains("WALRELAY_BROKER"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_form_one_cluster_with_replicated_topics() -> anyhow::Result<()> {
    let began = Instant::now();
    let kafka = tokio::task::spawn_blocking(|| {
        KafkaCluster::start(KafkaOptions {
            nodes: 3,
            ..Default::default()
        })
    })
    .await??;
    println!("three Apache Kafka nodes ready in {:?}", began.elapsed());
    let bootstrap = kafka.bootstrap_servers();
    assert_eq!(bootstrap.split(',').count(), 3);
    assert_eq!(kafka.replication_factor(), 3);
    kafka.create_topic("replicated", 3)?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    let md = consumer.fetch_metadata(Some("replicated"), Duration::from_secs(10))?;
    assert_eq!(md.brokers().len(), 3);
    for p in md.topics()[0].partitions() {
        assert_eq!(p.replicas().len(), 3, "{:?}", p.replicas());
        assert_eq!(p.isr().len(), 3, "{:?}", p.isr());
    }
    let p = producer(&bootstrap)?;
    p.send(
        FutureRecord::to("replicated").key("k").payload("v"),
        Duration::from_secs(20),
    )
    .await
    .map_err(|(e, _)| e)?;
    assert_eq!(
        read_topics(&bootstrap, &["replicated"], 1, TIMEOUT)
            .await?
            .len(),
        1
    );
    // A node killed and restarted comes back with its data.
    let mut kafka = kafka;
    tokio::task::block_in_place(|| kafka.restart_node(2))?;
    assert!(kafka.restart_node(4).is_err());
    assert_eq!(
        read_topics(&bootstrap, &["replicated"], 1, TIMEOUT)
            .await?
            .len(),
        1
    );
    Ok(())
}

/// Set in the environment of the child process
/// [`a_node_still_pooled_when_the_process_exits_is_killed_with_it`] starts.
const EXIT_CHILD_ENV: &str = "WALRELAY_TESTKIT_EXIT_CHILD";

/// In the child: leases a node, hands it back to the pool, prints its
/// JVM's pid and directory, and exits at once (statics are never dropped).
#[test]
fn exit_child() {
    if std::env::var_os(EXIT_CHILD_ENV).is_none() {
        return;
    }
    let lease = SharedKafka::lease().expect("a Kafka node");
    let node = &lease.nodes()[0];
    println!(
        "CHILD pid={} dir={}",
        node.pid().expect("running"),
        node.dir().display()
    );
    drop(lease);
    std::process::exit(0);
}

#[test]
fn a_node_still_pooled_when_the_process_exits_is_killed_with_it() -> anyhow::Result<()> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(["--exact", "exit_child", "--nocapture", "--test-threads=1"])
        .env(EXIT_CHILD_ENV, "1")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("CHILD ").map(|(_, rest)| rest))
        .ok_or_else(|| anyhow::anyhow!("no CHILD line: {stdout}"))?;
    let pid = line
        .split(' ')
        .find_map(|w| w.strip_prefix("pid="))
        .unwrap_or_default();
    let dir = line
        .split(' ')
        .find_map(|w| w.strip_prefix("dir="))
        .unwrap_or_default()
        .to_owned();
    let proc_path = std::path::PathBuf::from(format!("/proc/{pid}"));
    // The watchdog acts on the closed pipe: wait for it, not for a time.
    let deadline = Instant::now() + TIMEOUT;
    while (proc_path.exists() || std::path::Path::new(&dir).exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !proc_path.exists(),
        "the JVM {pid} outlived its test process"
    );
    assert!(
        !std::path::Path::new(&dir).exists(),
        "{dir} was left behind"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_node_authenticates_scram_users_over_tls_and_enforces_acls() -> anyhow::Result<()>
{
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use walrelay_testkit::{AclOperation, AclResource, KafkaSecurity, ScramUser, TestCa};

    let ca = TestCa::new("walrelay test Kafka CA")?;
    let security = KafkaSecurity::new(&ca, vec![ScramUser::new("writer", "writer-secret")])?;
    let kafka = tokio::task::spawn_blocking(move || {
        KafkaCluster::start(KafkaOptions {
            security: Some(security),
            ..Default::default()
        })
    })
    .await??;
    let dir = tempfile::tempdir()?;
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, kafka.ca_pem().expect("secured"))?;
    kafka.create_topic("secured", 1)?;
    let secure = kafka.secure_bootstrap_servers()?;
    assert_ne!(secure, kafka.bootstrap_servers());
    let writer = |password: &str| -> anyhow::Result<FutureProducer> {
        Ok(ClientConfig::new()
            .set("bootstrap.servers", &secure)
            .set("security.protocol", "SASL_SSL")
            .set("sasl.mechanism", "SCRAM-SHA-512")
            .set("sasl.username", "writer")
            .set("sasl.password", password)
            .set("ssl.ca.location", ca_path.to_str().unwrap())
            .set("message.timeout.ms", "5000")
            .create()?)
    };
    let send = |p: FutureProducer| async move {
        p.send(
            FutureRecord::to("secured").key("k").payload("v"),
            Duration::from_secs(10),
        )
        .await
        .map(|_| ())
        .map_err(|(e, _)| e)
    };
    let denied = send(writer("writer-secret")?).await.unwrap_err();
    assert_eq!(
        denied.rdkafka_error_code(),
        Some(RDKafkaErrorCode::TopicAuthorizationFailed),
        "{denied}"
    );
    let topic = AclResource::topic("secured");
    let ops = [AclOperation::Write, AclOperation::Describe];
    kafka.grant("User:writer", &topic, &ops)?;
    assert_eq!(kafka.allowed("User:writer", &topic)?, ops);
    send(writer("writer-secret")?).await?;
    let wrong = send(writer("not-the-password")?).await.unwrap_err();
    assert!(matches!(wrong, KafkaError::MessageProduction(_)), "{wrong}");
    kafka.revoke("User:writer", &topic, &ops)?;
    assert_eq!(kafka.allowed("User:writer", &topic)?, []);
    // The test's own PLAINTEXT admin path reads everything.
    let records = read_topics(&kafka.bootstrap_servers(), &["secured"], 1, TIMEOUT).await?;
    assert_eq!(records.len(), 1);
    Ok(())
}
