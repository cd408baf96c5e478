//! walrelay-consumer (placeholder)
