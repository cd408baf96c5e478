//! OAUTHBEARER on a secured node's SASL_SSL listener, validated by
//! Kafka's own validator (`OAuthBearerValidatorCallbackHandler`: RS256
//! signatures against a JWKS fetched over HTTP, `iss`, `aud`, `exp`;
//! principal `User:<sub>`), for the test issuer of [`crate::oauth`].
//!
//! Kafka 4.0 and later refuse every OAuth URL not named by the JVM
//! system property [`ALLOWED_URLS_PROPERTY`] (KIP-1005's allow list,
//! empty by default), so the node's JVM gets it with the JWKS URL.

use std::path::Path;
use std::time::Duration;

use anyhow::anyhow;

use super::{KafkaCluster, KafkaSecurity};
use crate::oauth::{OAuthClient, OAuthClientConfig, TokenIssuer};

/// The SASL mechanism name.
pub const OAUTH_MECHANISM: &str = "OAUTHBEARER";
/// The JVM system property listing the OAuth URLs a Kafka 4 JVM may open.
pub const ALLOWED_URLS_PROPERTY: &str = "org.apache.kafka.sasl.oauthbearer.allowed.urls";
/// The JWKS refresh by default: a rotated key is seen within a second.
const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(1);
/// Kafka's default `sasl.oauthbearer.clock.skew.seconds`.
const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(30);

/// How the listener validates tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OAuthValidation {
    /// `sasl.oauthbearer.jwks.endpoint.url`.
    pub jwks_url: String,
    /// `sasl.oauthbearer.expected.issuer`: tokens of another `iss` are
    /// refused.
    pub expected_issuer: String,
    /// `sasl.oauthbearer.expected.audience`: tokens without it in `aud`
    /// are refused.
    pub expected_audience: String,
    /// `sasl.oauthbearer.jwks.endpoint.refresh.ms`: how often the broker
    /// fetches the JWKS again (Kafka's default is an hour). A token whose
    /// `kid` is not cached also triggers a fetch, at most once a minute per
    /// key id, but that token is refused meanwhile: after a rotation, wait
    /// for a fetch ([`TokenIssuer::await_jwks_fetches`]) before using new
    /// tokens or expecting old ones to be refused.
    pub jwks_refresh: Duration,
    /// `connections.max.reauth.ms` (KIP-368). Unset (Kafka's default 0),
    /// a session authenticated once lasts as long as its connection, even
    /// past its token's `exp`. Set, the broker tells each client to log in
    /// again before the sooner of this and its token's expiry, and closes a
    /// connection that has not: what makes an expired or revoked credential
    /// end sessions, and what makes clients refresh tokens on time.
    pub max_reauth: Option<Duration>,
    /// `sasl.oauthbearer.clock.skew.seconds` (whole seconds; Kafka's
    /// default 30): how long past its `exp` (and before its `iat`) a token
    /// is still taken. A test of expiry sets 0 so that it need not wait
    /// half a minute more.
    pub clock_skew: Duration,
}

impl OAuthValidation {
    /// Validation of `issuer`'s tokens: its JWKS, `iss` and `aud`.
    pub fn for_issuer(issuer: &TokenIssuer) -> OAuthValidation {
        OAuthValidation {
            jwks_url: issuer.jwks_url(),
            expected_issuer: issuer.issuer().to_owned(),
            expected_audience: issuer.audience().to_owned(),
            jwks_refresh: DEFAULT_JWKS_REFRESH,
            max_reauth: None,
            clock_skew: DEFAULT_CLOCK_SKEW,
        }
    }

    /// These settings with `connections.max.reauth.ms` set to `max`.
    #[must_use]
    pub fn with_max_reauth(mut self, max: Duration) -> OAuthValidation {
        self.max_reauth = Some(max);
        self
    }

    /// The broker settings for the listener named `listener` (lowercase).
    pub(crate) fn properties(&self, listener: &str) -> Vec<(String, String)> {
        let mechanism = OAUTH_MECHANISM.to_ascii_lowercase();
        let prefix = format!("listener.name.{listener}.{mechanism}");
        let mut props = vec![
            (
                format!("{prefix}.sasl.jaas.config"),
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;"
                    .to_owned(),
            ),
            (
                format!("{prefix}.sasl.server.callback.handler.class"),
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
                    .to_owned(),
            ),
            // Kafka 4.1's default validator class (`DefaultJwtValidator`),
            // made by its no-argument constructor as the callback handler
            // does, falls back to the client-side validator, which checks
            // the claims' shape but no signature and never fetches the
            // JWKS. `BrokerJwtValidator` builds its key resolver from the
            // settings below.
            (
                "sasl.oauthbearer.jwt.validator.class".to_owned(),
                "org.apache.kafka.common.security.oauthbearer.BrokerJwtValidator".to_owned(),
            ),
            (
                "sasl.oauthbearer.jwks.endpoint.url".to_owned(),
                self.jwks_url.clone(),
            ),
            (
                "sasl.oauthbearer.jwks.endpoint.refresh.ms".to_owned(),
                self.jwks_refresh.as_millis().to_string(),
            ),
            (
                "sasl.oauthbearer.expected.issuer".to_owned(),
                self.expected_issuer.clone(),
            ),
            (
                "sasl.oauthbearer.expected.audience".to_owned(),
                self.expected_audience.clone(),
            ),
            (
                "sasl.oauthbearer.clock.skew.seconds".to_owned(),
                self.clock_skew.as_secs().to_string(),
            ),
        ];
        if let Some(max) = self.max_reauth {
            props.push((
                "connections.max.reauth.ms".to_owned(),
                max.as_millis().to_string(),
            ));
        }
        props
    }

    /// The JVM options the node needs: the allow list with the JWKS URL.
    pub(crate) fn jvm_options(&self) -> Vec<String> {
        vec![format!("-D{ALLOWED_URLS_PROPERTY}={}", self.jwks_url)]
    }
}

impl KafkaCluster {
    /// What a client of this cluster's OAUTHBEARER listener needs: the
    /// SASL_SSL bootstrap, the CA file at `ca_location` (the test writes
    /// [`KafkaCluster::ca_pem`] there) and `client`'s credentials. An error
    /// when the cluster has no OAuth listener.
    pub fn oauth_client_config(
        &self,
        client: &OAuthClient,
        ca_location: &Path,
    ) -> anyhow::Result<OAuthClientConfig> {
        if self.oauth_validation().is_none() {
            return Err(anyhow!("the cluster was started without an OAuth listener"));
        }
        Ok(OAuthClientConfig::new(
            &self.secure_bootstrap_servers()?,
            ca_location,
            client.clone(),
        ))
    }

    /// The OAuth validation of the secured listener, if it takes
    /// OAUTHBEARER.
    pub fn oauth_validation(&self) -> Option<&OAuthValidation> {
        self.security
            .as_ref()
            .and_then(KafkaSecurity::oauth_validation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validation() -> OAuthValidation {
        OAuthValidation {
            jwks_url: "http://127.0.0.1:1/jwks".into(),
            expected_issuer: "http://127.0.0.1:1".into(),
            expected_audience: "kafka".into(),
            jwks_refresh: Duration::from_millis(1500),
            max_reauth: None,
            clock_skew: Duration::ZERO,
        }
    }

    #[test]
    fn the_listener_validates_with_kafkas_handler_against_the_jwks() {
        let props = validation().properties("sasl_ssl");
        let get = |k: &str| {
            props
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            get("listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class"),
            Some(
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
            )
        );
        assert_eq!(
            get("sasl.oauthbearer.jwks.endpoint.url"),
            Some("http://127.0.0.1:1/jwks")
        );
        assert_eq!(
            get("sasl.oauthbearer.jwks.endpoint.refresh.ms"),
            Some("1500")
        );
        assert_eq!(get("sasl.oauthbearer.expected.audience"), Some("kafka"));
        assert_eq!(get("connections.max.reauth.ms"), None);
        assert_eq!(get("sasl.oauthbearer.clock.skew.seconds"), Some("0"));
        assert_eq!(
            get("sasl.oauthbearer.jwt.validator.class"),
            Some("org.apache.kafka.common.security.oauthbearer.BrokerJwtValidator")
        );
        let reauth = validation().with_max_reauth(Duration::from_secs(10));
        assert!(reauth
            .properties("sasl_ssl")
            .contains(&("connections.max.reauth.ms".into(), "10000".into())));
        assert_eq!(
            validation().jvm_options(),
            ["-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=http://127.0.0.1:1/jwks"]
        );
    }
}
