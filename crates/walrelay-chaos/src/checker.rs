//! The verdict over the whole history (see [`crate::history`]).
//!
//! * **Expected** events: every event of every unit in `chaos_ledger`
//!   (committed), and every non-transactional message PostgreSQL decoded.
//! * **Lost**: expected, never applied by the consumer.
//! * **Double-processed**: applied more than once (extra applications).
//! * **Rolled back but applied**: an event of a transaction that did not
//!   commit reached the consumer's table.
//! * **Order**: in each partition, the consumer applied events in commit
//!   order (event ids strictly increase in application order); with
//!   nothing lost, each partition's applications *equal* its events in
//!   commit order. Keys sorted numerically also follow commit order
//!   across all partitions and topics.
//! * **Wire**: per partition in offset order, every record is either a
//!   new key above all before it, or a repeat of a key seen before (a
//!   replay) — never a late new key, which a high-water-mark consumer
//!   would drop. Duplicates on the wire = records − distinct keys.
//! * **Confirmed before acknowledged**: [`crate::history::check_trace`].

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::event::EventId;
use crate::history::{Applied, TraceSummary, WireRecord};
use crate::workload::{ClientOutcome, Unit};

#[derive(Debug, Default)]
pub struct Verdict {
    pub units: usize,
    pub tx_units_committed: usize,
    pub tx_units_rolled_back: usize,
    pub tx_units_failed: usize,
    pub expected_tx_events: usize,
    pub expected_non_tx: usize,
    pub rolled_back_events: usize,
    pub applications: usize,
    pub lost: usize,
    pub double_processed: usize,
    pub rolled_back_applied: usize,
    pub unexpected_applied: usize,
    pub order_violations: usize,
    pub key_order_violations: usize,
    pub wire_records: usize,
    pub wire_distinct_keys: usize,
    pub wire_duplicates: usize,
    /// The relay ran with `relay.fence = false`: replayed duplicates on
    /// the wire are expected, not a failure.
    pub duplicates_allowed: bool,
    pub wire_late_keys: usize,
    pub wire_order_violations: usize,
    pub wire_missing: usize,
    pub wire_rolled_back: usize,
    pub key_conflicts: usize,
    pub ledger_anomalies: Vec<String>,
    pub examples: Vec<String>,
    /// The first few duplicates on the wire, where they are: apart from
    /// `examples`, which a run without the fence would fill with them.
    pub duplicate_examples: Vec<String>,
}

impl Verdict {
    fn example(&mut self, s: String) {
        if self.examples.len() < 20 {
            self.examples.push(s);
        }
    }

    /// Whether every check passed (the trace is judged separately).
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.double_processed == 0
            && self.rolled_back_applied == 0
            && self.unexpected_applied == 0
            && self.order_violations == 0
            && self.key_order_violations == 0
            && (self.duplicates_allowed || self.wire_duplicates == 0)
            && self.wire_late_keys == 0
            && self.wire_order_violations == 0
            && self.wire_missing == 0
            && self.wire_rolled_back == 0
            && self.key_conflicts == 0
            && self.ledger_anomalies.is_empty()
    }
}

pub fn check(
    units: &[Unit],
    ledger: &HashMap<u64, u32>,
    non_tx: &HashSet<EventId>,
    applied: &[Applied],
    wire: &[WireRecord],
) -> Verdict {
    let mut v = Verdict {
        units: units.len(),
        ..Verdict::default()
    };
    let history = committed(units, ledger, non_tx, &mut v);
    applications(applied, &history, &mut v);
    application_order(applied, &mut v);
    on_the_wire(wire, &history, &mut v);
    v
}

/// What committed, per PostgreSQL: the events expected once each, and the
/// units rolled back (or failed) whose events must never appear.
struct History {
    expected: HashSet<EventId>,
    rolled_back: HashSet<u64>,
}

impl History {
    fn is_rolled_back(&self, id: &EventId) -> bool {
        id.transactional && self.rolled_back.contains(&id.unit)
    }
}

/// The workload's units against the ledger and the audit slot's
/// non-transactional messages.
fn committed(
    units: &[Unit],
    ledger: &HashMap<u64, u32>,
    non_tx: &HashSet<EventId>,
    v: &mut Verdict,
) -> History {
    let by_unit: HashMap<u64, &Unit> = units.iter().map(|u| (u.unit, u)).collect();

    let mut expected: HashSet<EventId> = HashSet::new();
    let mut rolled_back: HashSet<u64> = HashSet::new();
    for u in units.iter().filter(|u| u.is_transaction()) {
        match (ledger.get(&u.unit), u.outcome) {
            (Some(&n), outcome) => {
                v.tx_units_committed += 1;
                if outcome == ClientOutcome::RolledBack {
                    v.ledger_anomalies.push(format!(
                        "unit {} was rolled back but is in the ledger",
                        u.unit
                    ));
                }
                if n != u.tx_events() {
                    v.ledger_anomalies.push(format!(
                        "unit {}: ledger says {n} events, the plan {}",
                        u.unit,
                        u.tx_events()
                    ));
                }
                expected.extend((0..u.tx_events()).map(|i| EventId::tx(u.unit, i)));
            }
            (None, ClientOutcome::Committed) => v.ledger_anomalies.push(format!(
                "unit {}: COMMIT succeeded but the ledger lacks it",
                u.unit
            )),
            (None, ClientOutcome::RolledBack) => {
                v.tx_units_rolled_back += 1;
                rolled_back.insert(u.unit);
                v.rolled_back_events += u.tx_events() as usize;
            }
            (None, ClientOutcome::Unknown) => {
                v.tx_units_failed += 1;
                rolled_back.insert(u.unit);
                v.rolled_back_events += u.tx_events() as usize;
            }
        }
    }
    for unit in ledger.keys() {
        if !by_unit.contains_key(unit) {
            v.ledger_anomalies
                .push(format!("the ledger holds unit {unit}, which was never run"));
        }
    }
    v.expected_tx_events = expected.len();
    for id in non_tx {
        match by_unit.get(&id.unit) {
            Some(u) if id.index < u.non_tx => {
                expected.insert(*id);
            }
            _ => v
                .ledger_anomalies
                .push(format!("PostgreSQL decoded a message {id} nobody wrote")),
        }
    }
    v.expected_non_tx = non_tx.len();
    History {
        expected,
        rolled_back,
    }
}

/// The consumer's applications: each expected event once, nothing else.
fn applications(applied: &[Applied], history: &History, v: &mut Verdict) {
    v.applications = applied.len();
    let mut counts: HashMap<EventId, u32> = HashMap::new();
    for a in applied {
        match a.event {
            Some(id) => *counts.entry(id).or_default() += 1,
            None => {
                v.unexpected_applied += 1;
                v.example(format!("applied an unknown payload {:?}", a.raw));
            }
        }
    }
    for (id, n) in &counts {
        if *n > 1 {
            v.double_processed += (*n - 1) as usize;
            v.example(format!("{id} applied {n} times"));
        }
        if history.is_rolled_back(id) {
            v.rolled_back_applied += 1;
            v.example(format!("{id} of a rolled-back transaction was applied"));
        } else if !history.expected.contains(id) {
            v.unexpected_applied += 1;
            v.example(format!("{id} applied but never committed"));
        }
    }
    let mut lost: Vec<&EventId> = history
        .expected
        .iter()
        .filter(|id| !counts.contains_key(id))
        .collect();
    lost.sort();
    v.lost = lost.len();
    for id in lost.iter().take(5) {
        v.example(format!("{id} committed but never applied"));
    }
}

/// Order of application per partition, and keys against commit order.
fn application_order(applied: &[Applied], v: &mut Verdict) {
    let mut last: HashMap<(&str, i32), (EventId, u128)> = HashMap::new();
    for a in applied {
        let Some(id) = a.event else { continue };
        if let Some((prev, prev_key)) = last.insert((a.topic.as_str(), a.partition), (id, a.key)) {
            if id <= prev || a.key <= prev_key {
                v.order_violations += 1;
                v.example(format!(
                    "{}/{}: {id} (key {:032x}) applied after {prev} (key {prev_key:032x})",
                    a.topic, a.partition, a.key
                ));
            }
        }
    }
    let mut by_key: Vec<(u128, EventId)> = applied
        .iter()
        .filter_map(|a| a.event.map(|e| (a.key, e)))
        .collect();
    by_key.sort();
    by_key.dedup();
    for w in by_key.windows(2) {
        if w[1].1 <= w[0].1 {
            v.key_order_violations += 1;
            v.example(format!(
                "key {:032x} ({}) < key {:032x} ({}) but commit order is the reverse",
                w[0].0, w[0].1, w[1].0, w[1].1
            ));
        }
    }
}

/// The wire: one key per event, in order per partition, nothing rolled
/// back, nothing missing; duplicates counted.
fn on_the_wire(wire: &[WireRecord], history: &History, v: &mut Verdict) {
    v.wire_records = wire.len();
    let mut partitions: BTreeMap<(u8, i32), Vec<&WireRecord>> = BTreeMap::new();
    for r in wire {
        partitions
            .entry((r.topic_index, r.partition))
            .or_default()
            .push(r);
    }
    let mut key_of: HashMap<EventId, u128> = HashMap::new();
    let mut on_wire: HashSet<EventId> = HashSet::new();
    let mut distinct: HashSet<u128> = HashSet::new();
    for ((t, p), mut records) in partitions {
        records.sort_by_key(|r| r.offset);
        // Each key's first offset in the partition.
        let mut seen: HashMap<u128, i64> = HashMap::new();
        let mut hwm: Option<(u128, Option<EventId>)> = None;
        for r in records {
            let Some(k) = r.key else {
                v.wire_late_keys += 1;
                v.example(format!("topic #{t}/{p} offset {}: no key", r.offset));
                continue;
            };
            distinct.insert(k);
            if let Some(id) = r.event {
                on_wire.insert(id);
                if *key_of.entry(id).or_insert(k) != k {
                    v.key_conflicts += 1;
                    v.example(format!("{id} was sent with two different keys"));
                }
                if history.is_rolled_back(&id) {
                    v.wire_rolled_back += 1;
                }
            }
            match hwm {
                Some((h, _)) if k <= h => {
                    if let Some(first) = seen.get(&k) {
                        if v.duplicate_examples.len() < 5 {
                            v.duplicate_examples.push(format!(
                                "topic #{t}/{p} offset {}: key {k:032x} again (first at offset {first})",
                                r.offset
                            ));
                        }
                    } else {
                        v.wire_late_keys += 1;
                        v.example(format!(
                            "topic #{t}/{p} offset {}: new key {k:032x} below the mark",
                            r.offset
                        ));
                    }
                }
                _ => {
                    if let (Some((_, Some(prev))), Some(id)) = (hwm, r.event) {
                        if id <= prev {
                            v.wire_order_violations += 1;
                            v.example(format!("topic #{t}/{p}: {id} after {prev} on the wire"));
                        }
                    }
                    seen.insert(k, r.offset);
                    hwm = Some((k, r.event.or(hwm.and_then(|h| h.1))));
                }
            }
        }
    }
    v.wire_distinct_keys = distinct.len();
    v.wire_duplicates = wire.len().saturating_sub(distinct.len());
    v.wire_missing = history
        .expected
        .iter()
        .filter(|id| !on_wire.contains(id))
        .count();
}

/// The result table, in Markdown.
pub fn table(
    v: &Verdict,
    trace: &TraceSummary,
    faults: &crate::faults::FaultLog,
    extra: &[(String, String)],
) -> String {
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut row = |k: &str, val: String| rows.push((k.to_owned(), val));
    row(
        "events committed (expected exactly once)",
        (v.expected_tx_events + v.expected_non_tx).to_string(),
    );
    row("  transactional events", v.expected_tx_events.to_string());
    row(
        "  non-transactional messages",
        v.expected_non_tx.to_string(),
    );
    row(
        "units: transactions committed / rolled back / failed by faults / total units",
        format!(
            "{} / {} / {} / {}",
            v.tx_units_committed, v.tx_units_rolled_back, v.tx_units_failed, v.units
        ),
    );
    row(
        "events of rolled-back or failed transactions",
        v.rolled_back_events.to_string(),
    );
    for (k, n) in &faults.counts {
        row(&format!("fault: {k}"), n.to_string());
    }
    row(
        "  consumer kills with applied-but-uncommitted offsets (checked)",
        faults.consumer_in_window.to_string(),
    );
    for (k, val) in extra {
        row(k, val.clone());
    }
    row(
        "relay sessions / failed sessions (trace)",
        format!("{} / {}", trace.sessions, trace.failed_sessions),
    );
    row(
        "records produced / acknowledged (trace)",
        format!("{} / {}", trace.produced, trace.acked),
    );
    row(
        "confirmations checked / confirmed before acknowledged",
        format!("{} / {}", trace.confirmations, trace.violation_count),
    );
    row("consumer applications", v.applications.to_string());
    row("**lost**", v.lost.to_string());
    row("**double-processed**", v.double_processed.to_string());
    row(
        "**rolled-back events applied**",
        v.rolled_back_applied.to_string(),
    );
    row(
        "unexpected events applied",
        v.unexpected_applied.to_string(),
    );
    row(
        "per-partition order violations (consumer / wire)",
        format!("{} / {}", v.order_violations, v.wire_order_violations),
    );
    row(
        "keys out of commit order",
        v.key_order_violations.to_string(),
    );
    row(
        "records on the wire / distinct keys",
        format!("{} / {}", v.wire_records, v.wire_distinct_keys),
    );
    row(
        if v.duplicates_allowed {
            "duplicates on the wire (tail fence off)"
        } else {
            "**duplicates on the wire** (tail fence on: must be 0)"
        },
        v.wire_duplicates.to_string(),
    );
    row(
        "new keys below a partition's mark on the wire",
        v.wire_late_keys.to_string(),
    );
    row(
        "committed events missing on the wire",
        v.wire_missing.to_string(),
    );
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(10);
    let mut out = format!(
        "| {:width$} | value |\n|{}|-------|\n",
        "",
        "-".repeat(width + 2)
    );
    for (k, val) in rows {
        out.push_str(&format!("| {k:width$} | {val} |\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Segment;

    fn unit(n: u64, events: u32, outcome: ClientOutcome) -> Unit {
        Unit {
            unit: n,
            segments: vec![Segment::Raw(events)],
            non_tx: 0,
            rollback: outcome == ClientOutcome::RolledBack,
            outcome,
        }
    }

    fn applied(id: EventId, partition: i32, key: u128) -> Applied {
        Applied {
            event: Some(id),
            raw: id.to_string(),
            topic: "t".into(),
            partition,
            offset: 0,
            key,
        }
    }

    fn wire(id: EventId, offset: i64, key: u128) -> WireRecord {
        WireRecord {
            topic_index: 0,
            partition: 0,
            offset,
            key: Some(key),
            event: Some(id),
        }
    }

    /// Units 1 (committed, 2 events) and 2 (rolled back, 1 event).
    fn history() -> (Vec<Unit>, HashMap<u64, u32>) {
        (
            vec![
                unit(1, 2, ClientOutcome::Committed),
                unit(2, 1, ClientOutcome::RolledBack),
            ],
            HashMap::from([(1, 2)]),
        )
    }

    #[test]
    fn a_clean_history_passes_and_every_kind_of_failure_is_caught() {
        let (units, ledger) = history();
        let (a, b) = (EventId::tx(1, 0), EventId::tx(1, 1));
        let ok = [applied(a, 0, 10), applied(b, 0, 11)];
        let on_wire = [
            wire(a, 0, 10),
            wire(b, 1, 11),
            wire(a, 2, 10),
            wire(b, 3, 11),
        ];
        let mut v = check(&units, &ledger, &HashSet::new(), &ok, &on_wire);
        assert_eq!(v.wire_duplicates, 2);
        assert_eq!(
            v.duplicate_examples,
            [
                format!(
                    "topic #0/0 offset 2: key {:032x} again (first at offset 0)",
                    10
                ),
                format!(
                    "topic #0/0 offset 3: key {:032x} again (first at offset 1)",
                    11
                ),
            ]
        );
        // The tail fence keeps replays off the wire: duplicates there
        // fail the run, unless it ran with the fence off.
        assert!(!v.passed(), "{v:?}");
        v.duplicates_allowed = true;
        assert!(v.passed(), "{v:?}");
        let v = check(&units, &ledger, &HashSet::new(), &ok, &on_wire[..2]);
        assert!(v.passed(), "{v:?}");

        let v = check(&units, &ledger, &HashSet::new(), &ok[..1], &on_wire);
        assert_eq!(v.lost, 1);
        assert!(!v.passed());

        let twice = [ok[0].clone(), ok[1].clone(), ok[1].clone()];
        let v = check(&units, &ledger, &HashSet::new(), &twice, &on_wire);
        assert_eq!(v.double_processed, 1);
        assert!(!v.passed());

        let reversed = [applied(b, 0, 11), applied(a, 0, 10)];
        let v = check(&units, &ledger, &HashSet::new(), &reversed, &on_wire);
        assert_eq!(v.order_violations, 1);
        assert!(!v.passed());

        // Keys that contradict commit order, in different partitions.
        let swapped = [applied(a, 0, 11), applied(b, 1, 10)];
        let v = check(&units, &ledger, &HashSet::new(), &swapped, &on_wire);
        assert_eq!(v.key_order_violations, 1);

        let rolled_back = [
            ok[0].clone(),
            ok[1].clone(),
            applied(EventId::tx(2, 0), 1, 20),
        ];
        let v = check(&units, &ledger, &HashSet::new(), &rolled_back, &on_wire);
        assert_eq!(v.rolled_back_applied, 1);
        assert!(!v.passed());

        // A new key below the partition's mark on the wire.
        let late = [wire(b, 0, 11), wire(a, 1, 10)];
        let v = check(&units, &ledger, &HashSet::new(), &ok, &late);
        assert_eq!(v.wire_late_keys, 1);
        assert!(!v.passed());

        // A COMMIT that succeeded but is not in the ledger.
        let v = check(&units, &HashMap::new(), &HashSet::new(), &[], &[]);
        assert_eq!(v.ledger_anomalies.len(), 1);
    }

    #[test]
    fn decoded_non_transactional_messages_are_expected() {
        let mut units = vec![unit(1, 1, ClientOutcome::Committed)];
        units[0].non_tx = 1;
        let ledger = HashMap::from([(1, 1)]);
        let n = EventId::non_tx(1, 0);
        let t = EventId::tx(1, 0);
        let decoded = HashSet::from([n]);
        let v = check(&units, &ledger, &decoded, &[applied(t, 0, 10)], &[]);
        assert_eq!(v.lost, 1, "the decoded message was never applied");
        let v = check(
            &units,
            &ledger,
            &HashSet::new(),
            &[applied(n, 0, 5), applied(t, 0, 10)],
            &[],
        );
        assert_eq!(
            v.unexpected_applied, 1,
            "applied, but PostgreSQL never decoded it"
        );
    }
}
