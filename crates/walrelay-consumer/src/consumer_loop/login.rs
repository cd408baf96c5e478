//! An `OAUTHBEARER` login for the loop's consumer, with the relay's token
//! providers (`walrelay-oauth`: OIDC client credentials, AWS MSK IAM):
//! walrelay's librdkafka is built without libcurl, so librdkafka's own
//! OIDC client is not there, and the consumer configured with
//! librdkafka's property names (`sasl.oauthbearer.method=oidc`,
//! `sasl.oauthbearer.client.id`, ...) logs in as any librdkafka client
//! would.
//!
//! The login properties are taken out of the consumer's configuration
//! (librdkafka must not see them) into a token cache, which the context
//! asks when librdkafka wants a token (at start, then at 80 % of each
//! token's lifetime): every consumer the loop makes, also after a
//! rejoin, shares it.

use std::sync::Arc;

use rdkafka::client::OAuthToken;
use rdkafka::ClientConfig;
use walrelay_oauth::librdkafka::{callback_plan, is_oauthbearer, LOGIN_PROPERTIES};
use walrelay_oauth::plan::OAuthOptions;
use walrelay_oauth::{OAuthError, Provider, TokenCache, TokenSource};

/// Where the consumer's tokens come from; `None`: no token login.
pub(crate) type Tokens = Option<Arc<dyn TokenSource>>;

/// Takes an `OAUTHBEARER` login's properties out of `kafka` and makes its
/// token cache; `None` for any other mechanism. Refuses, with the
/// setting's name, what the providers or the token callback cannot do.
pub(crate) fn take_login(
    kafka: &mut ClientConfig,
    options: &OAuthOptions,
) -> Result<Tokens, OAuthError> {
    if !is_oauthbearer(|name| kafka.get(name)) {
        return Ok(None);
    }
    let plan = callback_plan(
        |name| kafka.get(name),
        options,
        |name| std::env::var(name).ok(),
    )?;
    for name in LOGIN_PROPERTIES {
        kafka.remove(name);
    }
    let provider = Provider::new(plan)?;
    tracing::info!(
        provider = provider.kind(),
        "the Kafka consumer logs in with OAUTHBEARER"
    );
    Ok(Some(Arc::new(TokenCache::new(provider))))
}

/// What the context's `generate_oauth_token` returns
/// ([`walrelay_oauth::librdkafka::callback_token`]).
pub(crate) fn token_for_librdkafka(
    tokens: &Tokens,
) -> Result<OAuthToken, Box<dyn std::error::Error>> {
    walrelay_oauth::librdkafka::callback_token(tokens.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in pairs {
            c.set(*k, *v);
        }
        c
    }

    #[test]
    fn other_mechanisms_have_no_token_login() {
        let mut c = config(&[("sasl.mechanism", "SCRAM-SHA-512")]);
        assert!(take_login(&mut c, &OAuthOptions::default())
            .unwrap()
            .is_none());
        assert!(token_for_librdkafka(&None).is_err());
    }

    #[test]
    fn the_oidc_properties_become_walrelays_and_leave_librdkafkas() {
        let mut c = config(&[
            ("bootstrap.servers", "127.0.0.1:1"),
            ("sasl.mechanism", "OAUTHBEARER"),
            ("sasl.oauthbearer.method", "oidc"),
            (
                "sasl.oauthbearer.token.endpoint.url",
                "http://127.0.0.1:9/token",
            ),
            ("sasl.oauthbearer.client.id", "consumer"),
            ("sasl.oauthbearer.client.secret", "never-shown-consumer"),
        ]);
        assert!(take_login(&mut c, &OAuthOptions::default())
            .unwrap()
            .is_some());
        for name in LOGIN_PROPERTIES {
            assert_eq!(c.get(name), None, "{name}");
        }
        assert_eq!(c.get("sasl.mechanism"), Some("OAUTHBEARER"));
    }

    #[test]
    fn a_login_without_a_provider_is_refused_with_what_to_set() {
        let mut c = config(&[("sasl.mechanism", "OAUTHBEARER")]);
        let e = take_login(&mut c, &OAuthOptions::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("sasl.oauthbearer.method=oidc"), "{e}");
    }
}
