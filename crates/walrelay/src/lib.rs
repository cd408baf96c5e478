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
//! | [`record`] | the Kafka record as walrelay builds it, and the names of its reserved headers |
//! | [`partition`] | deterministic partitioning (Java-compatible murmur2) |
//! | [`fence`] | the tail fence's decisions: what a replay need not write again, whether the replay reproduces it, whether a readable record was acknowledged (`fence/`: the layout and fingerprint, decide, replay, durability, the topic settings and tail reads it decides from, the per-session state) |
//! | [`source_record`] | what each source published, in a compacted topic no retention empties, and the restore check made from it |
//! | [`kafka`] | the Kafka wing, everything but the producer's records: the `[kafka]` settings and each client's properties with their checks, walrelay's own requests (ApiVersions, log end) and connections, metadata, ACL advice, [`kafka::ClientError`] and [`kafka::RequestError`] |
//! | [`sink`] | the idempotent Kafka producer: sending, its delivery deadline, delivery reports, librdkafka's callbacks, [`sink::SinkError`] |
//! | [`checkpoint`] | which LSN may be confirmed, given what Kafka acknowledged |
//! | [`pipeline`] | the loop tying them together, and restarts from the slot |
//! | [`error`] | the relay's error type, with what to do about each |
//! | [`metrics`], [`http`] | Prometheus metrics, `/metrics`, `/healthz`, `/readyz` |
//! | [`publication`], [`monitor`] | what the publication must contain for the configuration; the periodic check while `run` runs |
//! | [`setup`] | `walrelay setup`: helpers, publication, slot |
//! | [`slot_record`] | what `setup` remembers of the slot it created (`walrelay.slots`), and the decision made from it |
//! | [`published`] | whether Kafka already holds records of a source: `setup`'s evidence when the slot and its row are both missing |
//! | [`slot_failover`] | whether a PostgreSQL failover keeps what walrelay published (failover slots, synchronized standbys) |
//! | [`status`] | `walrelay status`: the slot as PostgreSQL sees it; with `--kafka`, the topics' durability and the fence's verdict ([`status::kafka`]) |
//! | [`verify`] | `walrelay verify`: read topics back and check what a high-water-mark consumer needs |
//! | [`config`], [`cli`] | configuration file, environment and flags |
//! | [`shutdown`] | SIGTERM/SIGINT and the stop channel |
//! | [`secrets`] | Kafka secrets from files and environment variables, never shown |
//!
//! Imports among the relay's Kafka side run one way, without a cycle:
//! [`kafka`] imports none of the others (of the crate, only [`secrets`]);
//! [`config`] imports [`kafka`] (the `[kafka]` section and its checks);
//! [`route`] imports [`config`]; [`sink`] imports [`kafka`]; [`metrics`]
//! imports [`route`] and [`sink`] (their error kinds are labels);
//! [`fence`] imports [`config`], [`kafka`] and [`metrics`].

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
