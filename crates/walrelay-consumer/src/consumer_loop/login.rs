//! An `OAUTHBEARER` login for the loop's consumer, with the relay's token
//! providers (`walrelay-oauth`: OIDC client credentials, AWS MSK IAM):
//! walrelay's librdkafka is built without libcurl, so librdkafka's own
//! OIDC client is not there, and the consumer configured with
//! librdkafka's property names (`sasl.oauthbearer.method=oidc`,
//! `sasl.oauthbearer.client.id`, ...) logs in as any librdkafka client
//! would.
//!
//! The login properties are taken out of the consumer's configuration
//! (librdkafka must not see them) into a token cache, whose tokens, with
//! their SASL extensions, each consumer the loop makes (also after a
//! rejoin) is handed when it is made and before each expires
//! ([`ClientTokens`]).

use std::sync::Arc;

use rdkafka::ClientConfig;
use walrelay_oauth::librdkafka::{is_oauthbearer, ClientTokens, LOGIN_PROPERTIES};
use walrelay_oauth::plan::{plan, OAuthOptions};
use walrelay_oauth::{OAuthError, Provider, TokenCache};

/// Where the consumer's tokens come from; `None`: no token login.
pub(crate) type Tokens = Option<Arc<ClientTokens>>;

/// Takes an `OAUTHBEARER` login's properties out of `kafka` and makes its
/// token cache; `None` for any other mechanism. Refuses, with the
/// setting's name, what the providers cannot do.
pub(crate) fn take_login(
    kafka: &mut ClientConfig,
    options: &OAuthOptions,
) -> Result<Tokens, OAuthError> {
    if !is_oauthbearer(|name| kafka.get(name)) {
        return Ok(None);
    }
    let plan = plan(
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
    Ok(Some(ClientTokens::new(Arc::new(TokenCache::new(provider)))))
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
            ("sasl.oauthbearer.extensions", "logicalCluster=lkc-1"),
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
