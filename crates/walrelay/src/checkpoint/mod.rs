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
//! # Cost
//!
//! O(1) amortized per event: acknowledgement flags live in a ring
//! ([`VecDeque`]) indexed by `seq - base`, the acknowledged prefix is popped
//! as it forms, and candidates sit in a second ring in registration order.
//! Beyond the rings' amortized growth nothing is allocated per event.

use std::collections::VecDeque;

use walrelay_pgoutput::Lsn;

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
mod tests {
    use super::*;

    #[test]
    fn nothing_confirmable_at_start() {
        let mut t = CheckpointTracker::new();
        assert_eq!(t.confirmable(), None);
        assert_eq!(t.poll_confirm(), None);
        let t = CheckpointTracker::with_confirmed(Lsn(0x500));
        assert_eq!(t.confirmable(), Some(Lsn(0x500)));
    }

    #[test]
    fn out_of_order_acks_across_partitions() {
        let mut t = CheckpointTracker::new();
        // Transaction 1: events 0, 1; transaction 2: events 2, 3.
        let a = t.register_event(10);
        let b = t.register_event(20);
        t.commit(Lsn(0x100));
        let c = t.register_event(30);
        let d = t.register_event(40);
        t.commit(Lsn(0x200));
        assert_eq!((a, b, c, d), (0, 1, 2, 3));
        assert_eq!(t.in_flight_events(), 4);
        assert_eq!(t.in_flight_bytes(), 100);

        // Partition X acks 1 and 3, partition Y is slow.
        t.ack(d).unwrap();
        t.ack(b).unwrap();
        assert_eq!(t.confirmable(), None);
        assert_eq!(t.in_flight_bytes(), 40);
        t.ack(a).unwrap();
        assert_eq!(t.confirmable(), Some(Lsn(0x100)));
        assert_eq!(t.poll_confirm(), Some(Lsn(0x100)));
        assert_eq!(t.poll_confirm(), None);
        t.ack(c).unwrap();
        assert_eq!(t.confirmable(), Some(Lsn(0x200)));
        assert_eq!(t.poll_confirm(), Some(Lsn(0x200)));
        assert_eq!(t.in_flight_events(), 0);
        assert_eq!(t.in_flight_bytes(), 0);
        assert_eq!(t.pending_candidates(), 0);
    }

    #[test]
    fn last_event_acked_first_does_not_confirm() {
        let mut t = CheckpointTracker::new();
        let seqs: Vec<u64> = (0..5).map(|_| t.register_event(1)).collect();
        t.commit(Lsn(0x300));
        t.ack(seqs[4]).unwrap();
        t.ack(seqs[3]).unwrap();
        t.ack(seqs[1]).unwrap();
        t.ack(seqs[0]).unwrap();
        assert_eq!(t.confirmable(), None);
        t.ack(seqs[2]).unwrap();
        assert_eq!(t.confirmable(), Some(Lsn(0x300)));
    }

    #[test]
    fn empty_transactions() {
        let mut t = CheckpointTracker::new();
        // Nothing in flight: confirmable at once.
        t.commit(Lsn(0x100));
        assert_eq!(t.confirmable(), Some(Lsn(0x100)));
        // Behind an unacked event: waits for it, merged candidates.
        let e = t.register_event(5);
        t.commit(Lsn(0x200));
        t.commit(Lsn(0x280));
        t.commit(Lsn(0x300));
        assert_eq!(t.pending_candidates(), 1);
        assert_eq!(t.confirmable(), Some(Lsn(0x100)));
        t.ack(e).unwrap();
        assert_eq!(t.confirmable(), Some(Lsn(0x300)));
    }

    #[test]
    fn standalone_between_transactions() {
        let mut t = CheckpointTracker::new();
        let a = t.register_event(1);
        t.commit(Lsn(0x100));
        let m = t.register_event(1);
        t.standalone(Lsn(0x160));
        let b = t.register_event(1);
        t.commit(Lsn(0x200));

        t.ack(m).unwrap();
        assert_eq!(t.confirmable(), None);
        t.ack(a).unwrap();
        assert_eq!(t.confirmable(), Some(Lsn(0x160)));
        t.ack(b).unwrap();
        assert_eq!(t.confirmable(), Some(Lsn(0x200)));
    }

    #[test]
    fn keepalive_when_idle_confirms_wal_end() {
        let mut t = CheckpointTracker::new();
        t.keepalive(Lsn(0x1000), false);
        assert_eq!(t.confirmable(), Some(Lsn(0x1000)));
        assert_eq!(t.poll_confirm(), Some(Lsn(0x1000)));
    }

    #[test]
    fn keepalive_with_events_in_flight_does_not_confirm() {
        let mut t = CheckpointTracker::new();
        let e = t.register_event(1);
        t.commit(Lsn(0x100));
        t.keepalive(Lsn(0x1000), false);
        assert_eq!(t.confirmable(), None);
        t.ack(e).unwrap();
        // The candidate, not the earlier keepalive.
        assert_eq!(t.confirmable(), Some(Lsn(0x100)));
        t.keepalive(Lsn(0x1000), false);
        assert_eq!(t.confirmable(), Some(Lsn(0x1000)));
    }

    #[test]
    fn keepalive_with_acked_but_uncovered_event_does_not_confirm() {
        // A non-transactional message registered and acked before its
        // `standalone` call: not covered yet, so not idle.
        let mut t = CheckpointTracker::new();
        let e = t.register_event(1);
        t.ack(e).unwrap();
        t.keepalive(Lsn(0x1000), false);
        assert_eq!(t.confirmable(), None);
        t.standalone(Lsn(0x80));
        assert_eq!(t.confirmable(), Some(Lsn(0x80)));
        t.keepalive(Lsn(0x1000), false);
        assert_eq!(t.confirmable(), Some(Lsn(0x1000)));
    }

    #[test]
    fn keepalive_inside_transaction_does_not_confirm() {
        let mut t = CheckpointTracker::new();
        // Begin received, no event yet.
        t.keepalive(Lsn(0x1000), true);
        assert_eq!(t.confirmable(), None);
        // Events of the open transaction, all acked.
        let e = t.register_event(1);
        t.ack(e).unwrap();
        t.keepalive(Lsn(0x1000), true);
        assert_eq!(t.confirmable(), None);
        t.commit(Lsn(0x900));
        assert_eq!(t.confirmable(), Some(Lsn(0x900)));
        t.keepalive(Lsn(0x1000), false);
        assert_eq!(t.confirmable(), Some(Lsn(0x1000)));
    }

    #[test]
    fn confirmed_never_goes_backwards() {
        let mut t = CheckpointTracker::with_confirmed(Lsn(0x500));
        t.keepalive(Lsn(0x400), false);
        assert_eq!(t.confirmable(), Some(Lsn(0x500)));
        assert_eq!(t.poll_confirm(), None);
        t.commit(Lsn(0x300));
        assert_eq!(t.confirmable(), Some(Lsn(0x500)));
        t.keepalive(Lsn(0x800), false);
        let e = t.register_event(1);
        t.commit(Lsn(0x700));
        t.ack(e).unwrap();
        assert_eq!(t.confirmable(), Some(Lsn(0x800)));
    }

    #[test]
    fn ack_errors() {
        let mut t = CheckpointTracker::new();
        let a = t.register_event(7);
        let b = t.register_event(7);
        assert_eq!(t.ack(5), Err(AckError::Unknown { seq: 5, next: 2 }));
        t.ack(b).unwrap();
        assert_eq!(t.ack(b), Err(AckError::AlreadyAcked { seq: b }));
        t.ack(a).unwrap();
        // Popped from the ring: still recognised as a duplicate.
        assert_eq!(t.ack(a), Err(AckError::AlreadyAcked { seq: a }));
        assert_eq!(t.in_flight_events(), 0);
        assert_eq!(t.in_flight_bytes(), 0);
        assert!(AckError::Unknown { seq: 5, next: 2 }
            .to_string()
            .contains("never registered"));
    }

    #[test]
    fn many_events_keep_the_ring_small() {
        let mut t = CheckpointTracker::new();
        for i in 0..10_000u64 {
            let s = t.register_event(100);
            t.ack(s).unwrap();
            t.commit(Lsn(0x1000 + i));
        }
        assert_eq!(t.ring.len(), 0);
        assert_eq!(t.candidates.len(), 0);
        assert_eq!(t.confirmable(), Some(Lsn(0x1000 + 9_999)));
    }
}

#[cfg(test)]
mod proptests {
    //! Random interleavings checked against a naive model.

    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// Begin a transaction (if none is open).
        Begin,
        /// Register an event in the open transaction.
        Event(usize),
        /// Commit the open transaction.
        Commit,
        /// A non-transactional message (only outside a transaction).
        Standalone(usize),
        /// Ack the `n`-th (modulo) unacked event.
        Ack(usize),
        /// A keepalive advancing the WAL by the given amount.
        Keepalive(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => Just(Op::Begin),
            4 => (0..1000usize).prop_map(Op::Event),
            2 => Just(Op::Commit),
            1 => (0..1000usize).prop_map(Op::Standalone),
            6 => any::<usize>().prop_map(Op::Ack),
            2 => (0..50u64).prop_map(Op::Keepalive),
        ]
    }

    /// Naive model: every event and candidate of the current session.
    #[derive(Default)]
    struct Model {
        /// (seq, bytes, acked)
        events: Vec<(u64, usize, bool)>,
        /// (seq_end, lsn): covers every event with seq < seq_end.
        candidates: Vec<(u64, Lsn)>,
        confirmed: Lsn,
        /// (final_lsn, end_lsn) of the open transaction.
        open_tx: Option<(u64, u64)>,
        wal: u64,
    }

    impl Model {
        fn all_acked_below(&self, seq_end: u64) -> bool {
            self.events
                .iter()
                .all(|&(seq, _, acked)| acked || seq >= seq_end)
        }

        fn recompute(&mut self) {
            for &(seq_end, lsn) in &self.candidates {
                if self.all_acked_below(seq_end) {
                    self.confirmed = self.confirmed.max(lsn);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn matches_model_and_never_confirms_unacked(ops in prop::collection::vec(op(), 0..200)) {
            let mut t = CheckpointTracker::new();
            let mut m = Model::default();
            let mut last_confirmed = None;
            for op in ops {
                match op {
                    Op::Begin => {
                        if m.open_tx.is_none() {
                            // The server has read the commit record
                            // (wal+5 .. wal+10) when it sends Begin.
                            m.open_tx = Some((m.wal + 5, m.wal + 10));
                            m.wal += 10;
                        }
                    }
                    Op::Event(bytes) => {
                        if m.open_tx.is_some() {
                            let seq = t.register_event(bytes);
                            m.events.push((seq, bytes, false));
                        }
                    }
                    Op::Commit => {
                        if let Some((_, end_lsn)) = m.open_tx.take() {
                            t.commit(Lsn(end_lsn));
                            m.candidates.push((t.next_seq(), Lsn(end_lsn)));
                        }
                    }
                    Op::Standalone(bytes) => {
                        if m.open_tx.is_none() {
                            let seq = t.register_event(bytes);
                            m.events.push((seq, bytes, false));
                            m.wal += 10;
                            t.standalone(Lsn(m.wal));
                            m.candidates.push((t.next_seq(), Lsn(m.wal)));
                        }
                    }
                    Op::Ack(n) => {
                        let unacked: Vec<usize> = m
                            .events
                            .iter()
                            .enumerate()
                            .filter(|(_, e)| !e.2)
                            .map(|(i, _)| i)
                            .collect();
                        if !unacked.is_empty() {
                            let i = unacked[n % unacked.len()];
                            t.ack(m.events[i].0).unwrap();
                            m.events[i].2 = true;
                            prop_assert_eq!(
                                t.ack(m.events[i].0),
                                Err(AckError::AlreadyAcked { seq: m.events[i].0 })
                            );
                        }
                    }
                    Op::Keepalive(advance) => {
                        m.wal += advance;
                        t.keepalive(Lsn(m.wal), m.open_tx.is_some());
                        let idle = m.open_tx.is_none()
                            && m.events.iter().all(|e| e.2)
                            && m.candidates.iter().all(|&(end, _)| m.all_acked_below(end));
                        if idle {
                            m.confirmed = m.confirmed.max(Lsn(m.wal));
                        }
                    }
                }
                m.recompute();

                let confirmed = t.confirmable();
                prop_assert_eq!(confirmed, (!m.confirmed.is_zero()).then_some(m.confirmed));
                // Safety: every candidate at or below the confirmed position
                // (of this session) has all its events acked.
                if let Some(c) = confirmed {
                    for &(seq_end, lsn) in &m.candidates {
                        if lsn <= c {
                            prop_assert!(m.all_acked_below(seq_end), "confirmed {} too early", c);
                        }
                    }
                    // An open transaction must not be skipped on restart.
                    if let Some((final_lsn, _)) = m.open_tx {
                        prop_assert!(c.0 <= final_lsn, "confirmed {} past open tx", c);
                    }
                    // Monotonic.
                    prop_assert!(last_confirmed.is_none_or(|l| l <= c));
                }
                last_confirmed = confirmed;

                let unacked: Vec<_> = m.events.iter().filter(|e| !e.2).collect();
                prop_assert_eq!(t.in_flight_events(), unacked.len());
                prop_assert_eq!(t.in_flight_bytes(), unacked.iter().map(|e| e.1).sum::<usize>());
            }

            // Ack everything left: the last candidate becomes confirmable.
            let left: Vec<u64> = m.events.iter().filter(|e| !e.2).map(|e| e.0).collect();
            for seq in left {
                t.ack(seq).unwrap();
            }
            if let Some(&(_, last)) = m.candidates.last() {
                prop_assert!(t.confirmable() >= Some(last));
                prop_assert_eq!(t.confirmable(), Some(m.confirmed.max(last)));
            }
            prop_assert_eq!(t.in_flight_events(), 0);
            prop_assert_eq!(t.in_flight_bytes(), 0);
        }
    }
}
