//! The tail fence: a replay does not write again what Kafka already has.
//!
//! After a crash the slot replays everything it had not confirmed, and
//! most of it usually reached Kafka before the crash. High-water-mark
//! consumers drop those copies, but every other reader of the topic would
//! see them. The fence keeps them off the wire:
//!
//! 1. Before a session first produces to a topic, it reads the tail of
//!    every partition of that topic ([`tail`]) and keeps, per partition,
//!    the highest `idempotency-key` of its own source found there, and the
//!    [`Layout`] that record was routed with ([`decide`]).
//! 2. While replaying, a record whose key is at or below its partition's
//!    fence key is not produced; it counts as acknowledged (it is simply
//!    not registered with the checkpoint tracker, whose confirmation
//!    candidates cover only what was registered).
//! 3. Nothing is confirmed to PostgreSQL until the replay has reproduced
//!    every fence key at or after the slot's position, record for record
//!    ([`replay`]); a replay that passes a fence key without reproducing
//!    it, or a fence key ahead of the server's WAL, stops the relay with
//!    [`FenceError::WalWentBack`] or [`FenceError::NotReproduced`].
//!
//! | module | owns |
//! |---|---|
//! | this one | the `walrelay-layout` header ([`Layout`]) and the routing fingerprint |
//! | [`decide`] | a topic's fence from its partitions' tails (pure) |
//! | [`keyless`] | which rule places a topic's keyless records in a session, from the same tails (pure) |
//! | [`replay`] | the check that the replay reproduces the fence (pure) |
//! | [`durability`] | whether a readable record was acknowledged (pure), from [`settings`], the topic's settings as the cluster reports them |
//! | [`tail`] | reading the partitions' tails (through librdkafka) |
//! | [`session`] | one session's fence: reads, decides and logs once per topic |
//! | [`error`] | [`FenceError`], each with the fix |
//!
//! The requests the fence needs that librdkafka cannot send (the brokers'
//! release, each leader's log end) are the Kafka wing's
//! ([`crate::kafka::requests`]); the fence imports them, and the Kafka
//! wing imports nothing of the fence.
//!
//! # Why skipping is sound
//!
//! Take a record `e` for partition `p`, with key at or below the fence key
//! `f` of `p`, where `f` was written by an earlier session `S` whose layout
//! equals this session's. This session replays from the slot's confirmed
//! position, which never moves back, so `e` was in `S`'s replay range too.
//! `S` routed `e` exactly as this session does (same WAL, same layout: same
//! topic and partition) and produced it before `f` (keys are produced in
//! stream order). `S`'s producer is idempotent with the gapless guarantee
//! and never times a record out itself (the session's deadline stops it
//! sending first: [`producer_properties`](crate::engine::sink::producer_properties)),
//! so the broker never appends a later record of it to `p` after one that
//! failed: `f` being in `p` means `e` is too. (If `S` itself skipped `e`
//! under its own fence, the same argument applied to `S`.)
//!
//! The argument rests on three assumptions, each checked rather than
//! trusted:
//!
//! - **`f` was written by walrelay to `p`.** A copy of a genuine record
//!   (a dead-letter re-drive, a mirror, a stream processor that forwards
//!   headers) carries this source's header too. So a tail record is a
//!   fence key only if its layout names `p` as the partition it was routed
//!   to and its `walrelay-prev-key` names a record of this source before it
//!   in `p` (or is empty with none before it): a copy from another
//!   partition names a predecessor that is not in `p`. Otherwise `p` is
//!   left unfenced, with a WARN and a counter ([`decide::Untrusted`]).
//!   The reader reads committed records only, so an aborted transactional
//!   copy is never one.
//! - **`S` routed like this session.** Every record carries the layout of
//!   the session that wrote it ([`header::LAYOUT`](crate::engine::record::header::LAYOUT)):
//!   the topic's partition count and a fingerprint of everything in the
//!   configuration that decides which events exist and where they go
//!   ([`routing_fingerprint`]). If the partition count changed (partitions
//!   were added), an event the crashed session meant for partition 2 may
//!   now map to partition 3, whose tail holds a later key; if a route
//!   changed, an event may now go to a topic whose tail holds a later key
//!   of an event that was routed there all along. In both cases the tail
//!   proves nothing about that event, so a topic where any partition's
//!   last own record has another layout (or none: written by an older
//!   walrelay) is **not fenced** in this session: the replay is produced
//!   as before, with a WARN naming the topic and both layouts. Its new
//!   records carry the new layout, so the next session fences it again.
//!   The layout also names the rule that placed the topic's keyless
//!   records; a session places its replay by the rule of the records it
//!   replays ([`keyless`]), so a change of `relay.keyless_placement` keeps
//!   the fence, and a tail record replayed under another rule (which
//!   [`keyless::choose`] never lets happen) unfences the topic.
//! - **The WAL is the WAL `S` read.** A database restored from a base
//!   backup, recovered to an earlier point or failed over to a standby
//!   that had not received everything keeps its system identifier (so the
//!   default source id) while its WAL goes back: new events get keys at or
//!   below keys already in Kafka. Same WAL gives the same records, so the
//!   replay must reproduce `f` exactly; [`replay::ReplayCheck`] holds every
//!   confirmation until it has, and stops the relay when it cannot.
//!
//! # What it does not cover
//!
//! See docs/contract.md ("Duplicates on the wire"): a record a broker
//! appends after the fence read (a zombie relay's produce retries, or an
//! append not yet visible below the high watermark), and a relay run with
//! `relay.fence = false` (which also reads no tail, so it cannot detect a
//! WAL that went back).

pub mod decide;
pub mod durability;
pub mod error;
pub mod keyless;
pub mod replay;
pub mod session;
pub mod settings;
pub mod tail;

pub use decide::{OwnRecord, PartitionTail, TopicFence, Unfenced, Untrusted};
pub use error::{FenceError, RecordNotReproduced};
pub use replay::ReplayCheck;
pub use session::{SessionFence, TopicState};

use std::fmt;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::config::{Config, KeylessPlacement};

/// How a topic is routed in this session: its partition count and the
/// [`routing_fingerprint`] of the configuration for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicLayout {
    /// Partitions of the topic when the record was routed.
    pub partitions: u32,
    /// [`routing_fingerprint`] of the configuration that routed it.
    pub routing: u64,
}

/// How a record was routed, as written in the `walrelay-layout` header:
/// the partition it was routed to, its topic's [`TopicLayout`], and the
/// rule that placed it if it had no key. Placed by
/// [`KeylessPlacement::Commit`]: `<partition>/<partitions>/<fingerprint>`
/// (e.g. `2/4/9f86d081884c7d65`, what releases before `wal-range` wrote);
/// by [`KeylessPlacement::WalRange`] the same plus `/wal20` (ranges of
/// 2^20 bytes). A release that knows only the first form reads the second
/// as a layout it does not know, and leaves the topic unfenced rather than
/// trusting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The partition the record was routed to.
    pub partition: u32,
    /// The topic's layout.
    pub topic: TopicLayout,
    /// The rule that places the topic's records without a key (written on
    /// every record of the session, keyed or not: it is the topic's).
    pub keyless: KeylessPlacement,
}

/// The `walrelay-layout` field naming [`KeylessPlacement::WalRange`].
const WAL_RANGE_FIELD: &str = "wal20";

impl Layout {
    /// The header value.
    #[must_use]
    pub fn header_value(&self) -> Bytes {
        Bytes::from(self.to_string())
    }

    /// Parses a header value; `None` if it is not one this walrelay
    /// writes (an older walrelay wrote `<partitions>/<fingerprint>`).
    #[must_use]
    pub fn parse(value: &[u8]) -> Option<Layout> {
        let text = std::str::from_utf8(value).ok()?;
        let (partition, rest) = text.split_once('/')?;
        let (partitions, rest) = rest.split_once('/')?;
        let (routing, keyless) = match rest.split_once('/') {
            None => (rest, KeylessPlacement::Commit),
            Some((routing, WAL_RANGE_FIELD)) => (routing, KeylessPlacement::WalRange),
            Some(_) => return None,
        };
        let number = |t: &str| -> Option<u32> {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            t.parse().ok()
        };
        if routing.len() != 16 || !routing.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(Layout {
            partition: number(partition)?,
            topic: TopicLayout {
                partitions: number(partitions)?,
                routing: u64::from_str_radix(routing, 16).ok()?,
            },
            keyless,
        })
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.partition, self.topic)?;
        match self.keyless {
            KeylessPlacement::Commit => Ok(()),
            KeylessPlacement::WalRange => write!(f, "/{WAL_RANGE_FIELD}"),
        }
    }
}

impl fmt::Display for TopicLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:016x}", self.partitions, self.routing)
    }
}

/// Bumped whenever walrelay changes how it maps an event to a topic or a
/// partition, or which events exist, so that records routed by an older
/// walrelay never fence a newer one's replay. 2: the fingerprint covers
/// the publication and the topic, and the layout names the partition.
const ROUTING_RULES_VERSION: &str = "walrelay-routing-2";

/// A fingerprint of everything in the configuration that decides which
/// events exist and where they go, for records to `topic`: the
/// publication (which tables' rows are decoded at all), the message
/// routes, the outbox tables with their topic templates and columns, the
/// dead-letter topic and the ignored prefixes, plus the version of
/// walrelay's routing rules and the topic itself (so a record copied from
/// another topic does not match). Settings that do not route (timeouts,
/// in-flight limits, Kafka properties) are left out, so changing them
/// keeps the fence.
///
/// 64 bits of SHA-256 over a canonical JSON form: stable across runs,
/// platforms and walrelay versions (unlike `Hash`), and a changed
/// configuration colliding with the old one is out of reach in practice.
#[must_use]
pub fn routing_fingerprint(config: &Config, topic: &str) -> u64 {
    let messages: Vec<_> = config
        .messages
        .iter()
        .map(|m| serde_json::json!([m.prefix, m.topic]))
        .collect();
    let outbox: Vec<_> = config
        .outbox
        .iter()
        .map(|o| {
            let c = &o.columns;
            serde_json::json!([
                o.table,
                o.topic,
                c.id,
                c.aggregatetype,
                c.aggregateid,
                c.event_type,
                c.payload,
                c.headers
            ])
        })
        .collect();
    let canonical = serde_json::json!([
        ROUTING_RULES_VERSION,
        config.postgres.publication,
        messages,
        outbox,
        config.dead_letter.topic,
        config.relay.ignore_prefixes,
        topic,
    ]);
    let digest = Sha256::digest(canonical.to_string().as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{MessageRoute, OutboxColumns, OutboxConfig};

    const NOW: Layout = Layout {
        partition: 2,
        topic: TopicLayout {
            partitions: 4,
            routing: 0x0123_4567_89ab_cdef,
        },
        keyless: KeylessPlacement::Commit,
    };

    #[test]
    fn the_header_round_trips_and_refuses_what_walrelay_does_not_write() {
        assert_eq!(NOW.to_string(), "2/4/0123456789abcdef");
        assert_eq!(Layout::parse(&NOW.header_value()), Some(NOW));
        let ranges = Layout {
            keyless: KeylessPlacement::WalRange,
            ..NOW
        };
        assert_eq!(ranges.to_string(), "2/4/0123456789abcdef/wal20");
        assert_eq!(Layout::parse(&ranges.header_value()), Some(ranges));
        for bad in [
            &b""[..],
            b"4",
            b"4/",
            // What walrelay wrote before the layout named the partition.
            b"4/0123456789abcdef",
            b"2//0123456789abcdef",
            b"/4/0123456789abcdef",
            b"+2/4/0123456789abcdef",
            b"2/+4/0123456789abcdef",
            b"2/-4/0123456789abcdef",
            b"2/4/0123456789abcde",
            b"2/4/0123456789abcdefa",
            b"2/4/0123456789abcdeg",
            b"2/4/+123456789abcdef",
            b"x/4/0123456789abcdef",
            b"2/4/0123456789abcdef/1",
            b"2/4/0123456789abcdef/",
            b"2/4/0123456789abcdef/wal21",
            b"2/4/0123456789abcdef/wal20/",
            b"2/4/0123456789abcdef/WAL20",
            b"\xff/4/0123456789abcdef",
        ] {
            assert_eq!(
                Layout::parse(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_fingerprint_follows_what_decides_events_and_their_topic_only() {
        let base = Config::default();
        let fp = routing_fingerprint(&base, "orders");
        assert_eq!(fp, routing_fingerprint(&base.clone(), "orders"), "stable");

        let mut other = base.clone();
        other.relay.max_in_flight_events += 1;
        other.kafka.bootstrap_servers = "elsewhere:9092".into();
        other.relay.source_id = Some("another".into());
        assert_eq!(
            fp,
            routing_fingerprint(&other, "orders"),
            "not a routing setting"
        );

        let mut changed: Vec<Config> = Vec::new();
        let mut c = base.clone();
        c.messages.push(MessageRoute {
            prefix: "orders".into(),
            topic: "orders".into(),
        });
        changed.push(c.clone());
        let mut c2 = c.clone();
        c2.messages[0].topic = "orders-v2".into();
        changed.push(c2);
        let mut c3 = base.clone();
        c3.outbox.push(OutboxConfig {
            table: "public.outbox".into(),
            topic: "outbox.event.{aggregatetype}".into(),
            columns: OutboxColumns::default(),
        });
        changed.push(c3.clone());
        let mut c4 = c3.clone();
        c4.outbox[0].columns.aggregateid = "customer_id".into();
        changed.push(c4);
        let mut c5 = base.clone();
        c5.dead_letter.topic = Some("walrelay.dlq".into());
        changed.push(c5);
        let mut c6 = base.clone();
        c6.relay.ignore_prefixes.push("debezium".into());
        changed.push(c6);
        // Another publication decodes another set of tables: rows that
        // were dead letters may become events, or the reverse.
        let mut c7 = base.clone();
        c7.postgres.publication = "walrelay_v2".into();
        changed.push(c7);
        let mut seen = vec![fp];
        for c in &changed {
            let f = routing_fingerprint(c, "orders");
            assert!(!seen.contains(&f), "{c:?}");
            seen.push(f);
        }
        // The topic is part of it: a record copied from another topic
        // does not carry this topic's layout.
        let other_topic = routing_fingerprint(&base, "orders.mirror");
        assert!(!seen.contains(&other_topic));
    }
}
