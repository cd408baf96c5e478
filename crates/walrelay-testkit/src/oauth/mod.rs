//! OAuth 2 for tests of OAUTHBEARER Kafka listeners.
//!
//! * [`TokenIssuer`]: a test authorization server on loopback (client
//!   credentials at `/token`, RS256 JWTs, the keys at `/jwks`), with
//!   counters, key rotation and hand-made bad tokens for negative tests.
//! * [`crate::OAuthValidation::for_issuer`] and [`crate::KafkaSecurity::oauth`]
//!   give a [`crate::KafkaCluster`] a SASL_SSL listener that validates the
//!   issuer's tokens with Kafka's own validator.
//! * [`OAuthClientConfig`]: a client's properties for that listener, for
//!   librdkafka's OIDC login, for Java, and for the kit's own rdkafka
//!   clients with an [`OAuthContext`].
//!
//! ```no_run
//! # fn demo() -> anyhow::Result<()> {
//! use walrelay_testkit::oauth::{IssuerOptions, OAuthClient, TokenIssuer};
//! use walrelay_testkit::{KafkaCluster, KafkaOptions, KafkaSecurity, OAuthValidation, TestCa};
//! let issuer = TokenIssuer::start(IssuerOptions::default())?;
//! issuer.register_client("relay", "relay-secret");
//! let ca = TestCa::new("test CA")?;
//! let kafka = KafkaCluster::start(KafkaOptions {
//!     security: Some(KafkaSecurity::oauth(&ca, OAuthValidation::for_issuer(&issuer))?),
//!     ..KafkaOptions::default()
//! })?;
//! let ca_path = std::env::temp_dir().join("ca.pem");
//! std::fs::write(&ca_path, kafka.ca_pem().unwrap())?;
//! let client = OAuthClient::new(&issuer.token_url(), "relay", "relay-secret");
//! let props = kafka.oauth_client_config(&client, &ca_path)?.librdkafka_oidc();
//! # Ok(()) }
//! ```

mod client;
mod context;
mod endpoint;
mod http;
mod issuer;
mod jwt;
mod keys;
mod props;

pub use client::{IssuedToken, OAuthClient};
pub use context::{OAuthContext, TokenSource};
pub use issuer::{IssuerOptions, KeyChoice, TokenIssuer, DEFAULT_AUDIENCE, DEFAULT_TOKEN_LIFETIME};
pub use jwt::{decode_unverified, Claims};
pub use props::OAuthClientConfig;
