//! walrelay's Kafka settings (`[kafka]`: the brokers and the user's
//! librdkafka properties) and the properties the producer is created
//! with: walrelay's defaults, the user's properties, the enforced
//! guarantees ([`SinkConfig::effective_properties`]), checked by
//! [`super::policy`]. Every other client's properties start from the same
//! settings ([`super::client`]), so the checks live here, in the Kafka
//! wing, rather than with the producer that was their first user.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use serde::Deserialize;

use super::error::ClientError;
use super::login::{is_oauthbearer, Login, LOGIN_PROPERTIES};
use super::policy::{
    check_files, check_guarantees, check_ignored, check_security, find, ACKS, MAX_IN_FLIGHT,
    MAX_IN_FLIGHT_REQUESTS,
};
use crate::secrets::Redacted;
use walrelay_oauth::plan::{OAuthOptions, ProviderName};

/// `[kafka]`: the brokers and the user's librdkafka properties, as
/// written (file, environment, flags: [`crate::config::Config::kafka`]),
/// from which every client's properties are made ([`super::client`]).
///
/// `Debug` shows secret property values as `<redacted>` (secret
/// references such as `env:NAME` as written; see [`crate::secrets`]).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    pub bootstrap_servers: String,
    /// Any librdkafka producer property, passed as-is; walrelay refuses
    /// only values that would weaken its delivery guarantees, and
    /// inconsistent TLS/SASL settings. Secret properties (`sasl.password`,
    /// ...) may be `env:NAME` or `file:/path` (see [`crate::secrets`]).
    pub properties: BTreeMap<String, String>,
    /// An `OAUTHBEARER` token provider librdkafka has no property for:
    /// `"aws-msk-iam"` (see [`walrelay_oauth::plan`]).
    pub oauth_provider: Option<ProviderName>,
    /// The MSK cluster's region for `aws-msk-iam` (default: `AWS_REGION`,
    /// then `AWS_DEFAULT_REGION`).
    pub aws_region: Option<String>,
    /// Accept librdkafka's unsecured development tokens
    /// (`enable.sasl.oauthbearer.unsecure.jwt`): anyone can forge one, so
    /// the name says what it is.
    pub insecure_allow_unsecured_jwt: bool,
}

impl KafkaConfig {
    /// walrelay's own OAuth options, for the token provider's plan.
    #[must_use]
    pub fn oauth_options(&self) -> OAuthOptions {
        OAuthOptions {
            oauth_provider: self.oauth_provider,
            aws_region: self.aws_region.clone(),
            insecure_allow_unsecured_jwt: self.insecure_allow_unsecured_jwt,
        }
    }
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field(
                "properties",
                &crate::secrets::DisplayProperties(&self.properties),
            )
            .field("oauth_provider", &self.oauth_provider)
            .field("aws_region", &self.aws_region)
            .field(
                "insecure_allow_unsecured_jwt",
                &self.insecure_allow_unsecured_jwt,
            )
            .finish()
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            properties: BTreeMap::new(),
            oauth_provider: None,
            aws_region: None,
            insecure_allow_unsecured_jwt: false,
        }
    }
}

/// How long [`KafkaSink::partitions`](crate::engine::sink::KafkaSink::partitions) waits for a topic's metadata by default.
pub const DEFAULT_METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Default `queue.buffering.max.messages`. The relay bounds the number of
/// records in flight itself; librdkafka's queue must be larger than that
/// bound so that [`SinkError::QueueFull`](crate::engine::sink::SinkError::QueueFull) stays a backstop, not the normal
/// flow control.
pub const DEFAULT_QUEUE_MAX_MESSAGES: u32 = 1_000_000;

/// Default `message.timeout.ms`: a record not acknowledged within 30 s ends
/// the session, which restarts the pipeline from the slot. librdkafka's own
/// default (300 s) would hold every confirmed-LSN advance for five minutes
/// before anyone notices that Kafka is gone. The relay enforces it itself,
/// not librdkafka (see
/// [`producer_properties`](crate::engine::sink::producer_properties)).
pub const DEFAULT_MESSAGE_TIMEOUT_MS: u32 = 30_000;

/// Throughput defaults, each overridable by the user (under any alias).
///
/// - `linger.ms=5`: librdkafka's own default (and Kafka 4's Java
///   producer's), stated explicitly. Measured A/B on Apache Kafka
///   (docs/benchmarks.md, "Lever: librdkafka's `linger.ms` on Kafka"), 20
///   ms drains backlogs 8-30 % faster at 18-20 % less relay CPU per event,
///   but doubles the commit-to-ack median at live load (about 18 ms
///   against 8) and its p99 was lower in one run and higher in the next:
///   a trade, not a win, so the default keeps the median low and the docs
///   offer 20 ms to deployments that drain large backlogs or run at high
///   rates.
/// - `batch.num.messages=10000`: up to 10k records per partition batch;
///   `batch.size` (1 MB) usually binds first for larger records.
/// - `compression.codec=none`: only gzip is compiled in (libz), and gzip
///   costs more CPU than it usually saves on a local network. Set
///   `compression.codec=gzip` to trade CPU for bandwidth; codecs that are not
///   compiled in (snappy/lz4/zstd may be missing) are rejected by librdkafka
///   at start-up as a config error.
/// - `queue.buffering.max.messages`: see [`DEFAULT_QUEUE_MAX_MESSAGES`].
/// - `message.timeout.ms`: see [`DEFAULT_MESSAGE_TIMEOUT_MS`].
/// - `client.id=walrelay`: names the relay in broker logs and quotas.
const DEFAULTS: &[(&[&str], &str)] = &[
    (&["linger.ms", "queue.buffering.max.ms"], "5"),
    (&["batch.num.messages"], "10000"),
    (&["compression.codec", "compression.type"], "none"),
    (&["queue.buffering.max.messages"], "1000000"),
    (&["message.timeout.ms", "delivery.timeout.ms"], "30000"),
    (&["client.id"], "walrelay"),
];

/// librdkafka property aliases: setting two names of one group would make
/// the effective value depend on map order, so it is rejected.
const ALIASES: &[&[&str]] = &[
    &["bootstrap.servers", "metadata.broker.list"],
    &["acks", "request.required.acks"],
    &["max.in.flight.requests.per.connection", "max.in.flight"],
    &["linger.ms", "queue.buffering.max.ms"],
    &["message.timeout.ms", "delivery.timeout.ms"],
    &["compression.codec", "compression.type"],
    &["retries", "message.send.max.retries"],
    &["sasl.mechanisms", "sasl.mechanism"],
    &[
        "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.client.credentials.client.id",
    ],
    &[
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.client.credentials.client.secret",
    ],
];

const BOOTSTRAP: &[&str] = &["bootstrap.servers", "metadata.broker.list"];

/// The producer's configuration ([`crate::engine::sink::KafkaSink::new`]; the
/// readiness probe's properties are the producer's too). Named after the
/// sink that uses it; it lives here because its checks are every
/// client's.
///
/// `Debug` shows secret property values (see [`crate::secrets::is_secret_property`]) as
/// `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct SinkConfig {
    /// Comma-separated `host:port` list (librdkafka `bootstrap.servers`).
    pub bootstrap_servers: String,
    /// librdkafka properties, passed as-is except for the delivery
    /// guarantees walrelay enforces (see [`crate::engine::sink`]).
    pub properties: BTreeMap<String, String>,
    /// How long [`KafkaSink::partitions`](crate::engine::sink::KafkaSink::partitions) waits for a topic's metadata.
    pub metadata_timeout: Duration,
    /// walrelay's own `OAUTHBEARER` options (`[kafka]`), for [`Self::login`].
    pub oauth: OAuthOptions,
}

impl SinkConfig {
    /// A configuration with the given brokers and librdkafka properties and
    /// the default metadata timeout ([`DEFAULT_METADATA_TIMEOUT`]).
    pub fn new(bootstrap_servers: impl Into<String>, properties: BTreeMap<String, String>) -> Self {
        SinkConfig {
            bootstrap_servers: bootstrap_servers.into(),
            properties,
            metadata_timeout: DEFAULT_METADATA_TIMEOUT,
            oauth: OAuthOptions::default(),
        }
    }

    /// The `OAUTHBEARER` login settings checked without reading a secret
    /// or fetching a token: the provider they name and what it needs.
    fn check_login_settings(&self) -> Result<(), ClientError> {
        let shown: BTreeMap<String, String> = self
            .properties
            .iter()
            .map(|(k, v)| (k.clone(), crate::secrets::displayable(k, v).to_owned()))
            .collect();
        if is_oauthbearer(&shown) {
            walrelay_oauth::plan::plan(
                |name| shown.get(name).map(String::as_str),
                &self.oauth,
                |name| std::env::var(name).ok(),
            )?;
        }
        Ok(())
    }

    /// How the clients made from these properties log in: with
    /// `OAUTHBEARER`, the process's token cache for the provider the
    /// properties and [`Self::oauth`] name (refused, with the setting's
    /// name, when they name none it can use); else [`Login::none`].
    pub fn login(&self) -> Result<Login, ClientError> {
        let user = crate::secrets::resolve_properties(&self.properties).map_err(|e| {
            ClientError::Config {
                property: e.property().to_owned(),
                reason: e.detail(),
            }
        })?;
        check_security(&user)?;
        Login::for_properties(&user, &self.oauth)
    }

    /// Adds (or replaces) one librdkafka property.
    pub fn with_property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(name.into(), value.into());
        self
    }

    /// The properties the producer is created with: walrelay's defaults,
    /// then the user's properties, then the enforced delivery guarantees.
    /// Fails on a property that would weaken the guarantees, on a secret
    /// reference (`env:`, `file:`, see [`crate::secrets`]) that cannot be
    /// resolved, and on inconsistent TLS or SASL settings
    /// ([`check_security`]). The result holds secrets in clear text: log it
    /// only through [`redact`](crate::secrets::redact).
    pub fn effective_properties(&self) -> Result<BTreeMap<String, String>, ClientError> {
        self.properties_with(Secrets::Resolve, false)
    }

    /// `strict`: TLS or SASL properties that the security protocol ignores
    /// are errors rather than warnings.
    fn properties_with(
        &self,
        secrets: Secrets,
        strict: bool,
    ) -> Result<BTreeMap<String, String>, ClientError> {
        let user = &match secrets {
            Secrets::Resolve => {
                let user = crate::secrets::resolve_properties(&self.properties).map_err(|e| {
                    ClientError::Config {
                        property: e.property().to_owned(),
                        reason: e.detail(),
                    }
                })?;
                check_security(&user)?;
                check_ignored(&user, strict)?;
                check_files(&user)?;
                user
            }
            Secrets::Placeholder => {
                let user = self
                    .properties
                    .iter()
                    .map(|(k, v)| (k.clone(), crate::secrets::displayable(k, v).to_owned()))
                    .collect();
                check_security(&user)?;
                check_ignored(&user, strict)?;
                user
            }
        };
        for group in ALIASES {
            let set: Vec<&str> = group
                .iter()
                .copied()
                .filter(|name| user.contains_key(*name))
                .collect();
            if set.len() > 1 {
                return Err(ClientError::config(
                    set[1],
                    format!(
                        "`{}` and `{}` are aliases of one librdkafka property; set only one",
                        set[0], set[1]
                    ),
                ));
            }
        }
        check_guarantees(user)?;

        let mut props = BTreeMap::new();
        for (names, value) in DEFAULTS {
            if !names.iter().any(|name| user.contains_key(*name)) {
                props.insert(names[0].to_owned(), (*value).to_owned());
            }
        }
        props.extend(user.iter().map(|(k, v)| (k.clone(), v.clone())));
        if is_oauthbearer(user) {
            // walrelay's token provider reads these ([`super::login`]);
            // librdkafka, without libcurl, would refuse or misuse them.
            for name in LOGIN_PROPERTIES {
                props.remove(*name);
            }
        }

        // The enforced guarantees (user values, if any, were checked above
        // and are equivalent or stricter).
        props.insert("enable.idempotence".to_owned(), "true".to_owned());
        props.insert("enable.gapless.guarantee".to_owned(), "true".to_owned());
        if find(user, ACKS).is_none() {
            props.insert("acks".to_owned(), "all".to_owned());
        }
        if find(user, MAX_IN_FLIGHT).is_none() {
            props.insert(
                MAX_IN_FLIGHT[0].to_owned(),
                MAX_IN_FLIGHT_REQUESTS.to_string(),
            );
        }

        match find(user, BOOTSTRAP) {
            Some((name, value)) => {
                if !self.bootstrap_servers.is_empty() && value != self.bootstrap_servers {
                    return Err(ClientError::config(
                        name,
                        format!(
                            "conflicts with the configured bootstrap servers `{}`; set the \
                             brokers in one place",
                            self.bootstrap_servers
                        ),
                    ));
                }
            }
            None if self.bootstrap_servers.trim().is_empty() => {
                return Err(ClientError::config(
                    "bootstrap.servers",
                    "no Kafka brokers configured".to_owned(),
                ));
            }
            None => {
                props.insert(
                    "bootstrap.servers".to_owned(),
                    self.bootstrap_servers.clone(),
                );
            }
        }
        Ok(props)
    }
}

impl SinkConfig {
    /// Everything that can be checked without connecting: the properties
    /// ([`effective_properties`](Self::effective_properties)), TLS or SASL
    /// properties that the security protocol would ignore (an error here,
    /// a warning when the producer is created), then each name and value
    /// as librdkafka parses them. Creating the producer
    /// checks the rest (TLS files' contents, for one).
    pub fn validate(&self) -> Result<(), ClientError> {
        self.validate_with(Secrets::Resolve)
    }

    /// [`validate`](Self::validate) without reading anything: secret
    /// references are not resolved and files are not checked. For commands
    /// that load the whole configuration but do not produce (`setup`,
    /// `status`, `config`), which may run where the relay's Kafka secrets
    /// and certificates are not.
    pub fn validate_settings(&self) -> Result<(), ClientError> {
        self.validate_with(Secrets::Placeholder)
    }

    fn validate_with(&self, secrets: Secrets) -> Result<(), ClientError> {
        let props = self.properties_with(secrets, true)?;
        self.check_login_settings()?;
        to_client_config(&props)
            .create_native_config()
            .map(drop)
            .map_err(ClientError::from_rdkafka)
    }
}

/// How [`SinkConfig::properties_with`] treats secret properties.
#[derive(Clone, Copy)]
enum Secrets {
    /// Resolve `env:`/`file:` references and check named files.
    Resolve,
    /// Leave secrets out (a placeholder stands in) and read nothing.
    Placeholder,
}

impl fmt::Debug for SinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("properties", &Redacted(&self.properties))
            .field("metadata_timeout", &self.metadata_timeout)
            .field("oauth", &self.oauth)
            .finish()
    }
}

/// A property map as a librdkafka client configuration (for every Kafka
/// client walrelay creates; [`super::client`] builds each one with it).
pub fn to_client_config(props: &BTreeMap<String, String>) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (name, value) in props {
        c.set(name, value);
    }
    c
}
