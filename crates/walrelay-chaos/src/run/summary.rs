//! The end of a run besides the history check: what says the run itself
//! did not do what it meant to (coverage, unexpected exits), and the
//! report's rows besides the verdict's.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Injected, Procs};
use crate::checker::Verdict;
use crate::faults::{FaultKind, FaultLog};
use crate::history::Auditor;
use crate::{Options, Plan};

/// What says the run itself did not do what it meant to: unexpected
/// exits, faults that never ran, too few events.
pub(super) fn harness_failures(
    plan: &Plan,
    procs: &Procs,
    auditor: &Auditor,
    log: &FaultLog,
    verdict: &Verdict,
    failures: &mut Vec<String>,
) {
    for f in &log.sigterm_failures {
        failures.push(format!("relay SIGTERM did not exit 0: {f}"));
    }
    for e in procs
        .relay
        .unexpected_exits
        .iter()
        .chain(&procs.consumer.unexpected_exits)
        .chain(procs.others.iter().flat_map(|o| &o.proc.unexpected_exits))
    {
        failures.push(format!("unexpected exit: {e}"));
    }
    if !auditor.malformed.is_empty() {
        failures.push(format!(
            "unparsable audit rows: {:?}",
            &auditor.malformed[..1]
        ));
    }
    for &k in &plan.kinds {
        if log.count(k) < plan.min_each {
            failures.push(format!("only {} × {k}", log.count(k)));
        }
    }
    if log.count(FaultKind::ConsumerKill) > 0 && log.consumer_in_window == 0 {
        failures.push(
            "no consumer kill was shown to land between the database commit and the offset commit"
                .into(),
        );
    }
    if plan.schedule.remaining() > 0 {
        failures.push(format!(
            "{} scheduled faults never ran",
            plan.schedule.remaining()
        ));
    }
    if verdict.expected_tx_events as u64 + (verdict.expected_non_tx as u64) < plan.events {
        failures.push(format!(
            "only {} events committed, fewer than the {} planned",
            verdict.expected_tx_events + verdict.expected_non_tx,
            plan.events
        ));
    }
}

/// The report's rows besides the verdict's.
pub(super) fn extra_rows(
    o: &Options,
    procs: &Procs,
    injected: &Injected,
    other_verdicts: &[(&'static str, Verdict)],
    failovers: Option<usize>,
    elapsed: Duration,
) -> Vec<(String, String)> {
    let log = &injected.log;
    let mut extra = vec![(
        "brokers".to_string(),
        match o.brokers {
            3 => "three Apache Kafka nodes (RF 3, min.insync.replicas 2)".to_string(),
            _ => "one, behind the fault proxy".to_string(),
        },
    )];
    if let Some(failovers) = failovers {
        extra.push((
            "source PostgreSQL".to_string(),
            format!(
                "a primary and a failover standby (synchronous commit, \
                 synchronized_standby_slots); {failovers} failovers"
            ),
        ));
    }
    extra.extend(super::others::rows(&procs.others, other_verdicts));
    extra.extend([
        (
            "consumer kills without a new record (plain kill -9)".to_string(),
            log.consumer_idle_kills.to_string(),
        ),
        (
            "walsender terminations that found none (relay reconnecting)".to_string(),
            log.walsender_absent.to_string(),
        ),
        (
            "workload statements failed by faults".to_string(),
            injected.progress.errors.load(Ordering::Relaxed).to_string(),
        ),
        (
            "relay / consumer processes started".to_string(),
            format!("{} / {}", procs.relay.starts, procs.consumer.starts),
        ),
        (
            "wall time".to_string(),
            format!("{:.0} s", elapsed.as_secs_f64()),
        ),
    ]);
    extra
}
