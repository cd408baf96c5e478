//! How librdkafka clients log in with walrelay's tokens: the properties
//! librdkafka must not see ([`LOGIN_PROPERTIES`]), and [`ClientTokens`],
//! which hands each client its tokens with their SASL extensions, at once
//! when it is made and again before each expires.
//!
//! Why not rdkafka's token callback (`ClientContext::generate_oauth_token`):
//! rdkafka 0.39 passes no SASL extensions to librdkafka, so a cluster that
//! needs them (Confluent Cloud's `logicalCluster` and `identityPoolId`)
//! could not be logged in to; and the callback runs on each client's
//! polling thread, where an identity provider's slow answer would hold up
//! deliveries. walrelay's contexts leave the callback off, and librdkafka's
//! refresh requests go unanswered: [`ClientTokens`] sets the token first.

mod clients;
mod set_token;

pub use clients::{ClientTokens, HasClient};

/// The properties a librdkafka client's `OAUTHBEARER` login is configured
/// with that librdkafka itself must not see: without libcurl it refuses
/// the OIDC ones, and with `enable.sasl.oauthbearer.unsecure.jwt` it
/// would make its own tokens instead of taking walrelay's.
pub const LOGIN_PROPERTIES: &[&str] = &[
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.credentials.client.id",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.config",
    "enable.sasl.oauthbearer.unsecure.jwt",
    "https.ca.location",
];

/// Whether a client whose properties `get` returns logs in with
/// `OAUTHBEARER`.
pub fn is_oauthbearer<'a>(get: impl Fn(&str) -> Option<&'a str>) -> bool {
    ["sasl.mechanism", "sasl.mechanisms"]
        .iter()
        .filter_map(|name| get(name))
        .any(|m| m.trim().eq_ignore_ascii_case("OAUTHBEARER"))
}

/// A login that failed while a client was being made (no token to hand
/// it) fails the client's creation, as rdkafka reports it.
impl From<crate::OAuthError> for rdkafka::error::KafkaError {
    fn from(e: crate::OAuthError) -> rdkafka::error::KafkaError {
        rdkafka::error::KafkaError::ClientCreation(format!("Kafka OAuth login: {e}"))
    }
}
