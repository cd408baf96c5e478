//! `[relay]`: how the relay runs a session, and the two choices that shape
//! what it writes (the header set, the keyless records' placement).

use std::time::Duration;

use serde::Deserialize;

use super::{duration, DEFAULT_SOURCE_RECORD_TOPIC};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// Names this key sequence in the `walrelay-source` header; default
    /// `<system identifier>/<database>/<slot>`.
    pub source_id: Option<String>,
    /// Events sent to Kafka but not yet acknowledged, at most.
    pub max_in_flight_events: usize,
    /// Bytes of such events, at most.
    pub max_in_flight_bytes: usize,
    /// Logical-message prefixes that belong to other tools and are skipped
    /// on purpose. Any other prefix without a route is an error.
    pub ignore_prefixes: Vec<String>,
    /// Longest wait between reconnection attempts.
    #[serde(deserialize_with = "duration")]
    pub max_backoff: Duration,
    /// How often a standby (a second `walrelay run` on a slot another
    /// connection streams from) checks whether it can take over.
    #[serde(deserialize_with = "duration")]
    pub standby_poll: Duration,
    /// The tail fence (see `fence`): before writing to a topic, read the
    /// end of its partitions and do not write again what a crashed
    /// session already wrote there. Off, a replay after a crash writes
    /// duplicates that only high-water-mark consumers drop.
    pub fence: bool,
    /// How long reading the partition tails of one topic may take before
    /// the session fails (and is retried).
    #[serde(deserialize_with = "duration")]
    pub fence_timeout: Duration,
    /// Which of walrelay's headers every record carries
    /// ([`HeaderSet`]).
    pub headers: HeaderSet,
    /// How a record without a key is given its partition
    /// ([`KeylessPlacement`]).
    pub keyless_placement: KeylessPlacement,
    /// The compacted topic holding one record per source: a recent event
    /// it published, which a later session checks the database against
    /// ([`crate::source::source_record`]).
    pub source_record_topic: String,
}

/// Which of walrelay's headers every record carries.
///
/// Both sets carry what the contract, the tail fence and gap detection
/// read: `idempotency-key`, `walrelay-source`, `walrelay-layout` and the
/// previous key, which the lean set writes in the compact form `HIGH/LOW`
/// as `walrelay-prev` and the full set as 32 hex digits in
/// `walrelay-prev-key`. Every reader (both consumer libraries, `walrelay
/// verify`, the fence) takes either, so a topic may hold records of both
/// sets, and switching between sessions keeps the fence. `Full` adds four
/// headers a reader can mostly derive: the commit LSN (the key's high 64
/// bits), the event's LSN, the transaction id and the commit time (the
/// record's timestamp under `CreateTime`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HeaderSet {
    /// The four headers the contract needs, the previous key compact
    /// (under 60 % of the bytes of `Full` on the bench's records).
    #[default]
    Lean,
    /// Also `walrelay-commit-lsn`, `walrelay-lsn`, `walrelay-xid` and
    /// `walrelay-commit-time`.
    Full,
}

impl HeaderSet {
    /// The value in the configuration file.
    pub fn as_str(self) -> &'static str {
        match self {
            HeaderSet::Lean => "lean",
            HeaderSet::Full => "full",
        }
    }
}

/// How a record without a key (a logical message, an outbox row with a
/// NULL key column) is given its partition. Either rule is a function of
/// the WAL alone, so a replay puts every record where its first copy went
/// ([`crate::engine::partition::partition_for_keyless`]); they differ in
/// how many consecutive transactions share a partition.
///
/// Each record's `walrelay-layout` header names the rule that placed it,
/// and a session keeps placing a topic's replayed records by the rule
/// they were written with ([`crate::engine::fence::keyless`]), so the
/// setting can be changed between any two sessions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum KeylessPlacement {
    /// By the 1 MiB range of WAL its commit record starts in: a run of
    /// consecutive transactions shares a partition, so the producer
    /// batches them together (one-event transactions as full batches).
    #[default]
    WalRange,
    /// By its commit record's position: each transaction hashed on its
    /// own, what releases before `wal-range` did.
    Commit,
}

impl KeylessPlacement {
    /// The value in the configuration file.
    pub fn as_str(self) -> &'static str {
        match self {
            KeylessPlacement::WalRange => "wal-range",
            KeylessPlacement::Commit => "commit",
        }
    }
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            source_id: None,
            max_in_flight_events: 20_000,
            max_in_flight_bytes: 8 * 1024 * 1024,
            ignore_prefixes: Vec::new(),
            max_backoff: Duration::from_secs(30),
            standby_poll: Duration::from_secs(1),
            fence: true,
            fence_timeout: Duration::from_secs(30),
            headers: HeaderSet::Lean,
            keyless_placement: KeylessPlacement::WalRange,
            source_record_topic: DEFAULT_SOURCE_RECORD_TOPIC.to_owned(),
        }
    }
}
