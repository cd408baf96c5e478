//! Runs real Tansu brokers (the binary `scripts/install-tansu.sh` installs,
//! or `$WALRELAY_TANSU_BIN`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use walrelay_testkit::{
    partition_count, read_topics, read_until_quiet, ConsumedRecord, TansuBroker,
};

const TIMEOUT: Duration = Duration::from_secs(20);

fn producer(bootstrap: &str) -> anyhow::Result<FutureProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "10000")
        .create()?)
}

/// Produces `key -> value` with headers `seq` and `source`, returning
/// (partition, offset) from the delivery report.
async fn produce(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    value: &str,
    seq: usize,
) -> anyhow::Result<(i32, i64)> {
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "seq",
            value: Some(seq.to_string().as_bytes()),
        })
        .insert(Header {
            key: "source",
            value: Some("walrelay-test".as_bytes()),
        });
    let record = FutureRecord::to(topic)
        .key(key)
        .payload(value)
        .headers(headers);
    let delivery = producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| anyhow::anyhow!("delivery failed: {e}"))?;
    Ok((delivery.partition, delivery.offset))
}

fn by_seq(records: &mut [ConsumedRecord]) {
    records.sort_by_key(|r| {
        r.header_str("seq")
            .and_then(|s| s.parse::<usize>().ok())
            .unwrap_or(usize::MAX)
    });
}

#[tokio::test]
async fn produce_and_read_back_keyed_records_with_headers() -> anyhow::Result<()> {
    let broker = TansuBroker::start()?;
    assert_eq!(
        broker.bootstrap_servers(),
        format!("127.0.0.1:{}", broker.port())
    );
    broker.create_topic("orders", 3)?;
    assert_eq!(partition_count(&broker.bootstrap_servers(), "orders")?, 3);
    // Creating it again with the same partition count is fine.
    broker.create_topic("orders", 3)?;
    assert!(broker.create_topic("orders", 5).is_err());

    let producer = producer(&broker.bootstrap_servers())?;
    let keys = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"];
    let mut delivered = Vec::new();
    for (seq, key) in keys.iter().enumerate() {
        let value = format!("value-{seq}");
        delivered.push(produce(&producer, "orders", key, &value, seq).await?);
    }

    let mut records = read_topics(
        &broker.bootstrap_servers(),
        &["orders"],
        keys.len(),
        TIMEOUT,
    )
    .await?;
    assert_eq!(records.len(), keys.len(), "{records:#?}");
    by_seq(&mut records);
    for (seq, (record, key)) in records.iter().zip(keys).enumerate() {
        assert_eq!(record.topic, "orders");
        assert_eq!(record.key_str(), Some(key));
        assert_eq!(record.value_str(), Some(format!("value-{seq}").as_str()));
        assert_eq!(record.header_str("seq"), Some(seq.to_string().as_str()));
        assert_eq!(record.header("source"), Some(&b"walrelay-test"[..]));
        assert_eq!(record.header("missing"), None);
        assert_eq!(record.headers.len(), 2);
        assert_eq!((record.partition, record.offset), delivered[seq]);
        assert!((0..3).contains(&record.partition), "{record:?}");
        assert!(record.timestamp_ms.is_some_and(|t| t > 0), "{record:?}");
    }
    // The same key always goes to the same partition.
    let again = produce(&producer, "orders", "alpha", "value-again", 99).await?;
    assert_eq!(again.0, delivered[0].0);

    // Reading until quiet sees everything, including the last record.
    let all = read_until_quiet(
        &broker.bootstrap_servers(),
        &["orders"],
        Duration::from_millis(700),
        TIMEOUT,
    )
    .await?;
    assert_eq!(all.len(), keys.len() + 1, "{all:#?}");
    let offsets: BTreeSet<(i32, i64)> = all.iter().map(|r| (r.partition, r.offset)).collect();
    assert_eq!(offsets.len(), all.len(), "no duplicates");

    // Fewer expected than there are: the grace read still returns the rest.
    let more = read_topics(&broker.bootstrap_servers(), &["orders"], 2, TIMEOUT).await?;
    assert_eq!(more.len(), keys.len() + 1, "{more:#?}");
    Ok(())
}

#[tokio::test]
async fn reader_times_out_and_waits_for_topics_to_appear() -> anyhow::Result<()> {
    let broker = TansuBroker::start()?;
    let bootstrap = broker.bootstrap_servers();
    assert!(partition_count(&bootstrap, "nope").is_err());

    // Nothing there: returns empty at the timeout.
    let started = Instant::now();
    let none = read_topics(&bootstrap, &["nope"], 1, Duration::from_millis(600)).await?;
    assert!(none.is_empty());
    assert!(started.elapsed() < Duration::from_secs(5));

    // A topic created (auto-created by producing) after the reader started.
    let reader = {
        let bootstrap = bootstrap.clone();
        tokio::spawn(async move { read_topics(&bootstrap, &["late", "empty"], 2, TIMEOUT).await })
    };
    broker.create_topic("empty", 1)?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let producer = producer(&bootstrap)?;
    produce(&producer, "late", "k1", "v1", 0).await?;
    produce(&producer, "late", "k2", "v2", 1).await?;
    let mut records = reader.await??;
    by_seq(&mut records);
    let values: Vec<_> = records.iter().map(|r| r.value_str().unwrap()).collect();
    assert_eq!(values, ["v1", "v2"]);
    // Auto-created topics get 4 partitions on Tansu.
    assert_eq!(partition_count(&bootstrap, "late")?, 4);
    Ok(())
}

#[tokio::test]
async fn two_brokers_at_once() -> anyhow::Result<()> {
    let a = TansuBroker::start()?;
    let b = TansuBroker::start()?;
    assert_ne!(a.port(), b.port());
    a.create_topic("shared", 2)?;
    b.create_topic("shared", 1)?;
    assert_eq!(partition_count(&a.bootstrap_servers(), "shared")?, 2);
    assert_eq!(partition_count(&b.bootstrap_servers(), "shared")?, 1);

    produce(&producer(&a.bootstrap_servers())?, "shared", "k", "on-a", 0).await?;
    produce(&producer(&b.bootstrap_servers())?, "shared", "k", "on-b", 0).await?;
    let on_a = read_topics(&a.bootstrap_servers(), &["shared"], 1, TIMEOUT).await?;
    let on_b = read_topics(&b.bootstrap_servers(), &["shared"], 1, TIMEOUT).await?;
    assert_eq!(on_a.len(), 1);
    assert_eq!(on_b.len(), 1);
    assert_eq!(on_a[0].value_str(), Some("on-a"));
    assert_eq!(on_b[0].value_str(), Some("on-b"));
    Ok(())
}

#[tokio::test]
async fn restart_loses_data_but_answers_again() -> anyhow::Result<()> {
    let mut broker = TansuBroker::start()?;
    let port = broker.port();
    let bootstrap = broker.bootstrap_servers();
    broker.create_topic("t", 2)?;
    produce(&producer(&bootstrap)?, "t", "k", "before", 0).await?;
    assert_eq!(read_topics(&bootstrap, &["t"], 1, TIMEOUT).await?.len(), 1);

    let pid = broker.pid();
    broker.restart()?;
    assert_eq!(broker.port(), port);
    assert_ne!(broker.pid(), pid);
    assert!(broker.is_running());
    // In-memory storage: the topic is gone.
    assert!(partition_count(&bootstrap, "t").is_err());

    broker.create_topic("t", 3)?;
    produce(&producer(&bootstrap)?, "t", "k", "after", 0).await?;
    let records = read_topics(&bootstrap, &["t"], 1, TIMEOUT).await?;
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0].value_str(), Some("after"));

    // A stopped broker restarts too; the log covers both starts.
    broker.kill()?;
    assert!(!broker.is_running());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    broker.restart()?;
    assert!(partition_count(&bootstrap, "t").is_err());
    assert!(
        broker.log_tail(1000).contains("start #3"),
        "{}",
        broker.log_tail(1000)
    );

    let started = Instant::now();
    broker.stop()?;
    assert!(!broker.is_running());
    eprintln!("graceful stop took {:?}", started.elapsed());
    Ok(())
}

#[test]
fn drop_kills_the_broker_and_removes_its_directory() -> anyhow::Result<()> {
    let broker = TansuBroker::start()?;
    let port = broker.port();
    let dir = broker.log_path().parent().unwrap().to_path_buf();
    assert!(broker.log_path().is_file());
    drop(broker);
    assert!(!dir.exists());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    Ok(())
}

#[test]
fn missing_binary_is_a_clear_error() {
    let err = TansuBroker::start_with_binary("/nonexistent/tansu").unwrap_err();
    assert!(format!("{err:#}").contains("/nonexistent/tansu"), "{err:#}");
}
