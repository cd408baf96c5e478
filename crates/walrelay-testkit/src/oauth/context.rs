//! An rdkafka [`ClientContext`] that logs the test kit's own clients in
//! with OAUTHBEARER.
//!
//! The kit's librdkafka is built without libcurl, so it cannot run
//! `sasl.oauthbearer.method=oidc` itself; instead librdkafka asks this
//! context for a token (`ENABLE_REFRESH_OAUTH_TOKEN`) at start and at 80 %
//! of each token's lifetime, and the context fetches one from the issuer,
//! or hands out a fixed token for negative tests. It also records the
//! errors librdkafka reports, where a broker's refusal of a token shows.

use std::error::Error;
use std::sync::{Arc, Mutex};

use rdkafka::client::OAuthToken;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use rdkafka::producer::ProducerContext;
use rdkafka::{ClientContext, Message as _};

use super::client::OAuthClient;
use super::jwt::{decode_unverified, unix_now};

/// Where the context's tokens come from.
#[derive(Clone, Debug)]
pub enum TokenSource {
    /// Client credentials at the issuer, each time librdkafka asks.
    Issuer(OAuthClient),
    /// This JWT every time (e.g. one signed by a retired key), with the
    /// principal name librdkafka is told. librdkafka is told it lasts at
    /// least another minute, whatever its `exp`: it refuses to send a token
    /// it knows to be expired, and the point is the broker's refusal.
    Fixed { token: String, principal: String },
}

/// The OAUTHBEARER context; clones share the recorded errors.
#[derive(Clone, Debug)]
pub struct OAuthContext {
    source: TokenSource,
    errors: Arc<Mutex<Vec<String>>>,
}

impl OAuthContext {
    pub fn new(source: TokenSource) -> OAuthContext {
        OAuthContext {
            source,
            errors: Arc::default(),
        }
    }

    /// The errors librdkafka reported so far (`error: reason`), e.g.
    /// `SASL authentication error: ...` with the broker's text.
    pub fn errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl ClientContext for OAuthContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!("librdkafka (OAuth client): {error}: {reason}");
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!("{error}: {reason}"));
    }

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn Error>> {
        let (token, principal, at_least) = match &self.source {
            TokenSource::Issuer(client) => (
                client.fetch_token()?.access_token,
                client.client_id.clone(),
                0,
            ),
            TokenSource::Fixed { token, principal } => {
                (token.clone(), principal.clone(), unix_now() + 60)
            }
        };
        // librdkafka wants the expiry as an absolute time: the token's own.
        let (_, claims) = decode_unverified(&token)?;
        let exp = claims["exp"]
            .as_u64()
            .ok_or("the token has no numeric exp")?;
        Ok(OAuthToken {
            token,
            principal_name: principal,
            lifetime_ms: i64::try_from(exp.max(at_least).saturating_mul(1000))?,
        })
    }
}

impl ConsumerContext for OAuthContext {}

impl ProducerContext for OAuthContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            tracing::debug!("OAuth client: delivery to {} failed: {e}", m.topic());
        }
    }
}
