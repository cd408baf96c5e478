//! Which rule places a topic's keyless records in a session (pure).
//!
//! A replayed record must land where its first copy went (a consumer's
//! high-water mark is per partition), and a keyless record's partition
//! depends on the rule that placed it ([`KeylessPlacement`]), which the
//! configuration may have changed since. So a session does not simply
//! obey `relay.keyless_placement`:
//!
//! - The records a session replays are the events at or after the slot's
//!   confirmed position `start` (every replayed key's high half is at
//!   least `start`); everything below was confirmed and never comes back.
//! - So when no record of this source at the end of any partition has a
//!   key at or after `start`, nothing in Kafka is replayed, and the session
//!   places by the configured rule from its first record.
//! - Otherwise the replay includes records already in Kafka, placed by the
//!   rule of the session that wrote them, which the tails name
//!   (`walrelay-layout`; a record without a layout this walrelay reads was
//!   written by an older release, which placed by commit). The session
//!   keeps that rule for the topic, and switches at a later session, once
//!   the slot has confirmed past what was written under it.
//!
//! Every record of a topic at or after `start` was therefore placed by one
//! rule: a session switches only when the tails hold nothing at or after
//! its `start`, and `start` never moves back.

use super::decide::PartitionTail;
use crate::config::KeylessPlacement;
use walrelay_pgoutput::Lsn;

/// The rule for a topic's keyless records in this session, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeylessChoice {
    /// The rule the session places by.
    pub rule: KeylessPlacement,
    /// `Some` when it is not the configured one, or the configured one
    /// replaces another.
    pub change: Option<Change>,
}

/// A difference between the configured rule and what the topic holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The configured rule replaces `from`, which placed the topic's
    /// earlier records; none of those is replayed.
    Adopted { from: KeylessPlacement },
    /// The configured rule waits: records placed by the session's rule are
    /// replayed (the newest at `newest_replayed`).
    Deferred {
        configured: KeylessPlacement,
        newest_replayed: Lsn,
    },
}

/// The rule a record of the tails was placed by: its layout's, or
/// [`KeylessPlacement::Commit`] for a record written by a release before
/// the layout named one.
fn placed_by(tail: &PartitionTail) -> Option<(u64, KeylessPlacement)> {
    tail.top().map(|top| {
        let rule = top.layout.map_or(KeylessPlacement::Commit, |l| l.keyless);
        (top.key.high(), rule)
    })
}

/// The rule for a topic whose partitions' tails are `tails`, in a session
/// replaying from `start`, configured with `configured`.
#[must_use]
pub fn choose(tails: &[PartitionTail], configured: KeylessPlacement, start: Lsn) -> KeylessChoice {
    let placed: Vec<(u64, KeylessPlacement)> = tails.iter().filter_map(placed_by).collect();
    // The newest record at or after the replay's start, if any: its rule
    // is the rule of everything replayed.
    let replayed = placed
        .iter()
        .filter(|(high, _)| *high >= start.0)
        .max_by_key(|(high, _)| *high);
    match replayed {
        Some(&(high, rule)) if rule != configured => KeylessChoice {
            rule,
            change: Some(Change::Deferred {
                configured,
                newest_replayed: Lsn(high),
            }),
        },
        Some(_) => KeylessChoice {
            rule: configured,
            change: None,
        },
        None => {
            let newest = placed.iter().max_by_key(|(high, _)| *high);
            KeylessChoice {
                rule: configured,
                change: newest
                    .filter(|(_, rule)| *rule != configured)
                    .map(|&(_, from)| Change::Adopted { from }),
            }
        }
    }
}

/// How a session places a topic's keyless records, and where its replay
/// starts: what the fence checks a tail record against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placing {
    /// The session's rule for the topic ([`choose`]).
    pub rule: KeylessPlacement,
    /// The slot's confirmed position: the replay's start.
    pub start: Lsn,
}

impl Placing {
    /// Whether a tail record placed by `rule_then`, with `high` as its
    /// key's high half, is replayed and placed elsewhere this session:
    /// then it proves nothing for the fence. (By [`choose`], never: a
    /// check, not a trust.)
    #[must_use]
    pub fn replays_elsewhere(&self, high: u64, rule_then: KeylessPlacement) -> bool {
        rule_then != self.rule && high >= self.start.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fence::decide::OwnRecord;
    use crate::engine::fence::{Layout, TopicLayout};
    use crate::engine::key::EventKey;
    use KeylessPlacement::{Commit, WalRange};

    /// A partition whose last own record has key high `high`, placed by
    /// `rule` (`None`: no layout header this walrelay reads).
    fn tail(high: u64, rule: Option<KeylessPlacement>) -> PartitionTail {
        let mut t = PartitionTail::default();
        t.observe(Some(OwnRecord {
            offset: 7,
            key: EventKey::new(high, high),
            prev: None,
            layout: rule.map(|keyless| Layout {
                partition: 0,
                topic: TopicLayout {
                    partitions: 2,
                    routing: 1,
                },
                keyless,
            }),
        }));
        t
    }

    #[test]
    fn a_new_topic_or_one_placed_alike_takes_the_configured_rule() {
        for configured in [WalRange, Commit] {
            let empty = [PartitionTail::default(), PartitionTail::default()];
            let none = KeylessChoice {
                rule: configured,
                change: None,
            };
            assert_eq!(choose(&empty, configured, Lsn(100)), none);
            let alike = [tail(150, Some(configured)), tail(90, Some(configured))];
            assert_eq!(choose(&alike, configured, Lsn(100)), none);
        }
    }

    #[test]
    fn another_rule_is_replaced_when_nothing_placed_by_it_is_replayed() {
        let confirmed = [tail(99, Some(Commit)), PartitionTail::default()];
        assert_eq!(
            choose(&confirmed, WalRange, Lsn(100)),
            KeylessChoice {
                rule: WalRange,
                change: Some(Change::Adopted { from: Commit }),
            }
        );
        // Written by a release before the layout named the rule: by commit.
        let older = [tail(99, None)];
        assert_eq!(
            choose(&older, WalRange, Lsn(100)).change,
            Some(Change::Adopted { from: Commit })
        );
        assert_eq!(choose(&older, Commit, Lsn(100)).change, None);
    }

    #[test]
    fn a_replay_of_records_placed_by_another_rule_keeps_it() {
        // The crashed session's last record is at the replay's start.
        let replayed = [tail(100, Some(Commit)), tail(40, Some(Commit))];
        assert_eq!(
            choose(&replayed, WalRange, Lsn(100)),
            KeylessChoice {
                rule: Commit,
                change: Some(Change::Deferred {
                    configured: WalRange,
                    newest_replayed: Lsn(100),
                }),
            }
        );
        // The other way round, after a switch back to commit.
        let ranges = [tail(300, Some(WalRange)), tail(40, Some(Commit))];
        assert_eq!(choose(&ranges, Commit, Lsn(200)).rule, WalRange);
        // The newest replayed record decides: older partitions' records
        // below the start do not.
        assert_eq!(choose(&ranges, WalRange, Lsn(200)).change, None);
        let older = [tail(150, None)];
        assert_eq!(choose(&older, WalRange, Lsn(100)).rule, Commit);
    }

    #[test]
    fn only_a_record_that_is_replayed_under_another_rule_proves_nothing() {
        let placing = Placing {
            rule: WalRange,
            start: Lsn(100),
        };
        assert!(placing.replays_elsewhere(100, Commit));
        assert!(!placing.replays_elsewhere(99, Commit));
        assert!(!placing.replays_elsewhere(500, WalRange));
    }
}
