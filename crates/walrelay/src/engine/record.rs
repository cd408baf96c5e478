//! A Kafka record as walrelay builds it, before it is handed to the sink.
//!
//! Everything in it is derived from the WAL and the configuration only, so
//! replaying the same WAL yields the same record: same key, value, headers,
//! topic, partition and timestamp. That is what lets consumers recognise a
//! replayed duplicate by its idempotency key.

use std::sync::Arc;

use bytes::Bytes;

use crate::engine::key::EventKey;

/// Header names walrelay sets on every record (defined in the contract
/// crate, which consumers share; re-exported so relay code keeps this path).
pub mod header {
    pub use walrelay_contract::header::*;
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
    /// reserved). The pipeline adds `walrelay-layout` and the previous
    /// key (`walrelay-prev`, or `walrelay-prev-key` with the full header
    /// set) after walrelay's others ([`Record::insert_walrelay_header`]).
    pub headers: Vec<(Arc<str>, Bytes)>,
    /// The event's idempotency key (also in the `idempotency-key` header).
    pub event_key: EventKey,
    /// Kafka timestamp in milliseconds since the Unix epoch: the commit
    /// time, so it too is the same on replay. `None` lets the producer
    /// stamp it (non-transactional messages have no commit time).
    pub timestamp_ms: Option<i64>,
}

impl Record {
    /// The headers added once the partition is known (`walrelay-layout`
    /// and the previous key, see `pipeline/placement.rs`): whoever
    /// builds a record leaves room for them, so adding them does not
    /// reallocate.
    pub const PLACEMENT_HEADERS: usize = 2;

    /// Adds a walrelay header after walrelay's others and before the
    /// application's. Allocation-free when the builder left room for it
    /// ([`Record::PLACEMENT_HEADERS`]).
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
