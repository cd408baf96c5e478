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
/// consumers; re-exported here so `walrelay::engine::key::EventKey` keeps working.
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
mod tests;

#[cfg(test)]
mod proptests;
