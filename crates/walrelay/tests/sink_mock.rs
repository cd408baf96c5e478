//! `KafkaSink` against librdkafka's in-process mock cluster: ordering,
//! enforced settings, broker outages and injected produce errors.
//!
//! The mock cluster is not a real broker (no admin API, keeps only the last
//! 5 MiB / 100k records per partition); end-to-end tests use Tansu.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{Offset, TopicPartitionList};
use walrelay::engine::key::EventKey;
use walrelay::engine::record::Record;
use walrelay::engine::sink::{DeliveryReport, KafkaSink, Recovery, SinkError};
use walrelay::kafka::properties::SinkConfig;
use walrelay::kafka::ClientError;

type Cluster = MockCluster<'static, DefaultProducerContext>;

const WAIT: Duration = Duration::from_secs(30);

fn cluster_with_topic(brokers: i32, topic: &str, partitions: i32) -> Cluster {
    let cluster = MockCluster::new(brokers).expect("mock cluster");
    cluster
        .create_topic(topic, partitions, brokers)
        .expect("create topic");
    cluster
}

fn config(bootstrap: &str, properties: &[(&str, &str)]) -> SinkConfig {
    SinkConfig::new(
        bootstrap,
        properties
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

/// Record `i`: a mix of keyed/keyless, tombstones and empty values.
fn record(topic: &Arc<str>, i: u64) -> Record {
    let key = (i % 10 != 2).then(|| Bytes::from(format!("key-{i}")));
    let value = match i % 10 {
        0 => None,
        1 => Some(Bytes::new()),
        _ => Some(Bytes::from(format!("value-{i}"))),
    };
    Record {
        topic: Arc::clone(topic),
        key,
        value,
        headers: vec![
            (
                Arc::from("idempotency-key"),
                Bytes::from(format!("{i:032x}")),
            ),
            (Arc::from("seq"), Bytes::from(i.to_string())),
            (Arc::from("empty"), Bytes::new()),
        ],
        event_key: EventKey(u128::from(i)),
        timestamp_ms: Some(1_700_000_000_000 + i64::try_from(i).unwrap()),
    }
}

async fn deliveries(sink: &mut KafkaSink, n: usize) -> Vec<DeliveryReport> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout_at(deadline, sink.next_delivery()).await {
            Ok(d) => out.push(d),
            Err(_) => panic!("only {} of {n} deliveries within {WAIT:?}", out.len()),
        }
    }
    out
}

/// Checks that every delivery succeeded in the partition it was sent to,
/// and that offsets increase with `seq` in each partition.
fn assert_all_delivered(deliveries: &[DeliveryReport], sent: &HashMap<u64, u32>) {
    assert_eq!(deliveries.len(), sent.len());
    let mut by_partition: BTreeMap<i32, Vec<(u64, i64)>> = BTreeMap::new();
    for d in deliveries {
        let (partition, offset) = match &d.result {
            Ok(po) => *po,
            Err(e) => panic!("delivery of seq {} failed: {e}", d.seq),
        };
        assert_eq!(
            i64::from(partition),
            i64::from(sent[&d.seq]),
            "seq {} landed in the wrong partition",
            d.seq
        );
        by_partition
            .entry(partition)
            .or_default()
            .push((d.seq, offset));
    }
    let mut seqs: Vec<u64> = deliveries.iter().map(|d| d.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), sent.len(), "duplicate delivery reports");
    for (partition, mut list) in by_partition {
        list.sort_unstable();
        for pair in list.windows(2) {
            assert!(
                pair[0].1 < pair[1].1,
                "partition {partition}: seq {} at offset {} but later seq {} at offset {}",
                pair[0].0,
                pair[0].1,
                pair[1].0,
                pair[1].1
            );
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Stored {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp_ms: Option<i64>,
}

impl Stored {
    fn of(record: &Record) -> Stored {
        Stored {
            key: record.key.as_ref().map(|k| k.to_vec()),
            value: record.value.as_ref().map(|v| v.to_vec()),
            headers: record
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), Some(v.to_vec())))
                .collect(),
            timestamp_ms: record.timestamp_ms,
        }
    }
}

/// Reads every partition of `topic` from the beginning until `expected`
/// records arrived, and checks that the high watermarks account for exactly
/// those records (no duplicates, nothing extra).
fn read_back(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
) -> BTreeMap<i32, Vec<Stored>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "walrelay-sink-test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let deadline = Instant::now() + WAIT;
    let mut out: BTreeMap<i32, Vec<Stored>> = BTreeMap::new();
    let mut n = 0;
    while n < expected {
        assert!(
            Instant::now() < deadline,
            "read back {n} of {expected} records"
        );
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => panic!("consumer: {e}"),
            Some(Ok(m)) => {
                let headers = m.headers().map_or_else(Vec::new, |h| {
                    h.iter()
                        .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                });
                out.entry(m.partition()).or_default().push(Stored {
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                    headers,
                    timestamp_ms: m.timestamp().to_millis(),
                });
                n += 1;
            }
        }
    }
    let mut total = 0;
    for p in 0..partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks");
        total += high - low;
    }
    assert_eq!(
        total,
        i64::try_from(expected).unwrap(),
        "the topic holds more records than were read"
    );
    out
}

/// What each partition should hold, in send order.
fn expected_by_partition(records: &[(Record, u32)]) -> BTreeMap<i32, Vec<Stored>> {
    let mut out: BTreeMap<i32, Vec<Stored>> = BTreeMap::new();
    for (record, partition) in records {
        out.entry(i32::try_from(*partition).unwrap())
            .or_default()
            .push(Stored::of(record));
    }
    out
}

#[tokio::test]
async fn delivers_in_order_per_partition_with_headers() {
    let topic: Arc<str> = Arc::from("walrelay-happy");
    let cluster = cluster_with_topic(3, &topic, 3);
    let bootstrap = cluster.bootstrap_servers();
    let mut sink = KafkaSink::new(&config(&bootstrap, &[])).unwrap();
    assert_eq!(sink.partitions(&topic).await.unwrap(), 3);
    // Asking again gives the same count.
    assert_eq!(sink.partitions(&topic).await.unwrap(), 3);

    let started = Instant::now();
    let mut sent = HashMap::new();
    let mut records = Vec::new();
    for i in 0..1000u64 {
        let record = record(&topic, i);
        // Deliberately not round-robin: runs of the same partition.
        let partition = u32::try_from((i / 7 + i) % 3).unwrap();
        sink.send(i, &record, partition).unwrap();
        sent.insert(i, partition);
        records.push((record, partition));
    }
    let got = deliveries(&mut sink, records.len()).await;
    assert_all_delivered(&got, &sent);
    sink.flush(Duration::from_secs(10)).await.unwrap();
    eprintln!("1000 records delivered in {:?}", started.elapsed());

    let stored = read_back(&bootstrap, &topic, 3, records.len());
    assert_eq!(stored, expected_by_partition(&records));
}

#[test]
fn weakening_the_guarantees_is_rejected() {
    let cases: &[(&str, &str)] = &[
        ("acks", "1"),
        ("acks", "0"),
        ("request.required.acks", "1"),
        ("enable.idempotence", "false"),
        ("enable.gapless.guarantee", "false"),
        ("max.in.flight.requests.per.connection", "10"),
        ("max.in.flight", "6"),
        ("queuing.strategy", "lifo"),
        ("delivery.report.only.error", "true"),
        ("retries", "0"),
        ("transactional.id", "walrelay-1"),
    ];
    for (name, value) in cases {
        let err = KafkaSink::new(&config("127.0.0.1:9", &[(name, value)]))
            .expect_err(&format!("{name}={value} must be rejected"));
        match &err {
            SinkError::Client(ClientError::Config { property, reason }) => {
                assert_eq!(property, name);
                assert!(reason.contains("walrelay"), "{name}: {reason}");
            }
            other => panic!("{name}={value}: unexpected error {other:?}"),
        }
        assert_eq!(err.recovery(), Recovery::Fatal);
        assert!(!err.restarts_pipeline());
        eprintln!("{err}");
    }

    // The same guarantees, spelled differently, are accepted.
    for (name, value) in [
        ("acks", "all"),
        ("acks", "-1"),
        ("enable.idempotence", "true"),
        ("max.in.flight", "1"),
        ("max.in.flight.requests.per.connection", "5"),
        ("queuing.strategy", "fifo"),
    ] {
        KafkaSink::new(&config("127.0.0.1:9", &[(name, value)]))
            .unwrap_or_else(|e| panic!("{name}={value}: {e}"));
    }
}

#[test]
fn other_properties_pass_through() {
    let cfg = config(
        "127.0.0.1:9",
        &[
            ("linger.ms", "1"),
            ("client.id", "x"),
            ("compression.codec", "gzip"),
        ],
    );
    let props = cfg.effective_properties().unwrap();
    assert_eq!(props["linger.ms"], "1");
    assert_eq!(props["client.id"], "x");
    assert_eq!(props["compression.codec"], "gzip");
    assert_eq!(props["enable.idempotence"], "true");
    assert_eq!(props["enable.gapless.guarantee"], "true");
    assert_eq!(props["acks"], "all");
    assert_eq!(props["max.in.flight.requests.per.connection"], "5");
    assert_eq!(props["message.timeout.ms"], "30000");
    assert_eq!(props["bootstrap.servers"], "127.0.0.1:9");
    KafkaSink::new(&cfg).unwrap();

    // An alias replaces the default instead of fighting it.
    let props = config("127.0.0.1:9", &[("delivery.timeout.ms", "5000")])
        .effective_properties()
        .unwrap();
    assert_eq!(props["delivery.timeout.ms"], "5000");
    assert!(!props.contains_key("message.timeout.ms"));

    // Two aliases of one property: ambiguous.
    let err = KafkaSink::new(&config(
        "127.0.0.1:9",
        &[("linger.ms", "1"), ("queue.buffering.max.ms", "2")],
    ))
    .unwrap_err();
    assert!(
        matches!(err, SinkError::Client(ClientError::Config { .. })),
        "{err:?}"
    );

    // librdkafka's own validation surfaces as a config error too.
    let err = KafkaSink::new(&config("127.0.0.1:9", &[("no.such.property", "1")])).unwrap_err();
    assert!(
        matches!(&err, SinkError::Client(ClientError::Config { property, .. }) if property == "no.such.property"),
        "{err:?}"
    );
    eprintln!("{err}");
}

#[test]
fn secrets_stay_out_of_debug_and_errors() {
    let cfg = config(
        "127.0.0.1:9",
        &[
            ("sasl.password", "hunter2-password"),
            ("ssl.key.password", "hunter3-key"),
            ("sasl.oauthbearer.client.secret", "hunter4-secret"),
            ("sasl.username", "walrelay-user"),
        ],
    );
    let debug = format!("{cfg:?}");
    for secret in ["hunter2", "hunter3", "hunter4"] {
        assert!(!debug.contains(secret), "{debug}");
    }
    assert!(debug.contains("walrelay-user"), "{debug}");
    assert!(debug.contains("<redacted>"), "{debug}");
    let props = cfg.effective_properties().unwrap();
    let shown = format!("{:?}", walrelay::secrets::redact(&props));
    assert!(!shown.contains("hunter"), "{shown}");
}

/// librdkafka's `message.timeout.ms` would fail the oldest records of a
/// partition and then send the ones queued after them (a hole the tail
/// fence would take as written): the sink never times a record out
/// itself. The session's deadline stops it from sending (`stop_sending`)
/// and every record still waiting fails together.
#[tokio::test]
async fn broker_down_fails_no_delivery_by_itself_and_stop_sending_fails_them_all() {
    let topic: Arc<str> = Arc::from("walrelay-down");
    let cluster = cluster_with_topic(3, &topic, 3);
    let bootstrap = cluster.bootstrap_servers();
    let cfg = config(&bootstrap, &[("message.timeout.ms", "1000")]);

    let mut sink = KafkaSink::new(&cfg).unwrap();
    assert_eq!(sink.delivery_timeout(), Some(Duration::from_secs(1)));
    assert_eq!(sink.partitions(&topic).await.unwrap(), 3);
    // One record through, so the producer has its id and leaders.
    sink.send(0, &record(&topic, 0), 0).unwrap();
    assert!(deliveries(&mut sink, 1).await[0].result.is_ok());

    for broker in 1..=3 {
        cluster.broker_down(broker).unwrap();
    }
    for i in 1..=30u64 {
        let partition = u32::try_from(i % 3).unwrap();
        sink.send(i, &record(&topic, i), partition).unwrap();
    }
    // Three times message.timeout.ms: librdkafka would have failed them all.
    let early = tokio::time::timeout(Duration::from_secs(3), sink.next_delivery()).await;
    assert!(
        early.is_err(),
        "a record got a delivery report while every broker was down: {:?}",
        early.map(|d| d.result)
    );
    let started = Instant::now();
    sink.stop_sending();
    let failed = deliveries(&mut sink, 30).await;
    eprintln!(
        "30 deliveries failed {:?} after stop_sending",
        started.elapsed()
    );
    for d in &failed {
        let err = d
            .result
            .as_ref()
            .expect_err("a delivery succeeded while every broker was down");
        assert!(
            matches!(
                err.code(),
                Some(RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight)
            ),
            "{err}"
        );
        assert!(err.restarts_pipeline());
    }
    eprintln!("{}", failed[0].result.as_ref().unwrap_err());

    let started = Instant::now();
    drop(sink);
    let dropped_in = started.elapsed();
    assert!(
        dropped_in < Duration::from_secs(5),
        "drop took {dropped_in:?}"
    );

    for broker in 1..=3 {
        cluster.broker_up(broker).unwrap();
    }
    let mut sink = KafkaSink::new(&cfg).unwrap();
    let mut sent = HashMap::new();
    let mut records = vec![(record(&topic, 0), 0)];
    for i in 100..130u64 {
        let partition = u32::try_from(i % 3).unwrap();
        let r = record(&topic, i);
        sink.send(i, &r, partition).unwrap();
        sent.insert(i, partition);
        records.push((r, partition));
    }
    assert_all_delivered(&deliveries(&mut sink, 30).await, &sent);
    let stored = read_back(&bootstrap, &topic, 3, records.len());
    assert_eq!(stored, expected_by_partition(&records));
}

#[tokio::test]
async fn retriable_produce_errors_are_retried_exactly_once_in_order() {
    let topic: Arc<str> = Arc::from("walrelay-retry");
    let cluster = cluster_with_topic(3, &topic, 3);
    let bootstrap = cluster.bootstrap_servers();
    let mut sink = KafkaSink::new(&config(&bootstrap, &[])).unwrap();
    assert_eq!(sink.partitions(&topic).await.unwrap(), 3);

    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
        ],
    );

    let mut sent = HashMap::new();
    let mut records = Vec::new();
    // Several rounds, so that retried requests overlap new ones.
    for round in 0..5u64 {
        for j in 0..100u64 {
            let i = round * 100 + j;
            let partition = u32::try_from(i % 3).unwrap();
            let r = record(&topic, i);
            sink.send(i, &r, partition).unwrap();
            sent.insert(i, partition);
            records.push((r, partition));
        }
        tokio::task::yield_now().await;
    }
    assert_all_delivered(&deliveries(&mut sink, records.len()).await, &sent);
    let stored = read_back(&bootstrap, &topic, 3, records.len());
    assert_eq!(stored, expected_by_partition(&records));
}

#[tokio::test]
async fn queue_full_is_distinct_and_drop_does_not_hang() {
    let topic: Arc<str> = Arc::from("walrelay-full");
    let cluster = cluster_with_topic(1, &topic, 1);
    let bootstrap = cluster.bootstrap_servers();
    let cfg = config(
        &bootstrap,
        &[
            ("queue.buffering.max.messages", "10"),
            ("message.timeout.ms", "120000"),
        ],
    );
    let mut sink = KafkaSink::new(&cfg).unwrap();
    assert_eq!(sink.partitions(&topic).await.unwrap(), 1);
    sink.send(0, &record(&topic, 0), 0).unwrap();
    assert!(deliveries(&mut sink, 1).await[0].result.is_ok());

    // With the broker down, records stay queued until the queue is full.
    cluster.broker_down(1).unwrap();
    for i in 1..=10u64 {
        sink.send(i, &record(&topic, i), 0).unwrap();
    }
    let err = sink.send(11, &record(&topic, 11), 0).unwrap_err();
    assert!(matches!(err, SinkError::QueueFull), "{err:?}");
    assert_eq!(err.recovery(), Recovery::RetryAfterDeliveries);
    assert!(!err.restarts_pipeline());

    // Once the broker is back, deliveries make room and the same record
    // goes through.
    cluster.broker_up(1).unwrap();
    let got = deliveries(&mut sink, 10).await;
    assert!(got.iter().all(|d| d.result.is_ok()), "{got:?}");
    // librdkafka frees a record's place just after handing over its
    // delivery report: the room can come a moment after the report.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match sink.send(11, &record(&topic, 11), 0) {
            Ok(()) => break,
            Err(SinkError::QueueFull) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("the record did not go through once room was made: {e:?}"),
        }
    }
    assert!(deliveries(&mut sink, 1).await[0].result.is_ok());

    // Dropping with records stuck behind a dead broker returns promptly.
    cluster.broker_down(1).unwrap();
    for i in 12..20u64 {
        sink.send(i, &record(&topic, i), 0).unwrap();
    }
    let started = Instant::now();
    drop(sink);
    let dropped_in = started.elapsed();
    eprintln!("dropped with 8 records queued in {dropped_in:?}");
    assert!(
        dropped_in < Duration::from_secs(5),
        "drop took {dropped_in:?}"
    );
}

#[tokio::test]
async fn missing_topic_is_a_clear_error_and_auto_creation_works() {
    let cluster = cluster_with_topic(1, "walrelay-exists", 2);
    let bootstrap = cluster.bootstrap_servers();

    let mut cfg = config(&bootstrap, &[("allow.auto.create.topics", "false")]);
    cfg.metadata_timeout = Duration::from_secs(1);
    let sink = KafkaSink::new(&cfg).unwrap();
    assert_eq!(sink.partitions("walrelay-exists").await.unwrap(), 2);
    let err = sink.partitions("walrelay-missing").await.unwrap_err();
    let text = err.to_string();
    eprintln!("{text}");
    assert!(matches!(err, SinkError::TopicMissing { .. }), "{err:?}");
    assert!(text.contains("walrelay-missing"), "{text}");
    assert!(text.contains("--create"), "{text}");
    assert!(err.restarts_pipeline());

    let sink = KafkaSink::new(&config(&bootstrap, &[])).unwrap();
    let n = sink.partitions("walrelay-auto").await.unwrap();
    assert!(n > 0);
}

#[tokio::test]
async fn a_permanent_produce_error_fails_deliveries_without_gaps() {
    let topic: Arc<str> = Arc::from("walrelay-permanent");
    let cluster = cluster_with_topic(3, &topic, 3);
    let bootstrap = cluster.bootstrap_servers();
    let mut sink = KafkaSink::new(&config(&bootstrap, &[])).unwrap();
    assert_eq!(sink.partitions(&topic).await.unwrap(), 3);
    sink.send(0, &record(&topic, 0), 0).unwrap();
    assert!(deliveries(&mut sink, 1).await[0].result.is_ok());

    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
    );
    let mut sent = HashMap::new();
    let mut records = vec![(record(&topic, 0), 0u32)];
    for i in 1..=300u64 {
        let partition = u32::try_from(i % 3).unwrap();
        let r = record(&topic, i);
        sink.send(i, &r, partition).unwrap();
        sent.insert(i, partition);
        records.push((r, partition));
    }
    let mut got = deliveries(&mut sink, 300).await;
    got.sort_by_key(|d| d.seq);
    let mut failed_partitions = std::collections::BTreeSet::new();
    let mut written = vec![(record(&topic, 0), 0u32)];
    let mut errors = 0;
    let mut messages = std::collections::BTreeSet::new();
    for d in &got {
        let partition = i32::try_from(sent[&d.seq]).unwrap();
        match &d.result {
            Ok(_) => {
                assert!(
                    !failed_partitions.contains(&partition),
                    "seq {} acknowledged after an earlier failure in partition {partition}",
                    d.seq
                );
                written.push(records[usize::try_from(d.seq).unwrap()].clone());
            }
            Err(e) => {
                assert!(e.restarts_pipeline(), "{e}");
                messages.insert(e.to_string());
                errors += 1;
                failed_partitions.insert(partition);
            }
        }
    }
    assert!(errors > 0, "the injected error was not reported");
    eprintln!("{errors} of 300 deliveries failed: {messages:#?}");
    // What the broker holds is exactly what was acknowledged.
    drop(sink);
    let stored = read_back(&bootstrap, &topic, 3, written.len());
    assert_eq!(stored, expected_by_partition(&written));
}
