//! What a walrelay record promises its readers, apart from the relay: the
//! idempotency key ([`EventKey`]: parsing, hex form, ordering), the header
//! names ([`header`]) and the `walrelay.v1` envelope that `walrelay.emit`
//! writes ([`envelope`]).
//!
//! Consumers (`walrelay-consumer`, or any other client) depend on this
//! crate alone instead of the relay and its Kafka, HTTP and CLI
//! dependencies. It has no librdkafka either, so the envelope parser can be
//! fuzzed (`fuzz/`).

#![forbid(unsafe_code)]

pub mod envelope;
pub mod header;
mod key;

pub use key::{EventKey, ParseEventKeyError};
