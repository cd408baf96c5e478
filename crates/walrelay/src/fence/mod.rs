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
//!    [`Layout`] that record was routed with.
//! 2. While replaying, a record whose key is at or below its partition's
//!    fence key is not produced; it counts as acknowledged (it is simply
//!    not registered with the checkpoint tracker, whose confirmation
//!    candidates cover only what was registered).
//!
//! # Why skipping is sound
//!
//! Take a record `e` for partition `p`, with key at or below the fence key
//! `f` of `p`, where `f` was written by an earlier session `S` whose layout
//! equals this session's. This session replays from the slot's confirmed
//! position, which never moves back, so `e` was in `S`'s replay range too.
//! `S` routed `e` exactly as this session does (same WAL, same layout: same
//! topic and partition) and produced it before `f` (keys are produced in
//! stream order). `S`'s producer is idempotent with the gapless guarantee,
//! so the broker never appends a later record of it to `p` after one that
//! failed: `f` being in `p` means `e` is too. (If `S` itself skipped `e`
//! under its own fence, the same argument applied to `S`.)
//!
//! The argument needs the layout of the session that wrote `f`, which is
//! why every record carries it ([`header::LAYOUT`](crate::record::header::LAYOUT)):
//! the topic's partition count and a fingerprint of the routing
//! configuration ([`routing_fingerprint`]). If the partition count changed
//! (partitions were added), an event the crashed session meant for
//! partition 2 may now map to partition 3, whose tail holds a later key;
//! if a route changed, an event may now go to a topic whose tail holds a
//! later key of an event that was routed there all along. In both cases
//! the tail proves nothing about that event, so a topic where any
//! partition's last own record has another layout (or none: written
//! before the fence existed) is **not fenced** in this session: the
//! replay is produced as before, with a WARN naming the topic and both
//! layouts. Its new records carry the new layout, so the next session
//! fences it again.
//!
//! # What it does not cover
//!
//! See docs/contract.md ("Duplicates on the wire"): a record a broker
//! appends after the fence read (a zombie relay's produce retries, or an
//! append not yet visible below the high watermark), and a relay run with
//! `relay.fence = false`.

pub mod session;
pub mod tail;

pub use session::{SessionFence, TopicState};
pub use tail::FenceError;

use std::fmt;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::key::EventKey;

/// How a record was routed: the partition count of its topic and the
/// routing configuration, as written in the `walrelay-layout` header
/// (`<partitions>/<fingerprint>`, e.g. `4/9f86d081884c7d65`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Partitions of the topic when the record was routed.
    pub partitions: u32,
    /// [`routing_fingerprint`] of the configuration that routed it.
    pub routing: u64,
}

impl Layout {
    /// The header value.
    #[must_use]
    pub fn header_value(&self) -> Bytes {
        Bytes::from(self.to_string())
    }

    /// Parses a header value; `None` if it is not one walrelay wrote.
    #[must_use]
    pub fn parse(value: &[u8]) -> Option<Layout> {
        let text = std::str::from_utf8(value).ok()?;
        let (partitions, routing) = text.split_once('/')?;
        if routing.len() != 16 || partitions.is_empty() || partitions.starts_with('+') {
            return None;
        }
        Some(Layout {
            partitions: partitions.parse().ok()?,
            routing: u64::from_str_radix(routing, 16).ok()?,
        })
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:016x}", self.partitions, self.routing)
    }
}

/// Bumped whenever walrelay changes how it maps an event to a topic or a
/// partition, so that records routed by an older walrelay never fence a
/// newer one's replay.
const ROUTING_RULES_VERSION: &str = "walrelay-routing-1";

/// A fingerprint of everything in the configuration that decides an
/// event's topic and record key (and so its partition): the message
/// routes, the outbox tables with their topic templates and columns, the
/// dead-letter topic and the ignored prefixes, plus the version of
/// walrelay's routing rules. Settings that do not route (timeouts,
/// in-flight limits, Kafka properties) are left out, so changing them
/// keeps the fence.
///
/// 64 bits of SHA-256 over a canonical JSON form: stable across runs,
/// platforms and walrelay versions (unlike `Hash`), and a changed
/// configuration colliding with the old one is out of reach in practice.
#[must_use]
pub fn routing_fingerprint(config: &Config) -> u64 {
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
        messages,
        outbox,
        config.dead_letter.topic,
        config.relay.ignore_prefixes,
    ]);
    let digest = Sha256::digest(canonical.to_string().as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// What the tail read found in one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionTail {
    /// The highest key of this relay's source found, with the layout its
    /// record carried (`None`: no layout header, an older walrelay).
    pub own: Option<(EventKey, Option<Layout>)>,
    /// Records read from this partition (own and others').
    pub records_read: u64,
}

impl PartitionTail {
    /// Takes in one record of the partition.
    pub fn observe(&mut self, own_key: Option<EventKey>, layout: Option<Layout>) {
        self.records_read += 1;
        if let Some(key) = own_key {
            if self.own.is_none_or(|(k, _)| key > k) {
                self.own = Some((key, layout));
            }
        }
    }
}

/// Why a topic is not fenced in this session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfenced {
    /// `relay.fence = false`.
    Disabled,
    /// A partition's last own record was routed with another layout.
    LayoutChanged {
        partition: u32,
        was: Layout,
        now: Layout,
    },
    /// A partition's last own record has no layout header (written by a
    /// walrelay without the fence).
    LayoutUnknown { partition: u32 },
}

impl fmt::Display for Unfenced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unfenced::Disabled => f.write_str("relay.fence is off"),
            Unfenced::LayoutChanged { partition, was, now } if was.partitions != now.partitions => write!(
                f,
                "the topic had {} partitions when partition {partition}'s last record was written and has {} now",
                was.partitions, now.partitions
            ),
            Unfenced::LayoutChanged { partition, was, now } => write!(
                f,
                "partition {partition}'s last record was routed by another routing configuration (fingerprint {:016x}, now {:016x})",
                was.routing, now.routing
            ),
            Unfenced::LayoutUnknown { partition } => write!(
                f,
                "partition {partition}'s last record carries no layout header (written by a walrelay without the tail fence)"
            ),
        }
    }
}

/// The fence of one topic for one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicFence {
    /// Per partition, the highest key of ours already in it.
    Fenced(Vec<Option<EventKey>>),
    /// Replays are produced again.
    Unfenced(Unfenced),
}

impl TopicFence {
    /// Decides the fence of a topic from its partitions' tails (one entry
    /// per partition, in partition order), for records routed with `now`.
    #[must_use]
    pub fn decide(tails: &[PartitionTail], now: Layout) -> TopicFence {
        for (partition, tail) in (0u32..).zip(tails) {
            match tail.own {
                Some((_, Some(was))) if was != now => {
                    return TopicFence::Unfenced(Unfenced::LayoutChanged {
                        partition,
                        was,
                        now,
                    })
                }
                Some((_, None)) => {
                    return TopicFence::Unfenced(Unfenced::LayoutUnknown { partition })
                }
                _ => {}
            }
        }
        TopicFence::Fenced(tails.iter().map(|t| t.own.map(|(k, _)| k)).collect())
    }

    /// The highest key of ours already in `partition`, if fenced.
    #[must_use]
    pub fn key(&self, partition: u32) -> Option<EventKey> {
        match self {
            TopicFence::Fenced(keys) => keys.get(partition as usize).copied().flatten(),
            TopicFence::Unfenced(_) => None,
        }
    }

    /// Whether a record with `key` for `partition` is already in Kafka.
    #[must_use]
    pub fn covers(&self, partition: u32, key: EventKey) -> bool {
        self.key(partition).is_some_and(|f| key <= f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{MessageRoute, OutboxColumns, OutboxConfig};

    const NOW: Layout = Layout {
        partitions: 4,
        routing: 0x0123_4567_89ab_cdef,
    };

    fn tail(own: Option<(u128, Option<Layout>)>) -> PartitionTail {
        PartitionTail {
            own: own.map(|(k, l)| (EventKey(k), l)),
            records_read: 1,
        }
    }

    #[test]
    fn the_header_round_trips_and_refuses_what_walrelay_does_not_write() {
        assert_eq!(NOW.to_string(), "4/0123456789abcdef");
        assert_eq!(Layout::parse(&NOW.header_value()), Some(NOW));
        for bad in [
            &b""[..],
            b"4",
            b"4/",
            b"/0123456789abcdef",
            b"+4/0123456789abcdef",
            b"-4/0123456789abcdef",
            b"4/0123456789abcde",
            b"4/0123456789abcdefa",
            b"4/0123456789abcdeg",
            b"x/0123456789abcdef",
            b"\xff/0123456789abcdef",
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
    fn a_partition_is_fenced_at_its_highest_own_key() {
        let mut t = PartitionTail::default();
        t.observe(Some(EventKey(5)), Some(NOW));
        t.observe(None, None); // another source's record
        t.observe(Some(EventKey(9)), Some(NOW));
        t.observe(Some(EventKey(7)), Some(NOW));
        assert_eq!(t.records_read, 4);
        assert_eq!(t.own, Some((EventKey(9), Some(NOW))));

        let fence = TopicFence::decide(&[t, tail(None)], NOW);
        assert_eq!(fence.key(0), Some(EventKey(9)));
        assert!(fence.covers(0, EventKey(9)));
        assert!(fence.covers(0, EventKey(1)));
        assert!(!fence.covers(0, EventKey(10)));
        // Empty, or only other sources: nothing to skip.
        assert_eq!(fence.key(1), None);
        assert!(!fence.covers(1, EventKey(0)));
        // A partition the tail read did not cover is not fenced either.
        assert!(!fence.covers(7, EventKey(0)));
    }

    #[test]
    fn a_topic_whose_partition_count_changed_is_not_fenced_at_all() {
        let was = Layout {
            partitions: 3,
            ..NOW
        };
        let tails = [tail(Some((100, Some(NOW)))), tail(Some((90, Some(was))))];
        let fence = TopicFence::decide(&tails, NOW);
        assert_eq!(
            fence,
            TopicFence::Unfenced(Unfenced::LayoutChanged {
                partition: 1,
                was,
                now: NOW
            })
        );
        // Not even the partition whose own tail matches: the event the
        // old layout sent elsewhere may map to it now.
        assert!(!fence.covers(0, EventKey(1)));
        let TopicFence::Unfenced(why) = fence else {
            unreachable!()
        };
        let text = why.to_string();
        assert!(
            text.contains("3 partitions") && text.contains("has 4"),
            "{text}"
        );
    }

    #[test]
    fn a_changed_routing_configuration_or_an_old_record_unfences_the_topic() {
        let other_routes = Layout { routing: 1, ..NOW };
        assert!(matches!(
            TopicFence::decide(&[tail(Some((1, Some(other_routes))))], NOW),
            TopicFence::Unfenced(Unfenced::LayoutChanged { partition: 0, .. })
        ));
        assert_eq!(
            TopicFence::decide(&[tail(None), tail(Some((1, None)))], NOW),
            TopicFence::Unfenced(Unfenced::LayoutUnknown { partition: 1 })
        );
    }

    #[test]
    fn the_fingerprint_follows_routing_settings_only() {
        let base = Config::default();
        let fp = routing_fingerprint(&base);
        assert_eq!(fp, routing_fingerprint(&base.clone()), "stable");

        let mut other = base.clone();
        other.relay.max_in_flight_events += 1;
        other.kafka.bootstrap_servers = "elsewhere:9092".into();
        assert_eq!(fp, routing_fingerprint(&other), "not a routing setting");

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
        let mut seen = vec![fp];
        for c in &changed {
            let f = routing_fingerprint(c);
            assert!(!seen.contains(&f), "{c:?}");
            seen.push(f);
        }
    }
}
