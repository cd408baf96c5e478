//! The replay must reproduce the fence (pure).
//!
//! Skipping a record at or below a fence key is sound only if the WAL
//! this session replays is the WAL the fence key's record came from. A
//! database restored from a base backup, recovered to an earlier point,
//! or failed over to a standby that had not received everything keeps its
//! system identifier, and so the default source id, while its WAL goes
//! back: new events then get keys at or below keys already in Kafka, and
//! the fence (and every high-water-mark consumer) would skip them. Two
//! checks catch it:
//!
//! - **A key ahead of the server.** Every key of this source in Kafka was
//!   assigned from WAL the server had written, so its LSN (the high 64
//!   bits: a commit record's start, or just below a non-transactional
//!   message's end) is below the server's WAL position at the start of
//!   this session. One that is not proves the WAL went back
//!   ([`FenceError::WalWentBack`]), whatever else the tail says.
//! - **A fence key the replay passes by.** The slot replays every
//!   transaction whose commit record starts at or after its confirmed
//!   position `start`, and the same WAL gives the same records. So every
//!   fence key at or above `start` must come back, with the same key, in
//!   the same topic and partition, before any larger key, commit or
//!   keepalive position; a replay that goes past one without it did not
//!   read the WAL it came from ([`FenceError::NotReproduced`]). Until every
//!   such key has come back, nothing is confirmed ([`ReplayCheck::holding`]):
//!   the records skipped meanwhile stay in the slot, so stopping loses
//!   none of them.
//!
//! Fence keys below `start` need no proof: no replayed record is at or
//! below them (every replayed key is at least `start << 64`), so they
//! skip nothing.
//!
//! The second check does not depend on the fence trusting a key: every
//! key of this source found at a partition's end at or after `start` is
//! an obligation, skipped or not. A fence key must come back in its own
//! partition ([`ReplayCheck::admit`]); a key the fence does not skip (an
//! unfenced topic: `relay.fence = false`, the durability rule, a changed
//! layout; or a partition whose last record it does not trust) must come
//! back somewhere ([`ReplayCheck::admit_anywhere`]): after partitions were
//! added or a route moved, the same event legitimately lands elsewhere.
//! One such key can be checked only while the replay has not passed it:
//! a topic first opened after the replay placed a larger key (its events
//! came late in the replay) cannot tell whether the key came back in
//! another topic, so such a key is not an obligation; fence keys, whose
//! record would have opened their own topic, still are.

use std::collections::BTreeMap;
use std::sync::Arc;

use walrelay_pgoutput::Lsn;

use super::FenceError;
use crate::engine::key::EventKey;
use crate::source::source_record::{EventIdentity, RecordedEvent};

/// The proof obligations of one session's fence (see the module docs).
#[derive(Debug)]
pub struct ReplayCheck {
    /// The slot's confirmed position: where the replay starts.
    start: Lsn,
    /// The server's WAL position when the session started.
    server_wal: Lsn,
    /// This session's source, for the errors' fix.
    source: Arc<str>,
    /// Keys at or above `start` not reproduced yet, with where they must
    /// come back.
    pending: BTreeMap<EventKey, Obligation>,
    /// The smallest key of `pending`, kept apart so that the check per
    /// record is one comparison.
    first: Option<EventKey>,
    /// The highest key placed in this session.
    last: Option<EventKey>,
}

/// Where a pending key must come back.
#[derive(Debug, Clone)]
struct Obligation {
    /// Where it was found.
    topic: Arc<str>,
    partition: u32,
    /// In that partition (a fence key), or anywhere.
    exact: bool,
    /// Set for the event the source record names: it must come back as
    /// that event, not only with its key ([`crate::source::source_record`]).
    identity: Option<EventIdentity>,
}

impl ReplayCheck {
    #[must_use]
    pub fn new(start: Lsn, server_wal: Lsn, source: &str) -> ReplayCheck {
        ReplayCheck {
            start,
            server_wal,
            source: Arc::from(source),
            pending: BTreeMap::new(),
            first: None,
            last: None,
        }
    }

    /// Whether confirmation must wait: a fence key is not reproduced yet.
    #[must_use]
    pub fn holding(&self) -> bool {
        self.first.is_some()
    }

    /// A key of this source found at the end of `partition` of `topic`
    /// (trusted as a fence key or not): refused when it is ahead of the
    /// server's WAL.
    pub fn check_not_ahead(
        &self,
        topic: &str,
        partition: u32,
        key: EventKey,
    ) -> Result<(), FenceError> {
        if key.high() >= self.server_wal.0 {
            return Err(FenceError::WalWentBack {
                topic: topic.to_owned(),
                partition,
                key,
                server_wal: self.server_wal,
                source_id: self.source.to_string(),
            });
        }
        Ok(())
    }

    /// `key` fences `partition` of `topic`, opened for a record with key
    /// `next` (not placed yet): it must be reproduced unless it lies
    /// before the replay's start.
    pub fn admit(
        &mut self,
        topic: &Arc<str>,
        partition: u32,
        key: EventKey,
    ) -> Result<(), FenceError> {
        self.check_not_ahead(topic, partition, key)?;
        if key.high() < self.start.0 {
            return Ok(());
        }
        // Its record would have been placed in this session already, in
        // this topic, which would have opened it.
        if self.last.is_some_and(|last| last >= key) {
            return Err(self.not_reproduced(topic, partition, key, Passed::Key(self.last)));
        }
        // The source record may name the same event: its identity stays
        // an obligation too.
        let identity = self.pending.get(&key).and_then(|o| o.identity);
        self.pending.insert(
            key,
            Obligation {
                topic: topic.clone(),
                partition,
                exact: true,
                identity,
            },
        );
        self.first = self.pending.keys().next().copied();
        Ok(())
    }

    /// The event the source record names lies at or after the replay's
    /// start ([`crate::source::source_record::Verdict::Reproduce`]): it must come
    /// back, with its key and identity, in any topic and partition.
    pub fn expect_recorded(&mut self, event: &RecordedEvent) {
        if event.key.high() < self.start.0 {
            return;
        }
        self.pending.insert(
            event.key,
            Obligation {
                topic: Arc::from(event.topic.as_str()),
                partition: event.partition,
                exact: false,
                identity: Some(event.identity),
            },
        );
        self.first = self.pending.keys().next().copied();
    }

    /// `key`, of this source, ends `partition` of `topic`, which the fence
    /// does not skip by (see the module docs): it must come back in the
    /// replay, in any topic and partition, unless it lies before the
    /// replay's start or the replay already went past it.
    pub fn admit_anywhere(
        &mut self,
        topic: &Arc<str>,
        partition: u32,
        key: EventKey,
    ) -> Result<(), FenceError> {
        self.check_not_ahead(topic, partition, key)?;
        if key.high() < self.start.0 || self.last.is_some_and(|last| last >= key) {
            return Ok(());
        }
        // A fence key with the same key is the stricter obligation.
        self.pending.entry(key).or_insert_with(|| Obligation {
            topic: topic.clone(),
            partition,
            exact: false,
            identity: None,
        });
        self.first = self.pending.keys().next().copied();
        Ok(())
    }

    /// A record with `key` is placed in `partition` of `topic` (whether
    /// the fence skips it or not). Keys arrive strictly increasing.
    /// `identity` is asked only for a record the source record names.
    pub fn record(
        &mut self,
        topic: &str,
        partition: u32,
        key: EventKey,
        identity: impl FnOnce() -> EventIdentity,
    ) -> Result<(), FenceError> {
        self.last = Some(key);
        let Some(first) = self.first else {
            return Ok(());
        };
        if key < first {
            return Ok(());
        }
        let want = self.pending.remove(&first).expect("first is pending");
        let elsewhere = want.exact && (&*want.topic != topic || want.partition != partition);
        if key > first || elsewhere {
            let passed = if key > first {
                Passed::Key(Some(key))
            } else {
                Passed::Elsewhere {
                    topic: topic.to_owned(),
                    partition,
                }
            };
            return Err(self.broken(&want, first, passed));
        }
        if let Some(recorded) = want.identity {
            let found = identity();
            if found != recorded {
                return Err(self.broken(&want, first, Passed::Other(found)));
            }
        }
        self.first = self.pending.keys().next().copied();
        Ok(())
    }

    /// The stream got past `lsn`: a commit record ending there, or a
    /// keepalive between transactions. A pending fence key whose record
    /// starts before it was not reproduced.
    pub fn passed(&mut self, lsn: Lsn) -> Result<(), FenceError> {
        match self.first {
            Some(first) if first.high() < lsn.0 => {
                let want = self.pending.remove(&first).expect("first is pending");
                Err(self.broken(&want, first, Passed::Position(lsn)))
            }
            _ => Ok(()),
        }
    }

    /// [`Self::not_reproduced`] for an obligation; a loose one says what
    /// else can leave a key out of the replay.
    fn broken(&self, want: &Obligation, key: EventKey, passed: Passed) -> FenceError {
        if let Some(identity) = want.identity {
            return FenceError::RecordNotReproduced(Box::new(super::RecordNotReproduced {
                topic: want.topic.to_string(),
                partition: want.partition,
                key,
                identity: identity.to_string(),
                start: self.start,
                passed: passed.to_string(),
                source_id: self.source.to_string(),
            }));
        }
        let mut e = self.not_reproduced(&want.topic, want.partition, key, passed);
        if let (false, FenceError::NotReproduced { passed, .. }) = (want.exact, &mut e) {
            passed.push_str(
                " (the fence does not skip by that record in this session: its topic is unfenced \
                 or its layout changed; if a route was removed since it was written, its event is \
                 no longer written and walrelay cannot tell that from a restore: put the route \
                 back for one run)",
            );
        }
        e
    }

    fn not_reproduced(
        &self,
        topic: &str,
        partition: u32,
        key: EventKey,
        passed: Passed,
    ) -> FenceError {
        FenceError::NotReproduced {
            topic: topic.to_owned(),
            partition,
            key,
            passed: passed.to_string(),
            source_id: self.source.to_string(),
        }
    }
}

/// How the replay went past a fence key.
enum Passed {
    Key(Option<EventKey>),
    Elsewhere {
        topic: String,
        partition: u32,
    },
    Position(Lsn),
    /// The key came back as another event.
    Other(EventIdentity),
}

impl std::fmt::Display for Passed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Passed::Key(Some(k)) => write!(f, "the replay reached key {k} without it"),
            Passed::Key(None) => f.write_str("the replay went past it"),
            Passed::Elsewhere { topic, partition } => write!(
                f,
                "the replay put that key in partition {partition} of topic \"{topic}\" instead"
            ),
            Passed::Position(lsn) => write!(f, "the replay reached WAL position {lsn} without it"),
            Passed::Other(identity) => {
                write!(f, "the replay gave that key to another event ({identity})")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: u64 = 0x100;
    const SERVER: u64 = 0x900;

    fn key(high: u64, low: u64) -> EventKey {
        EventKey::new(high, low)
    }

    fn check() -> ReplayCheck {
        ReplayCheck::new(Lsn(START), Lsn(SERVER), "sys/db/slot")
    }

    fn topic(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    /// For records no source record names (never asked).
    fn no_identity() -> EventIdentity {
        unreachable!("only asked for the recorded event")
    }

    fn recorded(high: u64, low: u64, commit_ms: i64) -> RecordedEvent {
        RecordedEvent {
            key: key(high, low),
            topic: "orders".into(),
            partition: 3,
            identity: EventIdentity::CommitTime(commit_ms),
        }
    }

    #[test]
    fn the_recorded_event_must_come_back_as_itself() {
        let t = |ms| move || EventIdentity::CommitTime(ms);
        // Reproduced, in another partition even (partitions were added).
        let mut c = check();
        c.expect_recorded(&recorded(0x200, 0x210, 7));
        assert!(c.holding());
        c.record("orders", 0, key(0x150, 0x151), no_identity)
            .unwrap();
        c.record("orders", 1, key(0x200, 0x210), t(7)).unwrap();
        assert!(!c.holding());
        // The same key, another event: the WAL went back and was written
        // again up to the same position.
        let mut c = check();
        c.expect_recorded(&recorded(0x200, 0x210, 7));
        let err = c.record("orders", 3, key(0x200, 0x210), t(8)).unwrap_err();
        assert!(matches!(err, FenceError::RecordNotReproduced(_)), "{err}");
        let text = err.to_string();
        for part in [
            "commit-time-ms:7",
            "another event (commit-time-ms:8)",
            "replays from 0/100",
            "sys/db/slot@restored-1",
            "Restoring the database or failing over",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        // Passed by a larger key, or a position.
        let mut c = check();
        c.expect_recorded(&recorded(0x200, 0x210, 7));
        let err = c
            .record("orders", 3, key(0x200, 0x211), no_identity)
            .unwrap_err();
        assert!(err.to_string().contains("reached key"), "{err}");
        let mut c = check();
        c.expect_recorded(&recorded(0x200, 0x210, 7));
        let err = c.passed(Lsn(0x240)).unwrap_err();
        assert!(matches!(err, FenceError::RecordNotReproduced(_)));
        // Before the start: no obligation.
        let mut c = check();
        c.expect_recorded(&recorded(0xff, 0x1, 7));
        assert!(!c.holding());
    }

    #[test]
    fn a_tail_and_the_source_record_naming_one_key_keep_both_obligations() {
        let mut c = check();
        c.expect_recorded(&recorded(0x200, 0x210, 7));
        c.admit(&topic("orders"), 3, key(0x200, 0x210)).unwrap();
        let err = c
            .record("orders", 3, key(0x200, 0x210), || {
                EventIdentity::CommitTime(9)
            })
            .unwrap_err();
        assert!(matches!(err, FenceError::RecordNotReproduced(_)), "{err}");
        let mut c = check();
        c.expect_recorded(&recorded(0x200, 0x210, 7));
        c.admit(&topic("orders"), 3, key(0x200, 0x210)).unwrap();
        let err = c
            .record("orders", 2, key(0x200, 0x210), || {
                EventIdentity::CommitTime(7)
            })
            .unwrap_err();
        assert!(err.to_string().contains("partition 2"), "{err}");
    }

    #[test]
    fn a_reproduced_fence_releases_the_hold() {
        let mut c = check();
        let t = topic("orders");
        c.admit(&t, 0, key(0x200, 0x210)).unwrap();
        c.admit(&t, 1, key(0x300, 0x310)).unwrap();
        assert!(c.holding());
        c.record("orders", 0, key(0x150, 0x151), no_identity)
            .unwrap();
        c.passed(Lsn(0x160)).unwrap();
        c.record("orders", 0, key(0x200, 0x210), no_identity)
            .unwrap();
        assert!(c.holding(), "partition 1's key is still to come");
        c.record("orders", 0, key(0x200, 0x220), no_identity)
            .unwrap();
        c.passed(Lsn(0x260)).unwrap();
        c.record("orders", 1, key(0x300, 0x310), no_identity)
            .unwrap();
        assert!(!c.holding());
        c.record("orders", 1, key(0x400, 0x401), no_identity)
            .unwrap();
        c.passed(Lsn(0x800)).unwrap();
    }

    #[test]
    fn a_fence_key_before_the_start_needs_no_proof() {
        let mut c = check();
        c.admit(&topic("orders"), 0, key(0xff, 0xff)).unwrap();
        assert!(!c.holding());
    }

    #[test]
    fn a_key_ahead_of_the_server_means_the_wal_went_back() {
        let mut c = check();
        let err = c.admit(&topic("orders"), 2, key(SERVER, 1)).unwrap_err();
        assert!(matches!(err, FenceError::WalWentBack { partition: 2, .. }));
        let text = err.to_string();
        assert!(
            text.contains("relay.source_id") && text.contains("sys/db/slot"),
            "{text}"
        );
        assert!(c.check_not_ahead("orders", 0, key(SERVER - 1, 9)).is_ok());
    }

    #[test]
    fn a_larger_key_before_the_fence_key_stops_the_replay() {
        // A restore: new WAL gives other keys than those in Kafka.
        let mut c = check();
        let t = topic("orders");
        c.admit(&t, 0, key(0x200, 0x210)).unwrap();
        c.record("orders", 0, key(0x180, 0x181), no_identity)
            .unwrap();
        let err = c
            .record("orders", 3, key(0x200, 0x211), no_identity)
            .unwrap_err();
        assert!(
            matches!(err, FenceError::NotReproduced { partition: 0, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("reached key"), "{err}");
    }

    #[test]
    fn the_same_key_elsewhere_is_not_a_reproduction() {
        let mut c = check();
        c.admit(&topic("orders"), 0, key(0x200, 0x210)).unwrap();
        let err = c
            .record("orders", 1, key(0x200, 0x210), no_identity)
            .unwrap_err();
        assert!(err.to_string().contains("partition 1"), "{err}");
    }

    #[test]
    fn a_commit_or_keepalive_past_the_fence_key_stops_the_replay() {
        let mut c = check();
        c.admit(&topic("orders"), 0, key(0x200, 0x210)).unwrap();
        // The fence key's own commit record starts at 0x200 and ends
        // after it; a commit ending at 0x200 is an earlier one.
        c.passed(Lsn(0x200)).unwrap();
        let err = c.passed(Lsn(0x240)).unwrap_err();
        assert!(matches!(err, FenceError::NotReproduced { .. }));
    }

    #[test]
    fn a_key_the_fence_does_not_skip_must_come_back_somewhere() {
        // Partitions were added: the event comes back in another one.
        let mut c = check();
        c.admit_anywhere(&topic("orders"), 0, key(0x200, 0x210))
            .unwrap();
        assert!(c.holding(), "nothing is confirmed until it came back");
        c.record("orders", 5, key(0x200, 0x210), no_identity)
            .unwrap();
        assert!(!c.holding());
        // A route moved: it comes back in another topic.
        let mut c = check();
        c.admit_anywhere(&topic("orders"), 0, key(0x200, 0x210))
            .unwrap();
        c.record("payments", 0, key(0x200, 0x210), no_identity)
            .unwrap();
        assert!(!c.holding());
        // A restore: the replay never gives it back.
        let mut c = check();
        c.admit_anywhere(&topic("orders"), 0, key(0x200, 0x210))
            .unwrap();
        let err = c
            .record("orders", 0, key(0x200, 0x211), no_identity)
            .unwrap_err();
        assert!(matches!(err, FenceError::NotReproduced { .. }), "{err}");
        assert!(err.to_string().contains("put the route back"), "{err}");
        let mut c = check();
        c.admit_anywhere(&topic("orders"), 0, key(0x200, 0x210))
            .unwrap();
        assert!(c.passed(Lsn(0x240)).is_err());
        // Ahead of the server: the WAL went back, as for a fence key.
        let err = check()
            .admit_anywhere(&topic("orders"), 0, key(SERVER, 0))
            .unwrap_err();
        assert!(matches!(err, FenceError::WalWentBack { .. }));
    }

    #[test]
    fn a_loose_key_before_the_start_or_behind_the_replay_is_no_obligation_and_a_fence_key_stays_exact(
    ) {
        let mut c = check();
        c.admit_anywhere(&topic("orders"), 0, key(0xff, 0xff))
            .unwrap();
        assert!(!c.holding());
        c.record("payments", 0, key(0x300, 0x301), no_identity)
            .unwrap();
        c.admit_anywhere(&topic("orders"), 0, key(0x200, 0x210))
            .unwrap();
        assert!(!c.holding(), "it may have come back in another topic");
        // The same key as a fence key of one partition and a loose key of
        // another: it must come back in the fence key's partition.
        let mut c = check();
        let t = topic("orders");
        c.admit(&t, 1, key(0x200, 0x210)).unwrap();
        c.admit_anywhere(&t, 0, key(0x200, 0x210)).unwrap();
        let err = c
            .record("orders", 0, key(0x200, 0x210), no_identity)
            .unwrap_err();
        assert!(err.to_string().contains("partition 0"), "{err}");
    }

    #[test]
    fn a_topic_opened_late_with_a_fence_key_already_passed_stops_the_replay() {
        let mut c = check();
        c.record("payments", 0, key(0x300, 0x301), no_identity)
            .unwrap();
        let err = c.admit(&topic("orders"), 0, key(0x200, 0x210)).unwrap_err();
        assert!(matches!(err, FenceError::NotReproduced { .. }));
        // Opened by its own fence key's record: fine.
        let mut c = check();
        c.record("payments", 0, key(0x100, 0x101), no_identity)
            .unwrap();
        c.admit(&topic("orders"), 0, key(0x200, 0x210)).unwrap();
        c.record("orders", 0, key(0x200, 0x210), no_identity)
            .unwrap();
        assert!(!c.holding());
    }
}
