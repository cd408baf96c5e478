//! The tail fence's wait until what each leader holds is readable.
//!
//! The fence reads a partition up to its high watermark. On a replicated
//! topic the leader appends a record before its followers copy it; the
//! high watermark passes it only once every in-sync replica has it. A
//! relay session that ended (a `kill -9`, a timeout) may have left
//! records appended but not yet below the high watermark: invisible to the
//! next session's fence, which would write them again, and duplicates once
//! the followers catch up (or, while the partition is under
//! `min.insync.replicas`, once it is back in sync). So the fence first
//! asks the leader for its log end offset ([`log_end`]) and waits until
//! the high watermark reaches it: then everything appended before the
//! session began is either readable or gone with a truncation.
//!
//! Where walrelay cannot connect as the producer does (see
//! [`crate::kafka::conn::settings`]) the fence does not wait, and a replay
//! after a crash may write the unreplicated tail again (duplicates, never
//! a loss).
//!
//! The wait itself is a pure function of two look-ups ([`await_readable`],
//! tested below); [`await_topic_readable`] gives it the leaders from a
//! consumer's metadata and asks them over walrelay's own connections.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

use super::log_end::{self, PartitionOffsets};
use crate::kafka::conn::{Connection, Settings};

/// Kafka error codes a partition answers with while its leadership
/// moves: ask again (the leaders are looked up again).
const LEADERSHIP_MOVING: [i16; 5] = [
    5,  // LEADER_NOT_AVAILABLE
    6,  // NOT_LEADER_OR_FOLLOWER
    74, // FENCED_LEADER_EPOCH
    75, // UNKNOWN_LEADER_EPOCH
    78, // OFFSET_NOT_AVAILABLE
];

/// How often the high watermarks are read while waiting.
const POLL: Duration = Duration::from_millis(50);

/// A partition whose leader's records were not all readable at the
/// deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behind {
    pub partition: i32,
    pub lag: Lag,
}

/// Why a partition was behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lag {
    /// No leader was found for it (a leaderless partition, or the
    /// metadata could not be read: the last error, if any).
    NoLeader { last_error: Option<String> },
    /// The broker the metadata names as the leader did not answer (killed,
    /// and not yet noticed by the controller, or unreachable from here).
    Unreachable { leader: String, error: String },
    /// The in-sync replicas have not all copied what the leader holds.
    NotReplicated { high_watermark: i64, log_end: i64 },
}

/// The partitions in `behind`, what each lacks, and what to do: the
/// middle of the tail fence's error when it gave up waiting
/// (`fence::FenceError::Behind`).
#[must_use]
pub fn describe(behind: &[Behind]) -> String {
    let parts: Vec<String> = behind
        .iter()
        .map(|b| match &b.lag {
            Lag::NoLeader { last_error } => format!(
                "partition {} has no leader{}",
                b.partition,
                last_error
                    .as_ref()
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default()
            ),
            Lag::Unreachable { leader, error } => format!(
                "partition {}'s leader {leader} does not answer ({error})",
                b.partition
            ),
            Lag::NotReplicated {
                high_watermark,
                log_end,
            } => format!(
                "partition {} is at high watermark {high_watermark} below its log end {log_end}",
                b.partition
            ),
        })
        .collect();
    let mut advice = Vec::new();
    if behind
        .iter()
        .any(|b| matches!(b.lag, Lag::NotReplicated { .. }))
    {
        advice.push(
            "the in-sync replicas have not all copied what the leader holds: the partition may be \
             under min.insync.replicas (kafka-topics --describe --under-min-isr-partitions lists \
             them) or a follower is slow",
        );
    }
    if behind
        .iter()
        .any(|b| matches!(b.lag, Lag::NoLeader { .. } | Lag::Unreachable { .. }))
    {
        advice.push(
            "a partition without a leader cannot be read or written: its brokers are down or \
             unreachable (kafka-topics --describe --unavailable-partitions lists them)",
        );
    }
    format!("{}; {}", parts.join(", "), advice.join("; "))
}

/// Waits until the high watermark of every partition in `partitions`
/// reached the log end its current leader reported when first asked, or
/// `deadline`. `leaders` looks up each partition's leader (`host:port`;
/// a partition without one is left out), `offsets` asks a leader
/// ([`log_end::ask`]). Returns the partitions still behind at the deadline, each
/// with why.
///
/// A leader that does not answer at all is a leadership on the move, as
/// a moving-leadership error code is: the metadata names a broker that
/// was just killed until the controller notices, and the partition's new
/// leader may then hold records its high watermark has not passed yet
/// (the next session would write them again: duplicates; a chaos run on
/// three brokers found two). So the leader is looked up and asked again
/// until the deadline. When the leader changes, the log end to reach is
/// the new leader's: what only the old one held is truncated away when it
/// rejoins. Only a leader that refuses the request (any other error code,
/// e.g. an old broker without the debugging replica id) is not waited
/// for: it costs duplicates at worst, as without the wait.
pub fn await_readable(
    partitions: &[i32],
    deadline: Instant,
    mut leaders: impl FnMut() -> Result<Vec<(i32, String)>, String>,
    mut offsets: impl FnMut(&str, &[i32]) -> Result<Vec<PartitionOffsets>, String>,
) -> Result<(), Vec<Behind>> {
    // Per partition, the log end to reach and the leader that reported
    // it; `None` while not yet known.
    let mut targets: BTreeMap<i32, Option<(String, i64)>> =
        partitions.iter().map(|&p| (p, None)).collect();
    let mut last_high: BTreeMap<i32, i64> = BTreeMap::new();
    let mut leader_of: BTreeMap<i32, String> = BTreeMap::new();
    let mut last_error: Option<String> = None;
    // Per partition, the leader that did not answer, and how.
    let mut unanswered: BTreeMap<i32, (String, String)> = BTreeMap::new();
    loop {
        if targets.keys().any(|p| !leader_of.contains_key(p)) {
            match leaders() {
                Ok(found) => leader_of = found.into_iter().collect(),
                Err(e) => {
                    tracing::debug!("looking up the partitions' leaders: {e}");
                    last_error = Some(e);
                }
            }
        }
        let mut by_leader: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for p in targets.keys() {
            if let Some(leader) = leader_of.get(p) {
                by_leader.entry(leader.clone()).or_default().push(*p);
            }
        }
        for (leader, ps) in by_leader {
            match offsets(&leader, &ps) {
                Ok(answers) => {
                    for (p, answer) in answers {
                        let Some(target) = targets.get_mut(&p) else {
                            continue;
                        };
                        match answer {
                            Ok(o) => {
                                unanswered.remove(&p);
                                // A new leader's log end replaces the old one's.
                                let end = match target {
                                    Some((from, end)) if *from == leader => *end,
                                    _ => {
                                        *target = Some((leader.clone(), o.log_end));
                                        o.log_end
                                    }
                                };
                                if o.high_watermark >= end {
                                    targets.remove(&p);
                                } else {
                                    last_high.insert(p, o.high_watermark);
                                }
                            }
                            Err(code) if LEADERSHIP_MOVING.contains(&code) => {
                                leader_of.remove(&p);
                            }
                            Err(code) => {
                                tracing::debug!(
                                    partition = p,
                                    code,
                                    "no log end from the leader: not waiting for it"
                                );
                                targets.remove(&p);
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(%leader, "no answer from the leader ({e}): looking the leaders up again");
                    for p in ps {
                        leader_of.remove(&p);
                        unanswered.insert(p, (leader.clone(), e.clone()));
                    }
                }
            }
        }
        if targets.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(targets
                .into_iter()
                .map(|(partition, end)| Behind {
                    partition,
                    lag: match (
                        end,
                        last_high.get(&partition),
                        unanswered.remove(&partition),
                    ) {
                        (_, _, Some((leader, error))) => Lag::Unreachable { leader, error },
                        (Some((_, log_end)), Some(&high_watermark), None) => Lag::NotReplicated {
                            high_watermark,
                            log_end,
                        },
                        _ => Lag::NoLeader {
                            last_error: last_error.clone(),
                        },
                    },
                })
                .collect());
        }
        std::thread::sleep(POLL);
    }
}

/// [`await_readable`] for the partitions `0..partitions` of `topic`: what
/// each leader held when asked is readable before the tail is read, so the
/// fence sees the records an ended session left unreplicated instead of
/// writing them again. The leaders come from `consumer`'s metadata and are
/// asked over walrelay's own connections, made as `settings` say; one per
/// leader, kept for the wait. Blocking.
pub fn await_topic_readable<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    settings: &Settings,
    topic: &str,
    partitions: u32,
    deadline: Instant,
) -> Result<(), Vec<Behind>> {
    let step = |deadline: Instant| {
        deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(10), Duration::from_secs(2))
    };
    let all: Vec<i32> = (0..partitions)
        .map(|p| i32::try_from(p).unwrap_or(i32::MAX))
        .collect();
    let mut connections: HashMap<String, Connection> = HashMap::new();
    await_readable(
        &all,
        deadline,
        || {
            let md = consumer
                .fetch_metadata(Some(topic), step(deadline))
                .map_err(|e| e.to_string())?;
            let address = |id: i32| {
                md.brokers()
                    .iter()
                    .find(|b| b.id() == id)
                    .map(|b| format!("{}:{}", b.host(), b.port()))
            };
            Ok(md
                .topics()
                .iter()
                .filter(|t| t.name() == topic)
                .flat_map(|t| t.partitions())
                .filter_map(|p| address(p.leader()).map(|a| (p.id(), a)))
                .collect())
        },
        |leader, ps| {
            let connection = match connections.entry(leader.to_owned()) {
                std::collections::hash_map::Entry::Occupied(c) => c.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => v.insert(
                    Connection::open(leader, settings, step(deadline))
                        .map_err(|e| e.to_string())?,
                ),
            };
            let answer = log_end::ask(connection, topic, ps).map_err(|e| e.to_string());
            if answer.is_err() {
                connections.remove(leader);
            }
            answer
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::requests::log_end::Offsets;

    use std::cell::Cell;

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(400)
    }

    fn at(high_watermark: i64, log_end: i64) -> Result<Offsets, i16> {
        Ok(Offsets {
            log_end,
            high_watermark,
        })
    }

    #[test]
    fn waits_until_the_high_watermark_reaches_the_first_log_end() {
        let high = Cell::new(5);
        let got = await_readable(
            &[0],
            soon(),
            || Ok(vec![(0, "a:1".to_owned())]),
            |_, ps| {
                high.set(high.get() + 1);
                // The log end moves on; only the first one is waited for.
                Ok(ps
                    .iter()
                    .map(|&p| (p, at(high.get(), high.get() + 5)))
                    .collect())
            },
        );
        assert_eq!(got, Ok(()));
        assert_eq!(high.get(), 11, "read until it reached the first log end");
    }

    #[test]
    fn a_moving_leadership_is_asked_again_and_a_refusal_is_not_waited_for() {
        let asked = Cell::new(0);
        let looked_up = Cell::new(0);
        let got = await_readable(
            &[0, 1],
            soon(),
            || {
                looked_up.set(looked_up.get() + 1);
                Ok(vec![(0, "a:1".to_owned()), (1, "b:1".to_owned())])
            },
            |leader, _| {
                asked.set(asked.get() + 1);
                Ok(match (leader, asked.get()) {
                    ("a:1", n) if n <= 2 => vec![(0, Err(6))],
                    ("a:1", _) => vec![(0, at(3, 3))],
                    _ => vec![(1, Err(35))],
                })
            },
        );
        assert_eq!(got, Ok(()));
        assert!(asked.get() >= 3, "asked partition 0's leader again");
        assert!(looked_up.get() >= 2, "looked the leader up again");
    }

    #[test]
    fn a_partition_still_behind_or_without_a_leader_is_reported_with_why() {
        let got = await_readable(
            &[1, 2],
            Instant::now() + Duration::from_millis(120),
            // Partition 1 has no leader.
            || Ok(vec![(2, "a:1".to_owned())]),
            |_, _| Ok(vec![(2, at(7, 10))]),
        );
        let behind = got.unwrap_err();
        assert_eq!(
            behind,
            vec![
                Behind {
                    partition: 1,
                    lag: Lag::NoLeader { last_error: None }
                },
                Behind {
                    partition: 2,
                    lag: Lag::NotReplicated {
                        high_watermark: 7,
                        log_end: 10
                    }
                }
            ]
        );
        let text = describe(&behind);
        assert!(text.starts_with("partition 1 has no leader, partition 2 is at high watermark 7 below its log end 10; the in-sync replicas"), "{text}");
        assert!(text.contains("--unavailable-partitions"), "{text}");
        // The metadata cannot be read: no leader, and the error says why.
        let behind = await_readable(
            &[0],
            Instant::now() + Duration::from_millis(120),
            || Err("Broker: transport failure".to_owned()),
            |_, _| unreachable!("no leader to ask"),
        )
        .unwrap_err();
        let text = describe(&behind);
        assert!(
            text.contains("partition 0 has no leader (last error: Broker: transport failure)"),
            "{text}"
        );
        assert!(!text.contains("in-sync"), "{text}");
        // A leader that never answers: waited for, and named.
        let behind = await_readable(
            &[2],
            Instant::now() + Duration::from_millis(120),
            || Ok(vec![(2, "a:1".to_owned())]),
            |_, _| Err("connection refused".to_owned()),
        )
        .unwrap_err();
        assert_eq!(
            behind,
            vec![Behind {
                partition: 2,
                lag: Lag::Unreachable {
                    leader: "a:1".to_owned(),
                    error: "connection refused".to_owned()
                }
            }]
        );
        let text = describe(&behind);
        assert!(
            text.starts_with("partition 2's leader a:1 does not answer (connection refused); a partition without a leader"),
            "{text}"
        );
    }

    /// The chaos run's case: the relay restarts right after a partition's
    /// leader was killed. The metadata still names the dead broker; then
    /// the new leader holds records above its high watermark, which must
    /// be readable before the tail is read.
    #[test]
    fn a_dead_leader_is_looked_up_again_and_the_new_leaders_log_end_is_waited_for() {
        let lookups = Cell::new(0);
        let new_leader_asked = Cell::new(0);
        let got = await_readable(
            &[0],
            soon(),
            || {
                lookups.set(lookups.get() + 1);
                let leader = if lookups.get() <= 2 {
                    "dead:1"
                } else {
                    "new:2"
                };
                Ok(vec![(0, leader.to_owned())])
            },
            |leader, ps| {
                assert_eq!(ps, [0]);
                if leader == "dead:1" {
                    return Err("Connection refused (os error 111)".to_owned());
                }
                new_leader_asked.set(new_leader_asked.get() + 1);
                // The new leader's high watermark catches up with its log
                // end (12) on the third ask.
                Ok(vec![(0, at(9 + new_leader_asked.get(), 12))])
            },
        );
        assert_eq!(got, Ok(()));
        assert_eq!(
            lookups.get(),
            3,
            "looked the leader up until the metadata moved"
        );
        assert_eq!(
            new_leader_asked.get(),
            3,
            "waited for the new leader's log end"
        );
    }

    #[test]
    fn a_new_leader_sets_the_log_end_to_reach() {
        // The old leader reported log end 10 (two records it alone held)
        // and then lost its leadership; the new leader's log ends at 8, and
        // its high watermark is there: nothing more will become readable,
        // and waiting for 10 would last until the deadline.
        let asked = Cell::new(0);
        let got = await_readable(
            &[0],
            Instant::now() + Duration::from_secs(30),
            || {
                let leader = if asked.get() < 2 { "old:1" } else { "new:2" };
                Ok(vec![(0, leader.to_owned())])
            },
            |leader, _| {
                asked.set(asked.get() + 1);
                Ok(match (leader, asked.get()) {
                    ("old:1", 1) => vec![(0, at(8, 10))],
                    ("old:1", _) => vec![(0, Err(6))],
                    _ => vec![(0, at(8, 8))],
                })
            },
        );
        assert_eq!(got, Ok(()));
        assert_eq!(asked.get(), 3);
    }
}
