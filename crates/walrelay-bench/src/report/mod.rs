//! The results of a bench run: raw runs (serialized as JSON), the medians
//! over repeats and the per-tool and latency summaries built from them.
//!
//! The report built from these lives next door: `targets` judges them
//! against the project's performance targets and `markdown` renders the
//! tables of the markdown report.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::consumer::{ConsumerLatencyRun, ConsumerRun};
use crate::latency::{LatencyRun, Mode, Percentiles};
use crate::workload::Workload;

mod debezium;
mod markdown;
mod targets;

pub use targets::TargetCheck;

/// Who drained the backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tool {
    /// The `walrelay` binary.
    Walrelay,
    /// The `walrelay` binary with `relay.fence = false`: what the tail
    /// fence costs.
    WalrelayNoFence,
    /// The `walrelay` binary with `relay.headers = "full"`: what the
    /// lean header set (the default) saves in bytes and broker CPU.
    WalrelayFullHeaders,
    /// `--baseline-bin`: another walrelay build (e.g. the previous
    /// commit's), fence on, drained in the same repeats.
    WalrelayBaseline,
    /// `pg_recvlogical` to a file: the decode limit.
    PgRecvlogical,
    /// A plain rdkafka producer: the produce limit.
    Producer,
    /// The polling outbox relay.
    Polling,
    /// Debezium's PostgreSQL connector with the Outbox Event Router on a
    /// Kafka Connect standalone worker, with Debezium's and Connect's
    /// defaults (`bench/debezium/`, variant `defaults`).
    Debezium,
    /// The same, tuned as Debezium's docs and users advise (variant
    /// `tuned`).
    DebeziumTuned,
}

impl Tool {
    pub const ALL: [Tool; 9] = [
        Tool::Walrelay,
        Tool::WalrelayNoFence,
        Tool::WalrelayFullHeaders,
        Tool::WalrelayBaseline,
        Tool::PgRecvlogical,
        Tool::Producer,
        Tool::Polling,
        Tool::DebeziumTuned,
        Tool::Debezium,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Tool::Walrelay => "walrelay",
            Tool::WalrelayNoFence => "walrelay, fence off",
            Tool::WalrelayFullHeaders => "walrelay, full header set",
            Tool::WalrelayBaseline => "walrelay, baseline binary",
            Tool::PgRecvlogical => "decode limit (pg_recvlogical)",
            Tool::Producer => "produce limit (rdkafka)",
            Tool::Polling => "polling relay",
            Tool::Debezium => "Debezium, defaults",
            Tool::DebeziumTuned => "Debezium, tuned",
        }
    }
}

/// One tool draining one workload once.
#[derive(Debug, Clone, Serialize)]
pub struct ToolRun {
    pub tool: Tool,
    pub workload: String,
    pub repeat: u32,
    pub events: u64,
    pub seconds: f64,
    pub events_per_s: f64,
    /// CPU seconds of the tool (for the producer and the polling relay:
    /// the bench process while it ran them).
    pub cpu_seconds: f64,
    /// CPU seconds of the whole PostgreSQL server during the drain.
    pub db_cpu_seconds: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    /// Records found in the broker afterwards (walrelay's topic).
    pub records_in_broker: Option<u64>,
    /// CPU seconds of the broker during the run.
    pub broker_cpu_seconds: Option<f64>,
    /// Bytes the broker stores for the run's topic (Kafka's log segments).
    pub kafka_bytes: Option<u64>,
    /// Bytes of walrelay's own headers (names and values) over the
    /// records read back.
    pub walrelay_header_bytes: Option<u64>,
    /// walrelay's tail fence read at its first record.
    pub fence: Option<crate::drain::FenceCost>,
    /// Debezium: the worker's start before the drain (its `seconds`,
    /// CPU and rate count from the moment the connector streamed).
    pub startup: Option<crate::debezium::Startup>,
    /// Debezium: records of a backlog event written more than once (a
    /// finding, not an error; `records_in_broker` counts them).
    pub duplicates: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub postgres: String,
    pub broker: String,
}

impl Machine {
    pub fn detect(postgres: &str, broker: String) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kb: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory_gib: (kb / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            postgres: postgres.to_owned(),
            broker,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} cores ({}), {} GiB RAM, Linux {}, {}, {}",
            self.cores, self.cpu, self.memory_gib, self.kernel, self.postgres, self.broker
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Results {
    pub command: String,
    pub mode: String,
    pub started: String,
    pub finished: Option<String>,
    pub machine: Machine,
    pub repeats: u32,
    pub latency_seconds: f64,
    pub polling_batch: i64,
    pub polling_interval_ms: u64,
    pub workloads: Vec<Workload>,
    pub drain: Vec<ToolRun>,
    pub latency: Vec<LatencyRun>,
    pub consumer: Vec<ConsumerRun>,
    pub consumer_latency: Vec<ConsumerLatencyRun>,
    /// Debezium's workers stopped and started again after their drains.
    pub restarts: Vec<crate::debezium::RestartRun>,
    pub notes: Vec<String>,
}

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
