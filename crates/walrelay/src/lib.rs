//! walrelay: relay a PostgreSQL logical replication slot to Kafka with
//! ordered 128-bit idempotency keys.
//!
//! A byte's way from the slot to Kafka, module by module:
//!
//! | module | owns |
//! |---|---|
//! | `walrelay_pg` (crate) | the replication connection and stream, status updates |
//! | `walrelay_pgoutput` (crate) | decoding pgoutput messages |
//! | [`key`] | the idempotency key of each event (docs/contract.md; the key type itself is in `walrelay_contract`) |
//! | [`envelope`] | the `walrelay.emit` envelope format |
//! | [`route`] | which record an event becomes: topic, key, value, headers (`route/`: the router and base headers, logical messages, outbox rows, dead letters) |
//! | [`partition`] | deterministic partitioning (Java-compatible murmur2) |
//! | [`fence`] | the tail fence: what a replay need not write again |
//! | [`source_record`] | what each source published, in a compacted topic no retention empties, and the restore check made from it |
//! | [`sink`] | the idempotent Kafka producer and its delivery reports (`sink/`: the producer, its configuration, the property policy, librdkafka's callbacks, errors) |
//! | [`checkpoint`] | which LSN may be confirmed, given what Kafka acknowledged |
//! | [`pipeline`] | the loop tying them together, and restarts from the slot |
//! | [`error`] | the relay's error type, with what to do about each |
//! | [`metrics`], [`http`] | Prometheus metrics, `/metrics`, `/healthz`, `/readyz` |
//! | [`publication`], [`monitor`] | what the publication must contain for the configuration; the periodic check while `run` runs |
//! | [`setup`] | `walrelay setup`: helpers, publication, slot |
//! | [`status`] | `walrelay status`: the slot as PostgreSQL sees it |
//! | [`verify`] | `walrelay verify`: read topics back and check what a high-water-mark consumer needs |
//! | [`config`], [`cli`] | configuration file, environment and flags |
//! | [`shutdown`] | SIGTERM/SIGINT and the stop channel |
//! | [`secrets`] | Kafka secrets from files and environment variables, never shown |
//! | [`kafka_acl`] | which ACL a Kafka authorization error means is missing, and the fix |

#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod error;
pub mod fence;
/// The `walrelay.v1` envelope format lives in the contract crate (fuzzable, no
/// librdkafka); re-exported here because the router is its main user.
pub use walrelay_contract::envelope;
pub mod http;
pub mod kafka;
/// Old paths of the [`kafka`] modules.
pub use kafka::{
    acl as kafka_acl, client as kafka_client, conn as broker_conn, metadata as kafka_metadata,
};
pub mod key;
pub mod metrics;
pub mod monitor;
pub mod partition;
pub mod pipeline;
pub mod publication;
pub mod published;
pub mod record;
pub mod route;
pub mod secrets;
pub mod setup;
pub mod shutdown;
pub mod sink;
pub mod slot_failover;
pub mod slot_record;
pub mod source_record;
pub mod status;
pub mod verify;
