//! walrelay's configuration: a TOML file, overridden by environment
//! variables and command-line flags (see `cli.rs`), validated once at
//! startup so a mistake is reported before anything connects.
//!
//! `walrelay.example.toml` at the repository root documents every option
//! and is parsed by a test, so it cannot drift from this module.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::envelope::is_valid_topic;
use crate::kafka::properties::KafkaConfig;

mod relay;
mod render;

pub use relay::{HeaderSet, KeylessPlacement, RelayConfig};
pub use render::render;

/// Errors in the configuration, each naming the option.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the configuration file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid configuration file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("{option}: {message}")]
    Invalid { option: String, message: String },
}

fn invalid(option: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        option: option.into(),
        message: message.into(),
    }
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s)
        .map_err(|e| serde::de::Error::custom(format!("{s:?}: {e} (e.g. \"500ms\", \"10s\")")))
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub postgres: PostgresConfig,
    /// `[kafka]`: defined with the properties walrelay makes of it for
    /// each Kafka client ([`crate::kafka::properties`]), so that the Kafka
    /// wing needs nothing from this module.
    pub kafka: KafkaConfig,
    pub relay: RelayConfig,
    /// Raw logical-message routes: prefix → topic.
    pub messages: Vec<MessageRoute>,
    /// Outbox tables.
    pub outbox: Vec<OutboxConfig>,
    /// Where events that cannot be routed go instead of stopping the relay.
    pub dead_letter: DeadLetterConfig,
}

/// `[dead_letter]`: a topic for events that cannot be routed (malformed
/// envelope, unknown prefix, NULL outbox key, outbox UPDATE, ...).
///
/// Unset (the default), such an event stops the relay with an error that
/// names the fix, and nothing after it is confirmed: the operator decides.
/// Set, the event becomes a dead-letter record in this topic (original
/// bytes, its idempotency key, the reason; docs/relay.md) and the relay
/// keeps going: availability for the other events, at the price of having
/// to watch the dead-letter topic.
#[derive(Debug, Clone, Deserialize, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct DeadLetterConfig {
    pub topic: Option<String>,
}

/// `Debug` shows `url` without its password.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresConfig {
    /// libpq URL or keyword string; `PG*` variables fill in the rest.
    /// Keep the password out of it: use PGPASSWORD or ~/.pgpass.
    pub url: String,
    pub slot: String,
    pub publication: String,
    /// How often the confirmed position is reported to the server.
    #[serde(deserialize_with = "duration")]
    pub status_interval: Duration,
    /// How often `run` checks, on a plain SQL connection, that the
    /// publication still covers every configured outbox (see
    /// `publication.rs`) and samples the server's WAL position for the lag
    /// gauge. Nothing past the last clean check is confirmed, so this is
    /// also how far confirmation trails the stream.
    #[serde(deserialize_with = "duration")]
    pub publication_check_interval: Duration,
    /// `setup` makes the slot a failover slot (PostgreSQL 17+), which a
    /// standby with `sync_replication_slots` keeps, so that walrelay
    /// continues on the promoted standby (docs/operations.md).
    pub slot_failover: bool,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: String::new(),
            slot: "walrelay".into(),
            publication: "walrelay".into(),
            status_interval: Duration::from_secs(1),
            publication_check_interval: Duration::from_secs(2),
            slot_failover: false,
        }
    }
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = walrelay_pg::Config::parse(&self.url)
            .map(|c| c.redacted_url())
            .unwrap_or_else(|_| "<unparsable>".into());
        f.debug_struct("PostgresConfig")
            .field("url", &url)
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("status_interval", &self.status_interval)
            .field(
                "publication_check_interval",
                &self.publication_check_interval,
            )
            .field("slot_failover", &self.slot_failover)
            .finish()
    }
}

/// The source record topic's default name (`[relay] source_record_topic`).
pub const DEFAULT_SOURCE_RECORD_TOPIC: &str = "walrelay.sources";

/// `pg_logical_emit_message(..., prefix, content)` → `topic`, content as
/// the value, no key (partitioned by the WAL-derived keyless rule).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MessageRoute {
    pub prefix: String,
    pub topic: String,
}

/// An outbox table with Debezium-compatible column names by default.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// `schema.table` (or `table` for `public`).
    pub table: String,
    /// Topic template; `{aggregatetype}` is replaced by that column's value
    /// (also `{schema}` and `{table}`).
    #[serde(default = "default_topic_template")]
    pub topic: String,
    #[serde(default)]
    pub columns: OutboxColumns,
}

fn default_topic_template() -> String {
    "outbox.event.{aggregatetype}".into()
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxColumns {
    /// → header `id`.
    pub id: String,
    /// → `{aggregatetype}` in the topic template.
    pub aggregatetype: String,
    /// → record key.
    pub aggregateid: String,
    /// → header `type`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// → record value (NULL gives a tombstone).
    pub payload: String,
    /// Optional `jsonb` column whose object members become headers; used
    /// only if the table has it.
    pub headers: String,
}

impl Default for OutboxColumns {
    fn default() -> Self {
        OutboxColumns {
            id: "id".into(),
            aggregatetype: "aggregatetype".into(),
            aggregateid: "aggregateid".into(),
            event_type: "type".into(),
            payload: "payload".into(),
            headers: "headers".into(),
        }
    }
}

impl OutboxConfig {
    /// `(schema, table)`.
    pub fn qualified_name(&self) -> (String, String) {
        match self.table.split_once('.') {
            Some((s, t)) => (s.to_owned(), t.to_owned()),
            None => ("public".to_owned(), self.table.clone()),
        }
    }
}

impl Config {
    pub fn from_toml(text: &str, path: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// Check everything that can be checked without connecting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.postgres.status_interval.is_zero()
            || self.postgres.status_interval > Duration::from_secs(30)
        {
            return Err(invalid(
                "postgres.status_interval",
                "must be between 1ms and 30s (the server drops a replication connection that is silent for wal_sender_timeout, 60s by default)",
            ));
        }
        if self.postgres.publication_check_interval < Duration::from_millis(10)
            || self.postgres.publication_check_interval > Duration::from_secs(300)
        {
            return Err(invalid(
                "postgres.publication_check_interval",
                "must be between 10ms and 5min (nothing after the last check is confirmed to PostgreSQL, so a long interval holds WAL back)",
            ));
        }
        if self.kafka.bootstrap_servers.trim().is_empty() {
            return Err(invalid(
                "kafka.bootstrap_servers",
                "must name at least one broker (host:port)",
            ));
        }
        if let Some(source) = &self.relay.source_id {
            if source.trim().is_empty() {
                return Err(invalid(
                    "relay.source_id",
                    "must not be empty: every record would carry `walrelay-source: \"\"`, and \
                     consumers keep their high-water marks per source; leave it unset for the \
                     default <system identifier>/<database>/<slot> (unset WALRELAY_SOURCE_ID \
                     rather than setting it to nothing)",
                ));
            }
        }
        if !walrelay_contract::envelope::is_valid_topic(&self.relay.source_record_topic) {
            return Err(invalid(
                "relay.source_record_topic",
                "must be a valid Kafka topic name (1-249 of a-z A-Z 0-9 . _ -); the default is \
                 \"walrelay.sources\"",
            ));
        }
        if self.relay.standby_poll.is_zero() {
            return Err(invalid("relay.standby_poll", "must be greater than zero"));
        }
        if self.relay.fence_timeout.is_zero() {
            return Err(invalid(
                "relay.fence_timeout",
                "must be greater than zero (to turn the tail fence off, set relay.fence = false)",
            ));
        }
        self.validate_kafka()?;
        if self.relay.max_in_flight_events == 0 || self.relay.max_in_flight_bytes == 0 {
            return Err(invalid(
                "relay.max_in_flight_*",
                "must be greater than zero",
            ));
        }
        for (i, m) in self.messages.iter().enumerate() {
            if m.prefix.is_empty() || m.prefix == crate::envelope::PREFIX {
                return Err(invalid(
                    format!("messages[{i}].prefix"),
                    format!(
                        "must be non-empty and not the reserved envelope prefix {}",
                        crate::envelope::PREFIX
                    ),
                ));
            }
            if !is_valid_topic(&m.topic) {
                return Err(invalid(
                    format!("messages[{i}].topic"),
                    format!("{:?} is not a valid Kafka topic name", m.topic),
                ));
            }
            if self.messages[..i].iter().any(|o| o.prefix == m.prefix) {
                return Err(invalid(
                    format!("messages[{i}].prefix"),
                    format!("prefix {:?} is routed twice", m.prefix),
                ));
            }
        }
        for (i, o) in self.outbox.iter().enumerate() {
            let (schema, table) = o.qualified_name();
            if schema.is_empty() || table.is_empty() || table.contains('.') {
                return Err(invalid(
                    format!("outbox[{i}].table"),
                    "use \"schema.table\" or \"table\"",
                ));
            }
            let probe = o
                .topic
                .replace("{aggregatetype}", "x")
                .replace("{schema}", "x")
                .replace("{table}", "x");
            if !is_valid_topic(&probe) {
                return Err(invalid(
                    format!("outbox[{i}].topic"),
                    format!("template {:?} cannot give a valid topic name", o.topic),
                ));
            }
            if self.outbox[..i]
                .iter()
                .any(|p| p.qualified_name() == o.qualified_name())
            {
                return Err(invalid(
                    format!("outbox[{i}].table"),
                    format!("{} is configured twice", o.table),
                ));
            }
        }
        self.validate_dead_letter()
    }

    /// `[kafka]`: delivery guarantees, TLS and SASL consistency, and
    /// librdkafka's own parsing of every property, by the checks every
    /// Kafka client gets ([`crate::kafka::policy`]). Secrets and files are
    /// read only when the producer is created (`walrelay run`), so that
    /// `setup` and `status` run where the relay's Kafka secrets are not.
    fn validate_kafka(&self) -> Result<(), ConfigError> {
        crate::kafka::client::producer_config(&self.kafka)
            .validate_settings()
            .map_err(|e| match e {
                crate::kafka::ClientError::Config { property, reason } => {
                    invalid(format!("kafka.properties.{property:?}"), reason)
                }
                // A librdkafka property, or one of walrelay's own `[kafka]`
                // options (`oauth_provider`, ...).
                crate::kafka::ClientError::Login(walrelay_oauth::OAuthError::Config {
                    property,
                    reason,
                }) if property.contains('.') => {
                    invalid(format!("kafka.properties.{property:?}"), reason)
                }
                crate::kafka::ClientError::Login(walrelay_oauth::OAuthError::Config {
                    property,
                    reason,
                }) => invalid(format!("kafka.{property}"), reason),
                other => invalid("kafka.properties", other.to_string()),
            })
    }

    /// The dead-letter topic must be a valid name and must not be a topic
    /// that routed events can go to: a consumer of either topic would then
    /// have to tell dead letters from events.
    fn validate_dead_letter(&self) -> Result<(), ConfigError> {
        let Some(topic) = &self.dead_letter.topic else {
            return Ok(());
        };
        if !is_valid_topic(topic) {
            return Err(invalid(
                "dead_letter.topic",
                format!("{topic:?} is not a valid Kafka topic name (1 to 249 characters of a-zA-Z0-9._-)"),
            ));
        }
        if let Some(i) = self.messages.iter().position(|m| &m.topic == topic) {
            return Err(invalid(
                "dead_letter.topic",
                format!("{topic:?} is also the topic of messages[{i}] (prefix {:?}); use a topic of its own for dead letters", self.messages[i].prefix),
            ));
        }
        for (i, o) in self.outbox.iter().enumerate() {
            let (schema, table) = o.qualified_name();
            let template = o
                .topic
                .replace("{schema}", &schema)
                .replace("{table}", &table);
            if template_matches(&template, topic) {
                return Err(invalid(
                    "dead_letter.topic",
                    format!("{topic:?} can be a topic of outbox[{i}] (template {:?}); use a topic of its own for dead letters", o.topic),
                ));
            }
        }
        Ok(())
    }
}

/// Whether `topic` can come out of an outbox topic `template` whose
/// `{aggregatetype}` placeholders stand for any non-empty text.
fn template_matches(template: &str, topic: &str) -> bool {
    match template.split_once("{aggregatetype}") {
        None => template == topic,
        Some((literal, rest)) => {
            let Some(after) = topic.strip_prefix(literal) else {
                return false;
            };
            // The placeholder takes 1 or more bytes, then the rest matches.
            (1..=after.len())
                .filter(|&n| after.is_char_boundary(n))
                .any(|n| template_matches(rest, &after[n..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses_and_validates() {
        let text = include_str!("../../../../walrelay.example.toml");
        let c = Config::from_toml(text, "walrelay.example.toml").unwrap();
        c.validate().unwrap();
        assert_eq!(c.outbox.len(), 1);
        assert_eq!(c.outbox[0].columns, OutboxColumns::default());
        assert!(!c.messages.is_empty());
    }

    #[test]
    fn defaults_are_debezium_compatible() {
        let c = Config::from_toml("[[outbox]]\ntable = \"outbox\"\n", "t").unwrap();
        assert_eq!(c.outbox[0].topic, "outbox.event.{aggregatetype}");
        assert_eq!(
            c.outbox[0].qualified_name(),
            ("public".into(), "outbox".into())
        );
        assert_eq!(c.outbox[0].columns.aggregateid, "aggregateid");
        assert_eq!(c.postgres.status_interval, Duration::from_secs(1));
    }

    #[test]
    fn the_example_dead_letter_topic_is_valid() {
        // The example shows the option commented out (it is off by
        // default); uncommented, it must still parse and validate.
        let text = include_str!("../../../../walrelay.example.toml");
        let line = "# topic = \"walrelay.dead-letter\"";
        assert!(text.contains(line), "walrelay.example.toml shows {line}");
        let text = text.replace(line, "topic = \"walrelay.dead-letter\"");
        let c = Config::from_toml(&text, "walrelay.example.toml").unwrap();
        c.validate().unwrap();
        assert_eq!(c.dead_letter.topic.as_deref(), Some("walrelay.dead-letter"));
    }

    #[test]
    fn the_dead_letter_topic_is_checked() {
        let check = |extra: &str| {
            let text = format!(
                "[[messages]]\nprefix = \"orders\"\ntopic = \"orders\"\n\
                 [[outbox]]\ntable = \"outbox\"\n{extra}"
            );
            Config::from_toml(&text, "t")
                .unwrap()
                .validate()
                .map_err(|e| e.to_string())
        };
        check("[dead_letter]\ntopic = \"dlq\"\n").unwrap();
        check("[dead_letter]\n").unwrap();
        for (topic, expected) in [
            ("bad topic", "not a valid Kafka topic name"),
            ("orders", "messages[0]"),
            ("outbox.event.x", "outbox[0]"),
        ] {
            let err = check(&format!("[dead_letter]\ntopic = {topic:?}\n")).unwrap_err();
            assert!(
                err.starts_with("dead_letter.topic: ") && err.contains(expected),
                "{err}"
            );
        }
        assert!(template_matches("a.{aggregatetype}.b", "a.x.y.b"));
        assert!(!template_matches("a.{aggregatetype}.b", "a..b"));
        assert!(!template_matches("a.{aggregatetype}", "b.x"));
    }

    #[test]
    fn mistakes_name_the_option() {
        let err = Config::from_toml("[postgres]\nslott = \"x\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("slott"), "{err}");
        let err = Config::from_toml("[postgres]\nstatus_interval = \"soon\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("soon"), "{err}");
        let refused = |toml: &str| {
            let c = Config::from_toml(toml, "t").unwrap();
            c.validate().unwrap_err().to_string()
        };
        let err = refused("[[messages]]\nprefix = \"walrelay.v1\"\ntopic = \"t\"\n");
        assert!(err.contains("messages[0].prefix"), "{err}");
        let err = refused("[[outbox]]\ntable = \"o\"\ntopic = \"bad topic {aggregatetype}\"\n");
        assert!(err.contains("outbox[0].topic"), "{err}");
    }
}
