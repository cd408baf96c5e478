//! Debezium beside walrelay: the report's section (drains,
//! cost, start and restart) and the targets against it. Pure computations and
//! rendering over [`Results`].

use std::fmt::Write as _;

use super::markdown::{rate, thousands};
use super::{Stat, TargetCheck, ToolSummary};
use crate::runs::{Mode, RestartRun, Results, Startup, Tool};

/// The Debezium rows, tuned first.
const DBZ: [Tool; 2] = [Tool::DebeziumTuned, Tool::Debezium];

fn cell(s: Option<Stat>, f: impl Fn(f64) -> String) -> String {
    s.map_or("–".into(), |s| f(s.median))
}

fn ratio(x: Option<f64>, y: Option<f64>) -> String {
    match (x, y) {
        (Some(x), Some(y)) if y > 0.0 => format!("{:.2}x", x / y),
        _ => "–".into(),
    }
}

fn mb(b: Option<u64>) -> String {
    b.map_or("–".into(), |b| format!("{:.0} MB", b as f64 / 1e6))
}

impl Results {
    /// Whether any Debezium drain ran.
    fn has_debezium(&self) -> bool {
        self.drain.iter().any(|r| DBZ.contains(&r.tool))
    }

    /// Median of `f` over the Debezium runs of `tool` that have a start.
    fn startup_stat(&self, tool: Tool, f: impl Fn(&Startup) -> f64) -> String {
        Stat::of(
            self.drain
                .iter()
                .filter(|r| r.tool == tool)
                .filter_map(|r| r.startup.as_ref().map(&f)),
        )
        .map_or("–".into(), |s| format!("{:.1} s", s.median))
    }

    /// Median of `f` over `tool`'s restarts.
    fn restart_stat(&self, tool: Tool, f: impl Fn(&RestartRun) -> Option<f64>) -> String {
        Stat::of(
            self.restarts
                .iter()
                .filter(|r| r.tool == tool)
                .filter_map(f),
        )
        .map_or("–".into(), |s| {
            if s.median < 1.0 {
                format!("{:.2} s", s.median)
            } else {
                format!("{:.1} s", s.median)
            }
        })
    }

    /// The Debezium section (nothing without Debezium rows): the drains,
    /// their cost, the broker's side, and the start and restart.
    pub(super) fn debezium_markdown(&self, s: &mut String) {
        if !self.has_debezium() {
            return;
        }
        self.debezium_drain_markdown(s);
        self.debezium_cost_markdown(s);
        self.debezium_broker_markdown(s);
        self.debezium_start_markdown(s);
    }

    /// How the Debezium drains were run and timed, and their events/s
    /// beside walrelay's.
    fn debezium_drain_markdown(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n## Debezium beside walrelay: the same backlogs\n\nDebezium's PostgreSQL connector with the Outbox Event Router on a Kafka Connect standalone worker (`bench/debezium/`: tuned, and Debezium's and Connect's defaults), its own slot made with walrelay's before the backlog. Its drain is timed from the moment the connector streams (its walsender holds the slot) until the records of every event are in Kafka (the topics' end offsets, then read back and counted by event); its start is the table below. CPU is the worker JVM's over the drain (without its start), peak RSS the JVM's, DB CPU the whole PostgreSQL server's over the drain (with what the slot's walsender used before the bench saw it stream), broker CPU net of the broker's idle CPU.\n"
        );
        let _ = writeln!(
            s,
            "| workload | events | walrelay | Debezium tuned | walrelay / tuned | Debezium defaults | walrelay / defaults |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
        for w in &self.workloads {
            let get = |t| self.summary(&w.id, t).map(|x| x.rate);
            let (a, t, d) = (get(Tool::Walrelay), get(DBZ[0]), get(DBZ[1]));
            let m = |x: Option<Stat>| x.map(|x| x.median);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | **{}** | {} | **{}** |",
                w.label(),
                thousands(w.events),
                cell(a, rate),
                cell(t, rate),
                ratio(m(a), m(t)),
                cell(d, rate),
                ratio(m(a), m(d)),
            );
        }
    }

    /// CPU, peak RSS and database CPU: walrelay, tuned and defaults.
    fn debezium_cost_markdown(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n| workload | CPU s per M events: walrelay | tuned | defaults | tuned / walrelay | peak RSS: walrelay | tuned | defaults | DB CPU s per M: walrelay | tuned | defaults |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let f2 = |x: f64| format!("{x:.2}");
        for w in &self.workloads {
            let get = |t| self.summary(&w.id, t);
            let (a, t, d) = (get(Tool::Walrelay), get(DBZ[0]), get(DBZ[1]));
            let cpu = |x: Option<ToolSummary>| x.and_then(|x| x.cpu_per_m);
            let db = |x: Option<ToolSummary>| x.and_then(|x| x.db_cpu_per_m);
            let rss = |x: Option<ToolSummary>| x.and_then(|x| x.peak_rss_max);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | **{}** | {} | {} | {} | {} | {} | {} |",
                w.label(),
                cell(cpu(a), f2),
                cell(cpu(t), f2),
                cell(cpu(d), f2),
                ratio(cpu(t).map(|x| x.median), cpu(a).map(|x| x.median)),
                mb(rss(a)),
                mb(rss(t)),
                mb(rss(d)),
                cell(db(a), f2),
                cell(db(t), f2),
                cell(db(d), f2),
            );
        }
    }

    /// The broker's side: its CPU, the bytes in Kafka and the records
    /// per event (more than 1 with duplicates).
    fn debezium_broker_markdown(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n| workload | broker CPU s per M: walrelay | tuned | defaults | bytes in Kafka per event: walrelay | tuned | defaults | records per event: tuned | defaults |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        let f0 = |x: f64| format!("{x:.0}");
        let f2 = |x: f64| format!("{x:.2}");
        for w in &self.workloads {
            let get = |t| self.summary(&w.id, t);
            let (a, t, d) = (get(Tool::Walrelay), get(DBZ[0]), get(DBZ[1]));
            let bc = |x: Option<ToolSummary>| x.and_then(|x| x.broker_cpu_per_m);
            let kb = |x: Option<ToolSummary>| x.and_then(|x| x.kafka_bytes_per_event);
            let per_event = |tool: Tool| {
                Stat::of(
                    self.drain
                        .iter()
                        .filter(|r| r.workload == w.id && r.tool == tool)
                        .filter_map(|r| Some(r.records_in_broker? as f64 / r.events as f64)),
                )
                .map_or("–".into(), |x| format!("{:.4}", x.max))
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                w.label(),
                cell(bc(a), f2),
                cell(bc(t), f2),
                cell(bc(d), f2),
                cell(kb(a), f0),
                cell(kb(t), f0),
                cell(kb(d), f0),
                per_event(DBZ[0]),
                per_event(DBZ[1]),
            );
        }
    }

    /// Start and restart, from the process's spawn: Debezium's from its
    /// drains and restarts, walrelay's from its restarts.
    fn debezium_start_markdown(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n### Start and restart\n\nFrom the process's spawn (Debezium: the worker's JVM), medians over the drains (start) and over the restarts (SIGTERM, then a start with the same offsets and one event committed while the relay was down). Debezium's first record is one of its drain's backlog; walrelay's start is timed on a slot of its own holding one committed event.\n"
        );
        let _ = writeln!(
            s,
            "| relay | start → connector running | → streaming | → first record | CPU to stream | restart → streaming | → the new event in Kafka | records replayed at restart | restarts |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for tool in [Tool::Walrelay, DBZ[0], DBZ[1]] {
            let restarts: Vec<_> = self.restarts.iter().filter(|r| r.tool == tool).collect();
            let drained = DBZ.contains(&tool) && self.drain.iter().any(|r| r.tool == tool);
            if !drained && restarts.is_empty() {
                continue;
            }
            let replayed = restarts.iter().map(|r| r.replayed_records).max();
            let first_record = if drained {
                self.startup_stat(tool, |x| x.first_record_s)
            } else {
                self.restart_stat(tool, |x| x.start_first_record_s)
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                tool.label(),
                self.startup_stat(tool, |x| x.running_s),
                self.startup_stat(tool, |x| x.streaming_s),
                first_record,
                self.startup_stat(tool, |x| x.cpu_seconds),
                self.restart_stat(tool, |x| x.streaming_s),
                self.restart_stat(tool, |x| Some(x.first_new_record_s)),
                replayed.map_or("–".into(), |n| format!("max {n}")),
                restarts.len(),
            );
        }
    }

    /// The targets against tuned Debezium (none without its rows).
    pub(super) fn debezium_targets(&self) -> Vec<TargetCheck> {
        if !self.drain.iter().any(|r| r.tool == Tool::DebeziumTuned) {
            return Vec::new();
        }
        let med = |w: &str, t: Tool| self.summary(w, t);
        let mut out = Vec::new();
        // Drain: 3x tuned Debezium, or 0.9x the produce limit where 3x
        // is above it.
        let drains: Vec<(String, f64, Option<f64>, bool)> = self
            .workloads
            .iter()
            .filter_map(|w| {
                let a = med(&w.id, Tool::Walrelay)?.rate.median;
                let d = med(&w.id, Tool::DebeziumTuned)?.rate.median;
                let p = med(&w.id, Tool::Producer).map(|p| p.rate.median);
                let met = a >= 3.0 * d || p.is_some_and(|p| 3.0 * d > p && a >= 0.9 * p);
                Some((w.id.clone(), a / d, p.map(|p| a / p), met))
            })
            .collect();
        out.push(TargetCheck {
            target: "Debezium: walrelay >= 3x tuned Debezium's events/s on every drain workload (or >= 0.9x the produce limit where 3x is above it)".into(),
            measured: drains
                .iter()
                .map(|(w, r, p, _)| match p {
                    Some(p) => format!("{w} {r:.2}x ({p:.2}x the produce limit)"),
                    None => format!("{w} {r:.2}x"),
                })
                .collect::<Vec<_>>()
                .join(", "),
            met: (!drains.is_empty()).then(|| drains.iter().all(|d| d.3)),
        });
        let per = |f: &dyn Fn(&ToolSummary) -> Option<f64>| -> Vec<(String, f64)> {
            self.workloads
                .iter()
                .filter_map(|w| {
                    let a = f(&med(&w.id, Tool::Walrelay)?)?;
                    let d = f(&med(&w.id, Tool::DebeziumTuned)?)?;
                    (d > 0.0).then(|| (w.id.clone(), a / d))
                })
                .collect()
        };
        for (what, limit, shares) in [
            (
                "CPU per event",
                0.2,
                per(&|s: &ToolSummary| s.cpu_per_m.map(|c| c.median)),
            ),
            (
                "peak RSS",
                0.1,
                per(&|s: &ToolSummary| s.peak_rss_max.map(|r| r as f64)),
            ),
        ] {
            out.push(TargetCheck {
                target: format!(
                    "Debezium: walrelay's {what} <= 1/{:.0} of tuned Debezium's on every drain workload",
                    1.0 / limit
                ),
                measured: shares
                    .iter()
                    .map(|(w, r)| format!("{w} {r:.3}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                met: (!shares.is_empty()).then(|| shares.iter().all(|(_, r)| *r <= limit)),
            });
        }
        // Latency: commit → consumer for both (Debezium has no ack hook).
        let lat = self.latency_summary();
        let p99 = |mode: Mode, rate: u64| {
            lat.iter()
                .find(|l| l.mode == mode && l.target_rate == Some(rate))
                .map(|l| l.consumer.p99)
        };
        let rows: Vec<(u64, f64, f64)> = [1000, 5000]
            .into_iter()
            .filter_map(|r| {
                Some((
                    r,
                    p99(Mode::WalrelayOutbox, r)?,
                    p99(Mode::DebeziumOutbox, r)?,
                ))
            })
            .collect();
        out.push(TargetCheck {
            target: "Debezium: walrelay's p99 commit-to-consumer below tuned Debezium's at 1k and 5k events/s (outbox)".into(),
            measured: rows
                .iter()
                .map(|(r, a, d)| format!("{}k/s: walrelay {a:.1} ms, Debezium {d:.1} ms", r / 1000))
                .collect::<Vec<_>>()
                .join(", "),
            met: (rows.len() == 2).then(|| rows.iter().all(|(_, a, d)| a < d)),
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::{LatencyRun, ToolRun};
    use crate::workload::{Kind, Workload};

    fn run(tool: Tool, workload: &str, events_per_s: f64, cpu: f64, rss: u64) -> ToolRun {
        ToolRun {
            tool,
            workload: workload.into(),
            repeat: 0,
            events: 1000,
            seconds: 1000.0 / events_per_s,
            events_per_s,
            cpu_seconds: cpu,
            db_cpu_seconds: Some(0.1),
            peak_rss_bytes: Some(rss),
            records_in_broker: Some(1000),
            broker_cpu_seconds: None,
            kafka_bytes: None,
            walrelay_header_bytes: None,
            fence: None,
            startup: None,
            duplicates: None,
        }
    }

    fn latency(mode: Mode, rate: u64, p99: f64) -> LatencyRun {
        LatencyRun::for_tests(mode, rate, p99, p99)
    }

    fn results(drain: Vec<ToolRun>, latency: Vec<LatencyRun>) -> Results {
        let workloads = vec![
            Workload::new(Kind::Messages, 100, 200, 1000),
            Workload::new(Kind::Outbox, 100, 200, 1000),
        ];
        Results {
            drain,
            latency,
            ..Results::for_tests(workloads, 1)
        }
    }

    #[test]
    fn judges_walrelay_against_tuned_debezium() {
        let (m, o) = ("msg-100tx-200b", "outbox-100tx-200b");
        let r = results(
            vec![
                // messages: 4x Debezium; outbox: 2x, but 0.95x the produce
                // limit, which 3x Debezium's would be above.
                run(Tool::Walrelay, m, 40_000.0, 0.01, 50_000_000),
                run(Tool::DebeziumTuned, m, 10_000.0, 0.1, 600_000_000),
                run(Tool::Walrelay, o, 19_000.0, 0.01, 50_000_000),
                run(Tool::DebeziumTuned, o, 9_500.0, 0.04, 400_000_000),
                run(Tool::Producer, o, 20_000.0, 0.01, 0),
            ],
            vec![
                latency(Mode::WalrelayOutbox, 1000, 20.0),
                latency(Mode::DebeziumOutbox, 1000, 50.0),
                latency(Mode::WalrelayOutbox, 5000, 30.0),
            ],
        );
        let t = r.debezium_targets();
        assert_eq!(t.len(), 4);
        assert_eq!(t[0].met, Some(true), "{:?}", t[0]);
        assert!(t[0]
            .measured
            .contains("outbox-100tx-200b 2.00x (0.95x the produce limit)"));
        // CPU: 0.1 and 0.25 of Debezium's: the outbox one misses 1/5.
        assert_eq!(t[1].met, Some(false), "{:?}", t[1]);
        // RSS: 1/12 and 1/8: the outbox one misses 1/10.
        assert_eq!(t[2].met, Some(false), "{:?}", t[2]);
        // Latency: 5k/s has no Debezium row: not judged.
        assert_eq!(t[3].met, None, "{:?}", t[3]);
        let md = r.markdown(None);
        assert!(md.contains("## Debezium beside walrelay"), "{md}");
        assert!(
            md.contains("| messages, 100/tx, 200 B | 1,000 | 40k | 10k | **4.00x** |"),
            "{md}"
        );

        assert!(
            results(vec![run(Tool::Walrelay, m, 1.0, 0.1, 1)], Vec::new())
                .debezium_targets()
                .is_empty()
        );
    }
}
