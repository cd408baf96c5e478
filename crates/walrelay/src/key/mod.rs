//! 128-bit idempotency keys, derived from WAL positions only.
//!
//! Every event walrelay publishes carries an [`EventKey`]: a 128-bit number
//! that strictly increases in stream order and is identical when the same WAL
//! is replayed. Consumers keep one high-water mark per (topic, partition,
//! source) and process an event only if its key is greater, which gives
//! exactly-once processing on top of an at-least-once relay.
//!
//! # How keys are built (see `docs/contract.md`)
//!
//! * A transactional event: `key = (final_lsn << 64) | pos`, where
//!   `final_lsn` is the start of the transaction's commit record (from
//!   `Begin`) and `pos` is the event's reported LSN, raised to
//!   `previous pos in this transaction + 1` when it is not greater. The raise
//!   handles the two cases in which pgoutput reports equal LSNs inside one
//!   transaction: the rows of one COPY (heap multi-insert) record, and a
//!   logical message (which reports the END of its record) followed by a
//!   change starting exactly there.
//! * A non-transactional message reporting end LSN `L`:
//!   `key = ((L - 1) << 64) | (L - 1)`. Its record starts at or before
//!   `L - 1`, after every commit record emitted before it, and every commit
//!   record emitted after it starts at or after `L`.
//!
//! Keys depend only on the WAL, never on the session, the time or a counter,
//! so a replay from any confirmed position reproduces the same keys.
//!
//! [`KeyAssigner`] applies these rules to the stream and refuses (with a
//! [`KeyError`]) any input that would make keys not strictly increase: the
//! relay must stop rather than publish a key a consumer would misjudge.

use walrelay_pgoutput::Lsn;

/// The key type and its text form live in the contract crate, shared with
/// consumers; re-exported here so `walrelay::key::EventKey` keeps working.
pub use walrelay_contract::{EventKey, ParseEventKeyError};

/// Input that would make keys wrong: the relay must stop (and, after fixing
/// the cause, replay from the slot) instead of publishing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// `Begin` arrived while a transaction was still open.
    #[error(
        "Begin for the transaction committing at {next} arrived while the transaction \
         committing at {open} is still open (expected its Commit first)"
    )]
    TransactionAlreadyOpen {
        /// `final_lsn` of the open transaction.
        open: Lsn,
        /// `final_lsn` of the new `Begin`.
        next: Lsn,
    },
    /// `Begin` with `final_lsn` 0/0, which is not a WAL position.
    #[error("Begin carried final_lsn 0/0, which is not a valid commit position")]
    ZeroFinalLsn,
    /// Transactions must arrive in strictly increasing commit order.
    #[error(
        "Begin carried final_lsn {next}, not after the previous transaction's final_lsn \
         {previous} (transactions must arrive in strictly increasing commit order)"
    )]
    FinalLsnNotIncreasing {
        /// `final_lsn` of the previous transaction.
        previous: Lsn,
        /// `final_lsn` of the new `Begin`.
        next: Lsn,
    },
    /// The new transaction's keys would not sort after the last key issued
    /// (e.g. after a non-transactional message reporting a later position).
    #[error(
        "Begin carried final_lsn {final_lsn}, but the last key issued was {last_key} \
         (high part {last_high}); this transaction's keys would not be greater \
         (expected final_lsn > {last_high})"
    )]
    FinalLsnBehindLastKey {
        /// `final_lsn` of the new `Begin`.
        final_lsn: Lsn,
        /// The last key issued.
        last_key: EventKey,
        /// High part of `last_key`, as an LSN.
        last_high: Lsn,
    },
    /// A change or transactional message outside `Begin`/`Commit`.
    #[error(
        "event reported at {reported} arrived outside a transaction (expected Begin first; \
         non-transactional messages go through non_transactional)"
    )]
    EventOutsideTransaction {
        /// The event's reported LSN.
        reported: Lsn,
    },
    /// Raising the position would overflow 64 bits.
    #[error(
        "event reported at {reported} in the transaction committing at {final_lsn} cannot be \
         placed after the previous position {previous} (64-bit overflow)"
    )]
    PositionOverflow {
        /// `final_lsn` of the open transaction.
        final_lsn: Lsn,
        /// The previous position in this transaction.
        previous: Lsn,
        /// The event's reported LSN.
        reported: Lsn,
    },
    /// `Commit` without an open transaction.
    #[error("Commit for {commit_lsn} (end {end_lsn}) arrived without a Begin")]
    CommitWithoutBegin {
        /// `commit_lsn` of the `Commit`.
        commit_lsn: Lsn,
        /// `end_lsn` of the `Commit`.
        end_lsn: Lsn,
    },
    /// `Commit.commit_lsn` differs from `Begin.final_lsn`.
    #[error(
        "Commit carried commit_lsn {commit_lsn}, but the open transaction's Begin carried \
         final_lsn {final_lsn} (they must be equal)"
    )]
    CommitLsnMismatch {
        /// `final_lsn` of the open transaction.
        final_lsn: Lsn,
        /// `commit_lsn` of the `Commit`.
        commit_lsn: Lsn,
    },
    /// A non-transactional message inside `Begin`/`Commit`.
    #[error(
        "non-transactional message ending at {reported} arrived inside the transaction \
         committing at {final_lsn} (expected only outside Begin/Commit)"
    )]
    NonTransactionalInTransaction {
        /// `final_lsn` of the open transaction.
        final_lsn: Lsn,
        /// The message's reported (end) LSN.
        reported: Lsn,
    },
    /// A non-transactional message reporting end LSN 0/0.
    #[error("non-transactional message reported LSN 0/0, which cannot be the end of a record")]
    ZeroMessageLsn,
    /// Safety net: a key not strictly greater than the previous one.
    #[error(
        "key {next} is not greater than the previous key {previous}: refusing to publish \
         (keys must strictly increase in stream order)"
    )]
    NotIncreasing {
        /// The last key issued.
        previous: EventKey,
        /// The key that would have been issued.
        next: EventKey,
    },
}

/// The transaction between `Begin` and `Commit`.
#[derive(Debug, Clone, Copy)]
struct OpenTransaction {
    final_lsn: u64,
    /// Position of the previous event in this transaction.
    last_pos: Option<u64>,
}

/// Assigns [`EventKey`]s to the stream, fed in order.
///
/// Call [`begin`](Self::begin) on `Begin`, [`event`](Self::event) for every
/// published change or transactional message, [`commit`](Self::commit) on
/// `Commit`, and [`non_transactional`](Self::non_transactional) for a
/// non-transactional message. Each replication session starts with a new
/// assigner: keys depend only on the WAL, so the replay yields the same keys.
///
/// On error the state is left unchanged; the caller is expected to stop.
#[derive(Debug, Clone, Default)]
pub struct KeyAssigner {
    open: Option<OpenTransaction>,
    /// `final_lsn` of the last transaction begun in this session.
    last_final_lsn: Option<u64>,
    /// The last key issued in this session.
    last_key: Option<EventKey>,
}

impl KeyAssigner {
    /// A fresh assigner (no transaction open, no key issued).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a transaction (`Begin.final_lsn`).
    pub fn begin(&mut self, final_lsn: Lsn) -> Result<(), KeyError> {
        if let Some(open) = self.open {
            return Err(KeyError::TransactionAlreadyOpen {
                open: Lsn(open.final_lsn),
                next: final_lsn,
            });
        }
        if final_lsn.is_zero() {
            return Err(KeyError::ZeroFinalLsn);
        }
        if let Some(previous) = self.last_final_lsn {
            if final_lsn.0 <= previous {
                return Err(KeyError::FinalLsnNotIncreasing {
                    previous: Lsn(previous),
                    next: final_lsn,
                });
            }
        }
        if let Some(last_key) = self.last_key {
            if final_lsn.0 <= last_key.high() {
                return Err(KeyError::FinalLsnBehindLastKey {
                    final_lsn,
                    last_key,
                    last_high: Lsn(last_key.high()),
                });
            }
        }
        self.open = Some(OpenTransaction {
            final_lsn: final_lsn.0,
            last_pos: None,
        });
        self.last_final_lsn = Some(final_lsn.0);
        Ok(())
    }

    /// The key for the next event of the open transaction, given the LSN the
    /// server reported for it (XLogData `dataStart`).
    pub fn event(&mut self, reported: Lsn) -> Result<EventKey, KeyError> {
        let Some(open) = self.open else {
            return Err(KeyError::EventOutsideTransaction { reported });
        };
        let pos = match open.last_pos {
            Some(previous) if reported.0 <= previous => {
                previous.checked_add(1).ok_or(KeyError::PositionOverflow {
                    final_lsn: Lsn(open.final_lsn),
                    previous: Lsn(previous),
                    reported,
                })?
            }
            _ => reported.0,
        };
        let key = EventKey::new(open.final_lsn, pos);
        self.issue(key)?;
        self.open = Some(OpenTransaction {
            final_lsn: open.final_lsn,
            last_pos: Some(pos),
        });
        Ok(key)
    }

    /// Ends the open transaction (`Commit.commit_lsn`, `Commit.end_lsn`).
    ///
    /// `end_lsn` does not affect keys; it is taken for the error message and
    /// so that the call mirrors the protocol message.
    pub fn commit(&mut self, commit_lsn: Lsn, end_lsn: Lsn) -> Result<(), KeyError> {
        let Some(open) = self.open else {
            return Err(KeyError::CommitWithoutBegin {
                commit_lsn,
                end_lsn,
            });
        };
        if commit_lsn.0 != open.final_lsn {
            return Err(KeyError::CommitLsnMismatch {
                final_lsn: Lsn(open.final_lsn),
                commit_lsn,
            });
        }
        self.open = None;
        Ok(())
    }

    /// The key for a non-transactional message reporting end LSN `L`:
    /// `((L - 1) << 64) | (L - 1)`.
    pub fn non_transactional(&mut self, reported_end: Lsn) -> Result<EventKey, KeyError> {
        if let Some(open) = self.open {
            return Err(KeyError::NonTransactionalInTransaction {
                final_lsn: Lsn(open.final_lsn),
                reported: reported_end,
            });
        }
        let Some(position) = reported_end.0.checked_sub(1) else {
            return Err(KeyError::ZeroMessageLsn);
        };
        let key = EventKey::new(position, position);
        self.issue(key)?;
        Ok(key)
    }

    /// `true` between `begin` and `commit`.
    #[must_use]
    pub fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// `final_lsn` of the open transaction, if any.
    #[must_use]
    pub fn open_final_lsn(&self) -> Option<Lsn> {
        self.open.map(|open| Lsn(open.final_lsn))
    }

    /// The last key issued in this session.
    #[must_use]
    pub fn last_key(&self) -> Option<EventKey> {
        self.last_key
    }

    /// Records `key` as issued if it is greater than the previous one.
    fn issue(&mut self, key: EventKey) -> Result<(), KeyError> {
        if let Some(previous) = self.last_key {
            if key <= previous {
                return Err(KeyError::NotIncreasing {
                    previous,
                    next: key,
                });
            }
        }
        self.last_key = Some(key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(high: u64, low: u64) -> EventKey {
        EventKey::new(high, low)
    }

    // ---- KeyAssigner ----

    #[test]
    fn simple_transaction() {
        let mut a = KeyAssigner::new();
        a.begin(Lsn(0x300)).unwrap();
        assert!(a.in_transaction());
        assert_eq!(a.open_final_lsn(), Some(Lsn(0x300)));
        assert_eq!(a.event(Lsn(0x100)).unwrap(), key(0x300, 0x100));
        assert_eq!(a.event(Lsn(0x200)).unwrap(), key(0x300, 0x200));
        a.commit(Lsn(0x300), Lsn(0x330)).unwrap();
        assert!(!a.in_transaction());
        assert_eq!(a.last_key(), Some(key(0x300, 0x200)));
    }

    #[test]
    fn copy_rows_sharing_one_lsn_get_consecutive_positions() {
        let mut a = KeyAssigner::new();
        let x = 0x1_0000_0100;
        a.begin(Lsn(0x1_0000_0900)).unwrap();
        let keys: Vec<_> = (0..3).map(|_| a.event(Lsn(x)).unwrap()).collect();
        assert_eq!(
            keys,
            vec![
                key(0x1_0000_0900, x),
                key(0x1_0000_0900, x + 1),
                key(0x1_0000_0900, x + 2)
            ]
        );
        // A later record past the raised positions keeps its own LSN.
        assert_eq!(
            a.event(Lsn(x + 0x80)).unwrap(),
            key(0x1_0000_0900, x + 0x80)
        );
        a.commit(Lsn(0x1_0000_0900), Lsn(0x1_0000_0930)).unwrap();
    }

    #[test]
    fn message_end_equal_to_next_insert_start() {
        // BEGIN; emit m1 (record 0x100..0x180); INSERT at 0x180; COMMIT at 0x200.
        let mut a = KeyAssigner::new();
        a.begin(Lsn(0x200)).unwrap();
        let m1 = a.event(Lsn(0x180)).unwrap();
        let insert = a.event(Lsn(0x180)).unwrap();
        assert_eq!(m1, key(0x200, 0x180));
        assert_eq!(insert, key(0x200, 0x181));
        assert!(insert > m1);
        a.commit(Lsn(0x200), Lsn(0x228)).unwrap();
    }

    #[test]
    fn last_message_reporting_final_lsn() {
        // m3 ends exactly where the commit record starts.
        let mut a = KeyAssigner::new();
        a.begin(Lsn(0x200)).unwrap();
        a.event(Lsn(0x100)).unwrap();
        let m3 = a.event(Lsn(0x200)).unwrap();
        assert_eq!(m3, key(0x200, 0x200));
        a.commit(Lsn(0x200), Lsn(0x228)).unwrap();
        // The next transaction still sorts after it.
        a.begin(Lsn(0x300)).unwrap();
        assert!(a.event(Lsn(0x228)).unwrap() > m3);
    }

    #[test]
    fn non_transactional_between_transactions() {
        let mut a = KeyAssigner::new();
        a.begin(Lsn(0x200)).unwrap();
        let t1 = a.event(Lsn(0x100)).unwrap();
        a.commit(Lsn(0x200), Lsn(0x228)).unwrap();
        // Message record 0x228..0x260 reports its end.
        let m = a.non_transactional(Lsn(0x260)).unwrap();
        assert_eq!(m, key(0x25F, 0x25F));
        assert!(m > t1);
        // Next commit record starts at or after the message end.
        a.begin(Lsn(0x260)).unwrap();
        let t2 = a.event(Lsn(0x150)).unwrap(); // change written before the message
        assert!(t2 > m);
        a.commit(Lsn(0x260), Lsn(0x288)).unwrap();
        // Two non-transactional messages back to back.
        let m2 = a.non_transactional(Lsn(0x2C0)).unwrap();
        let m3 = a.non_transactional(Lsn(0x2F0)).unwrap();
        assert!(t2 < m2 && m2 < m3);
    }

    #[test]
    fn commit_lsn_mismatch_is_rejected() {
        let mut a = KeyAssigner::new();
        a.begin(Lsn(0x200)).unwrap();
        let err = a.commit(Lsn(0x208), Lsn(0x228)).unwrap_err();
        assert_eq!(
            err,
            KeyError::CommitLsnMismatch {
                final_lsn: Lsn(0x200),
                commit_lsn: Lsn(0x208)
            }
        );
        assert!(err.to_string().contains("0/208"), "{err}");
        assert!(err.to_string().contains("0/200"), "{err}");
        // State unchanged: the transaction is still open.
        assert!(a.in_transaction());
    }

    #[test]
    fn nested_begin_is_rejected() {
        let mut a = KeyAssigner::new();
        a.begin(Lsn(0x200)).unwrap();
        assert_eq!(
            a.begin(Lsn(0x300)),
            Err(KeyError::TransactionAlreadyOpen {
                open: Lsn(0x200),
                next: Lsn(0x300)
            })
        );
        assert_eq!(a.open_final_lsn(), Some(Lsn(0x200)));
    }

    #[test]
    fn events_and_commit_outside_transaction_are_rejected() {
        let mut a = KeyAssigner::new();
        assert_eq!(
            a.event(Lsn(0x100)),
            Err(KeyError::EventOutsideTransaction {
                reported: Lsn(0x100)
            })
        );
        assert_eq!(
            a.commit(Lsn(0x100), Lsn(0x128)),
            Err(KeyError::CommitWithoutBegin {
                commit_lsn: Lsn(0x100),
                end_lsn: Lsn(0x128)
            })
        );
        a.begin(Lsn(0x200)).unwrap();
        a.commit(Lsn(0x200), Lsn(0x228)).unwrap();
        assert!(matches!(
            a.event(Lsn(0x300)),
            Err(KeyError::EventOutsideTransaction { .. })
        ));
    }

    #[test]
    fn non_transactional_inside_transaction_or_at_zero_is_rejected() {
        let mut a = KeyAssigner::new();
        assert_eq!(a.non_transactional(Lsn(0)), Err(KeyError::ZeroMessageLsn));
        a.begin(Lsn(0x200)).unwrap();
        assert_eq!(
            a.non_transactional(Lsn(0x180)),
            Err(KeyError::NonTransactionalInTransaction {
                final_lsn: Lsn(0x200),
                reported: Lsn(0x180)
            })
        );
    }

    #[test]
    fn non_monotonic_final_lsn_is_rejected() {
        let mut a = KeyAssigner::new();
        a.begin(Lsn(0x200)).unwrap();
        a.commit(Lsn(0x200), Lsn(0x228)).unwrap();
        for bad in [0x200, 0x1F0] {
            assert_eq!(
                a.begin(Lsn(bad)),
                Err(KeyError::FinalLsnNotIncreasing {
                    previous: Lsn(0x200),
                    next: Lsn(bad)
                })
            );
        }
        assert_eq!(a.begin(Lsn(0)), Err(KeyError::ZeroFinalLsn));
        // After a non-transactional message ending at 0x300, a transaction
        // committing before it would produce smaller keys.
        a.non_transactional(Lsn(0x300)).unwrap();
        let err = a.begin(Lsn(0x2F0)).unwrap_err();
        assert!(
            matches!(err, KeyError::FinalLsnBehindLastKey { .. }),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("expected final_lsn > 0/2FF"),
            "{err}"
        );
        a.begin(Lsn(0x300)).unwrap();
    }

    #[test]
    fn empty_transactions_are_fine() {
        let mut a = KeyAssigner::new();
        a.begin(Lsn(0x200)).unwrap();
        a.commit(Lsn(0x200), Lsn(0x228)).unwrap();
        a.begin(Lsn(0x228)).unwrap();
        a.commit(Lsn(0x228), Lsn(0x250)).unwrap();
        assert_eq!(a.last_key(), None);
    }

    #[test]
    fn safety_net_rejects_non_increasing_keys() {
        // A non-transactional message reporting a position that does not
        // follow the previous one (impossible with a valid stream).
        let mut a = KeyAssigner::new();
        let first = a.non_transactional(Lsn(0x300)).unwrap();
        let err = a.non_transactional(Lsn(0x300)).unwrap_err();
        assert_eq!(
            err,
            KeyError::NotIncreasing {
                previous: first,
                next: first
            }
        );
        assert!(err.to_string().contains(&first.to_hex()));
        assert!(matches!(
            a.non_transactional(Lsn(0x200)),
            Err(KeyError::NotIncreasing { .. })
        ));
        // Still usable with valid input; the failed calls changed nothing.
        assert_eq!(a.last_key(), Some(first));
        assert!(a.non_transactional(Lsn(0x301)).is_ok());
    }

    #[test]
    fn position_overflow_is_an_error() {
        let mut a = KeyAssigner::new();
        a.begin(Lsn(u64::MAX)).unwrap();
        a.event(Lsn(u64::MAX)).unwrap();
        assert!(matches!(
            a.event(Lsn(u64::MAX)),
            Err(KeyError::PositionOverflow { .. })
        ));
    }
}

#[cfg(test)]
mod proptests {
    //! A model of the WAL and of what pgoutput sends for it.

    use super::*;
    use proptest::prelude::*;

    /// One WAL-writing action, in WAL order.
    #[derive(Debug, Clone)]
    enum Action {
        /// INSERT/UPDATE/DELETE in transaction slot `slot`.
        Change { slot: usize },
        /// Transactional logical message in `slot`.
        Message { slot: usize },
        /// COPY batch (one multi-insert record) of `rows` rows in `slot`.
        Copy { slot: usize, rows: usize },
        /// Commit record of the current transaction in `slot`.
        Commit { slot: usize },
        /// Abort: the current transaction in `slot` is discarded.
        Abort { slot: usize },
        /// Non-transactional logical message.
        NonTransactional,
    }

    /// What the server emits, in stream order.
    #[derive(Debug, Clone)]
    enum Unit {
        Transaction {
            final_lsn: u64,
            end_lsn: u64,
            /// Reported LSN of each event, in order.
            events: Vec<u64>,
        },
        NonTransactional {
            /// Start of the message record (what the server compares with
            /// the start position on replay).
            start: u64,
            /// End of the record: the reported LSN.
            end: u64,
        },
    }

    impl Unit {
        /// Position that decides the unit's place in the stream and whether
        /// a replay from `P` re-sends it (`position >= P`).
        fn position(&self) -> u64 {
            match self {
                Unit::Transaction { final_lsn, .. } => *final_lsn,
                Unit::NonTransactional { start, .. } => *start,
            }
        }

        /// The LSN the relay confirms once this unit is acknowledged.
        fn confirm_lsn(&self) -> u64 {
            match self {
                Unit::Transaction { end_lsn, .. } => *end_lsn,
                Unit::NonTransactional { end, .. } => *end,
            }
        }
    }

    const SLOTS: usize = 3;

    fn action() -> impl Strategy<Value = Action> {
        let slot = 0..SLOTS;
        prop_oneof![
            4 => slot.clone().prop_map(|slot| Action::Change { slot }),
            3 => slot.clone().prop_map(|slot| Action::Message { slot }),
            2 => (slot.clone(), 1..5usize).prop_map(|(slot, rows)| Action::Copy { slot, rows }),
            3 => slot.clone().prop_map(|slot| Action::Commit { slot }),
            1 => slot.prop_map(|slot| Action::Abort { slot }),
            2 => Just(Action::NonTransactional),
        ]
    }

    /// (action, record length, gap before the record). A gap of 0 makes a
    /// record start exactly where the previous one ended (the collision).
    fn wal() -> impl Strategy<Value = (u64, Vec<(Action, u64, u64)>)> {
        let gap = prop_oneof![3 => Just(0u64), 1 => 1..16u64];
        (
            prop_oneof![Just(1u64), 1..(1u64 << 40), Just(0xFFFF_FFFF_0000_0000u64)],
            prop::collection::vec((action(), 1..64u64, gap), 0..60),
        )
    }

    /// Lays the records out and derives the stream pgoutput would send.
    fn stream(base: u64, actions: &[(Action, u64, u64)]) -> Vec<Unit> {
        let mut position = base;
        let mut open: Vec<Vec<u64>> = vec![Vec::new(); SLOTS];
        let mut units = Vec::new();
        for (action, length, gap) in actions {
            let start = position + gap;
            let end = start + length;
            position = end;
            match *action {
                Action::Change { slot } => open[slot].push(start),
                Action::Message { slot } => open[slot].push(end),
                Action::Copy { slot, rows } => {
                    for _ in 0..rows {
                        open[slot].push(start);
                    }
                }
                Action::Commit { slot } => units.push(Unit::Transaction {
                    final_lsn: start,
                    end_lsn: end,
                    events: std::mem::take(&mut open[slot]),
                }),
                Action::Abort { slot } => open[slot].clear(),
                Action::NonTransactional => units.push(Unit::NonTransactional { start, end }),
            }
        }
        // Still-open transactions never committed: nothing is emitted.
        units
    }

    /// Feeds units to the assigner; returns one key list per unit.
    fn assign(assigner: &mut KeyAssigner, units: &[Unit]) -> Vec<Vec<EventKey>> {
        units
            .iter()
            .map(|unit| match unit {
                Unit::Transaction {
                    final_lsn,
                    end_lsn,
                    events,
                } => {
                    assigner.begin(Lsn(*final_lsn)).unwrap();
                    let keys = events
                        .iter()
                        .map(|lsn| assigner.event(Lsn(*lsn)).unwrap())
                        .collect();
                    assigner.commit(Lsn(*final_lsn), Lsn(*end_lsn)).unwrap();
                    keys
                }
                Unit::NonTransactional { end, .. } => {
                    vec![assigner.non_transactional(Lsn(*end)).unwrap()]
                }
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn keys_increase_and_replays_reproduce_the_suffix((base, actions) in wal()) {
            let units = stream(base, &actions);
            // Stream order is WAL order of commit / message records.
            prop_assert!(units.windows(2).all(|w| w[0].position() < w[1].position()));

            let mut assigner = KeyAssigner::new();
            let per_unit = assign(&mut assigner, &units);
            let all: Vec<EventKey> = per_unit.iter().flatten().copied().collect();
            prop_assert!(all.windows(2).all(|w| w[0] < w[1]), "keys not increasing: {:?}", all);
            for (unit, keys) in units.iter().zip(&per_unit) {
                if let Unit::Transaction { final_lsn, .. } = unit {
                    prop_assert!(keys.iter().all(|k| k.high() == *final_lsn));
                }
            }

            // Replay from every position the relay could have confirmed.
            for (index, unit) in units.iter().enumerate() {
                let confirmed = unit.confirm_lsn();
                let resent: Vec<Unit> = units
                    .iter()
                    .filter(|u| u.position() >= confirmed)
                    .cloned()
                    .collect();
                // A new session starts with a new assigner.
                let mut assigner = KeyAssigner::new();
                let replayed: Vec<EventKey> =
                    assign(&mut assigner, &resent).into_iter().flatten().collect();
                let expected: Vec<EventKey> =
                    per_unit[index + 1..].iter().flatten().copied().collect();
                prop_assert_eq!(replayed, expected, "replay from {}", Lsn(confirmed));
            }
        }
    }
}
