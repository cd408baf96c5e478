//! Unit tests of the checkpoint tracker: what becomes confirmable as acks arrive out of order.

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
