//! walrelay's own Kafka requests: what librdkafka reads from the brokers
//! but does not expose, asked over walrelay's own connections
//! ([`super::conn`]) and read with [`super::wire`]. They answer the tail
//! fence's questions (`fence::session` decides with the answers), so they
//! are encoded and decoded here, with the rest of the Kafka protocol, and
//! report [`RequestError`](super::RequestError).
//!
//! * [`api_versions`]: whether every broker holds the high watermark under
//!   min ISR (Kafka 3.7 and later, [`api_versions::StrictMinIsr`]);
//! * [`log_end`]: a partition's log end and high watermark from its
//!   leader;
//! * [`readable`]: the wait until what the leaders hold is readable,
//!   before the fence reads the tails.

pub mod api_versions;
pub mod log_end;
pub mod readable;
