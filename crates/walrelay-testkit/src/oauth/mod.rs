//! OAuth 2 for tests of OAUTHBEARER Kafka listeners.
//!
//! * [`TokenIssuer`]: a test authorization server on loopback (client
//!   credentials at `/token`, RS256 JWTs, the keys at `/jwks`), with
//!   counters, key rotation and hand-made bad tokens for negative tests.
//! * [`OAuthClient`]: a client's credentials and a blocking token request.

mod client;
mod endpoint;
mod http;
mod issuer;
mod jwt;
mod keys;

pub use client::{IssuedToken, OAuthClient};
pub use issuer::{IssuerOptions, KeyChoice, TokenIssuer, DEFAULT_AUDIENCE, DEFAULT_TOKEN_LIFETIME};
pub use jwt::{decode_unverified, Claims};
