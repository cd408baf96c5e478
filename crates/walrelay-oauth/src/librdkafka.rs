//! A [`Token`] as librdkafka's token callback takes it
//! (rdkafka's `ClientContext::generate_oauth_token` returns an
//! [`OAuthToken`]), for the producer's context once OAUTHBEARER is
//! allowed. Pure; nothing calls it yet.
//!
//! rdkafka 0.39 hands librdkafka no SASL extensions (it passes none to
//! `rd_kafka_oauthbearer_set_token`), so a token with extensions is
//! refused here rather than sent without them: a cluster that needs them
//! (Confluent Cloud's `logicalCluster`, `identityPoolId`) would refuse the
//! login with a less helpful message. walrelay's own connections do send
//! them (the relay's `kafka::conn`).

use rdkafka::client::OAuthToken;

use super::error::OAuthError;
use super::plan::{plan, OAuthOptions, ProviderPlan};
use super::refresh::TokenSource;
use super::token::Token;

/// The properties a librdkafka client's `OAUTHBEARER` login is configured
/// with that librdkafka itself must not see: without libcurl it refuses
/// the OIDC ones, and with `enable.sasl.oauthbearer.unsecure.jwt` it
/// would make its own tokens instead of asking the token callback.
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

/// [`plan`] for a librdkafka client, whose token callback cannot pass SASL
/// extensions: refused by name rather than sent without them (a cluster
/// that needs them, such as Confluent Cloud's `logicalCluster`, would
/// refuse the login with a less helpful message).
pub fn callback_plan<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
    options: &OAuthOptions,
    env: impl Fn(&str) -> Option<String>,
) -> Result<ProviderPlan, OAuthError> {
    let plan = plan(get, options, env)?;
    if let ProviderPlan::Oidc { settings, .. } = &plan {
        if !settings.extensions.is_empty() {
            return Err(OAuthError::config(
                "sasl.oauthbearer.extensions",
                "a librdkafka client cannot send SASL extensions yet (rdkafka 0.39's token \
                 callback passes none to librdkafka); remove them, or use a cluster that does \
                 not need them",
            ));
        }
    }
    Ok(plan)
}

/// What a client context's `generate_oauth_token` returns, from the
/// client's token source (`None`: the client was made without one). The
/// error is logged here and its text reaches librdkafka, which reports it
/// as the login's failure ("Failed to acquire SASL OAUTHBEARER token:
/// ..."). The relay's and the consumer's contexts both answer with it.
pub fn callback_token(
    tokens: Option<&dyn TokenSource>,
) -> Result<OAuthToken, Box<dyn std::error::Error>> {
    let token = tokens
        .ok_or_else(|| {
            OAuthError::config(
                "sasl.mechanism",
                "librdkafka asked for an OAUTHBEARER token, but the client was configured \
                 without walrelay's token provider",
            )
        })
        .and_then(|source| source.token())
        .and_then(|t| oauth_token(&t))
        .map_err(|e| {
            tracing::warn!("Kafka OAuth token: {e}");
            e
        })?;
    Ok(token)
}

/// `token` for librdkafka: the value, the principal, the expiry in
/// milliseconds since the epoch (librdkafka's "lifetime" is an instant).
pub fn oauth_token(token: &Token) -> Result<OAuthToken, OAuthError> {
    if !token.extensions.is_empty() {
        return Err(OAuthError::config(
            "sasl.oauthbearer.extensions",
            "the producer cannot send SASL extensions yet (rdkafka 0.39's token callback passes \
             none to librdkafka); remove them, or use a cluster that does not need them",
        ));
    }
    // librdkafka refuses a token or principal holding a NUL; say why
    // here rather than as its error.
    if token.value.expose().contains('\0') || token.principal.contains('\0') {
        return Err(OAuthError::Unusable {
            source_name: "the token provider".to_owned(),
            reason: "the token or its principal holds a NUL character".to_owned(),
        });
    }
    Ok(OAuthToken {
        token: token.value.expose().to_owned(),
        principal_name: token.principal.clone(),
        lifetime_ms: token.expires_at_unix_ms(),
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::{Extensions, Secret};

    fn token(extensions: Extensions) -> Token {
        Token {
            value: Secret::new("eyJ.x.y"),
            principal: "relay".into(),
            expires_at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_500),
            extensions,
        }
    }

    #[test]
    fn the_expiry_is_an_instant_in_milliseconds() {
        let t = oauth_token(&token(Extensions::default())).unwrap();
        assert_eq!(
            (t.token.as_str(), t.principal_name.as_str(), t.lifetime_ms),
            ("eyJ.x.y", "relay", 1_700_000_000_500)
        );
    }

    #[test]
    fn extensions_the_callback_cannot_pass_are_refused_by_name() {
        let e = oauth_token(&token(
            Extensions::parse("logicalCluster=lkc-1", "p").unwrap(),
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("sasl.oauthbearer.extensions"), "{e}");
        let mut nul = token(Extensions::default());
        nul.principal = "a\0b".into();
        assert!(oauth_token(&nul).is_err());
    }
}
