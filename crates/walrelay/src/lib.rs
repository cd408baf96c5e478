//! walrelay: relay a PostgreSQL logical replication slot to Kafka with
//! ordered 128-bit idempotency keys.
//!
//! The crate has three wings and the parts they share:
//!
//! - [`engine`]: a byte's way from the slot to Kafka's acknowledgement and
//!   back to the slot's confirmed position (keys, routing, placement, the
//!   tail fence, the producer, the checkpoint, the session loop);
//! - [`source`]: what walrelay knows and checks of its source PostgreSQL
//!   (the publication, the slot's record, failover slots, the source record
//!   that detects a restore);
//! - [`commands`]: the command line (`run`'s flags, `setup`, `status`,
//!   `verify`);
//! - shared by all three: [`config`], [`kafka`] (every Kafka client's
//!   settings and walrelay's own requests), [`metrics`] and [`http`],
//!   [`error`], [`secrets`], [`shutdown`].
//!
//! One event from the socket to Kafka's ack, module by module:
//!
//! | module | owns |
//! |---|---|
//! | `walrelay_pg` (crate) | the replication connection and stream, status updates |
//! | `walrelay_pgoutput` (crate) | decoding pgoutput messages |
//! | [`engine::pipeline`] | the session loop tying the rest together, and restarts from the slot |
//! | [`engine::key`] | the idempotency key of each event (docs/contract.md; the key type itself is in `walrelay_contract`) |
//! | [`envelope`] | the `walrelay.emit` envelope format |
//! | [`engine::route`] | which record an event becomes: topic, key, value, headers (the router and base headers, logical messages, outbox rows, dead letters) |
//! | [`engine::record`] | the Kafka record as walrelay builds it, and the names of its reserved headers |
//! | [`engine::partition`] | deterministic partitioning (Java-compatible murmur2) |
//! | [`engine::fence`] | the tail fence's decisions: what a replay need not write again, whether the replay reproduces it, whether a readable record was acknowledged (the layout and fingerprint, decide, replay, durability, the topic settings and tail reads it decides from, the per-session state) |
//! | [`engine::sink`] | the idempotent Kafka producer: sending, delivery reports, librdkafka's callbacks, [`engine::sink::SinkError`] |
//! | [`engine::checkpoint`] | which LSN may be confirmed: what Kafka's acknowledgements cover, capped by the relay's holds ([`engine::checkpoint::ConfirmGate`]) |
//! | [`source::publication`], [`source::monitor`] | what the publication must contain for the configuration; the periodic check while `run` runs |
//! | [`source::source_record`] | what each source published, in a compacted topic no retention empties, and the restore check made from it |
//! | [`source::slot_record`] | what `setup` remembers of the slot it created (`walrelay.slots`), and the decision made from it |
//! | [`source::published`] | whether Kafka already holds records of a source: `setup`'s evidence when the slot and its row are both missing |
//! | [`source::slot_failover`] | whether a PostgreSQL failover keeps what walrelay published (failover slots, synchronized standbys) |
//! | [`commands::cli`] | the command line's flags |
//! | [`commands::setup`] | `walrelay setup`: helpers, publication, slot |
//! | [`commands::status`] | `walrelay status`: the slot as PostgreSQL sees it; with `--kafka`, the topics' durability and the fence's verdict |
//! | [`commands::verify`] | `walrelay verify`: read topics back and check what a high-water-mark consumer needs |
//! | [`config`] | the configuration file, environment and flags, checked |
//! | [`kafka`] | the Kafka wing, everything but the producer's records: the `[kafka]` settings and each client's properties with their checks, walrelay's own requests (ApiVersions, log end) and connections, OAUTHBEARER logins ([`kafka::login`]; the tokens come from the `walrelay-oauth` crate), metadata, ACL advice, [`kafka::ClientError`] and [`kafka::RequestError`] |
//! | [`error`] | the relay's error type, with what to do about each |
//! | [`metrics`], [`http`] | Prometheus metrics, `/metrics`, `/healthz`, `/readyz` |
//! | [`shutdown`] | SIGTERM/SIGINT and the stop channel |
//! | [`secrets`] | Kafka secrets from files and environment variables, never shown |
//!
//! Imports among the relay's Kafka side run one way, without a cycle:
//! [`kafka`] imports none of the others (of the crate, only [`secrets`]);
//! [`config`] imports [`kafka`] (the `[kafka]` section and its checks);
//! [`engine::route`] imports [`config`]; [`engine::sink`] imports
//! [`kafka`]; [`metrics`] imports [`engine::route`] and [`engine::sink`]
//! (their error kinds are labels); [`engine::fence`] imports [`config`],
//! [`kafka`] and [`metrics`].

// One exception, with its reason: `kafka::login` hands an OAuth token to
// librdkafka's admin clients, which rdkafka offers no safe call for.
#![deny(unsafe_code)]

pub mod commands;
pub mod config;
pub mod engine;
/// The `walrelay.v1` envelope format lives in the contract crate (fuzzable, no
/// librdkafka); re-exported here because the router is its main user.
pub use walrelay_contract::envelope;
pub mod error;
pub mod http;
pub mod kafka;
pub mod metrics;
pub mod secrets;
pub mod shutdown;
pub mod source;
