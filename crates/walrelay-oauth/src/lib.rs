//! OAUTHBEARER tokens for walrelay's Kafka clients (the relay's and the
//! Rust consumer's): where a
//! token comes from, when it is refreshed, and what it looks like on the
//! wire, without librdkafka's libcurl-based OIDC client (not linked in:
//! walrelay builds librdkafka without curl to keep the binary lean).
//!
//! | module | owns |
//! |---|---|
//! | [`token`] | [`Token`] (value never shown) and [`Secret`] |
//! | [`refresh`] | when a token is refreshed (80 % of its lifetime, pure) and [`TokenCache`], shared by every user |
//! | [`plan`] | which provider the properties ask for ([`plan::plan`]), refused with the setting's name; walrelay's own [`plan::OAuthOptions`] |
//! | [`provider`] | [`Provider`]: the plan made into a fetcher |
//! | [`oidc`] | OIDC client credentials: the token request and the reading of the answer (pure), the fetch |
//! | [`aws`] | AWS MSK IAM: SigV4 presigning, the MSK token, the credential chain (environment, web identity, instance profile) |
//! | [`unsecured`] | librdkafka's unsecured development tokens, refused unless asked for |
//! | [`librdkafka`] | librdkafka clients handed their tokens with their SASL extensions, at once and before each expires ([`librdkafka::ClientTokens`]) |
//! | [`jwt`] | a JWT's `sub` and `exp` read without verification; unsecured JWTs |
//! | [`extensions`] | RFC 7628 SASL extensions, parsed and checked |
//! | [`http`], [`transport`] | the little HTTP/1.1 a token needs (pure framing; blocking TLS I/O with timeouts) |
//! | `error` | [`OAuthError`]: what failed, why, what to do; never a secret |
//!
//! The relay's clients take their tokens from a [`TokenCache`] shared by
//! all of them (librdkafka's clients through [`librdkafka::ClientTokens`];
//! walrelay's own connections, through [`TokenSource`]); so do the Rust
//! consumer's. The AWS parts have never reached AWS (see [`aws`]).

#![deny(unsafe_code)]

pub mod aws;
mod error;
pub mod extensions;
pub mod http;
pub mod jwt;
pub mod librdkafka;
pub mod oidc;
pub mod plan;
pub mod provider;
pub mod refresh;
pub mod token;
pub mod transport;
pub mod unsecured;

pub use error::OAuthError;
pub use extensions::Extensions;
pub use provider::Provider;
pub use refresh::{Fetch, TokenCache, TokenSource};
pub use token::{Secret, Token};

/// What a secret is shown as, wherever one would be.
pub const REDACTED: &str = "<redacted>";

/// How walrelay names itself to token endpoints and AWS.
pub const USER_AGENT: &str = concat!("walrelay/", env!("CARGO_PKG_VERSION"));
