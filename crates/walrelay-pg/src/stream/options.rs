//! How a [`super::ReplicationStream`] is tuned, and what it reports.

use std::time::Duration;

use walrelay_pgoutput::Lsn;

/// Tuning of a [`ReplicationStream`].
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// How often a status update is sent regardless of traffic. Must stay
    /// well under the server's `wal_sender_timeout` (default 60 s).
    pub status_interval: Duration,
    /// Batches buffered between the I/O task and the consumer.
    pub channel_capacity: usize,
    /// Bytes of message payload buffered between the I/O task and the
    /// consumer. A single larger message still passes (alone).
    pub channel_bytes: usize,
    /// The slot's confirmed flush position when streaming starts; status
    /// updates never report less (the server must not be told to move the
    /// slot backwards).
    pub initial_flush: Lsn,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            status_interval: Duration::from_secs(10),
            channel_capacity: 64,
            channel_bytes: 8 * 1024 * 1024,
            initial_flush: Lsn::ZERO,
        }
    }
}

/// Statistics, for tests and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamStats {
    pub confirmed: Lsn,
    pub reported: Lsn,
    pub status_updates_sent: u64,
    pub keepalives_received: u64,
}
