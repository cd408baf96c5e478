//! Everything walrelay says to Kafka outside the producer's records:
//!
//! * [`properties`]: the `[kafka]` settings and the producer's
//!   properties, [`policy`]: the checks on every client's properties,
//!   [`client`]: the properties of each client walrelay creates, and
//!   [`ClientError`], why they were refused;
//! * [`metadata`]: what a metadata answer says of one topic;
//! * [`acl`]: authorization errors as the ACL to grant;
//! * [`conn`]: walrelay's own broker connections (TLS, SASL) for the two
//!   requests librdkafka cannot send, and [`wire`], reading their answers.
//!
//! The old top-level paths (`crate::kafka::client`, `crate::kafka::acl`,
//! `crate::kafka::metadata`, `crate::kafka::durability_report`,
//! `crate::kafka::conn`) remain as aliases.

pub mod acl;
pub mod client;
pub mod conn;
mod error;
pub mod metadata;
pub mod policy;
pub mod properties;
pub mod requests;
pub mod wire;

pub use error::{ClientError, RequestError};
