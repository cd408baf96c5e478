//! The Kafka wing: everything walrelay says to Kafka outside the
//! producer's records, and what every Kafka client is built from.
//!
//! | module | owns |
//! |---|---|
//! | [`properties`] | the `[kafka]` settings ([`properties::KafkaConfig`]), the producer's properties ([`properties::SinkConfig`]: walrelay's defaults, the user's, the enforced guarantees), property maps as librdkafka configurations |
//! | [`policy`] | the checks on every client's properties: guarantees, TLS/SASL, files named |
//! | [`client`] | the properties of each client walrelay creates (producer, probe, verifier, fence reader, admin, source record) |
//! | [`requests`] | walrelay's own requests: ApiVersions (the brokers' release), log end, the wait until the leaders' records are readable |
//! | [`conn`], [`wire`] | walrelay's own broker connections (TLS, SASL) for those requests, and reading their answers |
//! | [`metadata`] | what a metadata answer says of one topic |
//! | [`login`] | each client's OAUTHBEARER login: the process's token cache per provider (the providers, OIDC, AWS MSK IAM and unsecured development tokens, are the `walrelay-oauth` crate's), the librdkafka context that hands tokens out |
//! | [`acl`] | authorization errors as the ACL to grant |
//! | `error` | [`ClientError`] (properties refused, a client not created) and [`RequestError`] (a request of walrelay's without a usable answer) |
//!
//! Nothing here imports the producer ([`crate::engine::sink`]), the fence
//! ([`crate::engine::fence`]), the commands or [`crate::config`]: they import this
//! wing, so the checks on Kafka properties, run by the configuration's
//! validation and by every client, have one home and no cycle.

pub mod acl;
pub mod client;
pub mod conn;
mod error;
pub mod login;
pub mod metadata;
pub mod policy;
pub mod properties;
pub mod requests;
pub mod wire;

pub use error::{ClientError, RequestError};
