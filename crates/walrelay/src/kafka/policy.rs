//! The property policy: which librdkafka settings walrelay refuses
//! because they would weaken its delivery guarantees, and the TLS/SASL
//! checks that report a mistake by property name before librdkafka sees it.
//! Pure functions of a property map (apart from reading the files named by
//! TLS properties), shared by the producer and every other Kafka client.

use std::collections::BTreeMap;

use rdkafka::config::ClientConfig;

use super::error::ClientError;

/// The highest `max.in.flight.requests.per.connection` walrelay accepts: the
/// idempotent producer keeps per-partition order only up to 5 (the broker
/// remembers the last 5 batches per producer and partition).
pub const MAX_IN_FLIGHT_REQUESTS: u32 = 5;

pub(super) const ACKS: &[&str] = &["acks", "request.required.acks"];
pub(super) const MAX_IN_FLIGHT: &[&str] =
    &["max.in.flight.requests.per.connection", "max.in.flight"];
const RETRIES: &[&str] = &["retries", "message.send.max.retries"];

/// The first property of an alias group the user set.
pub(super) fn find<'a>(
    props: &'a BTreeMap<String, String>,
    names: &[&'a str],
) -> Option<(&'a str, &'a str)> {
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
) -> Result<(), ClientError> {
    match props.get(name).map(|v| parse_bool(v)) {
        None | Some(Some(true)) => Ok(()),
        Some(_) => Err(ClientError::config(
            name,
            format!("walrelay requires {name}=true: {why}"),
        )),
    }
}

/// Rejects user properties that would weaken the delivery guarantees.
pub(super) fn check_guarantees(props: &BTreeMap<String, String>) -> Result<(), ClientError> {
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
            return Err(ClientError::config(
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
                return Err(ClientError::config(
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
            return Err(ClientError::config(
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
            return Err(ClientError::config(
                "delivery.report.only.error",
                "walrelay requires delivery.report.only.error=false: it confirms WAL positions \
                 to PostgreSQL only from successful delivery reports"
                    .to_owned(),
            ));
        }
    }
    if let Some((name, value)) = find(props, RETRIES) {
        if !matches!(value.trim().parse::<u32>(), Ok(n) if n > 0) {
            return Err(ClientError::config(
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
        return Err(ClientError::config(
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
/// Kerberos, which are not linked in. OAUTHBEARER's tokens come from
/// walrelay's own provider ([`super::login`]), not from librdkafka's OIDC
/// client, which needs libcurl.
const SASL_MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"];

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

fn require_feature(feature: &str, property: &str, what: &str) -> Result<(), ClientError> {
    let features = builtin_features();
    if features.iter().any(|f| f == feature) {
        return Ok(());
    }
    Err(ClientError::config(
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
pub fn check_security(props: &BTreeMap<String, String>) -> Result<(), ClientError> {
    let protocol = props
        .get("security.protocol")
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_else(|| "plaintext".to_owned());
    if !SECURITY_PROTOCOLS.contains(&protocol.as_str()) {
        return Err(ClientError::config(
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
            return Err(ClientError::config(
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
                        return Err(ClientError::config(
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
                // The login settings themselves are walrelay's token
                // provider's to check (`kafka::login`), with their names.
                require_feature("sasl_oauthbearer", name, &format!("{name}={mechanism}"))?;
            }
            "GSSAPI" => {
                return Err(ClientError::config(
                    name,
                    "GSSAPI (Kerberos) is not built into walrelay's librdkafka; use \
                     SCRAM-SHA-512, SCRAM-SHA-256, OAUTHBEARER or PLAIN (over SASL_SSL)"
                        .to_owned(),
                ));
            }
            _ => {
                return Err(ClientError::config(
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
pub(super) fn check_ignored(
    props: &BTreeMap<String, String>,
    strict: bool,
) -> Result<(), ClientError> {
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
        Some((name, reason)) if strict => Err(ClientError::config(name, reason)),
        Some((name, reason)) => {
            tracing::warn!("Kafka producer property `{name}` {reason}");
            Ok(())
        }
    }
}

/// Checks that the files named by `ssl.*.location` (and similar)
/// properties exist and can be read, naming the property if not.
pub fn check_files(props: &BTreeMap<String, String>) -> Result<(), ClientError> {
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
            return Err(ClientError::config(
                name,
                format!("cannot read `{path}`: {e}"),
            ));
        }
    }
    Ok(())
}
