//! Unit tests of the key assigner: positions, LSN checks and the errors for malformed streams.

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
