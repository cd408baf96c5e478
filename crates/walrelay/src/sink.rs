//! The Kafka side of the relay: an idempotent, gapless producer with
//! explicit partitions and one delivery report per record.
//!
//! Delivery guarantees are not configurable. walrelay's consumers accept a
//! record only if its idempotency key is above the partition's high-water
//! mark, so the producer must write, per partition, a gapless run of the key
//! sequence in send order (see `contract.md`, "Kafka side"). That needs
//! `enable.idempotence=true`, `acks=all`, `enable.gapless.guarantee=true`,
//! at most 5 in-flight requests per connection and FIFO queuing; a user
//! property that would weaken any of them is rejected with
//! [`SinkError::Config`]. Every other librdkafka property is passed through
//! as-is.
//!
//! Delivery reports are produced by librdkafka on the producer's own polling
//! thread ([`ThreadedProducer`]) and collected in a [`DeliveryQueue`], so
//! they keep flowing while the async side is busy; [`KafkaSink::next_delivery`]
//! reads them. Any delivery error means: stop forwarding, drop the sink, restart
//! from the slot's confirmed LSN ([`SinkError::restarts_pipeline`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig, ThreadedProducer,
};
use tokio::sync::Notify;

use walrelay_pg::log_limit::KeyedLogLimit;

use crate::record::Record;
use crate::secrets::{is_secret_property, redact, Redacted, REDACTED};

/// How long [`KafkaSink::partitions`] waits for a topic's metadata by default.
pub const DEFAULT_METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// The highest `max.in.flight.requests.per.connection` walrelay accepts: the
/// idempotent producer keeps per-partition order only up to 5 (the broker
/// remembers the last 5 batches per producer and partition).
pub const MAX_IN_FLIGHT_REQUESTS: u32 = 5;

/// Default `queue.buffering.max.messages`. The relay bounds the number of
/// records in flight itself; librdkafka's queue must be larger than that
/// bound so that [`SinkError::QueueFull`] stays a backstop, not the normal
/// flow control.
pub const DEFAULT_QUEUE_MAX_MESSAGES: u32 = 1_000_000;

/// Default `message.timeout.ms`: a record not acknowledged within 30 s fails
/// its delivery, which restarts the pipeline from the slot. librdkafka's own
/// default (300 s) would hold every confirmed-LSN advance for five minutes
/// before anyone notices that Kafka is gone.
pub const DEFAULT_MESSAGE_TIMEOUT_MS: u32 = 30_000;

/// Throughput defaults, each overridable by the user (under any alias).
///
/// - `linger.ms=5`: librdkafka's own default, stated explicitly. Long enough
///   to fill batches under load, short enough that a quiet stream is not
///   delayed (a 20 ms linger has been measured to cap small-batch relays at
///   a few thousand events per second).
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

const ACKS: &[&str] = &["acks", "request.required.acks"];
const MAX_IN_FLIGHT: &[&str] = &["max.in.flight.requests.per.connection", "max.in.flight"];
const RETRIES: &[&str] = &["retries", "message.send.max.retries"];
const BOOTSTRAP: &[&str] = &["bootstrap.servers", "metadata.broker.list"];

/// Producer configuration.
///
/// `Debug` shows secret property values (see [`is_secret_property`]) as
/// `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct SinkConfig {
    /// Comma-separated `host:port` list (librdkafka `bootstrap.servers`).
    pub bootstrap_servers: String,
    /// librdkafka properties, passed as-is except for the delivery
    /// guarantees walrelay enforces (see the module documentation).
    pub properties: BTreeMap<String, String>,
    /// How long [`KafkaSink::partitions`] waits for a topic's metadata.
    pub metadata_timeout: Duration,
}

impl SinkConfig {
    /// A configuration with the given brokers and librdkafka properties and
    /// the default metadata timeout ([`DEFAULT_METADATA_TIMEOUT`]).
    pub fn new(bootstrap_servers: impl Into<String>, properties: BTreeMap<String, String>) -> Self {
        SinkConfig {
            bootstrap_servers: bootstrap_servers.into(),
            properties,
            metadata_timeout: DEFAULT_METADATA_TIMEOUT,
        }
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
    /// only through [`redact`].
    pub fn effective_properties(&self) -> Result<BTreeMap<String, String>, SinkError> {
        self.properties_with(Secrets::Resolve, false)
    }

    /// `strict`: TLS or SASL properties that the security protocol ignores
    /// are errors rather than warnings.
    fn properties_with(
        &self,
        secrets: Secrets,
        strict: bool,
    ) -> Result<BTreeMap<String, String>, SinkError> {
        let user = &match secrets {
            Secrets::Resolve => {
                let user = crate::secrets::resolve_properties(&self.properties).map_err(|e| {
                    SinkError::Config {
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
                return Err(SinkError::config(
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
                    return Err(SinkError::config(
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
                return Err(SinkError::config(
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
    pub fn validate(&self) -> Result<(), SinkError> {
        self.validate_with(Secrets::Resolve)
    }

    /// [`validate`](Self::validate) without reading anything: secret
    /// references are not resolved and files are not checked. For commands
    /// that load the whole configuration but do not produce (`setup`,
    /// `status`, `config`), which may run where the relay's Kafka secrets
    /// and certificates are not.
    pub fn validate_settings(&self) -> Result<(), SinkError> {
        self.validate_with(Secrets::Placeholder)
    }

    fn validate_with(&self, secrets: Secrets) -> Result<(), SinkError> {
        let props = self.properties_with(secrets, true)?;
        crate::kafka_client::to_client_config(&props)
            .create_native_config()
            .map(drop)
            .map_err(create_error)
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
            .finish()
    }
}

/// The first property of an alias group the user set.
fn find<'a>(props: &'a BTreeMap<String, String>, names: &[&'a str]) -> Option<(&'a str, &'a str)> {
    names
        .iter()
        .find_map(|name| props.get(*name).map(|v| (*name, v.as_str())))
}

/// librdkafka's boolean syntax.
fn parse_bool(value: &str) -> Option<bool> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("true") || value.eq_ignore_ascii_case("t") || value == "1" {
        Some(true)
    } else if value.eq_ignore_ascii_case("false") || value.eq_ignore_ascii_case("f") || value == "0"
    {
        Some(false)
    } else {
        None
    }
}

fn require_true(
    props: &BTreeMap<String, String>,
    name: &'static str,
    why: &str,
) -> Result<(), SinkError> {
    match props.get(name).map(|v| parse_bool(v)) {
        None | Some(Some(true)) => Ok(()),
        Some(_) => Err(SinkError::config(
            name,
            format!("walrelay requires {name}=true: {why}"),
        )),
    }
}

/// Rejects user properties that would weaken the delivery guarantees.
fn check_guarantees(props: &BTreeMap<String, String>) -> Result<(), SinkError> {
    require_true(
        props,
        "enable.idempotence",
        "without it a retried produce request can duplicate or reorder records within a \
         partition, and a record written after a later key is skipped by consumers as a \
         duplicate",
    )?;
    require_true(
        props,
        "enable.gapless.guarantee",
        "without it a failed batch can leave a gap in a partition while later records are \
         still written; consumers then advance their high-water mark past the gap and skip \
         the missing records when walrelay replays them",
    )?;
    if let Some((name, value)) = find(props, ACKS) {
        let value = value.trim();
        if !(value.eq_ignore_ascii_case("all") || value == "-1") {
            return Err(SinkError::config(
                name,
                format!(
                    "walrelay requires acks=all (got `{value}`): a record acknowledged by fewer \
                     replicas can be lost in a leader failover after walrelay has confirmed its \
                     WAL position to PostgreSQL, and the slot never sends it again"
                ),
            ));
        }
    }
    if let Some((name, value)) = find(props, MAX_IN_FLIGHT) {
        match value.trim().parse::<u32>() {
            Ok(n) if (1..=MAX_IN_FLIGHT_REQUESTS).contains(&n) => {}
            _ => {
                return Err(SinkError::config(
                    name,
                    format!(
                        "walrelay requires 1 to {MAX_IN_FLIGHT_REQUESTS} in-flight requests per \
                         connection (got `{value}`): the idempotent producer keeps records in \
                         order within a partition only up to {MAX_IN_FLIGHT_REQUESTS}"
                    ),
                ));
            }
        }
    }
    if let Some(value) = props.get("queuing.strategy") {
        if !value.trim().eq_ignore_ascii_case("fifo") {
            return Err(SinkError::config(
                "queuing.strategy",
                format!(
                    "walrelay requires queuing.strategy=fifo (got `{value}`): any other \
                     strategy reorders records within a partition"
                ),
            ));
        }
    }
    if let Some(value) = props.get("delivery.report.only.error") {
        if parse_bool(value) != Some(false) {
            return Err(SinkError::config(
                "delivery.report.only.error",
                "walrelay requires delivery.report.only.error=false: it confirms WAL positions \
                 to PostgreSQL only from successful delivery reports"
                    .to_owned(),
            ));
        }
    }
    if let Some((name, value)) = find(props, RETRIES) {
        if !matches!(value.trim().parse::<u32>(), Ok(n) if n > 0) {
            return Err(SinkError::config(
                name,
                format!(
                    "walrelay requires retries > 0 (got `{value}`): the idempotent producer \
                     retries transient broker errors itself; without retries every one of them \
                     restarts the pipeline"
                ),
            ));
        }
    }
    if props.contains_key("transactional.id") {
        return Err(SinkError::config(
            "transactional.id",
            "walrelay does not use Kafka transactions (consumers deduplicate by idempotency \
             key); a transactional producer would reject records sent outside a transaction"
                .to_owned(),
        ));
    }
    Ok(())
}

/// librdkafka's `security.protocol` values.
const SECURITY_PROTOCOLS: &[&str] = &["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"];

/// The SASL mechanisms walrelay supports. GSSAPI needs Cyrus SASL and
/// Kerberos, which are not linked in; OAUTHBEARER needs a token provider:
/// librdkafka's OIDC client needs libcurl, which is not linked in either,
/// and its other provider makes unsecured test tokens.
const SASL_MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

const SASL_MECHANISM: &[&str] = &["sasl.mechanisms", "sasl.mechanism"];

/// Properties that name a file librdkafka reads when the producer is
/// created: checked up front so that a wrong path is reported by name.
const FILE_PROPERTIES: &[&str] = &[
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.crl.location",
    "ssl.keystore.location",
    "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.jwt.template.file",
];

/// The features compiled into librdkafka (its `builtin.features`
/// property), e.g. `ssl`, `sasl_scram`, `sasl_oauthbearer`, `gzip`.
pub fn builtin_features() -> Vec<String> {
    static FEATURES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    FEATURES
        .get_or_init(|| {
            ClientConfig::new()
                .create_native_config()
                .and_then(|c| c.get("builtin.features"))
                .map(|f| f.split(',').map(|s| s.trim().to_owned()).collect())
                .unwrap_or_default()
        })
        .clone()
}

fn require_feature(feature: &str, property: &str, what: &str) -> Result<(), SinkError> {
    let features = builtin_features();
    if features.iter().any(|f| f == feature) {
        return Ok(());
    }
    Err(SinkError::config(
        property,
        format!(
            "{what} needs librdkafka feature `{feature}`, which this walrelay build lacks \
             (built in: {}); build rdkafka with its `ssl` feature (scripts/install-deps.sh \
             installs OpenSSL's headers)",
            features.join(",")
        ),
    ))
}

/// Checks the TLS and SASL settings before librdkafka sees them, so that a
/// mistake is reported with the property and the fix rather than as a
/// failed connection later: the security protocol and SASL mechanism are
/// known and built in, and a password mechanism has a user name and
/// password. Warns about settings that weaken TLS. `props` are the user's
/// properties; [`check_files`] checks the files they name.
pub fn check_security(props: &BTreeMap<String, String>) -> Result<(), SinkError> {
    let protocol = props
        .get("security.protocol")
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_else(|| "plaintext".to_owned());
    if !SECURITY_PROTOCOLS.contains(&protocol.as_str()) {
        return Err(SinkError::config(
            "security.protocol",
            format!(
                "unknown security protocol `{}`; use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
                props["security.protocol"]
            ),
        ));
    }
    let shown = protocol.to_ascii_uppercase();
    let tls = protocol.ends_with("ssl");
    let sasl = protocol.starts_with("sasl_");
    if tls {
        require_feature(
            "ssl",
            "security.protocol",
            &format!("security.protocol={shown}"),
        )?;
    }
    if sasl {
        let Some((name, mechanism)) = find(props, SASL_MECHANISM) else {
            return Err(SinkError::config(
                "sasl.mechanism",
                format!(
                    "security.protocol={shown} needs a SASL mechanism: set sasl.mechanism to \
                     {} (librdkafka's default, GSSAPI/Kerberos, is not built into walrelay)",
                    SASL_MECHANISMS.join(", ")
                ),
            ));
        };
        let mechanism = mechanism.trim().to_ascii_uppercase();
        match mechanism.as_str() {
            "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512" => {
                if mechanism.starts_with("SCRAM") {
                    require_feature("sasl_scram", name, &format!("{name}={mechanism}"))?;
                }
                for needed in ["sasl.username", "sasl.password"] {
                    if props.get(needed).is_none_or(|v| v.is_empty()) {
                        return Err(SinkError::config(
                            needed,
                            format!(
                                "{name}={mechanism} needs sasl.username and sasl.password \
                                 (the password may be given as `env:NAME` or `file:/path`, \
                                 see docs/security.md)"
                            ),
                        ));
                    }
                }
                if mechanism == "PLAIN" && !tls {
                    tracing::warn!(
                        "security.protocol=SASL_PLAINTEXT with sasl.mechanism=PLAIN sends the \
                         Kafka password in clear text; use SASL_SSL"
                    );
                }
            }
            "OAUTHBEARER" => {
                return Err(SinkError::config(
                    name,
                    "OAUTHBEARER is not supported: walrelay's librdkafka has no OIDC token \
                     provider (it needs libcurl) and its built-in provider makes only \
                     unsecured test tokens; use SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN (over \
                     SASL_SSL)"
                        .to_owned(),
                ));
            }
            "GSSAPI" => {
                return Err(SinkError::config(
                    name,
                    "GSSAPI (Kerberos) is not built into walrelay's librdkafka; use \
                     SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN (over SASL_SSL)"
                        .to_owned(),
                ));
            }
            _ => {
                return Err(SinkError::config(
                    name,
                    format!(
                        "unknown SASL mechanism `{mechanism}`; use one of {}",
                        SASL_MECHANISMS.join(", ")
                    ),
                ));
            }
        }
    }
    if props
        .get("enable.ssl.certificate.verification")
        .is_some_and(|v| parse_bool(v) == Some(false))
    {
        tracing::warn!(
            "enable.ssl.certificate.verification=false: any server can impersonate the Kafka \
             brokers; set ssl.ca.location to the brokers' CA instead"
        );
    }
    if props
        .get("ssl.endpoint.identification.algorithm")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
    {
        tracing::warn!(
            "ssl.endpoint.identification.algorithm=none: broker host names are not checked \
             against their certificates"
        );
    }
    Ok(())
}

/// TLS or SASL properties that the security protocol ignores: likely a
/// forgotten `security.protocol`. An error if `strict`, else a warning.
fn check_ignored(props: &BTreeMap<String, String>, strict: bool) -> Result<(), SinkError> {
    let protocol = props
        .get("security.protocol")
        .map(|v| v.trim().to_ascii_uppercase())
        .unwrap_or_else(|| "PLAINTEXT".to_owned());
    let ignored = if !protocol.ends_with("SSL") {
        props.keys().find(|k| k.starts_with("ssl.")).map(|name| {
            (
                name,
                format!(
                    "is set, but security.protocol is {protocol}, which does not use TLS; set \
                     security.protocol=SSL or SASL_SSL"
                ),
            )
        })
    } else {
        None
    };
    let ignored = ignored.or_else(|| {
        if protocol.starts_with("SASL_") {
            return None;
        }
        props.keys().find(|k| k.starts_with("sasl.")).map(|name| {
            (
                name,
                format!(
                    "is set, but security.protocol is {protocol}, so no SASL authentication \
                     happens; set security.protocol=SASL_SSL"
                ),
            )
        })
    });
    match ignored {
        None => Ok(()),
        Some((name, reason)) if strict => Err(SinkError::config(name, reason)),
        Some((name, reason)) => {
            tracing::warn!("Kafka producer property `{name}` {reason}");
            Ok(())
        }
    }
}

/// Checks that the files named by `ssl.*.location` (and similar)
/// properties exist and can be read, naming the property if not.
pub fn check_files(props: &BTreeMap<String, String>) -> Result<(), SinkError> {
    for name in FILE_PROPERTIES {
        let Some(path) = props.get(*name) else {
            continue;
        };
        if *name == "ssl.ca.location" && path.trim() == "probe" {
            continue;
        }
        let readable = std::fs::metadata(path).and_then(|m| {
            if m.is_file() {
                std::fs::File::open(path).map(drop)
            } else {
                Ok(())
            }
        });
        if let Err(e) = readable {
            return Err(SinkError::config(
                name,
                format!("cannot read `{path}`: {e}"),
            ));
        }
    }
    Ok(())
}

/// The outcome of one [`KafkaSink::send`].
#[derive(Debug)]
pub struct Delivery {
    /// The `seq` passed to [`KafkaSink::send`].
    pub seq: u64,
    /// `(partition, offset)` of the written record, or why it failed.
    pub result: Result<(i32, i64), SinkError>,
}

/// What the relay should do about a [`SinkError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Nothing is lost: wait for deliveries, then send the record again.
    RetryAfterDeliveries,
    /// Stop forwarding, drop the sink, reconnect to the slot from its
    /// confirmed LSN and replay.
    RestartFromSlot,
    /// Restarting cannot help (configuration, a record the broker can never
    /// take): stop with the error.
    Fatal,
}

/// Errors of the Kafka sink.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// A producer property is invalid or would weaken the delivery
    /// guarantees.
    #[error("Kafka producer property `{property}`: {reason}")]
    Config {
        /// The property's name.
        property: String,
        /// Why it is rejected (never contains a secret value).
        reason: String,
    },
    /// librdkafka refused to create the producer.
    #[error("cannot create the Kafka producer: {0}")]
    Create(String),
    /// librdkafka's queue is full: wait for deliveries and send again.
    #[error("the Kafka producer queue is full (queue.buffering.max.messages/kbytes)")]
    QueueFull,
    /// A record could not be enqueued.
    #[error("cannot enqueue a record for {topic} partition {partition}: {message} ({code:?})")]
    Produce {
        /// Target topic.
        topic: String,
        /// Target partition.
        partition: i32,
        /// librdkafka's error code.
        code: RDKafkaErrorCode,
        /// librdkafka's description, with context.
        message: String,
    },
    /// A record larger than the producer (`message.max.bytes`, checked
    /// when it is enqueued) or the broker (the topic's
    /// `max.message.bytes`, in the delivery report) accepts. Not retried:
    /// a replay would fail at the same record. A dead-letter record cannot
    /// stand in for it either, since it would carry the same bytes.
    #[error(
        "record {key} for {topic} partition {partition} is {bytes} bytes (key, value and \
         headers), more than Kafka accepts: {message} ({code:?}); fix: raise the topic's \
         max.message.bytes and the producer's message.max.bytes (kafka.properties, e.g. \
         \"message.max.bytes\" = \"10485760\") together with the consumers' fetch sizes, or keep \
         events smaller (store large payloads elsewhere and publish a reference); nothing from \
         this event on was confirmed to PostgreSQL, so it is replayed when walrelay starts again"
    )]
    RecordTooLarge {
        /// The record's idempotency key (32 hex digits), or `?` if unknown.
        key: String,
        /// Target topic.
        topic: String,
        /// Target partition.
        partition: i32,
        /// Key, value and header bytes.
        bytes: usize,
        /// librdkafka's error code (`MessageSizeTooLarge`).
        code: RDKafkaErrorCode,
        /// librdkafka's description.
        message: String,
    },
    /// Kafka did not acknowledge a record.
    #[error("delivery to {topic} partition {partition} failed: {message} ({code:?})")]
    Delivery {
        /// Target topic.
        topic: String,
        /// Target partition.
        partition: i32,
        /// librdkafka's error code.
        code: RDKafkaErrorCode,
        /// librdkafka's description, with context.
        message: String,
    },
    /// Topic metadata could not be fetched.
    #[error("cannot fetch metadata for topic `{topic}`: {message}")]
    Metadata {
        /// The topic.
        topic: String,
        /// librdkafka's or the broker's error code.
        code: Option<RDKafkaErrorCode>,
        /// What went wrong.
        message: String,
    },
    /// The topic does not exist and the brokers did not create it.
    #[error(
        "Kafka topic `{topic}` does not exist (last broker answer: {last_error}) and was not \
         auto-created; create it before starting walrelay, e.g. `kafka-topics.sh --create \
         --topic {topic} --partitions N`, or allow auto-creation on the brokers \
         (auto.create.topics.enable=true) and in the producer (allow.auto.create.topics=true)"
    )]
    TopicMissing {
        /// The topic.
        topic: String,
        /// The broker's last answer for the topic.
        last_error: String,
    },
    /// [`KafkaSink::flush`] timed out.
    #[error("flush timed out with {in_flight} records not yet acknowledged")]
    FlushTimeout {
        /// Records (and requests) still in librdkafka's queues.
        in_flight: i32,
    },
    /// Flushing failed.
    #[error("flush failed: {0}")]
    Flush(RDKafkaErrorCode),
    /// A blocking helper task failed (panic or runtime shut down).
    #[error("Kafka {operation} task failed: {message}")]
    Task {
        /// What the task was doing.
        operation: &'static str,
        /// The join error.
        message: String,
    },
}

impl SinkError {
    fn config(property: &str, reason: String) -> Self {
        SinkError::Config {
            property: property.to_owned(),
            reason,
        }
    }

    /// What the relay should do about this error.
    pub fn recovery(&self) -> Recovery {
        match self {
            SinkError::QueueFull => Recovery::RetryAfterDeliveries,
            SinkError::Config { .. } | SinkError::Create(_) | SinkError::RecordTooLarge { .. } => {
                Recovery::Fatal
            }
            // A record too large for librdkafka is too large on replay too.
            SinkError::Produce {
                code: RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidArgument,
                ..
            } => Recovery::Fatal,
            // The contract: any delivery failure restarts from the slot.
            SinkError::Delivery { .. }
            | SinkError::Produce { .. }
            | SinkError::Metadata { .. }
            | SinkError::TopicMissing { .. }
            | SinkError::FlushTimeout { .. }
            | SinkError::Flush(_)
            | SinkError::Task { .. } => Recovery::RestartFromSlot,
        }
    }

    /// Whether the error means "stop forwarding and restart the pipeline from
    /// the slot's confirmed LSN". True for every delivery error.
    pub fn restarts_pipeline(&self) -> bool {
        self.recovery() == Recovery::RestartFromSlot
    }

    /// librdkafka's error code, if the error has one.
    pub fn code(&self) -> Option<RDKafkaErrorCode> {
        match self {
            SinkError::Produce { code, .. }
            | SinkError::Delivery { code, .. }
            | SinkError::RecordTooLarge { code, .. } => Some(*code),
            SinkError::Metadata { code, .. } => *code,
            SinkError::Flush(code) => Some(*code),
            SinkError::QueueFull => Some(RDKafkaErrorCode::QueueFull),
            _ => None,
        }
    }
}

/// Delivery reports on their way from librdkafka's polling thread to the
/// relay: a vector under a mutex, taken whole, with one wake-up when it
/// turns non-empty. librdkafka reports deliveries in bursts (one per
/// produce request); a channel send and a wake-up per report cost the
/// relay more than the reports themselves.
///
/// Unbounded: the relay bounds the number of records in flight (and
/// librdkafka's queue bounds them too), so at most that many reports wait
/// here. A bounded queue would block librdkafka's polling thread.
#[derive(Default)]
struct DeliveryQueue {
    reports: Mutex<Vec<Delivery>>,
    /// Signalled when `reports` turns non-empty. `Notify` keeps the signal
    /// if nobody waits yet, so a report pushed between the reader's check
    /// and its wait is not missed.
    ready: Notify,
}

impl DeliveryQueue {
    fn push(&self, delivery: Delivery) {
        let mut reports = self.reports.lock().unwrap_or_else(PoisonError::into_inner);
        let first = reports.is_empty();
        reports.push(delivery);
        drop(reports);
        if first {
            self.ready.notify_one();
        }
    }

    /// Every report queued so far, in order.
    fn take(&self) -> Vec<Delivery> {
        std::mem::take(&mut *self.reports.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Receives librdkafka's callbacks on the producer's polling thread.
struct SinkContext {
    deliveries: Arc<DeliveryQueue>,
    /// The producer's fatal error (e.g. a gapless-guarantee violation), to
    /// explain the purge errors that follow it.
    fatal: Mutex<Option<String>>,
}

/// At most one librdkafka log line per facility (and one error event per
/// error code) in this interval; the next one says how many were left out.
pub const LIBRDKAFKA_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// librdkafka repeats its complaints many times a second while a broker is
/// down (each also as an error event): per facility or error code, one
/// line per [`LIBRDKAFKA_LOG_INTERVAL`]. For the whole process, so that the
/// producers of successive sessions during an outage share it.
static LIBRDKAFKA_LOGS: LazyLock<KeyedLogLimit> =
    LazyLock::new(|| KeyedLogLimit::new(LIBRDKAFKA_LOG_INTERVAL, 64));

impl ClientContext for SinkContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        // Debug output is asked for explicitly: all of it.
        let suppressed = if matches!(level, RDKafkaLogLevel::Debug) {
            0
        } else {
            match LIBRDKAFKA_LOGS.check(fac) {
                Some(n) => n,
                None => return,
            }
        };
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility = fac, suppressed, "{message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", facility = fac, suppressed, "{message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility = fac, suppressed, "{message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", facility = fac, "{message}")
            }
        }
    }

    fn stats_raw(&self, statistics: &[u8]) {
        tracing::debug!(
            target: "librdkafka::stats",
            "{}",
            String::from_utf8_lossy(statistics)
        );
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal)) {
            tracing::error!(target: "librdkafka", "Kafka producer fatal error: {reason}");
            let mut fatal = self.fatal.lock().unwrap_or_else(PoisonError::into_inner);
            fatal.get_or_insert_with(|| reason.to_owned());
        } else {
            let code = error
                .rdkafka_error_code()
                .map_or_else(|| "other".to_owned(), |c| format!("error:{c:?}"));
            if let Some(suppressed) = LIBRDKAFKA_LOGS.check(&code) {
                tracing::warn!(target: "librdkafka", suppressed, "Kafka producer error: {error}: {reason}");
            }
        }
    }
}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, seq: usize) {
        let result = match result {
            Ok(message) => Ok((message.partition(), message.offset())),
            Err((error, message)) if is_too_large(error.rdkafka_error_code()) => {
                let code = error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
                let headers = message.headers();
                let key = headers
                    .and_then(|h| {
                        h.iter()
                            .find(|h| h.key == crate::record::header::IDEMPOTENCY_KEY)
                            .and_then(|h| h.value)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                    })
                    .unwrap_or_else(|| "?".to_owned());
                let header_bytes: usize = headers.map_or(0, |h| {
                    h.iter()
                        .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
                        .sum()
                });
                Err(SinkError::RecordTooLarge {
                    key,
                    topic: message.topic().to_owned(),
                    partition: message.partition(),
                    bytes: message.key().map_or(0, <[u8]>::len)
                        + message.payload().map_or(0, <[u8]>::len)
                        + header_bytes,
                    code,
                    message: self.describe(code),
                })
            }
            Err((error, message)) => {
                let code = error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
                Err(SinkError::Delivery {
                    topic: message.topic().to_owned(),
                    partition: message.partition(),
                    code,
                    message: self.describe(code),
                })
            }
        };
        self.deliveries.push(Delivery {
            seq: seq as u64,
            result,
        });
    }
}

impl SinkContext {
    fn describe(&self, code: RDKafkaErrorCode) -> String {
        let fatal = self.fatal.lock().unwrap_or_else(PoisonError::into_inner);
        match (code, fatal.as_deref()) {
            (_, Some(reason)) => format!("{code}; the producer stopped: {reason}"),
            (RDKafkaErrorCode::MessageTimedOut, None) => format!(
                "{code}: not acknowledged within message.timeout.ms (brokers unreachable or too \
                 slow)"
            ),
            _ => code.to_string(),
        }
    }
}

type Inner = ThreadedProducer<SinkContext>;

/// An idempotent, gapless Kafka producer with explicit partitions.
///
/// Dropping it purges everything not yet acknowledged (the pipeline replays
/// from the slot anyway) and waits at most about half a second for
/// librdkafka to wind down; it blocks the current thread for that long.
pub struct KafkaSink {
    producer: Arc<Inner>,
    deliveries: Arc<DeliveryQueue>,
    /// Reports taken from `deliveries` and not yet returned.
    taken: std::vec::IntoIter<Delivery>,
    partition_counts: Mutex<HashMap<String, u32>>,
    metadata_timeout: Duration,
}

impl fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("in_flight", &self.producer.in_flight_count())
            .field("metadata_timeout", &self.metadata_timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// Creates the producer (it connects in the background).
    pub fn new(config: &SinkConfig) -> Result<KafkaSink, SinkError> {
        let props = config.effective_properties()?;
        let mut client_config = crate::kafka_client::to_client_config(&props);
        // librdkafka's log level gates what reaches `ClientContext::log`.
        client_config.set_log_level(
            if props.contains_key("debug")
                || tracing::enabled!(target: "librdkafka", tracing::Level::DEBUG)
            {
                RDKafkaLogLevel::Debug
            } else if tracing::enabled!(target: "librdkafka", tracing::Level::INFO) {
                RDKafkaLogLevel::Info
            } else {
                RDKafkaLogLevel::Warning
            },
        );
        tracing::debug!(properties = ?redact(&props), "creating the Kafka producer");

        let deliveries = Arc::new(DeliveryQueue::default());
        let context = SinkContext {
            deliveries: Arc::clone(&deliveries),
            fatal: Mutex::new(None),
        };
        let producer: Inner = client_config
            .create_with_context(context)
            .map_err(create_error)?;
        Ok(KafkaSink {
            producer: Arc::new(producer),
            deliveries,
            taken: Vec::new().into_iter(),
            partition_counts: Mutex::new(HashMap::new()),
            metadata_timeout: config.metadata_timeout,
        })
    }

    /// The topic's partition count, from metadata (cached per topic for the
    /// sink's lifetime: a new pipeline run builds a new sink). Fetching
    /// metadata may auto-create a missing topic where the brokers allow it;
    /// a topic that still does not exist when the metadata timeout runs out
    /// is [`SinkError::TopicMissing`].
    pub async fn partitions(&self, topic: &str) -> Result<u32, SinkError> {
        if let Some(&count) = self
            .partition_counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(topic)
        {
            return Ok(count);
        }
        let producer = Arc::clone(&self.producer);
        let name = topic.to_owned();
        let timeout = self.metadata_timeout;
        let count = tokio::task::spawn_blocking(move || partition_count(&producer, &name, timeout))
            .await
            .map_err(|e| SinkError::Task {
                operation: "metadata",
                message: e.to_string(),
            })??;
        self.partition_counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(topic.to_owned(), count);
        Ok(count)
    }

    /// Enqueues one record for `partition` without blocking. Its outcome
    /// arrives later from [`next_delivery`](Self::next_delivery), tagged with
    /// `seq`. [`SinkError::QueueFull`] means nothing was enqueued: wait for
    /// deliveries and send again.
    pub fn send(&self, seq: u64, record: &Record, partition: u32) -> Result<(), SinkError> {
        let produce_error = |code: RDKafkaErrorCode, message: String| SinkError::Produce {
            topic: record.topic.to_string(),
            partition: i32::try_from(partition).unwrap_or(i32::MAX),
            code,
            message,
        };
        let Ok(kafka_partition) = i32::try_from(partition) else {
            return Err(produce_error(
                RDKafkaErrorCode::InvalidArgument,
                "partition number out of range".to_owned(),
            ));
        };
        let Ok(opaque) = usize::try_from(seq) else {
            return Err(produce_error(
                RDKafkaErrorCode::InvalidArgument,
                "sequence number does not fit in usize".to_owned(),
            ));
        };
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (name, value) in &record.headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_ref()),
            });
        }
        let mut kafka_record: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(&record.topic, opaque)
                .partition(kafka_partition)
                .headers(headers);
        if let Some(key) = &record.key {
            kafka_record = kafka_record.key(key.as_ref());
        }
        if let Some(value) = &record.value {
            kafka_record = kafka_record.payload(value.as_ref());
        }
        if let Some(timestamp) = record.timestamp_ms {
            kafka_record = kafka_record.timestamp(timestamp);
        }
        match self.producer.send(kafka_record) {
            Ok(()) => Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                Err(SinkError::QueueFull)
            }
            Err((error, _)) if is_too_large(error.rdkafka_error_code()) => {
                Err(SinkError::RecordTooLarge {
                    key: record.event_key.to_hex(),
                    topic: record.topic.to_string(),
                    partition: kafka_partition,
                    bytes: record.size() - record.topic.len(),
                    code: RDKafkaErrorCode::MessageSizeTooLarge,
                    message: error.to_string(),
                })
            }
            Err((error, _)) => {
                let code = error
                    .rdkafka_error_code()
                    .unwrap_or(RDKafkaErrorCode::InvalidArgument);
                let message = match self.producer.client().fatal_error() {
                    Some((_, reason)) => format!("{code}; the producer stopped: {reason}"),
                    None => error.to_string(),
                };
                Err(produce_error(code, message))
            }
        }
    }

    /// The next delivery report, in the order librdkafka reports them
    /// (per partition that is send order). Cancel-safe: the only await is
    /// the wake-up, and reports already taken stay in the sink. Pends
    /// while nothing is in flight. The producer lives as long as the sink,
    /// so there is no "closed" outcome.
    pub async fn next_delivery(&mut self) -> Delivery {
        loop {
            if let Some(delivery) = self.try_next_delivery() {
                return delivery;
            }
            self.deliveries.ready.notified().await;
        }
    }

    /// A delivery report that is already available, without waiting.
    pub fn try_next_delivery(&mut self) -> Option<Delivery> {
        let delivery = match self.taken.next() {
            Some(d) => d,
            None => {
                self.taken = self.deliveries.take().into_iter();
                self.taken.next()?
            }
        };
        Some(self.explain(delivery))
    }

    /// Adds the producer's fatal error to a purge error reported before the
    /// fatal error event reached the context.
    fn explain(&self, mut delivery: Delivery) -> Delivery {
        if let Err(SinkError::Delivery {
            code: RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight,
            message,
            ..
        }) = &mut delivery.result
        {
            if !message.contains("the producer stopped") {
                if let Some((code, reason)) = self.producer.client().fatal_error() {
                    message.push_str(&format!("; the producer stopped: {code:?}: {reason}"));
                }
            }
        }
        delivery
    }

    /// Records (and requests) librdkafka has not finished with, including
    /// delivery reports not yet handed to the channel.
    pub fn in_flight(&self) -> i32 {
        self.producer.in_flight_count()
    }

    /// Waits until every enqueued record has a delivery report (success or
    /// failure), or `timeout`. Runs on a blocking thread; cancelling the
    /// returned future does not stop that thread before `timeout`.
    ///
    /// Queued records still wait out `linger.ms`: rdkafka 0.39 implements
    /// flush as repeated `rd_kafka_flush(0)` calls plus polling, so
    /// librdkafka's "ignore linger while flushing" lasts only for each
    /// instant call. With the default `linger.ms=5` that does not matter.
    pub async fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        let producer = Arc::clone(&self.producer);
        tokio::task::spawn_blocking(move || match producer.flush(timeout) {
            Ok(()) => Ok(()),
            Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => {
                Err(SinkError::FlushTimeout {
                    in_flight: producer.in_flight_count(),
                })
            }
            Err(error) => Err(SinkError::Flush(
                error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
            )),
        })
        .await
        .map_err(|e| SinkError::Task {
            operation: "flush",
            message: e.to_string(),
        })?
    }
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        // Unacknowledged records fail with a purge error (nobody listens any
        // more); a flush running on a blocking thread returns promptly. The
        // producer's own drop then purges again, flushes for at most 500 ms
        // and destroys the client.
        self.producer
            .purge(PurgeConfig::default().queue().inflight().non_blocking());
    }
}

/// librdkafka's answer to a record above `message.max.bytes` (at enqueue)
/// or the broker's limit (in a delivery report).
fn is_too_large(code: Option<RDKafkaErrorCode>) -> bool {
    code == Some(RDKafkaErrorCode::MessageSizeTooLarge)
}

fn create_error(error: KafkaError) -> SinkError {
    match error {
        KafkaError::ClientConfig(_, description, property, value) => {
            let reason = if is_secret_property(&property) {
                // librdkafka's description may quote the value.
                let description = if value.is_empty() {
                    description
                } else {
                    description.replace(&value, REDACTED)
                };
                format!("invalid value: {description}")
            } else {
                format!("{description} (value `{value}`)")
            };
            SinkError::Config { property, reason }
        }
        KafkaError::ClientCreation(message) => SinkError::Create(message),
        other => SinkError::Create(other.to_string()),
    }
}

/// Blocking: the topic's partition count from metadata, retried until
/// `timeout` while the topic is missing or being created.
fn partition_count(producer: &Inner, topic: &str, timeout: Duration) -> Result<u32, SinkError> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(50);
    let mut last_error = String::from("no answer");
    loop {
        let remaining = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let metadata = producer
            .client()
            .fetch_metadata(Some(topic), remaining)
            .map_err(|error| {
                let code = error.rdkafka_error_code();
                SinkError::Metadata {
                    topic: topic.to_owned(),
                    code,
                    message: match code {
                        Some(code) => format!("{code} (waited up to {timeout:?})"),
                        None => error.to_string(),
                    },
                }
            })?;
        if let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) {
            match found.error().map(RDKafkaErrorCode::from) {
                None if !found.partitions().is_empty() => {
                    return u32::try_from(found.partitions().len()).map_err(|_| {
                        SinkError::Metadata {
                            topic: topic.to_owned(),
                            code: None,
                            message: "too many partitions".to_owned(),
                        }
                    });
                }
                None => last_error = "the topic has no partitions".to_owned(),
                // Missing, or being auto-created: ask again.
                Some(
                    code @ (RDKafkaErrorCode::UnknownTopicOrPartition
                    | RDKafkaErrorCode::UnknownTopic
                    | RDKafkaErrorCode::LeaderNotAvailable),
                ) => last_error = code.to_string(),
                Some(code) => {
                    return Err(SinkError::Metadata {
                        topic: topic.to_owned(),
                        code: Some(code),
                        message: code.to_string(),
                    });
                }
            }
        }
        if Instant::now() + backoff >= deadline {
            return Err(SinkError::TopicMissing {
                topic: topic.to_owned(),
                last_error,
            });
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Log output captured in memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A broker that is down: librdkafka reports each failed connection
    /// attempt as a log line and as an error event, about 30 a second.
    /// walrelay logged every one of them.
    #[test]
    fn librdkafka_complaining_about_a_broker_that_is_down_is_logged_once_per_interval() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let context = SinkContext {
            deliveries: Arc::new(DeliveryQueue::default()),
            fatal: Mutex::new(None),
        };
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..300 {
                // A facility of this test's own: the limit is process-wide.
                context.log(
                    RDKafkaLogLevel::Error,
                    "TESTFAIL",
                    "sasl_plaintext://b:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused",
                );
                context.error(
                    KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
                    "1/1 brokers are down",
                );
            }
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches("Connect to ipv4").count(), 1, "{text}");
        assert_eq!(text.matches("1/1 brokers are down").count(), 1, "{text}");
        assert!(text.contains("suppressed=0"), "{text}");
    }
}
