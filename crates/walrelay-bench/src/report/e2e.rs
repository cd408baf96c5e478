//! The consumers' end-to-end latency in the report: per topic shape and
//! rate, each library's commit → committed effect beside the plain
//! reference's, with the relay's commit → ack and the consumer's ack →
//! effect; and the end-to-end targets. Medians over the repeats.

use std::fmt::Write as _;

use super::{Stat, TargetCheck};
use crate::runs::{Consumer, ConsumerLatencyRun, Percentiles};

/// The plain reference's row: the application produces after its commit,
/// a plain loop applies (no walrelay, no dedupe).
const PLAIN: Consumer = Consumer::ApplyLimit;

/// The rate the targets are judged at.
const TARGET_RATE: u64 = 5_000;

/// The rows, in the tables' order.
const ORDER: [Consumer; 4] = [
    Consumer::ApplyLimit,
    Consumer::WalrelayBatch,
    Consumer::PythonBatch,
    Consumer::JavaBatch,
];

/// Medians over the repeats of one consumer on one shape at one rate.
#[derive(Debug, Clone, Copy)]
struct Row {
    achieved: f64,
    e2e: Percentiles,
    ack: Percentiles,
    ack_to_effect: Percentiles,
    events_per_tx: f64,
    db_cores: f64,
}

fn label(c: Consumer) -> &'static str {
    match c {
        Consumer::ApplyLimit => "plain producer + plain consumer (reference)",
        Consumer::WalrelayBatch => "walrelay + Rust library",
        Consumer::PythonBatch => "walrelay + Python library",
        Consumer::JavaBatch => "walrelay + Java library",
        other => other.label(),
    }
}

fn shape_label(partitions: i32, keyed: bool) -> String {
    let keys = if keyed {
        "keyed (1,000 keys)"
    } else {
        "keyless"
    };
    format!(
        "{partitions} partition{}, {keys}",
        if partitions == 1 { "" } else { "s" }
    )
}

fn median_pct(
    of: &[&ConsumerLatencyRun],
    f: impl Fn(&ConsumerLatencyRun) -> Percentiles,
) -> Percentiles {
    let m = |g: &dyn Fn(Percentiles) -> f64| {
        Stat::of(of.iter().map(|r| g(f(r)))).map_or(f64::NAN, |s| s.median)
    };
    Percentiles {
        p50: m(&|p| p.p50),
        p99: m(&|p| p.p99),
        p999: m(&|p| p.p999),
        max: m(&|p| p.max),
    }
}

fn row(
    lat: &[ConsumerLatencyRun],
    consumer: Consumer,
    partitions: i32,
    keyed: bool,
    rate: u64,
) -> Option<Row> {
    let of: Vec<&ConsumerLatencyRun> = lat
        .iter()
        .filter(|r| {
            r.consumer == consumer
                && r.partitions == partitions
                && r.keyed == keyed
                && r.target_rate == rate
        })
        .collect();
    Some(Row {
        achieved: Stat::of(of.iter().map(|r| r.achieved_rate))?.median,
        e2e: median_pct(&of, |r| r.commit_to_effect),
        ack: median_pct(&of, |r| r.commit_to_ack),
        ack_to_effect: median_pct(&of, |r| r.ack_to_effect),
        events_per_tx: Stat::of(of.iter().map(|r| r.events_per_tx))?.median,
        db_cores: Stat::of(of.iter().map(|r| r.db_cores))?.median,
    })
}

/// The shapes and rates measured, in run order.
fn shapes(lat: &[ConsumerLatencyRun]) -> Vec<(i32, bool)> {
    let mut v: Vec<(i32, bool)> = Vec::new();
    for r in lat {
        if !v.contains(&(r.partitions, r.keyed)) {
            v.push((r.partitions, r.keyed));
        }
    }
    v
}

fn rates(lat: &[ConsumerLatencyRun]) -> Vec<u64> {
    let mut v: Vec<u64> = lat.iter().map(|r| r.target_rate).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The end-to-end section, or nothing without end-to-end runs.
pub fn markdown(s: &mut String, lat: &[ConsumerLatencyRun]) {
    if lat.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n## End to end: the application's commit → the consumer's committed effect, ms\n\n\
         One-event transactions at a fixed rate (open loop); each event timed from its \
         transaction's commit to the commit of the consumer transaction holding its effect row \
         (both the server's commit timestamps), per consumer with its library's default \
         settings. The plain reference: the application sends the record itself after its \
         commit (walrelay's producer settings) and a plain loop applies it (one multi-row \
         insert per poll, no dedupe). commit → ack: to the producer's delivery report (walrelay \
         in the bench's process; the reference's own producer); ack → effect: the consumer's \
         part. Events per consumer transaction: effect rows over the transactions that wrote \
         them. DB cores: the database server's CPU seconds per second over the stretch and its \
         catch-up. Medians over the repeats.\n"
    );
    for (partitions, keyed) in shapes(lat) {
        let _ = writeln!(s, "\n{}:\n", shape_label(partitions, keyed));
        let _ = writeln!(
            s,
            "| rate | path | achieved | p50 | p99 | p99.9 | max | p99 × plain | commit → ack p50 / p99 | ack → effect p50 / p99 | events / consumer tx | DB cores |"
        );
        let _ = writeln!(
            s,
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for rate in rates(lat) {
            let plain = row(lat, PLAIN, partitions, keyed, rate);
            for consumer in ORDER {
                let Some(r) = row(lat, consumer, partitions, keyed, rate) else {
                    continue;
                };
                let vs = plain
                    .filter(|_| consumer != PLAIN)
                    .map_or("–".to_owned(), |p| {
                        format!("{:.2}x", r.e2e.p99 / p.e2e.p99)
                    });
                let _ = writeln!(
                    s,
                    "| {rate}/s | {} | {:.0}/s | {:.1} | {:.1} | {:.1} | {:.1} | {vs} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} | {:.2} |",
                    label(consumer),
                    r.achieved,
                    r.e2e.p50,
                    r.e2e.p99,
                    r.e2e.p999,
                    r.e2e.max,
                    r.ack.p50,
                    r.ack.p99,
                    r.ack_to_effect.p50,
                    r.ack_to_effect.p99,
                    r.events_per_tx,
                    r.db_cores,
                );
            }
        }
    }
}

/// The end-to-end targets at 5,000/s, on every shape measured: the Rust
/// library's p99 at most 25 ms and at most 1.5x the plain reference's; the
/// Python and Java libraries' at most 2x.
pub fn targets(lat: &[ConsumerLatencyRun]) -> Vec<TargetCheck> {
    if lat.is_empty() {
        return Vec::new();
    }
    let checks = [
        (Consumer::WalrelayBatch, "Rust", 1.5, Some(25.0)),
        (Consumer::PythonBatch, "Python", 2.0, None),
        (Consumer::JavaBatch, "Java", 2.0, None),
    ];
    let mut out = Vec::new();
    for (consumer, language, most, ceiling) in checks {
        let mut measured = Vec::new();
        let mut met = None;
        for (partitions, keyed) in shapes(lat) {
            let (Some(r), Some(p)) = (
                row(lat, consumer, partitions, keyed, TARGET_RATE),
                row(lat, PLAIN, partitions, keyed, TARGET_RATE),
            ) else {
                continue;
            };
            let ratio = r.e2e.p99 / p.e2e.p99;
            let ok = ratio <= most && ceiling.is_none_or(|c| r.e2e.p99 <= c);
            met = Some(met.unwrap_or(true) && ok);
            measured.push(format!(
                "{}: {:.1} ms, {ratio:.2}x ({:.1} ms)",
                shape_label(partitions, keyed),
                r.e2e.p99,
                p.e2e.p99
            ));
        }
        let ceiling = ceiling.map_or(String::new(), |c| format!(" <= {c:.0} ms and"));
        out.push(TargetCheck {
            target: format!(
                "end to end: the {language} library's commit → committed effect p99 at \
                 {TARGET_RATE}/s{ceiling} <= {most}x the plain reference's (every shape)"
            ),
            measured: if measured.is_empty() {
                "–".into()
            } else {
                measured.join("; ")
            },
            met,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(consumer: Consumer, keyed: bool, rate: u64, p99: f64) -> ConsumerLatencyRun {
        let p = Percentiles {
            p50: p99 / 2.0,
            p99,
            p999: p99 * 1.5,
            max: p99 * 2.0,
        };
        ConsumerLatencyRun {
            consumer,
            partitions: 4,
            keyed,
            repeat: 0,
            target_rate: rate,
            achieved_rate: rate as f64,
            events: rate * 10,
            commit_to_effect: p,
            commit_to_ack: p,
            ack_to_effect: p,
            events_per_tx: 3.0,
            db_cores: 0.5,
        }
    }

    #[test]
    fn targets_hold_each_library_against_the_plain_reference_of_its_shape() {
        let lat = vec![
            run(Consumer::ApplyLimit, false, 5_000, 10.0),
            run(Consumer::ApplyLimit, true, 5_000, 20.0),
            run(Consumer::WalrelayBatch, false, 5_000, 14.0),
            // 1.4x its shape's reference, but over 25 ms.
            run(Consumer::WalrelayBatch, true, 5_000, 28.0),
            run(Consumer::PythonBatch, false, 5_000, 19.0),
            run(Consumer::PythonBatch, true, 5_000, 39.0),
            // Other rates do not count.
            run(Consumer::JavaBatch, false, 1_000, 100.0),
            run(Consumer::JavaBatch, false, 5_000, 21.0),
        ];
        let t = targets(&lat);
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].met, Some(false), "{:?}", t[0]);
        assert!(
            t[0].measured.contains("28.0 ms, 1.40x"),
            "{}",
            t[0].measured
        );
        assert_eq!(t[1].met, Some(true), "{:?}", t[1]);
        assert_eq!(t[2].met, Some(false), "{:?}", t[2]);
        let mut s = String::new();
        markdown(&mut s, &lat);
        assert!(s.contains("4 partitions, keyed (1,000 keys)"), "{s}");
        assert!(
            s.contains("| 5000/s | walrelay + Rust library | 5000/s | 7.0 | 14.0 |"),
            "{s}"
        );
        assert!(s.contains("| 1.40x |"), "{s}");
    }

    #[test]
    fn no_runs_no_section_and_no_targets() {
        let mut s = String::new();
        markdown(&mut s, &[]);
        assert!(s.is_empty());
        assert!(targets(&[]).is_empty());
    }
}
