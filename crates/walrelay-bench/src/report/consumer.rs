//! The consumer section of the report: the throughput/cost table, the
//! end-to-end latency tables ([`super::e2e`]), and the consumer targets, all as medians over repeats.
//! (It lived in the consumer runner, which made the report import a
//! runner and the runner import the report; it reads only [`crate::runs`].)

use std::fmt::Write as _;

use super::{Stat, TargetCheck};
use crate::runs::{Consumer, ConsumerLatencyRun, ConsumerRun};

/// Medians of one consumer on one partition count.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub rate: Stat,
    /// Seconds from the consumer's start to its first record.
    pub first_record_s: Stat,
    pub cpu_us: Stat,
    pub db_cpu_us: Stat,
    pub state_rows: i64,
    pub state_bytes: i64,
    pub records: u64,
    /// Median over the repeats of records per batch and of pauses.
    pub batch_mean: Option<f64>,
    pub pauses: Option<f64>,
}

pub fn summary(runs: &[ConsumerRun], consumer: Consumer, partitions: i32) -> Option<Summary> {
    let of: Vec<&ConsumerRun> = runs
        .iter()
        .filter(|r| r.consumer == consumer && r.partitions == partitions)
        .collect();
    let last = of.last()?;
    Some(Summary {
        rate: Stat::of(of.iter().map(|r| r.records_per_s))?,
        first_record_s: Stat::of(of.iter().map(|r| r.first_record_s))?,
        cpu_us: Stat::of(of.iter().map(|r| r.cpu_us_per_record))?,
        db_cpu_us: Stat::of(of.iter().map(|r| r.db_cpu_us_per_record))?,
        state_rows: last.state_rows,
        state_bytes: last.state_bytes,
        records: last.records,
        batch_mean: Stat::of(of.iter().filter_map(|r| {
            r.batches
                .filter(|b| *b > 0)
                .map(|b| r.records as f64 / b as f64)
        }))
        .map(|s| s.median),
        pauses: Stat::of(of.iter().filter_map(|r| r.pauses.map(|p| p as f64))).map(|s| s.median),
    })
}

const ROWS: [(Consumer, i32); 26] = [
    (Consumer::WalrelayBatch, 4),
    (Consumer::WalrelayBatch, 1),
    (Consumer::WalrelayRecord, 4),
    (Consumer::WalrelayRecord, 1),
    (Consumer::PythonBatch, 4),
    (Consumer::PythonBatch, 1),
    (Consumer::PythonRecord, 4),
    (Consumer::PythonRecord, 1),
    (Consumer::PythonApplyLimit, 4),
    (Consumer::PythonApplyLimit, 1),
    (Consumer::PythonInboxCareful, 4),
    (Consumer::PythonInboxCareful, 1),
    (Consumer::JavaBatch, 4),
    (Consumer::JavaBatch, 1),
    (Consumer::JavaApplyLimit, 4),
    (Consumer::JavaApplyLimit, 1),
    (Consumer::JavaInboxCareful, 4),
    (Consumer::JavaInboxCareful, 1),
    (Consumer::ApplyLimit, 4),
    (Consumer::ApplyLimit, 1),
    (Consumer::InboxCareful, 4),
    (Consumer::InboxCareful, 1),
    (Consumer::Inbox500, 4),
    (Consumer::Inbox1, 4),
    (Consumer::ReadLimit, 4),
    (Consumer::ReadLimit, 1),
];

/// The apply limit a consumer is held against: the one in its language.
fn limit_of(consumer: Consumer) -> Consumer {
    if consumer.is_python() {
        Consumer::PythonApplyLimit
    } else if consumer.is_java() {
        Consumer::JavaApplyLimit
    } else {
        Consumer::ApplyLimit
    }
}

/// `a / b` of two medians, when both were measured.
fn ratio(a: Option<Summary>, b: Option<Summary>) -> Option<f64> {
    a.zip(b).map(|(a, b)| a.rate.median / b.rate.median)
}

fn shown(r: Option<f64>) -> String {
    r.map_or("not measured".into(), |r| format!("{r:.2}x"))
}

/// The consumer targets of docs/benchmarks.md: every ratio from the same
/// run.
pub fn targets(runs: &[ConsumerRun]) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    let batch = |p| summary(runs, Consumer::WalrelayBatch, p);
    let limit = |p| summary(runs, Consumer::ApplyLimit, p);
    let record = summary(runs, Consumer::WalrelayRecord, 4);
    let careful = summary(runs, Consumer::InboxCareful, 4);
    let inbox = summary(runs, Consumer::Inbox500, 4).or(summary(runs, Consumer::Inbox1, 4));
    let python = summary(runs, Consumer::PythonBatch, 4);
    if batch(4).is_none() && record.is_none() && python.is_none() {
        return java_targets(runs);
    }
    for p in [4, 1] {
        let r = ratio(batch(p), limit(p));
        out.push(TargetCheck {
            target: format!(
                "consumer, batch handler: >= 0.9x the apply limit ({p} partition{})",
                if p == 1 { "" } else { "s" }
            ),
            measured: shown(r),
            met: r.map(|r| r >= 0.9),
        });
    }
    let r = ratio(batch(4), careful);
    out.push(TargetCheck {
        target: "consumer, batch handler: >= 1.2x the careful inbox consumer (4 partitions)".into(),
        measured: shown(r),
        met: r.map(|r| r >= 1.2),
    });
    let r = ratio(batch(4), batch(1));
    out.push(TargetCheck {
        target: "consumer, batch handler: 4 partitions at least as fast as 1".into(),
        measured: shown(r),
        met: r.map(|r| r >= 1.0),
    });
    let spread = batch(4).map(|b| b.rate.spread_pct());
    out.push(TargetCheck {
        target: "consumer, batch handler: spread between repeats < 20 % (4 partitions)".into(),
        measured: spread.map_or("not measured".into(), |s| format!("{s:.0} %")),
        met: spread.map(|s| s < 20.0),
    });
    out.push(TargetCheck {
        target: "consumer, per-record handler: >= 10,000 records/s".into(),
        measured: record.map_or("not measured".into(), |r| {
            format!("{:.0} records/s", r.rate.median)
        }),
        met: record.map(|r| r.rate.median >= 10_000.0),
    });
    out.push(TargetCheck {
        target: "consumer, batch handler: CPU <= 20 µs per record".into(),
        measured: batch(4).map_or("not measured".into(), |b| {
            format!("{:.1} µs", b.cpu_us.median)
        }),
        met: batch(4).map(|b| b.cpu_us.median <= 20.0),
    });
    let r = ratio(python, summary(runs, Consumer::PythonApplyLimit, 4));
    out.push(TargetCheck {
        target: "Python package, batch handler: >= 0.8x the Python apply limit (4 partitions)"
            .into(),
        measured: shown(r),
        met: r.map(|r| r >= 0.8),
    });
    out.push(TargetCheck {
        target: "Python package, batch handler: >= 20,000 records/s".into(),
        measured: python.map_or("not measured".into(), |p| {
            format!("{:.0} records/s", p.rate.median)
        }),
        met: python.map(|p| p.rate.median >= 20_000.0),
    });
    // The time to the first record is the group join and the offset
    // fetch, the same for a plain rdkafka loop: walrelay's loop adds
    // nothing of its own (within half a second, for the noise).
    let first = batch(4).zip(limit(4));
    out.push(TargetCheck {
        target: "consumer, batch handler: first record no later than the apply limit's + 0.5 s (4 partitions)".into(),
        measured: first.map_or("not measured".into(), |(b, l)| {
            format!(
                "{:.2} s (apply limit {:.2} s)",
                b.first_record_s.median, l.first_record_s.median
            )
        }),
        met: first.map(|(b, l)| b.first_record_s.median <= l.first_record_s.median + 0.5),
    });
    // One mark row per partition and source (one source here), whatever
    // the record count; the inbox keeps a row per record.
    let constant = batch(4).map(|b| b.state_rows <= 4);
    let any_inbox = careful.or(inbox);
    let grows = any_inbox.map(|i| i.state_rows as u64 == i.records);
    out.push(TargetCheck {
        target: "dedupe state: constant (one row per partition and source) vs the inbox's row per record".into(),
        measured: format!(
            "marks: {} rows, {} B; inbox: {} rows, {} B",
            batch(4).map_or(0, |b| b.state_rows),
            batch(4).map_or(0, |b| b.state_bytes),
            any_inbox.map_or(0, |i| i.state_rows),
            any_inbox.map_or(0, |i| i.state_bytes),
        ),
        met: constant.zip(grows).map(|(c, g)| c && g),
    });
    out.extend(java_targets(runs));
    out
}

/// The Java targets: the library's batch handler against the Java
/// references of the same run (the best plain loop, the careful inbox),
/// in records/s and CPU per record, with one mark row per partition.
fn java_targets(runs: &[ConsumerRun]) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    let batch = |p| summary(runs, Consumer::JavaBatch, p);
    if batch(4).is_none() && batch(1).is_none() {
        return out;
    }
    let plural = |p: i32| if p == 1 { "" } else { "s" };
    for p in [4, 1] {
        let plain = summary(runs, Consumer::JavaApplyLimit, p);
        let r = ratio(batch(p), plain);
        out.push(TargetCheck {
            target: format!(
                "Java library, batch handler: >= 0.9x the Java plain loop's records/s ({p} partition{})",
                plural(p)
            ),
            measured: shown(r),
            met: r.map(|r| r >= 0.9),
        });
        let cpu = batch(p)
            .zip(plain)
            .map(|(b, l)| b.cpu_us.median / l.cpu_us.median);
        out.push(TargetCheck {
            target: format!(
                "Java library, batch handler: CPU per record <= 1.2x the Java plain loop's ({p} partition{})",
                plural(p)
            ),
            measured: shown(cpu),
            met: cpu.map(|r| r <= 1.2),
        });
    }
    for p in [4, 1] {
        let r = ratio(batch(p), summary(runs, Consumer::JavaInboxCareful, p));
        out.push(TargetCheck {
            target: format!(
                "Java library, batch handler: >= 1.2x the careful Java inbox ({p} partition{})",
                plural(p)
            ),
            measured: shown(r),
            met: r.map(|r| r >= 1.2),
        });
    }
    for p in [4, 1] {
        out.push(TargetCheck {
            target: format!(
                "Java library, batch handler: one row of state per partition ({p} partition{})",
                plural(p)
            ),
            measured: batch(p).map_or("not measured".into(), |b| {
                format!("{} rows, {} B", b.state_rows, b.state_bytes)
            }),
            met: batch(p).map(|b| b.state_rows == i64::from(p)),
        });
    }
    out
}

/// The consumer tables, or nothing when the consumer bench did not run.
pub fn markdown(runs: &[ConsumerRun], latency: &[ConsumerLatencyRun]) -> String {
    let mut s = String::new();
    if runs.is_empty() {
        super::e2e::markdown(&mut s, latency);
        return s;
    }
    let records = runs.first().map_or(0, |r| r.records);
    let _ = writeln!(
        s,
        "\n## Consumers: applying a relayed topic exactly once\n\n\
         {records} relayed 200-byte events, each consumer with a fresh group and a fresh \
         database (`synchronous_commit = on`); one row per event in `applied_events`, checked \
         exactly once after every run. CPU is the consumer process's, database CPU the whole \
         server's, per record. Dedupe state: what the consumer keeps to drop duplicates.\n"
    );
    let _ = writeln!(
        s,
        "| consumer | partitions | records/s | × apply limit | CPU µs/record | DB CPU µs/record | dedupe state | records/batch | pauses | first record after |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|");
    for (consumer, partitions) in ROWS {
        let Some(m) = summary(runs, consumer, partitions) else {
            continue;
        };
        let opt = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.0}"));
        let vs_limit = ratio(Some(m), summary(runs, limit_of(consumer), partitions))
            .map_or("–".to_owned(), |r| format!("{r:.2}x"));
        let _ = writeln!(
            s,
            "| {} | {partitions} | {:.0} | {vs_limit} | {:.1} | {:.1} | {} rows, {} kB | {} | {} | {:.2} s |",
            consumer.label(),
            m.rate.median,
            m.cpu_us.median,
            m.db_cpu_us.median,
            m.state_rows,
            m.state_bytes / 1024,
            opt(m.batch_mean),
            opt(m.pauses),
            m.first_record_s.median
        );
    }
    phase_table(&mut s, runs);
    super::e2e::markdown(&mut s, latency);
    s
}

/// Where walrelay's consumer loop spent its time: each phase's share of
/// the partition-seconds (medians over the repeats).
fn phase_table(s: &mut String, runs: &[ConsumerRun]) {
    const SHOWN: [&str; 8] = [
        "polling",
        "paused",
        "backoff",
        "pool",
        "connecting",
        "handler",
        "commit",
        "loop",
    ];
    let mut rows = Vec::new();
    for (consumer, partitions) in ROWS {
        let of: Vec<&ConsumerRun> = runs
            .iter()
            .filter(|r| r.consumer == consumer && r.partitions == partitions)
            .collect();
        let shares: Vec<Vec<f64>> = of
            .iter()
            .filter_map(|r| r.phases.as_ref().map(|p| phase_shares(p)))
            .collect();
        if shares.is_empty() {
            continue;
        }
        let medians: Vec<f64> = (0..SHOWN.len())
            .map(|i| Stat::of(shares.iter().map(|s| s[i])).map_or(0.0, |s| s.median))
            .collect();
        rows.push((consumer, partitions, medians));
    }
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\nWhere walrelay's consumer loop spent its time: each phase's share of the \
         partition-seconds (every assigned partition counts one second per second). \
         polling: waiting for records with room for them; paused: paused in Kafka with \
         nothing to apply (a refetch); backoff: retry or linger; pool: a batch ready, no free connection; then a \
         batch in flight: connecting, handler, commit (marks and `COMMIT`), loop (the \
         finished batch waiting for the loop to act on it).\n"
    );
    let _ = writeln!(s, "| consumer | partitions | {} |", SHOWN.join(" | "));
    let _ = writeln!(s, "|---|---:|{}", "---:|".repeat(SHOWN.len()));
    for (consumer, partitions, medians) in rows {
        let cells: Vec<String> = medians
            .iter()
            .map(|m| format!("{:.0}%", m * 100.0))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {partitions} | {} |",
            consumer.label(),
            cells.join(" | ")
        );
    }
}

/// Shares of the shown phases (see [`phase_table`]) in one run's
/// breakdown; `loop` is the time in flight the batch did not measure.
fn phase_shares(phases: &[(String, f64)]) -> Vec<f64> {
    let get = |name: &str| {
        phases
            .iter()
            .find(|(p, _)| p == name)
            .map_or(0.0, |(_, s)| *s)
    };
    let job = get("connecting") + get("handler") + get("commit");
    let values = [
        get("polling"),
        get("paused"),
        get("backoff"),
        get("pool"),
        get("connecting"),
        get("handler"),
        get("commit"),
        (get("in_flight") - job).max(0.0),
    ];
    let total: f64 = values.iter().sum::<f64>().max(1e-9);
    values.iter().map(|v| v / total).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(consumer: Consumer, rate: f64, cpu: f64, rows: i64) -> ConsumerRun {
        ConsumerRun {
            consumer,
            partitions: 4,
            repeat: 0,
            records: 1000,
            first_record_s: 0.5,
            seconds: 1000.0 / rate,
            records_per_s: rate,
            cpu_us_per_record: cpu,
            db_cpu_us_per_record: 10.0,
            state_rows: rows,
            state_bytes: 8192,
            batches: None,
            pauses: None,
            phases: None,
        }
    }

    #[test]
    fn the_phase_table_shows_each_phase_as_a_share_and_what_the_loop_added() {
        let phases: Vec<(String, f64)> = [
            ("polling", 1.0),
            ("paused", 0.0),
            ("in_flight", 9.0),
            ("connecting", 1.0),
            ("handler", 4.0),
            ("commit", 3.0),
        ]
        .into_iter()
        .map(|(p, s)| (p.to_owned(), s))
        .collect();
        // polling, paused, backoff, pool, connecting, handler, commit, loop
        let shares = phase_shares(&phases);
        let expected = [0.1, 0.0, 0.0, 0.0, 0.1, 0.4, 0.3, 0.1];
        for (got, want) in shares.iter().zip(expected) {
            assert!((got - want).abs() < 1e-9, "{shares:?}");
        }
        let mut runs = vec![run(Consumer::WalrelayBatch, 50_000.0, 10.0, 4)];
        runs[0].phases = Some(phases);
        let mut s = String::new();
        phase_table(&mut s, &runs);
        assert!(
            s.contains(
                "| walrelay, batch handler | 4 | 10% | 0% | 0% | 0% | 10% | 40% | 30% | 10% |"
            ),
            "{s}"
        );
        let mut none = String::new();
        phase_table(&mut none, &[run(Consumer::ApplyLimit, 1.0, 1.0, 0)]);
        assert!(none.is_empty(), "no table without walrelay's breakdown");
    }

    #[test]
    fn targets_compare_walrelay_with_the_references_of_the_same_run() {
        let one = |c, rate| ConsumerRun {
            partitions: 1,
            ..run(c, rate, 5.0, 1)
        };
        let runs = vec![
            run(Consumer::WalrelayBatch, 60_000.0, 12.0, 4),
            one(Consumer::WalrelayBatch, 100_000.0),
            run(Consumer::ApplyLimit, 62_000.0, 8.0, 0),
            one(Consumer::ApplyLimit, 101_000.0),
            run(Consumer::InboxCareful, 55_000.0, 9.0, 1000),
            run(Consumer::WalrelayRecord, 9_000.0, 30.0, 4),
            run(Consumer::Inbox500, 10_000.0, 40.0, 1000),
            run(Consumer::PythonBatch, 19_000.0, 50.0, 4),
            run(Consumer::PythonApplyLimit, 20_000.0, 30.0, 0),
        ];
        let t = targets(&runs);
        let met: Vec<(String, Option<bool>)> =
            t.iter().map(|t| (t.measured.clone(), t.met)).collect();
        assert_eq!(
            met,
            [
                ("0.97x".to_owned(), Some(true)),
                ("0.99x".to_owned(), Some(true)),
                ("1.09x".to_owned(), Some(false)),
                ("0.60x".to_owned(), Some(false)),
                ("0 %".to_owned(), Some(true)),
                ("9000 records/s".to_owned(), Some(false)),
                ("12.0 µs".to_owned(), Some(true)),
                ("0.95x".to_owned(), Some(true)),
                ("19000 records/s".to_owned(), Some(false)),
                ("0.50 s (apply limit 0.50 s)".to_owned(), Some(true)),
                (
                    "marks: 4 rows, 8192 B; inbox: 1000 rows, 8192 B".to_owned(),
                    Some(true)
                ),
            ]
        );
        let md = markdown(&runs, &[]);
        assert!(
            md.contains(
                "| walrelay, batch handler | 4 | 60000 | 0.97x | 12.0 | 10.0 | 4 rows, 8 kB | – | – | 0.50 s |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| Python package, batch handler | 4 | 19000 | 0.95x | 50.0 |"),
            "{md}"
        );
        assert!(targets(&[]).is_empty());
        // The Python rows alone still check the Python target.
        let py = targets(&[run(Consumer::PythonBatch, 25_000.0, 40.0, 4)]);
        assert_eq!(py[8].met, Some(true), "{py:?}");
        assert!(markdown(&[], &[]).is_empty());
    }
}
