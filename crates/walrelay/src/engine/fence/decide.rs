//! Deciding a topic's fence from what its partitions' tails hold (pure).
//!
//! A tail record of this source becomes a partition's fence key only when
//! it provably belongs to that partition's sequence: its layout names the
//! partition, and its `walrelay-prev-key` names a record of this source
//! before it in the same partition (or is empty, with none before it).
//! Anything else leaves the partition unfenced ([`Untrusted`]): a replay
//! then writes duplicates to it, never skips an event.

use std::fmt;

use super::keyless::Placing;
use super::{Layout, TopicLayout};
use crate::config::KeylessPlacement;
use crate::engine::key::EventKey;

/// A record of this relay's source read from a partition's tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnRecord {
    /// Its offset in the partition.
    pub offset: i64,
    /// Its `idempotency-key`.
    pub key: EventKey,
    /// Its `walrelay-prev-key`: the key of the record of this source
    /// before it in the partition, `None` when empty or absent.
    pub prev: Option<EventKey>,
    /// Its `walrelay-layout`, `None` when absent or written by an older
    /// walrelay.
    pub layout: Option<Layout>,
}

/// What the tail read found in one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionTail {
    /// The records of this source read, in the order read.
    own: Vec<OwnRecord>,
    /// Records read from this partition (own and others').
    pub records_read: u64,
}

impl PartitionTail {
    /// Takes in one record of the partition (`own`: `Some` when it is one
    /// of this source's).
    pub fn observe(&mut self, own: Option<OwnRecord>) {
        self.records_read += 1;
        if let Some(r) = own {
            self.own.push(r);
        }
    }

    /// The record of this source with the highest key: the fence key's
    /// candidate.
    #[must_use]
    pub fn top(&self) -> Option<&OwnRecord> {
        self.own.iter().max_by_key(|r| r.key)
    }

    /// The key of the last record of this source in the partition (by
    /// offset): the `walrelay-prev-key` of this session's first record to
    /// it, so that the chain goes on.
    #[must_use]
    pub fn last(&self) -> Option<EventKey> {
        self.own.iter().max_by_key(|r| r.offset).map(|r| r.key)
    }

    /// Whether the top record's predecessor is among the records read.
    fn predecessor_read(&self, top: &OwnRecord) -> bool {
        let before = |r: &&OwnRecord| r.offset < top.offset;
        match top.prev {
            Some(prev) => self.own.iter().filter(before).any(|r| r.key == prev),
            None => !self.own.iter().any(|r| before(&r)),
        }
    }

    /// Whether reading further back could change the decision: nothing of
    /// this source was read, or the top record's predecessor was not.
    #[must_use]
    pub fn wants_more(&self) -> bool {
        match self.top() {
            None => self.records_read > 0,
            Some(top) => !self.predecessor_read(top),
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
        was: TopicLayout,
        now: TopicLayout,
    },
    /// A partition's last own record has no layout header this walrelay
    /// reads (written by an older walrelay).
    LayoutUnknown { partition: u32 },
    /// A partition's last own record is replayed in this session but was
    /// placed by another keyless rule than the session's.
    PlacementChanged {
        partition: u32,
        was: KeylessPlacement,
        now: KeylessPlacement,
    },
    /// A record the fence reads may not have been acknowledged
    /// ([`super::durability`]).
    NotProvenAcked(super::durability::NotProvenAcked),
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
                "partition {partition}'s last record was routed by another routing configuration, or copied from another topic (fingerprint {:016x}, now {:016x})",
                was.routing, now.routing
            ),
            Unfenced::LayoutUnknown { partition } => write!(
                f,
                "partition {partition}'s last record carries no layout header this walrelay reads (written by an older walrelay)"
            ),
            Unfenced::PlacementChanged { partition, was, now } => write!(
                f,
                "partition {partition}'s last record is replayed in this session and was placed by relay.keyless_placement = \"{}\", the session places by \"{}\"",
                was.as_str(),
                now.as_str()
            ),
            Unfenced::NotProvenAcked(why) => why.fmt(f),
        }
    }
}

/// Why one partition's tail record of this source is not trusted as its
/// fence key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Untrusted {
    /// Its layout names another partition: a copy of a record routed
    /// elsewhere.
    Foreign { key: EventKey, routed_to: u32 },
    /// Its `walrelay-prev-key` names no record of this source before it in
    /// the partition (within the records read): a copy from another
    /// partition, or a sequence broken by a relay that wrote without the
    /// fence.
    ChainBroken {
        key: EventKey,
        prev: Option<EventKey>,
    },
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Untrusted::Foreign { key, routed_to } => write!(
                f,
                "its record with key {key} was routed to partition {routed_to}: a copy, not written here by walrelay"
            ),
            Untrusted::ChainBroken { key, prev: Some(prev) } => write!(
                f,
                "its record with key {key} follows key {prev}, which is not in the partition before it: a copy from elsewhere, or the chain is older than the records read"
            ),
            Untrusted::ChainBroken { key, prev: None } => write!(
                f,
                "its record with key {key} names no predecessor, yet records of this source come before it: a copy, or written by a relay with the fence off"
            ),
        }
    }
}

/// The fence of one topic for one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicFence {
    /// Per partition, the highest key of ours already in it (`None`: none,
    /// or not trusted).
    Fenced(Vec<Option<EventKey>>),
    /// Replays are produced again.
    Unfenced(Unfenced),
}

/// A topic's fence, and the partitions left out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub fence: TopicFence,
    /// Partitions whose tail record of this source is not trusted (each
    /// unfenced in this session).
    pub untrusted: Vec<(u32, Untrusted)>,
}

impl TopicFence {
    /// Decides the fence of a topic from its partitions' tails (one entry
    /// per partition, in partition order), for records routed with `now`
    /// and, without a key, placed as `placing` says.
    #[must_use]
    pub fn decide(tails: &[PartitionTail], now: TopicLayout, placing: Placing) -> Decision {
        let mut keys = Vec::with_capacity(tails.len());
        let mut untrusted = Vec::new();
        for (partition, tail) in (0u32..).zip(tails) {
            let Some(top) = tail.top() else {
                keys.push(None);
                continue;
            };
            let Some(layout) = top.layout else {
                return Decision::unfenced(Unfenced::LayoutUnknown { partition });
            };
            if layout.topic != now {
                return Decision::unfenced(Unfenced::LayoutChanged {
                    partition,
                    was: layout.topic,
                    now,
                });
            }
            if placing.replays_elsewhere(top.key.high(), layout.keyless) {
                return Decision::unfenced(Unfenced::PlacementChanged {
                    partition,
                    was: layout.keyless,
                    now: placing.rule,
                });
            }
            let verdict = if layout.partition != partition {
                Err(Untrusted::Foreign {
                    key: top.key,
                    routed_to: layout.partition,
                })
            } else if !tail.predecessor_read(top) {
                Err(Untrusted::ChainBroken {
                    key: top.key,
                    prev: top.prev,
                })
            } else {
                Ok(top.key)
            };
            match verdict {
                Ok(key) => keys.push(Some(key)),
                Err(why) => {
                    keys.push(None);
                    untrusted.push((partition, why));
                }
            }
        }
        Decision {
            fence: TopicFence::Fenced(keys),
            untrusted,
        }
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

impl Decision {
    fn unfenced(why: Unfenced) -> Decision {
        Decision {
            fence: TopicFence::Unfenced(why),
            untrusted: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: TopicLayout = TopicLayout {
        partitions: 4,
        routing: 0x0123_4567_89ab_cdef,
    };

    /// By commit, every tail record replayed (the start at 0).
    const PLACING: Placing = Placing {
        rule: KeylessPlacement::Commit,
        start: walrelay_pgoutput::Lsn(0),
    };

    fn at(partition: u32) -> Option<Layout> {
        Some(Layout {
            partition,
            topic: NOW,
            keyless: KeylessPlacement::Commit,
        })
    }

    fn own(offset: i64, key: u128, prev: Option<u128>, layout: Option<Layout>) -> OwnRecord {
        OwnRecord {
            offset,
            key: EventKey(key),
            prev: prev.map(EventKey),
            layout,
        }
    }

    /// A tail of partition `p` holding `chain` (keys in offset order, each
    /// naming the one before).
    fn chain(p: u32, keys: &[u128]) -> PartitionTail {
        let mut t = PartitionTail::default();
        let mut prev = None;
        for (offset, &k) in (0i64..).zip(keys) {
            t.observe(Some(own(offset, k, prev, at(p))));
            prev = Some(k);
        }
        t
    }

    #[test]
    fn a_partition_is_fenced_at_its_highest_own_key() {
        let mut t = PartitionTail::default();
        t.observe(Some(own(10, 5, None, at(0))));
        t.observe(None); // another source's record
        t.observe(Some(own(12, 9, Some(5), at(0))));
        // A late copy of a lower key (a zombie's retry) changes nothing.
        t.observe(Some(own(13, 7, Some(5), at(0))));
        assert_eq!(t.records_read, 4);
        assert_eq!(t.top().map(|r| r.key), Some(EventKey(9)));
        assert_eq!(t.last(), Some(EventKey(7)));
        assert!(!t.wants_more());

        let d = TopicFence::decide(&[t, PartitionTail::default()], NOW, PLACING);
        assert!(d.untrusted.is_empty());
        let fence = d.fence;
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
    fn a_copy_routed_to_another_partition_is_not_a_fence_key() {
        // Partition 1 ends with a copy of a record routed to partition 3
        // (a re-drive, a forwarded record), with a higher key.
        let mut t = chain(1, &[10, 11]);
        t.observe(Some(own(2, 500, Some(499), at(3))));
        let d = TopicFence::decide(&[chain(0, &[1, 2]), t], NOW, PLACING);
        assert_eq!(d.fence.key(0), Some(EventKey(2)), "the other stays fenced");
        assert_eq!(d.fence.key(1), None);
        assert!(!d.fence.covers(1, EventKey(12)));
        assert_eq!(
            d.untrusted,
            vec![(
                1,
                Untrusted::Foreign {
                    key: EventKey(500),
                    routed_to: 3
                }
            )]
        );
        assert!(d.untrusted[0].1.to_string().contains("partition 3"));
    }

    #[test]
    fn a_copy_whose_predecessor_is_not_in_the_partition_is_not_a_fence_key() {
        // Same partition number (a copy from a mirror topic's partition 1,
        // or of partition 1 from before it was recreated), but its
        // predecessor is not here.
        let mut t = chain(1, &[10, 11]);
        t.observe(Some(own(2, 500, Some(499), at(1))));
        assert!(t.wants_more(), "the predecessor may lie further back");
        let d = TopicFence::decide(&[PartitionTail::default(), t], NOW, PLACING);
        assert_eq!(d.fence.key(1), None);
        assert!(matches!(
            d.untrusted[..],
            [(
                1,
                Untrusted::ChainBroken {
                    key: EventKey(500),
                    prev: Some(EventKey(499))
                }
            )]
        ));

        // An empty predecessor with records of ours before it: a copy of
        // some partition's first record.
        let mut t = chain(0, &[10, 11]);
        t.observe(Some(own(2, 500, None, at(0))));
        let d = TopicFence::decide(&[t], NOW, PLACING);
        assert!(matches!(
            d.untrusted[..],
            [(0, Untrusted::ChainBroken { prev: None, .. })]
        ));
    }

    #[test]
    fn a_chain_start_and_a_chain_through_other_sources_are_trusted() {
        let mut t = PartitionTail::default();
        t.observe(None);
        t.observe(Some(own(1, 20, None, at(0))));
        t.observe(None);
        t.observe(Some(own(3, 21, Some(20), at(0))));
        let d = TopicFence::decide(&[t], NOW, PLACING);
        assert_eq!(d.fence.key(0), Some(EventKey(21)));
        assert!(d.untrusted.is_empty());
    }

    #[test]
    fn only_a_missing_predecessor_or_nothing_of_ours_asks_for_more() {
        assert!(!PartitionTail::default().wants_more(), "empty");
        let mut others = PartitionTail::default();
        others.observe(None);
        assert!(others.wants_more());
        let mut t = PartitionTail::default();
        t.observe(Some(own(7, 21, Some(20), at(0))));
        assert!(t.wants_more());
        t.observe(Some(own(5, 20, Some(19), at(0))));
        assert!(!t.wants_more());
    }

    #[test]
    fn a_topic_whose_partition_count_changed_is_not_fenced_at_all() {
        let was = TopicLayout {
            partitions: 3,
            ..NOW
        };
        let mut old = PartitionTail::default();
        old.observe(Some(own(
            0,
            90,
            None,
            Some(Layout {
                partition: 1,
                topic: was,
                keyless: KeylessPlacement::Commit,
            }),
        )));
        let d = TopicFence::decide(&[chain(0, &[100]), old], NOW, PLACING);
        assert_eq!(
            d.fence,
            TopicFence::Unfenced(Unfenced::LayoutChanged {
                partition: 1,
                was,
                now: NOW
            })
        );
        // Not even the partition whose own tail matches: the event the
        // old layout sent elsewhere may map to it now.
        assert!(!d.fence.covers(0, EventKey(1)));
        let TopicFence::Unfenced(why) = d.fence else {
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
        let other_routes = Layout {
            partition: 0,
            topic: TopicLayout { routing: 1, ..NOW },
            keyless: KeylessPlacement::Commit,
        };
        let mut t = PartitionTail::default();
        t.observe(Some(own(0, 1, None, Some(other_routes))));
        assert!(matches!(
            TopicFence::decide(&[t], NOW, PLACING).fence,
            TopicFence::Unfenced(Unfenced::LayoutChanged { partition: 0, .. })
        ));
        let mut old = PartitionTail::default();
        old.observe(Some(own(0, 1, None, None)));
        assert_eq!(
            TopicFence::decide(&[PartitionTail::default(), old], NOW, PLACING).fence,
            TopicFence::Unfenced(Unfenced::LayoutUnknown { partition: 1 })
        );
    }

    #[test]
    fn a_record_replayed_under_another_keyless_rule_unfences_the_topic_one_confirmed_does_not() {
        let by_ranges = Layout {
            keyless: KeylessPlacement::WalRange,
            ..at(0).unwrap()
        };
        // Key high 5: at or after a start of 5 it is replayed.
        let tail = || {
            let mut t = PartitionTail::default();
            t.observe(Some(own(0, 5 << 64, None, Some(by_ranges))));
            t
        };
        let placing = |start| Placing {
            rule: KeylessPlacement::Commit,
            start: walrelay_pgoutput::Lsn(start),
        };
        assert_eq!(
            TopicFence::decide(&[tail()], NOW, placing(5)).fence,
            TopicFence::Unfenced(Unfenced::PlacementChanged {
                partition: 0,
                was: KeylessPlacement::WalRange,
                now: KeylessPlacement::Commit
            })
        );
        assert_eq!(
            TopicFence::decide(&[tail()], NOW, placing(6)).fence,
            TopicFence::Fenced(vec![Some(EventKey(5 << 64))])
        );
    }
}
