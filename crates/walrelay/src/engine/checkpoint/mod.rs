//! Which LSN may be confirmed to PostgreSQL.
//!
//! The slot's confirmed flush LSN is walrelay's only checkpoint: on restart
//! the server skips every transaction whose commit record starts before it,
//! and every non-transactional message whose record starts before it. So a
//! position may be confirmed only when everything the server sent before it
//! has been acknowledged by Kafka (see `docs/contract.md`).
//!
//! [`CheckpointTracker`] gives every produced event a sequence number,
//! collects Kafka's acknowledgements (in any order, across partitions) and
//! *checkpoint candidates* — a transaction's `end_lsn`, a non-transactional
//! message's reported LSN — each covering every event registered before it.
//! A candidate becomes confirmable when all the events it covers are acked.
//! When nothing at all is waiting, a keepalive's `wal_end` is confirmable
//! too, so a slot on an otherwise idle (for us) database does not hold WAL
//! forever.
//!
//! What it never does: confirm on receipt, or confirm a keepalive's
//! `wal_end` while anything received is still unacknowledged.
//!
//! [`ConfirmGate`] then applies the relay's two holds (the last clean
//! publication check, the placement's hold during a replay) and keeps the
//! confirmation moving only forward: the whole rule of what the slot's
//! confirmed flush LSN becomes lives in this module.
//!
//! # Cost
//!
//! O(1) amortized per event: acknowledgement flags live in a ring
//! ([`VecDeque`]) indexed by `seq - base`, the acknowledged prefix is popped
//! as it forms, and candidates sit in a second ring in registration order.
//! Beyond the rings' amortized growth nothing is allocated per event.

use std::collections::VecDeque;

use walrelay_pgoutput::Lsn;

mod gate;
pub use gate::ConfirmGate;

/// An event registered and not yet popped from the ring.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Bytes counted in [`CheckpointTracker::in_flight_bytes`] until acked.
    bytes: usize,
    acked: bool,
}

/// A position that may be confirmed once every event with
/// `seq < seq_end` is acknowledged.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    seq_end: u64,
    lsn: Lsn,
}

/// Why an acknowledgement was refused. The tracker's state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// The sequence number was never handed out.
    #[error("ack for event {seq}, which was never registered (next sequence number is {next})")]
    Unknown {
        /// The acknowledged sequence number.
        seq: u64,
        /// The next sequence number the tracker would hand out.
        next: u64,
    },
    /// The event was acknowledged before.
    #[error("duplicate ack for event {seq}: it was already acknowledged")]
    AlreadyAcked {
        /// The acknowledged sequence number.
        seq: u64,
    },
}

/// Decides the LSN that may be confirmed to PostgreSQL.
///
/// Feed it in stream order: [`register_event`](Self::register_event) for
/// every record handed to Kafka, [`commit`](Self::commit) on a transaction's
/// `Commit`, [`standalone`](Self::standalone) right after registering a
/// non-transactional message, [`keepalive`](Self::keepalive) on every
/// primary keepalive; and [`ack`](Self::ack) whenever Kafka acknowledges a
/// record. Every registered event must eventually be covered by a `commit`
/// or `standalone`: until then keepalives are not confirmed.
#[derive(Debug, Clone, Default)]
pub struct CheckpointTracker {
    /// Sequence number of `ring[0]`; every event below it is acked.
    base: u64,
    /// Next sequence number to hand out.
    next: u64,
    /// Flags of events `base..next`; `ring[0]`, if any, is unacked.
    ring: VecDeque<Slot>,
    /// Candidates not yet confirmable, in registration order, each with a
    /// larger `seq_end` than the previous one.
    candidates: VecDeque<Candidate>,
    /// `seq_end` of the last candidate registered
    /// (events at or above it are not covered by any candidate yet).
    covered: u64,
    in_flight_events: usize,
    in_flight_bytes: usize,
    /// Highest LSN safe to confirm (never decreases).
    confirmed: Lsn,
    /// The last value [`poll_confirm`](Self::poll_confirm) returned.
    polled: Lsn,
}

impl CheckpointTracker {
    /// A tracker with nothing confirmed yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A tracker that starts from an already confirmed position (e.g. the
    /// slot's `confirmed_flush_lsn`); it is never reported lower than that.
    #[must_use]
    pub fn with_confirmed(confirmed: Lsn) -> Self {
        CheckpointTracker {
            confirmed,
            polled: confirmed,
            ..Self::default()
        }
    }

    /// Registers an event handed to Kafka, occupying `bytes` of memory until
    /// acked, and returns its sequence number (strictly increasing).
    pub fn register_event(&mut self, bytes: usize) -> u64 {
        let seq = self.next;
        self.next += 1;
        self.ring.push_back(Slot {
            bytes,
            acked: false,
        });
        self.in_flight_events += 1;
        self.in_flight_bytes += bytes;
        seq
    }

    /// Kafka acknowledged event `seq` (in any order).
    ///
    /// Errors (state unchanged): [`AckError::Unknown`] for a number never
    /// handed out, [`AckError::AlreadyAcked`] for a duplicate: both are bugs
    /// in the caller.
    pub fn ack(&mut self, seq: u64) -> Result<(), AckError> {
        if seq >= self.next {
            return Err(AckError::Unknown {
                seq,
                next: self.next,
            });
        }
        if seq < self.base {
            return Err(AckError::AlreadyAcked { seq });
        }
        // `base <= seq < next` and `ring.len() == next - base`.
        let index = usize::try_from(seq - self.base).map_err(|_| AckError::Unknown {
            seq,
            next: self.next,
        })?;
        let Some(slot) = self.ring.get_mut(index) else {
            return Err(AckError::Unknown {
                seq,
                next: self.next,
            });
        };
        if slot.acked {
            return Err(AckError::AlreadyAcked { seq });
        }
        slot.acked = true;
        self.in_flight_events -= 1;
        self.in_flight_bytes -= slot.bytes;
        if index == 0 {
            while self.ring.front().is_some_and(|slot| slot.acked) {
                self.ring.pop_front();
                self.base += 1;
            }
            self.advance();
        }
        Ok(())
    }

    /// A transaction ended with `end_lsn`: a candidate covering every event
    /// registered so far.
    pub fn commit(&mut self, end_lsn: Lsn) {
        self.add_candidate(end_lsn);
    }

    /// A non-transactional message reporting `lsn`, whose event was just
    /// registered: a candidate covering every event registered so far.
    pub fn standalone(&mut self, lsn: Lsn) {
        self.add_candidate(lsn);
    }

    /// A primary keepalive reported `wal_end`. If nothing is waiting — no
    /// unacked event, no pending candidate, no event not yet covered by a
    /// candidate — and no transaction is open, `wal_end` becomes
    /// confirmable (never lowering the confirmed position).
    ///
    /// Call it in stream order, after registering everything received
    /// before the keepalive.
    pub fn keepalive(&mut self, wal_end: Lsn, in_transaction: bool) {
        if !in_transaction && self.is_idle() {
            self.raise(wal_end);
        }
    }

    /// The highest LSN safe to confirm, or `None` while nothing is (neither
    /// a candidate nor a keepalive nor [`with_confirmed`](Self::with_confirmed)
    /// gave a position). Never decreases.
    #[must_use]
    pub fn confirmable(&self) -> Option<Lsn> {
        (!self.confirmed.is_zero()).then_some(self.confirmed)
    }

    /// The confirmable LSN if it advanced since the last call (or since
    /// construction), for sending a status update at once. Periodic status
    /// updates should use [`confirmable`](Self::confirmable) instead.
    pub fn poll_confirm(&mut self) -> Option<Lsn> {
        if self.confirmed > self.polled {
            self.polled = self.confirmed;
            Some(self.confirmed)
        } else {
            None
        }
    }

    /// Events registered and not yet acked.
    #[must_use]
    pub fn in_flight_events(&self) -> usize {
        self.in_flight_events
    }

    /// Bytes of the events registered and not yet acked.
    #[must_use]
    pub fn in_flight_bytes(&self) -> usize {
        self.in_flight_bytes
    }

    /// Candidates registered and not yet confirmable.
    #[must_use]
    pub fn pending_candidates(&self) -> usize {
        self.candidates.len()
    }

    /// The oldest event not yet acknowledged, if any (for the delivery
    /// deadline).
    #[must_use]
    pub fn oldest_unacked(&self) -> Option<u64> {
        (!self.ring.is_empty()).then_some(self.base)
    }

    /// The sequence number the next registered event will get.
    #[must_use]
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// `true` when nothing received is waiting for Kafka.
    fn is_idle(&self) -> bool {
        self.in_flight_events == 0 && self.candidates.is_empty() && self.covered == self.next
    }

    fn add_candidate(&mut self, lsn: Lsn) {
        self.covered = self.next;
        if self.next <= self.base {
            // Everything it covers is already acked.
            self.raise(lsn);
            return;
        }
        match self.candidates.back_mut() {
            // No event in between (e.g. an empty transaction): merge.
            Some(last) if last.seq_end == self.next => last.lsn = last.lsn.max(lsn),
            _ => self.candidates.push_back(Candidate {
                seq_end: self.next,
                lsn,
            }),
        }
    }

    /// Confirms every candidate whose events are all acked.
    fn advance(&mut self) {
        while let Some(candidate) = self.candidates.front() {
            if candidate.seq_end > self.base {
                break;
            }
            let lsn = candidate.lsn;
            self.candidates.pop_front();
            self.raise(lsn);
        }
    }

    fn raise(&mut self, lsn: Lsn) {
        self.confirmed = self.confirmed.max(lsn);
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod proptests;
