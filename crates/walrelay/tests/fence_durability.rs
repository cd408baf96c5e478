//! Visible is not durable: the tail fence's durability rule on three
//! Apache Kafka brokers (docs/contract.md, "Visible is not durable").
//!
//! On Kafka before 3.7, a record appended while the in-sync set was full,
//! whose set then shrinks below `min.insync.replicas` before it is
//! replicated everywhere, becomes readable although its producer got
//! `NOT_ENOUGH_REPLICAS_AFTER_APPEND` and no acknowledgement. A fence that
//! skipped it would let walrelay confirm past an event Kafka never promised
//! to keep. Kafka 3.7 made the high watermark wait under min ISR
//! (KAFKA-15583), with or without Eligible Leader Replicas. Each test first
//! shows the broker's behaviour with a plain producer, then checks the
//! fence's decision for topics of each kind, through the relay's own code
//! (the ApiVersions request, DescribeConfigs, the tail read).
//!
//! Kafka only: three KRaft nodes of 3.6.2 (`scripts/install-kafka.sh
//! 3.6.2`) in one test, of the pinned 4.1.1 formatted without ELR in the
//! other; the topics have one partition.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use walrelay::config::Config;
use walrelay::engine::fence::durability::NotProvenAcked;
use walrelay::engine::fence::session::SessionFence;
use walrelay::engine::fence::{TopicFence, Unfenced};
use walrelay::kafka::client::{client_config, KafkaClient};
use walrelay::kafka::requests::api_versions::StrictMinIsr;
use walrelay_pgoutput::Lsn;
use walrelay_testkit::{read_until_quiet, KafkaCluster, KafkaHome, KafkaOptions};

/// Three nodes of `home`, with `features` at format, which notice a killed
/// broker within seconds.
async fn three_nodes(home: KafkaHome, features: Vec<(String, u16)>) -> Result<KafkaCluster> {
    let began = Instant::now();
    let what = format!("{} {features:?}", home.dir().display());
    let kafka = tokio::task::spawn_blocking(move || {
        KafkaCluster::start_with_home(
            home,
            KafkaOptions {
                nodes: 3,
                features,
                ..KafkaOptions::default()
            }
            .quick_to_notice_failures(),
        )
    })
    .await??;
    println!("three Kafka nodes ({what}) ready in {:?}", began.elapsed());
    Ok(kafka)
}

/// A plain producer that reports the broker's answer as it is: acks=all,
/// no idempotence, no retries.
fn plain_producer(bootstrap: &str, request_timeout: Duration) -> Result<FutureProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "false")
        .set("retries", "0")
        .set("linger.ms", "0")
        .set(
            "request.timeout.ms",
            request_timeout.as_millis().to_string(),
        )
        .set(
            "message.timeout.ms",
            (request_timeout + Duration::from_secs(10))
                .as_millis()
                .to_string(),
        )
        .create()?)
}

async fn send(producer: &FutureProducer, topic: &str, value: &str) -> Result<(), KafkaError> {
    producer
        .send(
            FutureRecord::<(), _>::to(topic).partition(0).payload(value),
            Duration::from_secs(0),
        )
        .await
        .map(|_| ())
        .map_err(|(e, _)| e)
}

async fn values_readable(bootstrap: &str, topic: &str) -> Result<Vec<String>> {
    let records = read_until_quiet(
        bootstrap,
        &[topic],
        Duration::from_secs(2),
        Duration::from_secs(30),
    )
    .await?;
    Ok(records
        .iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect())
}

/// What [`append_then_shrink`] leaves: the producer's pending answer for
/// the appended record (the producer must live until it comes), and the
/// node killed.
struct Shrunk {
    producer: FutureProducer,
    answer: DeliveryFuture,
    killed: usize,
}

/// Creates `topic` (3 replicas, `min.insync.replicas=3`), writes one
/// acknowledged record, kills a follower, and appends another at once:
/// the controller still counts the dead broker in sync (it notices only
/// after `broker.session.timeout.ms`), so the append passes the min-ISR
/// check and then waits for a replica that never fetches. Returns once the
/// in-sync set has shrunk to the two live replicas.
async fn append_then_shrink(kafka: &mut KafkaCluster, topic: &str) -> Result<Shrunk> {
    let bootstrap = kafka.bootstrap_servers();
    kafka.create_topic_with(topic, 1, 3, &[("min.insync.replicas", "3")])?;
    let producer = plain_producer(&bootstrap, Duration::from_secs(40))?;
    send(&producer, topic, "acknowledged")
        .await
        .context("a record with all three replicas in sync")?;
    let (_, isr) = kafka.partition_state(topic, 0)?;
    ensure!(isr.len() == 3, "all three in sync first: {isr:?}");
    let follower = kafka.kill_a_follower(topic, 0)?;
    let answer = producer
        .send_result(
            FutureRecord::<(), _>::to(topic)
                .partition(0)
                .payload("appended"),
        )
        .map_err(|(e, _)| e)?;
    let (_, isr) = kafka.await_partition(
        topic,
        0,
        Duration::from_secs(30),
        "the killed follower out of the in-sync set",
        |_, isr| !isr.contains(&follower),
    )?;
    println!("{topic}: follower {follower} killed, in sync now {isr:?}");
    Ok(Shrunk {
        producer,
        answer,
        killed: usize::try_from(follower)?,
    })
}

/// The fence's decision for `topic` through the relay's code, as a session
/// would take it when it first writes there.
async fn fence_of(bootstrap: &str, topic: &str) -> Result<TopicFence> {
    let mut config = Config::default();
    config.kafka.bootstrap_servers = bootstrap.to_owned();
    config.relay.fence = true;
    config.relay.fence_timeout = Duration::from_secs(20);
    let fence = SessionFence::new(
        &config,
        Some(client_config(&config.kafka, KafkaClient::Fence)?),
        Some(client_config(&config.kafka, KafkaClient::Admin)?),
        "durability-test",
        Lsn(0),
    );
    let state = fence.open(&Arc::from(topic), 1, None).await?;
    Ok(state.fence)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_kafka_3_7_a_readable_record_may_be_unacknowledged_so_replicated_topics_are_not_fenced(
) -> Result<()> {
    let mut kafka = three_nodes(KafkaHome::version("3.6.2")?, Vec::new()).await?;
    let bootstrap = kafka.bootstrap_servers();

    // Reproduce: readable, never acknowledged.
    let shrunk = append_then_shrink(&mut kafka, "shrunk").await?;
    let began = Instant::now();
    let answer = shrunk
        .answer
        .await
        .context("the producer dropped the record")?;
    println!(
        "the produce answered {answer:?} after a further {:?}",
        began.elapsed()
    );
    match &answer {
        Err((KafkaError::MessageProduction(RDKafkaErrorCode::NotEnoughReplicasAfterAppend), _)) => {
        }
        other => anyhow::bail!("expected NOT_ENOUGH_REPLICAS_AFTER_APPEND, got {other:?}"),
    }
    drop(shrunk.producer);
    let readable = values_readable(&bootstrap, "shrunk").await?;
    ensure!(
        readable == ["acknowledged", "appended"],
        "the unacknowledged record is readable (committed reader): {readable:?}"
    );
    let killed = shrunk.killed;
    let kafka =
        tokio::task::spawn_blocking(move || kafka.restart_node(killed).map(|()| kafka)).await??;

    // The rule: replicated topics with min ISR >= 2 stay unfenced there.
    kafka.create_topic_with("rf3-min2", 1, 3, &[("min.insync.replicas", "2")])?;
    kafka.create_topic_with("rf3-min1", 1, 3, &[("min.insync.replicas", "1")])?;
    kafka.create_topic_with("rf1", 1, 1, &[])?;
    match fence_of(&bootstrap, "rf3-min2").await? {
        TopicFence::Unfenced(Unfenced::NotProvenAcked(
            NotProvenAcked::HighWatermarkUnderMinIsr {
                replication_factor: 3,
                min_insync_replicas: 2,
                strict_min_isr: StrictMinIsr::No,
            },
        )) => {}
        other => anyhow::bail!("rf3-min2 on Kafka 3.6 must stay unfenced, got {other:?}"),
    }
    ensure!(
        matches!(
            fence_of(&bootstrap, "shrunk").await?,
            TopicFence::Unfenced(Unfenced::NotProvenAcked(_))
        ),
        "the topic of the reproduction stays unfenced"
    );
    for fenced in ["rf3-min1", "rf1"] {
        ensure!(
            matches!(fence_of(&bootstrap, fenced).await?, TopicFence::Fenced(_)),
            "{fenced}: a readable record there was acknowledged, so it is fenced"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_kafka_3_7_the_high_watermark_waits_even_without_elr_so_replicated_topics_are_fenced(
) -> Result<()> {
    let features = vec![("eligible.leader.replicas.version".to_owned(), 0)];
    let mut kafka = three_nodes(KafkaHome::find()?, features).await?;
    let bootstrap = kafka.bootstrap_servers();

    // The in-sync set shrank below min ISR and the record is still not
    // readable: the high watermark waits, ELR or not, and the producer
    // gets no acknowledgement (its request would time out).
    let shrunk = append_then_shrink(&mut kafka, "shrunk").await?;
    let readable = values_readable(&bootstrap, "shrunk").await?;
    ensure!(
        readable == ["acknowledged"],
        "an unacknowledged record is not readable on Kafka 3.7+: {readable:?}"
    );
    let killed = shrunk.killed;
    drop(shrunk);

    let kafka =
        tokio::task::spawn_blocking(move || kafka.restart_node(killed).map(|()| kafka)).await??;
    kafka.create_topic_with("rf3-min2", 1, 3, &[("min.insync.replicas", "2")])?;
    ensure!(
        matches!(
            fence_of(&bootstrap, "rf3-min2").await?,
            TopicFence::Fenced(_)
        ),
        "on Kafka 3.7+ a replicated topic is fenced"
    );

    // A broker the metadata still lists but that does not answer (killed a
    // moment ago) is vouched for by the cluster's finalized
    // metadata.version, which each 4.1.1 node reports in its ApiVersions
    // response.
    let live = bootstrap.split(',').next().context("a bootstrap server")?;
    let (strict, why) = walrelay::kafka::requests::api_versions::strict_min_isr_of(
        &[live.to_owned(), "127.0.0.1:1".to_owned()],
        &walrelay::kafka::conn::Settings::plaintext(),
        Duration::from_secs(10),
    )
    .await;
    ensure!(
        (strict, &why) == (StrictMinIsr::Yes, &None),
        "a 4.1.1 node vouches for one that does not answer: {strict} {why:?}"
    );
    Ok(())
}
