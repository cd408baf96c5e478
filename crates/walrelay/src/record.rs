//! A Kafka record as walrelay builds it, before it is handed to the sink.
//!
//! Everything in it is derived from the WAL and the configuration only, so
//! replaying the same WAL yields the same record: same key, value, headers,
//! topic, partition and timestamp. That is what lets consumers recognise a
//! replayed duplicate by its idempotency key.

use std::sync::Arc;

use bytes::Bytes;

use crate::key::EventKey;

/// Header names walrelay sets on every record.
pub mod header {
    /// The 128-bit idempotency key as 32 lowercase hex digits.
    pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
    /// Where the key sequence comes from: keys of different sources are not
    /// comparable (default `<system identifier>/<database>/<slot>`).
    pub const SOURCE: &str = "walrelay-source";
    /// Start LSN of the transaction's commit record (absent for
    /// non-transactional messages).
    pub const COMMIT_LSN: &str = "walrelay-commit-lsn";
    /// The LSN the server reported for the event.
    pub const LSN: &str = "walrelay-lsn";
    /// Transaction id (absent for non-transactional messages).
    pub const XID: &str = "walrelay-xid";
    /// Commit time, RFC 3339 UTC with microseconds (absent for
    /// non-transactional messages).
    pub const COMMIT_TIME: &str = "walrelay-commit-time";
    /// The key of the record this session sent before to the same topic
    /// and partition; empty for the first one of a session. A consumer
    /// whose high-water mark is below it has missed something (gap
    /// detection). Unlike everything else in a record it depends on the
    /// session, not only on the WAL.
    pub const PREV_KEY: &str = "walrelay-prev-key";

    /// On a dead-letter record: why the event could not be routed (the
    /// error's text, which names the fix).
    pub const DEAD_LETTER_REASON: &str = "walrelay-dead-letter-reason";
    /// On a dead-letter record: a stable, machine-readable kind of problem
    /// (`malformed-envelope`, `missing-topic`, `unknown-prefix`, ...; see
    /// [`crate::route::RouteError::kind`]), for filtering and alerting.
    pub const DEAD_LETTER_KIND: &str = "walrelay-dead-letter-kind";
    /// On a dead-letter record of a logical message: its prefix.
    pub const DEAD_LETTER_PREFIX: &str = "walrelay-dead-letter-prefix";
    /// On a dead-letter record of an outbox row: `schema.table`.
    pub const DEAD_LETTER_TABLE: &str = "walrelay-dead-letter-table";
}

/// One record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Shared: most records of a run go to a handful of topics.
    pub topic: Arc<str>,
    /// The record key (outbox `aggregateid`, envelope `key`); `None` for
    /// keyless records, which are partitioned by a WAL-derived rule.
    pub key: Option<Bytes>,
    /// `None` produces a tombstone (a record with a null value).
    pub value: Option<Bytes>,
    /// Headers in order: walrelay's own first, then the application's.
    pub headers: Vec<(Arc<str>, Bytes)>,
    /// The event's idempotency key (also in the `idempotency-key` header).
    pub event_key: EventKey,
    /// Kafka timestamp in milliseconds since the Unix epoch: the commit
    /// time, so it too is the same on replay. `None` lets the producer
    /// stamp it (non-transactional messages have no commit time).
    pub timestamp_ms: Option<i64>,
}

impl Record {
    /// Bytes this record occupies in memory while in flight (payload,
    /// key, headers): what the in-flight byte budget counts.
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Bytes::len)
            + self.value.as_ref().map_or(0, Bytes::len)
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
            + self.topic.len()
    }
}
