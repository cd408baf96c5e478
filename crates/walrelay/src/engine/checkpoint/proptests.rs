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
