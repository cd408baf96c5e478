//! An Apache Kafka node whose SASL_SSL listener takes OAUTHBEARER tokens
//! of the test issuer, validated by Kafka's own validator. The cases share
//! one node and one issuer, one case at a time (a key rotation changes
//! what every client gets).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use walrelay_testkit::oauth::{
    decode_unverified, IssuerOptions, KeyChoice, OAuthClient, OAuthClientConfig, OAuthContext,
    TokenIssuer, TokenSource,
};
use walrelay_testkit::{
    AclOperation, AclResource, KafkaCluster, KafkaOptions, KafkaSecurity, OAuthValidation, TestCa,
};

const TIMEOUT: Duration = Duration::from_secs(20);
const WRITER: &str = "writer";
const WRITER_SECRET: &str = "writer-secret-6a09e667";
const READER: &str = "reader";
const READER_SECRET: &str = "reader-secret-bb67ae85";
/// The readers' group: they assign partitions and commit nothing, but
/// librdkafka wants a group id to assign.
const GROUP: &str = "oauth-readers";

/// The node, its issuer and the CA file its clients trust.
struct Fixture {
    issuer: TokenIssuer,
    kafka: KafkaCluster,
    ca_path: PathBuf,
}

impl Fixture {
    fn start() -> anyhow::Result<Fixture> {
        let began = Instant::now();
        let issuer = TokenIssuer::start(IssuerOptions::default())?;
        issuer.register_client(WRITER, WRITER_SECRET);
        issuer.register_client(READER, READER_SECRET);
        let ca = TestCa::new("walrelay test Kafka CA")?;
        // Sessions must log in again before their token expires (KIP-368),
        // and an expired token gets no grace.
        let validation = OAuthValidation {
            clock_skew: Duration::ZERO,
            ..OAuthValidation::for_issuer(&issuer).with_max_reauth(Duration::from_secs(60))
        };
        let kafka = KafkaCluster::start(KafkaOptions {
            security: Some(KafkaSecurity::oauth(&ca, validation)?),
            ..KafkaOptions::default()
        })?;
        // In the node's directory, which goes with the node (the fixture,
        // in a static, is never dropped).
        let ca_path = kafka.nodes()[0].dir().join("client-ca.pem");
        std::fs::write(&ca_path, kafka.ca_pem().expect("secured"))?;
        println!(
            "issuer and OAuth Kafka node ready in {:?} ({} JWKS fetch(es))",
            began.elapsed(),
            issuer.jwks_fetches()
        );
        Ok(Fixture {
            issuer,
            kafka,
            ca_path,
        })
    }

    fn client(&self, id: &str, secret: &str) -> anyhow::Result<OAuthClientConfig> {
        let client = OAuthClient::new(&self.issuer.token_url(), id, secret).with_scope("kafka");
        self.kafka.oauth_client_config(&client, &self.ca_path)
    }

    /// A consumer of the listener whose tokens come from `source`.
    fn consumer(&self, source: TokenSource) -> anyhow::Result<BaseConsumer<OAuthContext>> {
        let config = self.client(READER, READER_SECRET)?;
        Ok(config
            .rdkafka_config()
            .set("group.id", GROUP)
            .set("enable.auto.commit", "false")
            .create_with_context(OAuthContext::new(source))?)
    }
}

/// One case at a time: a key rotation changes what every client gets.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The shared fixture, started by the first case.
fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| Fixture::start().expect("an OAuth Kafka node"))
}

/// Polls `consumer` until librdkafka reports an error containing `needle`
/// (a refused login shows there), and returns the errors.
fn await_error(consumer: &BaseConsumer<OAuthContext>, needle: &str) -> Vec<String> {
    let deadline = Instant::now() + TIMEOUT;
    let seen = || {
        consumer
            .context()
            .errors()
            .iter()
            .any(|e| e.contains(needle))
    };
    while !seen() && Instant::now() < deadline {
        // Drives the token callback and the connection attempts.
        let _ = consumer.poll(Duration::from_millis(100));
        let _ = consumer.fetch_metadata(None, Duration::from_millis(200));
    }
    consumer.context().errors()
}

/// What librdkafka reports when the broker refuses a token.
const REFUSED: &str = "SASL authentication error: {\"status\":\"invalid_token\"}";

/// Waits until the node logged a line with all of `needles` (its reason
/// for refusing a token).
fn await_broker_log(kafka: &KafkaCluster, needles: &[&str]) -> anyhow::Result<()> {
    let log = kafka.nodes()[0].log_path();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let text = std::fs::read_to_string(&log)?;
        if text.lines().any(|l| needles.iter().all(|n| l.contains(n))) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "the broker did not log {needles:?}:\n{}",
                kafka.log_tail(20)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `consumer` gets metadata within the timeout: a login worked.
fn logs_in(consumer: &BaseConsumer<OAuthContext>) -> bool {
    let deadline = Instant::now() + TIMEOUT;
    while Instant::now() < deadline {
        let _ = consumer.poll(Duration::from_millis(50));
        if consumer
            .fetch_metadata(None, Duration::from_millis(500))
            .is_ok()
        {
            return true;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_clients_produce_and_read_back_over_sasl_ssl_as_their_principals(
) -> anyhow::Result<()> {
    let _turn = TURN.lock().await;
    let fx = tokio::task::block_in_place(fixture);
    let topic = "oauth-orders";
    fx.kafka.create_topic(topic, 1)?;
    let writer = fx.client(WRITER, WRITER_SECRET)?;
    let reader = fx.client(READER, READER_SECRET)?;
    let resource = AclResource::topic(topic);
    fx.kafka.grant(
        &writer.client.principal(),
        &resource,
        &[AclOperation::Write],
    )?;
    fx.kafka.grant(
        &reader.client.principal(),
        &resource,
        &[AclOperation::Read, AclOperation::Describe],
    )?;
    fx.kafka.grant(
        &reader.client.principal(),
        &AclResource::group(GROUP),
        &[AclOperation::Read],
    )?;
    let (writer_before, reader_before) = (
        fx.issuer.tokens_issued_to(WRITER),
        fx.issuer.tokens_issued_to(READER),
    );

    let context = OAuthContext::new(TokenSource::Issuer(writer.client.clone()));
    let producer: FutureProducer<OAuthContext> = writer
        .rdkafka_config()
        .set("message.timeout.ms", "15000")
        .create_with_context(context.clone())?;
    for i in 0..5 {
        producer
            .send(
                FutureRecord::to(topic).key(&format!("k{i}")).payload("v"),
                TIMEOUT,
            )
            .await
            .map_err(|(e, _)| anyhow::anyhow!("{e}: {:?}", context.errors()))?;
    }

    let consumer = fx.consumer(TokenSource::Issuer(reader.client.clone()))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut keys = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while keys.len() < 5 && Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m?;
            keys.push(String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned());
        }
    }
    assert_eq!(keys, ["k0", "k1", "k2", "k3", "k4"]);
    assert!(fx.issuer.tokens_issued_to(WRITER) > writer_before);
    assert!(fx.issuer.tokens_issued_to(READER) > reader_before);
    assert!(fx.issuer.tokens_issued() >= 2);

    // The principal is User:<sub>: the reader has no Write on the topic.
    let reader_producer: FutureProducer<OAuthContext> = reader
        .rdkafka_config()
        .set("message.timeout.ms", "10000")
        .create_with_context(OAuthContext::new(TokenSource::Issuer(
            reader.client.clone(),
        )))?;
    let refused = reader_producer
        .send(FutureRecord::to(topic).key("x").payload("v"), TIMEOUT)
        .await
        .expect_err("the reader may not write");
    assert!(refused.0.to_string().contains("authoriz"), "{}", refused.0);
    fx.kafka.delete_topics(&[topic])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_another_audience_or_expired_or_by_an_unknown_key_are_refused(
) -> anyhow::Result<()> {
    let _turn = TURN.lock().await;
    let fx = tokio::task::block_in_place(fixture);
    let issuer = &fx.issuer;
    let mut wrong_audience = issuer.claims(READER);
    wrong_audience.audience = "another-service".into();
    // The client is told `invalid_token` only; the broker logs why.
    let expired = issuer.claims(READER).expired(Duration::from_secs(120));
    let expired_exp = format!("\"exp\":{}", expired.expires_at);
    let unpublished = issuer.sign(&issuer.claims(READER), KeyChoice::Unpublished)?;
    let (header, _) = decode_unverified(&unpublished)?;
    let unpublished_kid = format!("\"kid\":{}", header["kid"]);
    let cases = [
        (
            "wrong audience",
            issuer.sign(&wrong_audience, KeyChoice::Current)?,
            vec!["Audience (aud) claim [another-service] doesn't contain an acceptable identifier"],
        ),
        (
            "expired",
            issuer.sign(&expired, KeyChoice::Current)?,
            vec!["The JWT is no longer valid", &expired_exp],
        ),
        (
            "unknown key",
            unpublished,
            vec![
                "Unable to find a suitable verification key",
                &unpublished_kid,
            ],
        ),
    ];
    for (case, token, reason) in cases {
        let consumer = fx.consumer(TokenSource::Fixed {
            token,
            principal: READER.into(),
        })?;
        let errors = tokio::task::block_in_place(|| await_error(&consumer, REFUSED));
        println!("{case}: {errors:?}");
        assert!(
            errors.iter().any(|e| e.contains(REFUSED)),
            "{case}: {errors:?}"
        );
        tokio::task::block_in_place(|| await_broker_log(&fx.kafka, &reason))?;
    }
    // A token signed the same way but valid is taken: the refusals were
    // about the claims and the key, not the set-up.
    let token = issuer.sign(&issuer.claims(READER), KeyChoice::Current)?;
    let consumer = fx.consumer(TokenSource::Fixed {
        token,
        principal: READER.into(),
    })?;
    assert!(tokio::task::block_in_place(|| logs_in(&consumer)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_key_rotation_the_retired_keys_tokens_are_refused() -> anyhow::Result<()> {
    let _turn = TURN.lock().await;
    let fx = tokio::task::block_in_place(fixture);
    let issuer = &fx.issuer;
    let old_token = issuer.sign(&issuer.claims(READER), KeyChoice::Current)?;
    let old_kid = issuer.current_kid();
    let new_kid = issuer.rotate_key()?;
    assert_ne!(old_kid, new_kid);
    // A fetch served after the rotation: the broker caches the new set.
    let fetches = issuer.jwks_fetches();
    tokio::task::block_in_place(|| issuer.await_jwks_fetches(fetches + 1, TIMEOUT))?;
    assert_eq!(issuer.jwks()["keys"][0]["kid"], new_kid.as_str());

    let retired = issuer.sign(&issuer.claims(READER), KeyChoice::Retired)?;
    for (case, token) in [("taken before", old_token), ("signed after", retired)] {
        let consumer = fx.consumer(TokenSource::Fixed {
            token,
            principal: READER.into(),
        })?;
        let errors = tokio::task::block_in_place(|| await_error(&consumer, REFUSED));
        println!("retired key, {case}: {errors:?}");
        assert!(
            errors.iter().any(|e| e.contains(REFUSED)),
            "{case}: {errors:?}"
        );
    }
    // New tokens from /token carry the new key and are taken.
    let reader = fx.client(READER, READER_SECRET)?;
    let consumer = fx.consumer(TokenSource::Issuer(reader.client.clone()))?;
    assert!(tokio::task::block_in_place(|| logs_in(&consumer)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_endpoint_refuses_a_wrong_secret_and_the_listener_refuses_scram(
) -> anyhow::Result<()> {
    let _turn = TURN.lock().await;
    let fx = tokio::task::block_in_place(fixture);
    let refused_before = fx.issuer.requests_refused();
    let wrong = OAuthClient::new(&fx.issuer.token_url(), WRITER, "not-the-secret");
    let err = tokio::task::block_in_place(|| wrong.fetch_token()).unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("401") && text.contains("invalid_client"),
        "{text}"
    );
    assert!(!text.contains("not-the-secret"), "{text}");
    assert_eq!(fx.issuer.requests_refused(), refused_before + 1);

    // The listener takes one mechanism: a SCRAM client is turned away.
    let scram: BaseConsumer<OAuthContext> = fx
        .client(WRITER, WRITER_SECRET)?
        .rdkafka_config()
        .set("sasl.mechanism", "SCRAM-SHA-512")
        .set("sasl.username", WRITER)
        .set("sasl.password", WRITER_SECRET)
        .create_with_context(OAuthContext::new(TokenSource::Fixed {
            token: String::new(),
            principal: WRITER.into(),
        }))?;
    let errors = tokio::task::block_in_place(|| await_error(&scram, "supported mechanisms"));
    println!("SCRAM on the OAuth listener: {errors:?}");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("broker's supported mechanisms: OAUTHBEARER")),
        "{errors:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_max_reauth_a_session_ends_when_its_token_expires() -> anyhow::Result<()> {
    let _turn = TURN.lock().await;
    let fx = tokio::task::block_in_place(fixture);
    let mut claims = fx.issuer.claims(READER);
    claims.expires_at = claims.issued_at + 4;
    let token = fx.issuer.sign(&claims, KeyChoice::Current)?;
    // The context tells librdkafka the token lasts a minute, so it never
    // asks for another: the broker's session lifetime (the token's 4 s)
    // makes it log in again with the expired token, which is refused.
    let consumer = fx.consumer(TokenSource::Fixed {
        token,
        principal: READER.into(),
    })?;
    let began = Instant::now();
    assert!(tokio::task::block_in_place(|| logs_in(&consumer)));
    // The broker refuses the token when librdkafka logs in again on the
    // same connection; the client sees that as a failed handshake
    // (ILLEGAL_SASL_STATE), not as `invalid_token`.
    let ended = "SASL OAUTHBEARER mechanism handshake failed";
    let errors = tokio::task::block_in_place(|| await_error(&consumer, ended));
    println!("after {:?}: {errors:?}", began.elapsed());
    assert!(errors.iter().any(|e| e.contains(ended)), "{errors:?}");
    let exp = format!("\"exp\":{}", claims.expires_at);
    tokio::task::block_in_place(|| {
        await_broker_log(&fx.kafka, &[&exp, "The JWT is no longer valid"])
    })?;
    Ok(())
}

/// A Java producer of one record (`java File.java`, kafka-clients from
/// the Kafka install): the properties file and topic as arguments.
const JAVA_PRODUCER: &str = r#"
import java.io.FileReader;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;

public class OAuthProduce {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (FileReader r = new FileReader(args[0])) { props.load(r); }
        String ser = "org.apache.kafka.common.serialization.StringSerializer";
        props.put("key.serializer", ser);
        props.put("value.serializer", ser);
        props.put("max.block.ms", "20000");
        props.put("delivery.timeout.ms", "20000");
        props.put("request.timeout.ms", "10000");
        try (KafkaProducer<String, String> p = new KafkaProducer<>(props)) {
            p.send(new ProducerRecord<>(args[1], "java", "v")).get();
        }
    }
}
"#;

/// A confluent-kafka producer of one record, with librdkafka's own OIDC
/// login: the properties (JSON) and topic as arguments.
const PYTHON_PRODUCER: &str = r#"
import json, sys
from confluent_kafka import Producer
props = dict(json.load(open(sys.argv[1])))
errors = []
props["error_cb"] = lambda e: errors.append(str(e))
p = Producer(props)
p.produce(sys.argv[2], key=b"python", value=b"v",
          on_delivery=lambda e, m: e and errors.append(str(e)))
left = p.flush(20)
if left or errors:
    sys.exit(f"not delivered: {errors}")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_and_librdkafka_oidc_clients_log_in_with_the_helpers_properties() -> anyhow::Result<()>
{
    let _turn = TURN.lock().await;
    let fx = tokio::task::block_in_place(fixture);
    let topic = "oauth-clients";
    fx.kafka.create_topic(topic, 1)?;
    let writer = fx.client(WRITER, WRITER_SECRET)?;
    fx.kafka.grant(
        &writer.client.principal(),
        &AclResource::topic(topic),
        &[AclOperation::Write],
    )?;
    let dir = fx.kafka.nodes()[0].dir().to_owned();
    let mut expected = Vec::new();

    let before = fx.issuer.tokens_issued_to(WRITER);
    let props_path = dir.join("java-client.properties");
    let text: String = writer
        .java()
        .iter()
        .map(|(k, v)| format!("{k}={}\n", v.replace('\\', "\\\\")))
        .collect();
    std::fs::write(&props_path, text)?;
    let source = dir.join("OAuthProduce.java");
    std::fs::write(&source, JAVA_PRODUCER)?;
    let home = walrelay_testkit::KafkaHome::find()?;
    let began = Instant::now();
    let out = tokio::process::Command::new("java")
        .arg(writer.java_jvm_flag())
        .arg("-cp")
        .arg(home.dir().join("libs/*"))
        .arg(&source)
        .arg(&props_path)
        .arg(topic)
        .output()
        .await?;
    assert!(
        out.status.success(),
        "java: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("Java producer done in {:?}", began.elapsed());
    assert!(fx.issuer.tokens_issued_to(WRITER) > before);
    expected.push("java");

    if let Some(python) = walrelay_testkit::python_interpreter()? {
        let before = fx.issuer.tokens_issued_to(WRITER);
        let props_path = dir.join("python-client.json");
        let props: serde_json::Map<String, serde_json::Value> = writer
            .librdkafka_oidc()
            .into_iter()
            .map(|(k, v)| (k, v.into()))
            .collect();
        std::fs::write(&props_path, serde_json::to_string(&props)?)?;
        let began = Instant::now();
        let out = tokio::process::Command::new(python)
            .arg("-c")
            .arg(PYTHON_PRODUCER)
            .arg(&props_path)
            .arg(topic)
            .output()
            .await?;
        assert!(
            out.status.success(),
            "python: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("librdkafka OIDC producer done in {:?}", began.elapsed());
        assert!(fx.issuer.tokens_issued_to(WRITER) > before);
        expected.push("python");
    }

    let records = walrelay_testkit::read_topics(
        &fx.kafka.bootstrap_servers(),
        &[topic],
        expected.len(),
        TIMEOUT,
    )
    .await?;
    let mut keys: Vec<String> = records
        .iter()
        .map(|r| String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned())
        .collect();
    keys.sort();
    assert_eq!(keys, expected);
    fx.kafka.delete_topics(&[topic])?;
    Ok(())
}
