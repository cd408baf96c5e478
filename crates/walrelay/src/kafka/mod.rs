//! Everything walrelay says to Kafka outside the producer's records:
//!
//! * [`client`]: walrelay's configuration as librdkafka properties, for
//!   every client it creates;
//! * [`metadata`]: what a metadata answer says of one topic;
//! * [`acl`]: authorization errors as the ACL to grant;
//! * [`durability_report`]: `walrelay status --kafka`;
//! * [`conn`]: walrelay's own broker connections (TLS, SASL) for the two
//!   requests librdkafka cannot send, and [`wire`], reading their answers.
//!
//! The old top-level paths (`crate::kafka::client`, `crate::kafka::acl`,
//! `crate::kafka::metadata`, `crate::kafka::durability_report`,
//! `crate::kafka::conn`) remain as aliases.

pub mod acl;
pub mod client;
pub mod conn;
pub mod durability_report;
pub mod metadata;
pub mod wire;
