//! The engine: one event's way from the replication stream to Kafka's
//! acknowledgement, and back to the slot's confirmed position.
//!
//! In the order an event meets them: [`pipeline`] runs the session (the
//! stream, the producer, restarts); [`key`] gives the event its
//! idempotency key; [`route`] makes it a [`record`]; [`partition`] and the
//! [`fence`] decide where it goes and whether a replay must write it again;
//! [`sink`] produces it; [`checkpoint`] decides, from Kafka's
//! acknowledgements, what the slot may confirm.

pub mod checkpoint;
pub mod fence;
pub mod key;
pub mod partition;
pub mod pipeline;
pub mod record;
pub mod route;
pub mod sink;
