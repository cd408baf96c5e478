//! The one place where walrelay's Kafka configuration (`[kafka]`,
//! `--bootstrap-servers`, `--kafka-property`) becomes librdkafka
//! properties, for every Kafka client walrelay creates:
//!
//! | client | properties |
//! |---|---|
//! | [`KafkaClient::Producer`] (`walrelay run`) | [`SinkConfig::effective_properties`] ([`super::properties`]): walrelay's defaults, the user's properties, the enforced delivery guarantees |
//! | [`KafkaClient::Probe`] (`/readyz`) | the producer's, under the client id `<client.id>-probe` |
//! | [`KafkaClient::Verify`] (`walrelay verify`) | reader defaults, the user's properties, then what makes it a read-only reader |
//! | [`KafkaClient::Fence`] (`walrelay run`) | the reader's, under the client id `<client.id>-fence`, reporting partition ends, committed records only |
//! | [`KafkaClient::Admin`] (`walrelay run`, `setup`) | the user's properties under the client id `<client.id>-admin`, without idempotence or transactions: reads the topics' durability settings for the fence, creates the source record's topic |
//! | [`KafkaClient::SourceRecord`] (`walrelay run`) | the admin client's, under the client id `<client.id>-sources`, with `acks=all`: writes the source record ([`crate::source::source_record`]) |
//!
//! In each of them secret references (`env:NAME`, `file:/path`) are
//! resolved ([`crate::secrets`]) and TLS/SASL settings are checked, each
//! time a client is created, so a rotated secret file is picked up on the
//! next client. A client built from the raw properties would send
//! `env:NAME` to the broker as the password; that is why no client may
//! build its own.

use std::collections::BTreeMap;
use std::sync::Arc;

use rdkafka::admin::AdminClient;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, FutureProducer};

use super::conn::Settings;
use super::error::{ClientError, RequestError};
use super::login::{is_oauthbearer, Login, PlainContext, LOGIN_PROPERTIES};
use super::policy::check_security;
use super::properties::{to_client_config, KafkaConfig, SinkConfig};

/// Which Kafka client the properties are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaClient {
    /// The relay's idempotent producer.
    Producer,
    /// The readiness probe: a producer client that only fetches metadata.
    Probe,
    /// `walrelay verify`'s group-less reader (the caller adds a unique
    /// `group.id`, which librdkafka needs to assign partitions; no ACL on
    /// it is needed).
    Verify,
    /// The tail fence's group-less reader of partition tails
    /// ([`crate::engine::fence::tail`]).
    Fence,
    /// The fence's admin client, which only describes topic configurations
    /// ([`crate::engine::fence::settings`]); `setup`'s, which creates the source
    /// record's topic.
    Admin,
    /// The writer of the source record ([`crate::source::source_record`]): a
    /// plain producer with `acks=all`.
    SourceRecord,
}

/// The producer's configuration, from the Kafka settings.
pub fn producer_config(kafka: &KafkaConfig) -> SinkConfig {
    let mut config = SinkConfig::new(&kafka.bootstrap_servers, kafka.properties.clone());
    config.oauth = kafka.oauth_options();
    config
}

/// The librdkafka properties for `client`, secrets resolved. The result
/// holds secrets in clear text: log it only through
/// [`crate::secrets::redact`].
pub fn properties(
    kafka: &KafkaConfig,
    client: KafkaClient,
) -> Result<BTreeMap<String, String>, ClientError> {
    match client {
        KafkaClient::Producer => producer_config(kafka).effective_properties(),
        KafkaClient::Probe => {
            let mut props = producer_config(kafka).effective_properties()?;
            props
                .entry("client.id".to_owned())
                .or_insert_with(|| "walrelay".to_owned())
                .push_str("-probe");
            Ok(props)
        }
        KafkaClient::Verify => verify_properties(kafka),
        KafkaClient::Fence => {
            let mut props = verify_properties(kafka)?;
            let id = props
                .remove("client.id")
                .filter(|id| id != VERIFY_CLIENT_ID)
                .unwrap_or_else(|| "walrelay".to_owned());
            props.insert("client.id".to_owned(), format!("{id}-fence"));
            // The read stops where each partition ends; a broker holding
            // an empty fetch open would add its wait to every start.
            props.insert("enable.partition.eof".to_owned(), "true".to_owned());
            props.insert("fetch.wait.max.ms".to_owned(), "10".to_owned());
            // librdkafka assigns partitions only to a consumer with a
            // group.id, and then looks up the group's coordinator, which a
            // principal without an ACL on the group is refused: the reader
            // ignores that refusal (see `fence::tail`), it never uses the
            // group.
            props.insert("group.id".to_owned(), "walrelay-fence".to_owned());
            // Whatever the user's properties say: an aborted transactional
            // copy of one of our records must never become a fence key.
            props.insert("isolation.level".to_owned(), "read_committed".to_owned());
            Ok(props)
        }
        KafkaClient::Admin => plain_producer(kafka, "admin"),
        KafkaClient::SourceRecord => {
            let mut props = plain_producer(kafka, "sources")?;
            // Evidence a later session relies on: written to every
            // in-sync replica, or not at all.
            props.insert("acks".to_owned(), "all".to_owned());
            // One request at a time: a retried older record never lands
            // after a newer one (compaction keeps the last).
            props.insert(
                "max.in.flight.requests.per.connection".to_owned(),
                "1".to_owned(),
            );
            Ok(props)
        }
    }
}

/// The user's properties under the client id `<client.id>-<suffix>`,
/// without idempotence or transactions.
fn plain_producer(
    kafka: &KafkaConfig,
    suffix: &str,
) -> Result<BTreeMap<String, String>, ClientError> {
    let mut props = user_properties(kafka)?;
    // An admin client is a producer handle to librdkafka: with these it
    // would ask for a producer id it never uses.
    for producer_only in ["enable.idempotence", "transactional.id"] {
        props.remove(producer_only);
    }
    let id = props
        .remove("client.id")
        .unwrap_or_else(|| "walrelay".to_owned());
    props.insert("client.id".to_owned(), format!("{id}-{suffix}"));
    Ok(props)
}

/// Closing a librdkafka client takes 100-150 ms (its threads wind down):
/// a session's start or its first record need not wait for that, so a
/// client used for one read is dropped on a thread of its own.
pub fn close_in_background<C: Send + 'static>(client: C) {
    let close = std::thread::Builder::new()
        .name("walrelay-kafka-close".into())
        .spawn(move || drop(client));
    if let Err(e) = close {
        tracing::debug!("closing a Kafka client on this thread: {e}");
    }
}

/// What `client` is made from ([`properties`], and its [`login`]).
pub fn client_config(kafka: &KafkaConfig, client: KafkaClient) -> Result<ClientSetup, ClientError> {
    Ok(ClientSetup {
        config: to_client_config(&properties(kafka, client)?),
        login: login(kafka)?,
    })
}

/// A client's librdkafka configuration and its login, kept together so
/// that no client is made without the login its properties ask for: the
/// constructors below give each kind of client its token.
#[derive(Clone)]
pub struct ClientSetup {
    /// The properties (secrets resolved: never log them but through
    /// [`crate::secrets::redact`]).
    pub config: ClientConfig,
    pub login: Login,
}

impl std::fmt::Debug for ClientSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSetup")
            .field("login", &self.login)
            .finish_non_exhaustive()
    }
}

impl ClientSetup {
    /// A group-less reader with `context`, handed its first token at once
    /// (a reader's first calls, metadata and offsets, are made before it
    /// polls) and kept fresh while it lives ([`Login::client`]).
    pub fn consumer_with<C: ConsumerContext + 'static>(
        &self,
        context: C,
    ) -> Result<Arc<BaseConsumer<C>>, KafkaError> {
        self.login.client(&self.config, context)
    }

    /// A reader with rdkafka's default behaviour and this login.
    pub fn consumer(&self) -> Result<Arc<BaseConsumer<PlainContext>>, KafkaError> {
        self.consumer_with(PlainContext)
    }

    /// An admin client with this login ([`Login::admin_client`]).
    pub fn admin(&self) -> Result<Arc<AdminClient<PlainContext>>, KafkaError> {
        self.login.admin_client(&self.config)
    }

    /// A producer with this login.
    pub fn future_producer(&self) -> Result<Arc<FutureProducer<PlainContext>>, KafkaError> {
        self.login.client(&self.config, PlainContext)
    }

    /// A producer that its user polls (the readiness probe).
    pub fn base_producer(&self) -> Result<Arc<BaseProducer<PlainContext>>, KafkaError> {
        self.login.client(&self.config, PlainContext)
    }

    /// How walrelay's own connections reach the brokers as this client
    /// does, with its tokens.
    pub fn connections(&self) -> Result<Settings, RequestError> {
        Settings::from_client_config_with_tokens(&self.config, self.login.token_source())
    }
}

const VERIFY_CLIENT_ID: &str = "walrelay-verify";

/// Overridable defaults of `walrelay verify`'s reader.
const VERIFY_DEFAULTS: &[(&str, &str)] = &[
    ("client.id", VERIFY_CLIENT_ID),
    ("fetch.wait.max.ms", "100"),
    ("socket.connection.setup.timeout.ms", "10000"),
];

/// The user's properties, secrets resolved and TLS/SASL checked, with the
/// bootstrap servers.
fn user_properties(kafka: &KafkaConfig) -> Result<BTreeMap<String, String>, ClientError> {
    let mut user =
        crate::secrets::resolve_properties(&kafka.properties).map_err(|e| ClientError::Config {
            property: e.property().to_owned(),
            reason: e.detail(),
        })?;
    check_security(&user)?;
    if is_oauthbearer(&user) {
        // The login properties are walrelay's token provider's
        // ([`login`]), never librdkafka's.
        for name in LOGIN_PROPERTIES {
            user.remove(*name);
        }
    }
    user.remove("metadata.broker.list");
    user.insert(
        "bootstrap.servers".to_owned(),
        kafka.bootstrap_servers.clone(),
    );
    Ok(user)
}

/// How every client made from `kafka` logs in: with `OAUTHBEARER`, the
/// process's token cache for its provider (shared by all of them), else
/// [`Login::none`]. Each context and each of walrelay's own connections
/// made from these settings needs it.
pub fn login(kafka: &KafkaConfig) -> Result<Login, ClientError> {
    producer_config(kafka).login()
}

fn verify_properties(kafka: &KafkaConfig) -> Result<BTreeMap<String, String>, ClientError> {
    let user = user_properties(kafka)?;
    let mut props: BTreeMap<String, String> = VERIFY_DEFAULTS
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    props.extend(user);
    // What makes this a read-only reader that commits nothing.
    for (k, v) in [
        ("enable.auto.commit", "false"),
        ("enable.auto.offset.store", "false"),
        ("enable.partition.eof", "false"),
        ("auto.offset.reset", "earliest"),
        ("allow.auto.create.topics", "false"),
    ] {
        props.insert(k.to_owned(), v.to_owned());
    }
    Ok(props)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sasl_with_password_file() -> (tempfile::TempDir, KafkaConfig) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kafka-password");
        std::fs::write(&path, "s3cret\n").unwrap();
        let mut kafka = KafkaConfig {
            bootstrap_servers: "b:9092".into(),
            ..KafkaConfig::default()
        };
        for (k, v) in [
            ("security.protocol", "sasl_plaintext".to_owned()),
            ("sasl.mechanisms", "PLAIN".to_owned()),
            ("sasl.username", "relay".to_owned()),
            ("sasl.password", format!("file:{}", path.display())),
        ] {
            kafka.properties.insert(k.into(), v);
        }
        (dir, kafka)
    }

    #[test]
    fn every_client_gets_the_secret_not_its_reference() {
        let (_dir, kafka) = sasl_with_password_file();
        for client in [
            KafkaClient::Producer,
            KafkaClient::Probe,
            KafkaClient::Verify,
            KafkaClient::Fence,
        ] {
            let p = properties(&kafka, client).unwrap();
            assert_eq!(p["sasl.password"], "s3cret", "{client:?}");
            assert_eq!(p["security.protocol"], "sasl_plaintext", "{client:?}");
            assert_eq!(p["bootstrap.servers"], "b:9092", "{client:?}");
            // librdkafka accepts it as a whole.
            client_config(&kafka, client)
                .unwrap()
                .config
                .create_native_config()
                .unwrap();
        }
    }

    #[test]
    fn an_unreadable_secret_is_an_error_for_every_client_naming_the_property() {
        let (dir, kafka) = sasl_with_password_file();
        drop(dir);
        for client in [
            KafkaClient::Producer,
            KafkaClient::Probe,
            KafkaClient::Verify,
            KafkaClient::Fence,
        ] {
            let err = properties(&kafka, client).unwrap_err().to_string();
            assert!(err.contains("sasl.password"), "{client:?}: {err}");
            assert!(!err.contains("s3cret"), "{client:?}: {err}");
        }
    }

    #[test]
    fn each_client_keeps_its_own_settings() {
        let mut kafka = KafkaConfig {
            bootstrap_servers: "b:9092".into(),
            ..KafkaConfig::default()
        };
        let probe = properties(&kafka, KafkaClient::Probe).unwrap();
        assert_eq!(probe["client.id"], "walrelay-probe");
        // The probe has the producer's defaults (it checks the relay's
        // settings), the reader has its own.
        assert_eq!(probe["message.timeout.ms"], "30000");
        let verify = properties(&kafka, KafkaClient::Verify).unwrap();
        assert_eq!(verify["client.id"], "walrelay-verify");
        assert_eq!(verify["enable.auto.commit"], "false");
        assert!(!verify.contains_key("enable.idempotence"));
        let fence = properties(&kafka, KafkaClient::Fence).unwrap();
        assert_eq!(fence["client.id"], "walrelay-fence");
        assert_eq!(fence["enable.partition.eof"], "true");
        assert_eq!(fence["enable.auto.commit"], "false");
        assert_eq!(fence["isolation.level"], "read_committed");
        kafka.properties.insert("client.id".into(), "app".into());
        kafka
            .properties
            .insert("isolation.level".into(), "read_uncommitted".into());
        assert_eq!(
            properties(&kafka, KafkaClient::Fence).unwrap()["isolation.level"],
            "read_committed",
            "the fence reads committed records whatever the user set"
        );
        kafka
            .properties
            .insert("enable.auto.commit".into(), "true".into());
        assert_eq!(
            properties(&kafka, KafkaClient::Probe).unwrap()["client.id"],
            "app-probe"
        );
        let verify = properties(&kafka, KafkaClient::Verify).unwrap();
        assert_eq!(verify["client.id"], "app");
        assert_eq!(
            properties(&kafka, KafkaClient::Fence).unwrap()["client.id"],
            "app-fence"
        );
        assert_eq!(
            verify["enable.auto.commit"], "false",
            "verify never commits"
        );
    }
}
