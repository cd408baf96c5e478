//! walrelay against a plain Python relay (`python_relay.py`), drained
//! in the same run: events/s, CPU per event, the CPU each spends beyond
//! the plain producer of its own records (its floor), and the
//! walsender's and the broker's CPU per event. The section and the
//! targets against it; pure computations over [`Results`].

use std::fmt::Write as _;

use super::markdown::rate;
use super::{Stat, TargetCheck, ToolSummary};
use crate::runs::{Results, Tool};
use crate::workload::{Kind, Workload};

/// One workload's comparison (medians; µs per event).
#[derive(Debug, Clone, Copy)]
struct Row {
    /// walrelay's events/s over the Python relay's, pair by pair.
    rate_ratio: Option<Stat>,
    walrelay: ToolSummary,
    python: ToolSummary,
    /// CPU per event beyond the plain producer of the same records.
    walrelay_beyond: Option<f64>,
    python_beyond: Option<f64>,
    /// The walsender's (the whole server's) CPU per event while the
    /// decode limit drained.
    decode_db: Option<f64>,
}

impl Row {
    fn cpu_ratio(&self) -> Option<f64> {
        let a = self.walrelay.cpu_per_m?.median;
        let b = self.python.cpu_per_m?.median;
        (b > 0.0).then(|| a / b)
    }
}

/// Batched workloads: the ones the per-event targets apply to.
fn batched(w: &Workload) -> bool {
    w.per_tx >= 100
}

impl Results {
    fn python_row(&self, w: &Workload) -> Option<Row> {
        let walrelay = self.summary(&w.id, Tool::Walrelay)?;
        let python = self.summary(&w.id, Tool::PythonRelay)?;
        let cpu = |t: Tool| Some(self.summary(&w.id, t)?.cpu_per_m?.median);
        let beyond = |own: ToolSummary, floor: Tool| Some(own.cpu_per_m?.median - cpu(floor)?);
        let ratios = self.paired_ratios(Tool::Walrelay, Tool::PythonRelay);
        Some(Row {
            rate_ratio: ratios.iter().find(|(id, _)| *id == w.id).map(|(_, s)| *s),
            walrelay,
            python,
            walrelay_beyond: beyond(walrelay, Tool::Producer),
            python_beyond: beyond(python, Tool::ProducerOneHeader),
            decode_db: self
                .summary(&w.id, Tool::PgRecvlogical)
                .and_then(|d| d.db_cpu_per_m)
                .map(|s| s.median),
        })
    }

    /// The section: one row per workload the Python relay drained.
    pub(super) fn python_relay_markdown(&self, s: &mut String) {
        let rows: Vec<(&Workload, Row)> = self
            .workloads
            .iter()
            .filter_map(|w| Some((w, self.python_row(w)?)))
            .collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(s, "\n## Against a plain Python relay\n");
        let _ = writeln!(
            s,
            "The Python relay (`crates/walrelay-bench/src/python_relay.py`): psycopg2's logical replication, pgoutput decoded in Python, confluent-kafka's idempotent producer with walrelay's producer properties, one `idempotency-key` header, the slot confirmed after delivery. CPU columns are µs per event (medians). *Beyond its floor*: the relay's CPU per event minus the plain rdkafka producer's sending the same records (walrelay's with its headers; the Python relay's with one header). Walsender: the whole PostgreSQL server's CPU per event during the drain.\n"
        );
        let _ = writeln!(
            s,
            "| workload | walrelay events/s | Python events/s | walrelay / Python (pairs) | CPU walrelay | CPU Python | walrelay / Python | beyond its floor: walrelay | Python | walsender: walrelay | Python | decode limit | broker: walrelay | Python |"
        );
        let _ = writeln!(
            s,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        let f2 = |x: Option<f64>| x.map_or("–".into(), |x| format!("{x:.2}"));
        let med = |x: Option<Stat>| x.map(|x| x.median);
        for (w, r) in rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | **{}** | {} | {} | **{}** | {} | {} | {} | {} | {} | {} | {} |",
                w.label(),
                rate(r.walrelay.rate.median),
                rate(r.python.rate.median),
                r.rate_ratio.map_or("–".into(), |x| format!(
                    "{:.2}x ({:.2}-{:.2})",
                    x.median, x.min, x.max
                )),
                f2(med(r.walrelay.cpu_per_m)),
                f2(med(r.python.cpu_per_m)),
                r.cpu_ratio().map_or("–".into(), |x| format!("{x:.2}x")),
                f2(r.walrelay_beyond),
                f2(r.python_beyond),
                f2(med(r.walrelay.db_cpu_per_m)),
                f2(med(r.python.db_cpu_per_m)),
                f2(r.decode_db),
                f2(med(r.walrelay.broker_cpu_per_m)),
                f2(med(r.python.broker_cpu_per_m)),
            );
        }
    }

    /// The targets against the Python relay, on the batched workloads the Python relay
    /// drained (none without it).
    pub(super) fn python_relay_targets(&self) -> Vec<TargetCheck> {
        let rows: Vec<(&Workload, Row)> = self
            .workloads
            .iter()
            .filter(|w| batched(w))
            .filter_map(|w| Some((w, self.python_row(w)?)))
            .collect();
        if rows.is_empty() {
            return Vec::new();
        }
        let list = |f: &dyn Fn(&Workload, &Row) -> Option<String>| {
            rows.iter()
                .filter_map(|(w, r)| f(w, r))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let beyond_met = rows
            .iter()
            .map(|(_, r)| r.walrelay_beyond.map(|b| b <= 0.5))
            .collect::<Option<Vec<bool>>>()
            .map(|v| v.iter().all(|m| *m));
        let cpu_met = rows
            .iter()
            .map(|(_, r)| r.cpu_ratio().map(|c| c <= 0.8))
            .collect::<Option<Vec<bool>>>()
            .map(|v| v.iter().all(|m| *m));
        let wanted = |w: &Workload| if w.kind == Kind::Outbox { 1.2 } else { 1.0 };
        let rate_met = rows
            .iter()
            .map(|(w, r)| r.rate_ratio.map(|x| x.median >= wanted(w)))
            .collect::<Option<Vec<bool>>>()
            .map(|v| v.iter().all(|m| *m));
        vec![
            TargetCheck {
                target: "hot path: walrelay's CPU per event beyond the plain producer of the same records <= 0.5 µs on the batched workloads".into(),
                measured: list(&|w, r| Some(format!("{} {:.2} µs", w.id, r.walrelay_beyond?))),
                met: beyond_met,
            },
            TargetCheck {
                target: "against the Python relay: CPU per event <= 0.8x on the batched workloads".into(),
                measured: list(&|w, r| Some(format!("{} {:.2}x", w.id, r.cpu_ratio()?))),
                met: cpu_met,
            },
            TargetCheck {
                target: "against the Python relay: drain >= 1.2x its events/s on outbox, >= 1.0x on messages (batched)".into(),
                measured: list(&|w, r| Some(format!("{} {:.2}x", w.id, r.rate_ratio?.median))),
                met: rate_met,
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::runs::{Results, Tool, ToolRun};
    use crate::workload::{Kind, Workload};

    fn run(tool: Tool, w: &Workload, repeat: u32, rate: f64, cpu_us: f64) -> ToolRun {
        ToolRun {
            tool,
            workload: w.id.clone(),
            repeat,
            events: w.events,
            seconds: w.events as f64 / rate,
            events_per_s: rate,
            cpu_seconds: cpu_us * w.events as f64 / 1e6,
            db_cpu_seconds: Some(w.events as f64 / 1e6),
            peak_rss_bytes: None,
            records_in_broker: None,
            broker_cpu_seconds: None,
            kafka_bytes: None,
            walrelay_header_bytes: None,
            fence: None,
            startup: None,
            duplicates: None,
        }
    }

    #[test]
    fn the_section_and_targets_compare_walrelay_with_the_python_relay_and_each_floor() {
        let w = Workload::new(Kind::Outbox, 100, 200, 1_000_000);
        let mut r = Results::for_tests(vec![w.clone()], 1);
        r.drain.extend([
            run(Tool::Walrelay, &w, 0, 240_000.0, 4.0),
            run(Tool::PythonRelay, &w, 0, 200_000.0, 5.0),
            run(Tool::Producer, &w, 0, 400_000.0, 3.6),
            run(Tool::ProducerOneHeader, &w, 0, 450_000.0, 3.0),
        ]);
        let mut s = String::new();
        r.python_relay_markdown(&mut s);
        assert!(
            s.contains("| **1.20x (1.20-1.20)** | 4.00 | 5.00 | **0.80x** | 0.40 | 2.00 |"),
            "{s}"
        );
        let t = r.python_relay_targets();
        assert_eq!(
            t.iter().map(|t| t.met).collect::<Vec<_>>(),
            [Some(true), Some(true), Some(true)],
            "{t:?}"
        );
        // Without the Python relay: no section, no targets.
        let mut bare = Results::for_tests(vec![w.clone()], 1);
        bare.drain.push(run(Tool::Walrelay, &w, 0, 1.0, 1.0));
        let mut s = String::new();
        bare.python_relay_markdown(&mut s);
        assert!(s.is_empty() && bare.python_relay_targets().is_empty());
    }
}
