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
    /// and partition; for the first one of a session, the partition's
    /// fence key (the last key of this source the tail fence found in the
    /// partition), or empty without one. A consumer
    /// whose high-water mark is below it has missed something (gap
    /// detection). Unlike everything else in a record it depends on the
    /// session, not only on the WAL.
    pub const PREV_KEY: &str = "walrelay-prev-key";
    /// How the record was routed: `<partitions>/<fingerprint>`, the
    /// partition count of its topic and a fingerprint of the routing
    /// configuration (see `fence`). The tail fence of a later session
    /// trusts a partition's tail only if it was routed as that session
    /// routes.
    pub const LAYOUT: &str = "walrelay-layout";

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

    /// Every header whose name starts with this belongs to walrelay.
    pub const RESERVED_PREFIX: &str = "walrelay-";

    /// Whether a header name is walrelay's: `idempotency-key` and every
    /// `walrelay-*`, in any letter case. Such a header can never come from
    /// an application (an envelope's or an outbox row's headers, refused
    /// by the router and by `walrelay.emit`): a copy next to walrelay's
    /// would let a consumer or `walrelay verify` take a forged key as a
    /// high-water mark, or report a gap that never happened. Any letter
    /// case, because some consumers compare header names that way.
    ///
    /// The one definition of the rule in Rust: the router, `walrelay
    /// verify` and the consumer library use it; `sql/walrelay.sql` repeats
    /// it for `walrelay.emit` (a test keeps the two in step).
    pub fn is_reserved(name: &str) -> bool {
        let prefix = RESERVED_PREFIX.len();
        name.eq_ignore_ascii_case(IDEMPOTENCY_KEY)
            || (name.len() >= prefix
                && name.as_bytes()[..prefix].eq_ignore_ascii_case(RESERVED_PREFIX.as_bytes()))
    }
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
    /// Headers in order: walrelay's own first (each exactly once, all of
    /// them [`header::is_reserved`]), then the application's (none of them
    /// reserved). The pipeline adds `walrelay-layout` and
    /// `walrelay-prev-key` after walrelay's others ([`Record::insert_walrelay_header`]).
    pub headers: Vec<(Arc<str>, Bytes)>,
    /// The event's idempotency key (also in the `idempotency-key` header).
    pub event_key: EventKey,
    /// Kafka timestamp in milliseconds since the Unix epoch: the commit
    /// time, so it too is the same on replay. `None` lets the producer
    /// stamp it (non-transactional messages have no commit time).
    pub timestamp_ms: Option<i64>,
}

impl Record {
    /// Adds a walrelay header after walrelay's others and before the
    /// application's. Allocation-free when the router left room for it
    /// (it does, for `walrelay-prev-key`).
    pub fn insert_walrelay_header(&mut self, name: Arc<str>, value: Bytes) {
        let at = self
            .headers
            .iter()
            .position(|(k, _)| !header::is_reserved(k))
            .unwrap_or(self.headers.len());
        self.headers.insert(at, (name, value));
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_names_are_idempotency_key_and_every_walrelay_header_in_any_case() {
        for name in [
            "idempotency-key",
            "Idempotency-Key",
            "walrelay-prev-key",
            "walrelay-source",
            "WALRELAY-anything",
            "walrelay-",
            header::DEAD_LETTER_KIND,
        ] {
            assert!(header::is_reserved(name), "{name}");
        }
        for name in [
            "",
            "idempotency",
            "idempotency-key2",
            "walrelay",
            "x-walrelay-source",
            "trace",
            "walrelay_source",
            "wälrelay-x",
        ] {
            assert!(!header::is_reserved(name), "{name}");
        }
    }

    #[test]
    fn a_walrelay_header_goes_after_walrelays_and_before_the_applications() {
        let h = |k: &str| (Arc::<str>::from(k), Bytes::from_static(b"v"));
        let mut headers = Vec::with_capacity(5);
        headers.extend([
            h("idempotency-key"),
            h("walrelay-source"),
            h("trace"),
            h("id"),
        ]);
        let mut r = Record {
            topic: Arc::from("t"),
            key: None,
            value: None,
            headers,
            event_key: EventKey(1),
            timestamp_ms: None,
        };
        let capacity = r.headers.capacity();
        r.insert_walrelay_header(Arc::from(header::PREV_KEY), Bytes::new());
        let names: Vec<&str> = r.headers.iter().map(|(k, _)| &**k).collect();
        assert_eq!(
            names,
            [
                "idempotency-key",
                "walrelay-source",
                "walrelay-prev-key",
                "trace",
                "id"
            ]
        );
        assert_eq!(r.headers.capacity(), capacity, "no reallocation");
        // Only walrelay headers: at the end.
        r.headers.truncate(2);
        r.insert_walrelay_header(Arc::from(header::PREV_KEY), Bytes::new());
        assert_eq!(&*r.headers[2].0, "walrelay-prev-key");
    }
}
