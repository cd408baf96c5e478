//! Which records of a batch are new: the pure dedupe decision behind every
//! batch transaction.
//!
//! A batch holds consecutive records of one partition, possibly of several
//! sources. Each source has its own high-water mark. Walking the batch in
//! order with a *running* mark per source (the stored mark, then raised by
//! every record taken) decides each record:
//!
//! * key at or below the running mark: a duplicate (a relay replay puts
//!   lower keys after higher ones inside one batch too), dropped;
//! * above it: new, applied, and the running mark becomes its key.
//!
//! A new record whose previous key (`walrelay-prev` or `walrelay-prev-key`) is above the running mark is
//! also a **gap**: the record the relay sent before it was never
//! processed. It is still applied (see the crate docs); a running mark at
//! its initial value is never compared, since new groups start mid-stream.
//!
//! The batch transaction raises each stored mark to its running mark at
//! the end, so the marks move exactly as if the records were applied one
//! transaction each.

use std::collections::BTreeMap;

use walrelay_contract::EventKey;

use crate::meta::RecordMeta;
use crate::position::INITIAL_HWM;

/// A gap found in a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gap {
    /// Index of the record (in the batch) that revealed it.
    pub index: usize,
    /// Its source.
    pub source: String,
    /// The running mark it was compared with.
    pub hwm: EventKey,
    /// Its previous key (`walrelay-prev` or `walrelay-prev-key`), above the mark.
    pub prev: EventKey,
}

/// What to do with a batch, given the marks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Indexes of the new records, in batch order.
    pub apply: Vec<usize>,
    /// How many records were duplicates.
    pub duplicates: usize,
    /// Gaps revealed by new records.
    pub gaps: Vec<Gap>,
    /// The marks after the batch, for every source whose mark rises.
    pub raised: BTreeMap<String, EventKey>,
}

impl Plan {
    /// Whether nothing in the batch is new.
    pub fn is_all_duplicates(&self) -> bool {
        self.apply.is_empty()
    }
}

/// Decides every record of a batch against `marks` (per source; a missing
/// source is at [`INITIAL_HWM`]). See the module docs.
pub fn plan<'a, I>(marks: &BTreeMap<String, EventKey>, records: I) -> Plan
where
    I: IntoIterator<Item = &'a RecordMeta>,
{
    let mut plan = Plan::default();
    for (index, meta) in records.into_iter().enumerate() {
        let running = plan
            .raised
            .get(&meta.source)
            .or_else(|| marks.get(&meta.source))
            .copied()
            .unwrap_or(INITIAL_HWM);
        if meta.key <= running {
            plan.duplicates += 1;
            continue;
        }
        if let Some(prev) = meta.prev_key {
            if running != INITIAL_HWM && prev > running {
                plan.gaps.push(Gap {
                    index,
                    source: meta.source.clone(),
                    hwm: running,
                    prev,
                });
            }
        }
        plan.apply.push(index);
        match plan.raised.get_mut(&meta.source) {
            Some(mark) => *mark = meta.key,
            None => {
                plan.raised.insert(meta.source.clone(), meta.key);
            }
        }
    }
    plan
}

/// The distinct sources of a batch, sorted: the order in which the batch
/// transaction locks their mark rows, so that two members applying batches
/// of one partition never deadlock.
pub fn sources<'a, I>(records: I) -> Vec<String>
where
    I: IntoIterator<Item = &'a RecordMeta>,
{
    let mut sources: Vec<String> = Vec::new();
    for meta in records {
        if !sources.contains(&meta.source) {
            sources.push(meta.source.clone());
        }
    }
    sources.sort_unstable();
    sources
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(source: &str, key: u64, prev: Option<u64>) -> RecordMeta {
        RecordMeta {
            key: EventKey::new(key, 0),
            source: source.to_owned(),
            lsn: None,
            commit_lsn: None,
            prev_key: prev.map(|p| EventKey::new(p, 0)),
        }
    }

    fn marks(pairs: &[(&str, u64)]) -> BTreeMap<String, EventKey> {
        pairs
            .iter()
            .map(|(s, k)| ((*s).to_owned(), EventKey::new(*k, 0)))
            .collect()
    }

    #[test]
    fn new_records_raise_the_running_mark() {
        let batch = [
            meta("a", 1, None),
            meta("a", 2, Some(1)),
            meta("a", 3, Some(2)),
        ];
        let p = plan(&BTreeMap::new(), &batch);
        assert_eq!(p.apply, vec![0, 1, 2]);
        assert_eq!(p.duplicates, 0);
        assert!(p.gaps.is_empty());
        assert_eq!(p.raised, marks(&[("a", 3)]));
    }

    #[test]
    fn replays_inside_a_batch_are_dropped() {
        // A relay replay: 3, 4 arrive again after 5.
        let batch = [
            meta("a", 3, Some(2)),
            meta("a", 4, Some(3)),
            meta("a", 5, Some(4)),
            meta("a", 3, None),
            meta("a", 4, Some(3)),
            meta("a", 5, Some(4)),
            meta("a", 6, Some(5)),
        ];
        let p = plan(&marks(&[("a", 2)]), &batch);
        assert_eq!(p.apply, vec![0, 1, 2, 6]);
        assert_eq!(p.duplicates, 3);
        assert!(p.gaps.is_empty(), "{:?}", p.gaps);
        assert_eq!(p.raised, marks(&[("a", 6)]));
    }

    #[test]
    fn stored_marks_drop_old_records() {
        let batch = [meta("a", 1, None), meta("a", 2, Some(1))];
        let p = plan(&marks(&[("a", 2)]), &batch);
        assert!(p.is_all_duplicates());
        assert_eq!(p.duplicates, 2);
        assert!(p.raised.is_empty());
    }

    #[test]
    fn two_sources_keep_separate_marks() {
        // Source b's keys are far below a's: not comparable, both new.
        let batch = [
            meta("a", 100, Some(99)),
            meta("b", 5, Some(4)),
            meta("a", 101, Some(100)),
            meta("b", 4, None),
            meta("b", 6, Some(5)),
        ];
        let p = plan(&marks(&[("a", 99), ("b", 4)]), &batch);
        assert_eq!(p.apply, vec![0, 1, 2, 4]);
        assert_eq!(p.duplicates, 1);
        assert_eq!(p.raised, marks(&[("a", 101), ("b", 6)]));
    }

    #[test]
    fn gaps_are_reported_and_still_applied() {
        let batch = [
            // prev 12 > mark 10: 11 and 12 were never processed.
            meta("a", 13, Some(12)),
            meta("a", 14, Some(13)),
            // Within the batch: 15 missing.
            meta("a", 16, Some(15)),
            // A session start (no prev): never a gap.
            meta("a", 20, None),
        ];
        let p = plan(&marks(&[("a", 10)]), &batch);
        assert_eq!(p.apply, vec![0, 1, 2, 3]);
        assert_eq!(
            p.gaps,
            vec![
                Gap {
                    index: 0,
                    source: "a".into(),
                    hwm: EventKey::new(10, 0),
                    prev: EventKey::new(12, 0),
                },
                Gap {
                    index: 2,
                    source: "a".into(),
                    hwm: EventKey::new(14, 0),
                    prev: EventKey::new(15, 0),
                },
            ]
        );
    }

    #[test]
    fn initial_mark_is_never_a_gap() {
        // A new group starting mid-stream.
        let p = plan(&BTreeMap::new(), &[meta("a", 50, Some(49))]);
        assert!(p.gaps.is_empty());
        assert_eq!(p.apply, vec![0]);
    }

    #[test]
    fn duplicates_are_not_gaps() {
        let p = plan(&marks(&[("a", 10)]), &[meta("a", 9, Some(8))]);
        assert!(p.gaps.is_empty());
        assert_eq!(p.duplicates, 1);
    }

    #[test]
    fn sources_are_distinct_and_sorted() {
        let batch = [meta("b", 1, None), meta("a", 1, None), meta("b", 2, None)];
        assert_eq!(sources(&batch), vec!["a".to_owned(), "b".to_owned()]);
    }
}
