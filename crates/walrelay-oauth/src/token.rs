//! A token as the brokers get it, and the secret wrapper that keeps it
//! (and client secrets, AWS keys) out of `Debug`, logs and errors.

use std::fmt;
use std::time::SystemTime;

use super::extensions::Extensions;
use crate::REDACTED;

/// A secret string: `Debug` and `Display` show `<redacted>`; the value is
/// read only through [`Secret::expose`], at the one place that sends it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    #[must_use]
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself: for the request that carries it, never a log.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// An OAUTHBEARER token: what the SASL message carries (the value and the
/// extensions) and what the client needs to know of it (whose it is, when
/// it stops working). `Debug` hides the value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    /// The bearer token (a JWT, an MSK IAM presigned URL, ...).
    pub value: Secret,
    /// The principal it stands for, as the client reports it (librdkafka's
    /// token callback wants one; brokers take theirs from the token).
    pub principal: String,
    /// When the token stops being accepted.
    pub expires_at: SystemTime,
    /// RFC 7628 key/value pairs sent beside the token (Confluent Cloud's
    /// `logicalCluster` and `identityPoolId`, for one).
    pub extensions: Extensions,
}

impl Token {
    /// `expires_at` in milliseconds since the Unix epoch: what librdkafka's
    /// `rd_kafka_oauthbearer_set_token` (rdkafka's `OAuthToken::lifetime_ms`)
    /// takes, despite the name.
    #[must_use]
    pub fn expires_at_unix_ms(&self) -> i64 {
        self.expires_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn debug_never_shows_the_token() {
        let token = Token {
            value: Secret::new("eyJhbGciOiJSUzI1NiJ9.secret-part.sig"),
            principal: "relay".into(),
            expires_at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            extensions: Extensions::default(),
        };
        let shown = format!("{token:?} {}", token.value);
        assert!(!shown.contains("secret-part"), "{shown}");
        assert!(shown.contains("relay"), "{shown}");
        assert_eq!(token.expires_at_unix_ms(), 1_700_000_000_123);
    }
}
