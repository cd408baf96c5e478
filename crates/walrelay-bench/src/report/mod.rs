//! The report of a bench run: the medians over repeats and the per-tool
//! and latency summaries built from the runs in [`Results`], `targets`
//! judging them against the project's performance targets and `markdown`
//! rendering the tables of the markdown report.
//!
//! It reads the runs' types from [`crate::runs`] and imports no runner:
//! the runners fill [`Results`], `main` renders it
//! ([`Results::markdown`]).

use std::collections::BTreeMap;

use crate::runs::{LatencyRun, Mode, Percentiles, Results, Tool, ToolRun};

mod consumer;
mod debezium;
mod e2e;
mod markdown;
mod python_relay;
mod targets;

pub use targets::TargetCheck;

/// Median, minimum and maximum of some repeats.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Stat {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Stat> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Stat {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }

    /// (max - min) / median, in percent.
    pub fn spread_pct(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / self.median * 100.0
        }
    }
}

/// Medians of one tool on one workload.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToolSummary {
    pub rate: Stat,
    pub cpu_per_m: Option<Stat>,
    pub db_cpu_per_m: Option<Stat>,
    pub peak_rss_max: Option<u64>,
    /// The broker's CPU seconds per million events.
    pub broker_cpu_per_m: Option<Stat>,
    /// Bytes the broker stores per event.
    pub kafka_bytes_per_event: Option<Stat>,
    /// Bytes of walrelay's headers per record read back.
    pub header_bytes_per_record: Option<Stat>,
}

impl Results {
    pub fn summary(&self, workload: &str, tool: Tool) -> Option<ToolSummary> {
        let runs: Vec<&ToolRun> = self
            .drain
            .iter()
            .filter(|r| r.workload == workload && r.tool == tool)
            .collect();
        let rate = Stat::of(runs.iter().map(|r| r.events_per_s))?;
        let per_m = |x: f64, r: &ToolRun| x / r.events as f64 * 1e6;
        Some(ToolSummary {
            rate,
            cpu_per_m: Stat::of(runs.iter().map(|r| per_m(r.cpu_seconds, r))),
            db_cpu_per_m: Stat::of(
                runs.iter()
                    .filter_map(|r| r.db_cpu_seconds.map(|c| per_m(c, r))),
            ),
            peak_rss_max: runs.iter().filter_map(|r| r.peak_rss_bytes).max(),
            broker_cpu_per_m: Stat::of(
                runs.iter()
                    .filter_map(|r| r.broker_cpu_seconds.map(|c| per_m(c, r))),
            ),
            kafka_bytes_per_event: Stat::of(
                runs.iter()
                    .filter_map(|r| r.kafka_bytes.map(|b| b as f64 / r.events as f64)),
            ),
            header_bytes_per_record: Stat::of(runs.iter().filter_map(|r| {
                let n = r.records_in_broker.filter(|n| *n > 0)?;
                Some(r.walrelay_header_bytes? as f64 / n as f64)
            })),
        })
    }

    /// Latency medians per (mode, target rate), in run order.
    pub fn latency_summary(&self) -> Vec<LatencySummary> {
        let mut groups: BTreeMap<(usize, usize), Vec<&LatencyRun>> = BTreeMap::new();
        let mut rate_order: Vec<Option<u64>> = Vec::new();
        for r in &self.latency {
            if !rate_order.contains(&r.target_rate) {
                rate_order.push(r.target_rate);
            }
            let m = Mode::ALL.iter().position(|m| *m == r.mode).unwrap_or(0);
            let k = rate_order
                .iter()
                .position(|x| *x == r.target_rate)
                .unwrap_or(0);
            groups.entry((m, k)).or_default().push(r);
        }
        groups
            .into_values()
            .map(|rs| {
                let med = |f: &dyn Fn(&LatencyRun) -> f64| {
                    Stat::of(rs.iter().map(|r| f(r))).unwrap_or_default()
                };
                let pct = |f: &dyn Fn(&LatencyRun) -> Percentiles| Percentiles {
                    p50: med(&|r| f(r).p50).median,
                    p99: med(&|r| f(r).p99).median,
                    p999: med(&|r| f(r).p999).median,
                    max: med(&|r| f(r).max).median,
                };
                LatencySummary {
                    mode: rs[0].mode,
                    target_rate: rs[0].target_rate,
                    achieved: med(&|r| r.achieved_rate),
                    ack: pct(&|r| r.commit_to_ack),
                    consumer: pct(&|r| r.commit_to_consumer),
                    ack_p99: med(&|r| r.commit_to_ack.p99),
                    events: rs.iter().map(|r| r.events).sum(),
                }
            })
            .collect()
    }
}

#[derive(Debug, Clone, Copy)]
pub struct LatencySummary {
    pub mode: Mode,
    pub target_rate: Option<u64>,
    pub achieved: Stat,
    pub ack: Percentiles,
    pub consumer: Percentiles,
    pub ack_p99: Stat,
    pub events: u64,
}

#[cfg(test)]
mod tests {
    use super::markdown::{rate, thousands};
    use super::*;

    #[test]
    fn medians_and_spread() {
        let s = Stat::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert!((s.spread_pct() - 100.0).abs() < 1e-9);
        assert_eq!(Stat::of([1.0, 3.0]).unwrap().median, 2.0);
        assert!(Stat::of([]).is_none());
        assert_eq!(thousands(1_000_000), "1,000,000");
        assert_eq!(rate(123_456.0), "123k");
    }
}
