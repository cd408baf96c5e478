//! The Kafka wing's errors:
//!
//! * [`ClientError`]: why walrelay refused a Kafka client's properties, or
//!   librdkafka refused to create the client. Not the producer's
//!   [`SinkError`](crate::engine::sink::SinkError), because every client (the
//!   verifier, the fence's reader, the admin client) is built from the same
//!   properties; the producer turns it into its own error
//!   (`From<ClientError> for SinkError`), unchanged in what it says.
//! * [`RequestError`]: why one of walrelay's own requests
//!   ([`super::requests`], over [`super::conn`]) got no usable answer. The
//!   callers treat every kind alike today (the fence does not wait, the
//!   brokers' release stays unknown: duplicates at worst, never a loss),
//!   but the kinds say where it failed: walrelay cannot connect as its
//!   client would, the connection failed, or the answer was not readable.

use rdkafka::error::KafkaError;

use crate::secrets::{is_secret_property, REDACTED};

/// Why a Kafka client's properties were refused, or the client could not
/// be created. Never contains a secret value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// A property is invalid or would weaken the delivery guarantees.
    /// (The message says "producer": the producer's properties are the
    /// ones a user writes, and every other client starts from them.)
    #[error("Kafka producer property `{property}`: {reason}")]
    Config {
        /// The property's name.
        property: String,
        /// Why it is rejected (never contains a secret value).
        reason: String,
    },
    /// librdkafka refused to create the client.
    #[error("cannot create the Kafka producer: {0}")]
    Create(String),
    /// An `OAUTHBEARER` login's settings are refused, or no token could
    /// be had (the token endpoint's answer is in the message).
    #[error(transparent)]
    Login(walrelay_oauth::OAuthError),
}

impl ClientError {
    pub(super) fn config(property: &str, reason: String) -> Self {
        ClientError::Config {
            property: property.to_owned(),
            reason,
        }
    }

    /// A librdkafka configuration or creation error, with secret values
    /// left out (librdkafka's description may quote the value).
    #[must_use]
    pub fn from_rdkafka(error: KafkaError) -> Self {
        match error {
            KafkaError::ClientConfig(_, description, property, value) => {
                let reason = if is_secret_property(&property) {
                    let description = if value.is_empty() {
                        description
                    } else {
                        description.replace(&value, REDACTED)
                    };
                    format!("invalid value: {description}")
                } else {
                    format!("{description} (value `{value}`)")
                };
                ClientError::Config { property, reason }
            }
            KafkaError::ClientCreation(message) => ClientError::Create(message),
            other => ClientError::Create(other.to_string()),
        }
    }
}

/// Why one of walrelay's own requests to a broker got no usable answer.
/// Each message names the server and the step, as the WARN and the
/// fence's errors quote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// walrelay cannot connect as its Kafka client does (a setting
    /// [`super::conn::settings`] refuses to approximate: a Kerberos or
    /// OAuth login, a keystore, ...).
    #[error("{0}")]
    Unsupported(String),
    /// Connecting, the TLS handshake, the SASL login, sending or receiving
    /// failed.
    #[error("{0}")]
    Connection(String),
    /// The broker's answer was not one walrelay can read, or it answered
    /// with an error code for the whole request.
    #[error("{0}")]
    Response(String),
    /// librdkafka could not read the cluster's metadata (which brokers to
    /// ask).
    #[error("{0}")]
    Metadata(String),
}
