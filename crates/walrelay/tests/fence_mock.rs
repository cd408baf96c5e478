//! The tail fence's reader against librdkafka's mock cluster, for what a
//! real broker here cannot do: refuse the read (authorization) and stay
//! unreachable. The fence end to end is in `fence.rs` (PostgreSQL and
//! Tansu).

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::message::Header;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, DefaultProducerContext, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaErrorCode, RDKafkaRespErr};
use walrelay::config::KeylessPlacement;
use walrelay::engine::fence::keyless::Placing;
use walrelay::engine::fence::{tail, FenceError};
use walrelay::engine::fence::{Layout, PartitionTail, TopicFence, TopicLayout};
use walrelay::engine::key::EventKey;
use walrelay::kafka::client::{client_config, ClientSetup, KafkaClient};
use walrelay::kafka::properties::KafkaConfig;
use walrelay_pgoutput::Lsn;
use walrelay_testkit::relay_headers;

type Cluster = MockCluster<'static, DefaultProducerContext>;

const SOURCE: &str = "sys/db/slot";
const LAYOUT: TopicLayout = TopicLayout {
    partitions: 3,
    routing: 7,
};

fn layout(partition: i32) -> Layout {
    Layout {
        partition: u32::try_from(partition).expect("a partition"),
        topic: LAYOUT,
        keyless: KeylessPlacement::WalRange,
    }
}

fn reader(bootstrap: &str) -> ClientSetup {
    let kafka = KafkaConfig {
        bootstrap_servers: bootstrap.to_owned(),
        ..KafkaConfig::default()
    };
    client_config(&kafka, KafkaClient::Fence).expect("fence reader settings")
}

/// Writes records with keys `keys` of `source` to `partition`.
fn write(bootstrap: &str, partition: i32, source: &str, keys: &[u128]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("producer");
    let layout = layout(partition).to_string();
    let mut prev = String::new();
    for &k in keys {
        let key = EventKey(k).to_hex();
        let headers = relay_headers(&key, source, Some(&layout)).insert(Header {
            key: "walrelay-prev-key",
            value: Some(prev.as_str()),
        });
        prev = key;
        producer
            .send(
                rdkafka::producer::BaseRecord::<(), str>::to("orders")
                    .partition(partition)
                    .payload("x")
                    .headers(headers),
            )
            .expect("enqueue");
    }
    producer.flush(Duration::from_secs(10)).expect("flush");
}

fn cluster() -> Cluster {
    let c = MockCluster::new(1).expect("mock cluster");
    c.create_topic("orders", 3, 1).expect("topic");
    c
}

#[test]
fn each_partition_is_read_to_its_end_for_its_highest_own_key() {
    let c = cluster();
    let b = c.bootstrap_servers();
    write(&b, 0, SOURCE, &[1, 2, 3]);
    // Partition 1: ours, then another source's.
    write(&b, 1, SOURCE, &[10, 11]);
    write(&b, 1, "another", &[99]);
    // Partition 2 stays empty.
    let tails = tail::read(
        &reader(&b),
        "orders",
        3,
        SOURCE.as_bytes(),
        Duration::from_secs(20),
    )
    .expect("tails");
    let own: Vec<_> = tails
        .partitions
        .iter()
        .map(|t| t.top().map(|r| (r.key, r.prev, r.layout)))
        .collect();
    assert_eq!(
        own,
        [
            Some((EventKey(3), Some(EventKey(2)), Some(layout(0)))),
            Some((EventKey(11), Some(EventKey(10)), Some(layout(1)))),
            None
        ]
    );
    assert_eq!(tails.partitions[2], PartitionTail::default());
    // Each top record's predecessor was read, so each is trusted.
    let placing = Placing {
        rule: KeylessPlacement::WalRange,
        start: Lsn(0),
    };
    let decision = TopicFence::decide(&tails.partitions, LAYOUT, placing);
    assert!(decision.untrusted.is_empty());
    assert_eq!(decision.fence.key(1), Some(EventKey(11)));
}

#[test]
fn a_refused_read_names_the_acl_to_grant() {
    let c = cluster();
    let b = c.bootstrap_servers();
    write(&b, 0, SOURCE, &[1]);
    c.request_errors(
        RDKafkaApiKey::ListOffsets,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 50],
    );
    c.request_errors(
        RDKafkaApiKey::Fetch,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 50],
    );
    let err = tail::read(
        &reader(&b),
        "orders",
        3,
        SOURCE.as_bytes(),
        Duration::from_secs(20),
    )
    .expect_err("the read is refused");
    assert!(
        matches!(
            err,
            FenceError::Denied {
                code: RDKafkaErrorCode::TopicAuthorizationFailed,
                ..
            }
        ),
        "{err:?}"
    );
    // Retried with backoff: an ACL granted meanwhile is picked up by the
    // next session, and nothing is confirmed until then.
    assert!(err.is_transient());
    let text = err.to_string();
    assert!(
        text.contains("Kafka denied Read on topic \"orders\"")
            && text.contains("(TOPIC_AUTHORIZATION_FAILED)")
            && text.contains("docs/security.md#acls")
            && text.contains("relay.fence = false"),
        "{text}"
    );
}

#[test]
fn an_unreachable_broker_is_a_timeout_naming_the_partitions() {
    let c = cluster();
    let b = c.bootstrap_servers();
    c.broker_down(1).expect("broker down");
    let err = tail::read(
        &reader(&b),
        "orders",
        3,
        SOURCE.as_bytes(),
        Duration::from_secs(2),
    )
    .expect_err("nothing can be read");
    match &err {
        FenceError::Timeout {
            topic, partitions, ..
        } => {
            assert_eq!(topic, "orders");
            assert_eq!(partitions, &[0, 1, 2]);
        }
        other => panic!("{other:?}"),
    }
    assert!(err.is_transient());
    assert!(err.to_string().contains("relay.fence_timeout"), "{err}");
}
