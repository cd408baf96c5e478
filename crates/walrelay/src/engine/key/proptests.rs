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
