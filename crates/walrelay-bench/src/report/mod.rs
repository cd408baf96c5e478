//! The results: raw runs (JSON), medians over repeats, the markdown
//! report and the target checks.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::consumer::{ConsumerLatencyRun, ConsumerRun};
use crate::latency::{LatencyRun, Mode, Percentiles};
use crate::workload::{Kind, Workload};

/// Who drained the backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tool {
    /// The `walrelay` binary.
    Walrelay,
    /// The `walrelay` binary with `relay.fence = false`: what the tail
    /// fence costs.
    WalrelayNoFence,
    /// `pg_recvlogical` to a file: the decode limit.
    PgRecvlogical,
    /// A plain rdkafka producer: the produce limit.
    Producer,
    /// The polling outbox relay.
    Polling,
}

impl Tool {
    pub const ALL: [Tool; 5] = [
        Tool::Walrelay,
        Tool::WalrelayNoFence,
        Tool::PgRecvlogical,
        Tool::Producer,
        Tool::Polling,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Tool::Walrelay => "walrelay",
            Tool::WalrelayNoFence => "walrelay, fence off",
            Tool::PgRecvlogical => "decode limit (pg_recvlogical)",
            Tool::Producer => "produce limit (rdkafka)",
            Tool::Polling => "polling relay",
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
    /// walrelay's tail fence read at its first record.
    pub fence: Option<crate::drain::FenceCost>,
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
    pub fn detect(postgres: &str) -> Machine {
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
            broker: "Tansu 0.6.0 (memory storage)".into(),
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

fn rate(x: f64) -> String {
    if x >= 10_000.0 {
        format!("{:.0}k", x / 1000.0)
    } else if x >= 1000.0 {
        format!("{:.1}k", x / 1000.0)
    } else {
        format!("{x:.0}")
    }
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn cell(s: Option<Stat>, f: impl Fn(f64) -> String) -> String {
    s.map_or("–".into(), |s| f(s.median))
}

fn ms(p: &Percentiles) -> String {
    format!("{:.1} / {:.1} / {:.1} / {:.1}", p.p50, p.p99, p.p999, p.max)
}

impl Results {
    /// The tail fence's drain ratio per workload: the median over repeats
    /// of walrelay's rate with the fence over its rate without it in the
    /// same repeat (the two run back to back, so a pair shares the
    /// machine's speed of the moment; a ratio of medians would not).
    fn fence_ratios(&self) -> Vec<(String, Stat)> {
        self.workloads
            .iter()
            .filter_map(|w| {
                let rate = |tool: Tool, repeat: u32| {
                    self.drain
                        .iter()
                        .find(|r| r.workload == w.id && r.tool == tool && r.repeat == repeat)
                        .map(|r| r.events_per_s)
                };
                let pairs = (0..self.repeats).filter_map(|r| {
                    let (on, off) = (rate(Tool::Walrelay, r)?, rate(Tool::WalrelayNoFence, r)?);
                    (off > 0.0).then_some(on / off)
                });
                Some((w.id.clone(), Stat::of(pairs)?))
            })
            .collect()
    }

    /// Per workload: the fence's read at start (median ms) as a share of
    /// the drain without the fence (median seconds): the part of the
    /// difference that is the fence's own, free of the machine's noise.
    fn fence_read_share(&self, workload: &str) -> Option<f64> {
        let ms = Stat::of(
            self.drain
                .iter()
                .filter(|r| r.workload == workload && r.tool == Tool::Walrelay)
                .filter_map(|r| r.fence.map(|f| f.elapsed_ms as f64)),
        )?;
        let off = Stat::of(
            self.drain
                .iter()
                .filter(|r| r.workload == workload && r.tool == Tool::WalrelayNoFence)
                .map(|r| r.seconds),
        )?;
        (off.median > 0.0).then(|| ms.median / 1000.0 / off.median)
    }

    fn fence_target(&self) -> TargetCheck {
        let ratios = self.fence_ratios();
        TargetCheck {
            target:
                "tail fence: walrelay's drain with the fence >= 0.98x without it on every workload"
                    .into(),
            measured: ratios
                .iter()
                .map(|(w, r)| format!("{w} {:.3}x ({:.3}-{:.3})", r.median, r.min, r.max))
                .collect::<Vec<_>>()
                .join(", "),
            met: (!ratios.is_empty()).then(|| ratios.iter().all(|(_, r)| r.median >= 0.98)),
        }
    }

    /// The fence section of the report.
    fn fence_markdown(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n## Tail fence: the drain with and without it\n\nOne relay start per backlog; the fence reads the (empty) topic's partition tails before the first record.\n"
        );
        let _ = writeln!(
            s,
            "| workload | walrelay (fence on) | walrelay, fence off | on / off (median of pairs, min-max) | fence read at start (median) | read / drain without fence | records read |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
        let ratios = self.fence_ratios();
        for w in &self.workloads {
            let get = |t| self.summary(&w.id, t).map(|x| x.rate);
            let (on, off) = (get(Tool::Walrelay), get(Tool::WalrelayNoFence));
            let costs: Vec<crate::drain::FenceCost> = self
                .drain
                .iter()
                .filter(|r| r.workload == w.id && r.tool == Tool::Walrelay)
                .filter_map(|r| r.fence)
                .collect();
            let ms = Stat::of(costs.iter().map(|c| c.elapsed_ms as f64));
            let records = Stat::of(costs.iter().map(|c| c.records_read as f64));
            let ratio = ratios
                .iter()
                .find(|(id, _)| *id == w.id)
                .map_or("–".into(), |(_, r)| {
                    format!("**{:.3}x** ({:.3}-{:.3})", r.median, r.min, r.max)
                });
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                w.label(),
                cell(on, rate),
                cell(off, rate),
                ratio,
                ms.map_or("–".into(), |m| format!("{:.0} ms", m.median)),
                self.fence_read_share(&w.id)
                    .map_or("–".into(), |x| format!("{:.1} %", x * 100.0)),
                records.map_or("–".into(), |m| format!("{:.0}", m.median)),
            );
        }
    }
}

/// One target and how the run did.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    pub target: String,
    pub measured: String,
    pub met: Option<bool>,
}

impl Results {
    pub fn targets(&self) -> Vec<TargetCheck> {
        let mut out = Vec::new();
        let ratio = |w: &Workload, other: Tool| -> Option<f64> {
            let a = self.summary(&w.id, Tool::Walrelay)?.rate.median;
            let b = self.summary(&w.id, other)?.rate.median;
            Some(a / b)
        };
        for kind in [Kind::Messages, Kind::Outbox] {
            let ratios: Vec<(String, f64)> = self
                .workloads
                .iter()
                .filter(|w| w.kind == kind)
                .filter_map(|w| ratio(w, Tool::PgRecvlogical).map(|r| (w.id.clone(), r)))
                .collect();
            let met = (!ratios.is_empty()).then(|| ratios.iter().all(|(_, r)| *r >= 0.8));
            out.push(TargetCheck {
                target: format!(
                    "drain: walrelay >= 0.8x the decode limit on every {kind} workload"
                ),
                measured: ratios
                    .iter()
                    .map(|(w, r)| format!("{w} {r:.2}x"))
                    .collect::<Vec<_>>()
                    .join(", "),
                met,
            });
        }
        let at5k: Vec<LatencySummary> = self
            .latency_summary()
            .into_iter()
            // The target is about the defaults: the linger.ms=20 row is
            // reported, not judged.
            .filter(|l| {
                l.target_rate == Some(5000)
                    && matches!(l.mode, Mode::WalrelayMessages | Mode::WalrelayOutbox)
            })
            .collect();
        out.push(TargetCheck {
            target: "latency: walrelay commit-to-ack p99 <= 10 ms at 5k events/s".into(),
            measured: at5k
                .iter()
                .map(|l| format!("{} {:.1} ms", l.mode.label(), l.ack.p99))
                .collect::<Vec<_>>()
                .join(", "),
            met: (!at5k.is_empty()).then(|| at5k.iter().all(|l| l.ack.p99 <= 10.0)),
        });
        let rss: Vec<(String, u64)> = self
            .workloads
            .iter()
            .filter_map(|w| {
                self.summary(&w.id, Tool::Walrelay)
                    .and_then(|s| s.peak_rss_max)
                    .map(|r| (w.id.clone(), r))
            })
            .collect();
        let worst = rss.iter().max_by_key(|(_, r)| *r);
        out.push(TargetCheck {
            target: "memory: walrelay peak RSS <= 64 MB in every workload".into(),
            measured: worst.map_or("–".into(), |(w, r)| {
                format!("highest {:.1} MB ({w})", *r as f64 / 1e6)
            }),
            met: worst.map(|(_, r)| *r <= 64_000_000),
        });
        let cpu: Vec<(String, f64, f64)> = self
            .workloads
            .iter()
            .filter_map(|w| {
                let a = self.summary(&w.id, Tool::Walrelay)?.cpu_per_m?.median;
                let b = self.summary(&w.id, Tool::PgRecvlogical)?.cpu_per_m?.median;
                Some((w.id.clone(), a, b))
            })
            .collect();
        out.push(TargetCheck {
            target: "cost: walrelay CPU per event below pg_recvlogical's".into(),
            measured: cpu
                .iter()
                .map(|(w, a, b)| format!("{w} {a:.2} vs {b:.2} s/M"))
                .collect::<Vec<_>>()
                .join(", "),
            met: (!cpu.is_empty()).then(|| cpu.iter().all(|(_, a, b)| a < b)),
        });
        let poll: Vec<(String, f64, f64, f64)> = self
            .workloads
            .iter()
            .filter(|w| w.kind == Kind::Outbox)
            .filter_map(|w| {
                let wr = self.summary(&w.id, Tool::Walrelay)?;
                let p = self.summary(&w.id, Tool::Polling)?;
                Some((
                    w.id.clone(),
                    wr.rate.median / p.rate.median,
                    wr.db_cpu_per_m?.median,
                    p.db_cpu_per_m?.median,
                ))
            })
            .collect();
        out.push(TargetCheck {
            target: "against polling: >= 3x the throughput at lower database CPU".into(),
            measured: poll
                .iter()
                .map(|(w, r, a, b)| format!("{w} {r:.1}x, DB CPU {a:.2} vs {b:.2} s/M"))
                .collect::<Vec<_>>()
                .join(", "),
            met: (!poll.is_empty()).then(|| poll.iter().all(|(_, r, a, b)| *r >= 3.0 && a < b)),
        });
        out.push(self.fence_target());
        out.extend(crate::consumer::report::targets(&self.consumer));
        out
    }

    /// The report: drain, cost, latency, noise and targets.
    pub fn markdown(&self, svg_name: Option<&str>) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# walrelay end-to-end benchmark\n");
        let _ = writeln!(
            s,
            "- **Run**: {} ({} mode), finished {}",
            self.started,
            self.mode,
            self.finished.as_deref().unwrap_or("(incomplete)")
        );
        let _ = writeln!(s, "- **Machine**: {}", self.machine.describe());
        let _ = writeln!(s, "- **Command**: `{}`", self.command);
        let _ = writeln!(
            s,
            "- **Repeats**: {}; every number is the median over the repeats; spread = (max - min) / median.",
            self.repeats
        );
        for n in &self.notes {
            let _ = writeln!(s, "- {n}");
        }
        if let Some(svg) = svg_name {
            let _ = writeln!(s, "\n![drain throughput]({svg})");
        }

        let _ = writeln!(s, "\n## Drain: a committed backlog, events/s\n");
        let _ = writeln!(
            s,
            "| workload | events | walrelay | decode limit (pg_recvlogical) | walrelay / decode | produce limit (rdkafka) | polling relay | walrelay / polling |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for w in &self.workloads {
            let get = |t| self.summary(&w.id, t).map(|x| x.rate);
            let (a, d, p, q) = (
                get(Tool::Walrelay),
                get(Tool::PgRecvlogical),
                get(Tool::Producer),
                get(Tool::Polling),
            );
            let ratio = |x: Option<Stat>, y: Option<Stat>| match (x, y) {
                (Some(x), Some(y)) if y.median > 0.0 => format!("{:.2}x", x.median / y.median),
                _ => "–".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | **{}** | {} | {} | {} |",
                w.label(),
                thousands(w.events),
                cell(a, rate),
                cell(d, rate),
                ratio(a, d),
                cell(p, rate),
                cell(q, rate),
                ratio(a, q),
            );
        }

        self.fence_markdown(&mut s);

        let _ = writeln!(s, "\n## Cost: CPU seconds per million events, peak RSS\n");
        let _ = writeln!(
            s,
            "| workload | walrelay CPU | pg_recvlogical CPU | walrelay peak RSS | DB CPU, walrelay drain | DB CPU, pg_recvlogical drain | DB CPU, polling drain | polling relay CPU | rdkafka producer CPU |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        let f2 = |x: f64| format!("{x:.2}");
        for w in &self.workloads {
            let get = |t| self.summary(&w.id, t);
            let (a, d, p, q) = (
                get(Tool::Walrelay),
                get(Tool::PgRecvlogical),
                get(Tool::Producer),
                get(Tool::Polling),
            );
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                w.label(),
                cell(a.and_then(|x| x.cpu_per_m), f2),
                cell(d.and_then(|x| x.cpu_per_m), f2),
                a.and_then(|x| x.peak_rss_max)
                    .map_or("–".into(), |r| format!("{:.1} MB", r as f64 / 1e6)),
                cell(a.and_then(|x| x.db_cpu_per_m), f2),
                cell(d.and_then(|x| x.db_cpu_per_m), f2),
                cell(q.and_then(|x| x.db_cpu_per_m), f2),
                cell(q.and_then(|x| x.cpu_per_m), f2),
                cell(p.and_then(|x| x.cpu_per_m), f2),
            );
        }

        let lat = self.latency_summary();
        if !lat.is_empty() {
            let _ = writeln!(
                s,
                "\n## Latency: live load, one event per transaction, ms (p50 / p99 / p99.9 / max)\n"
            );
            let _ = writeln!(
                s,
                "| relay, workload | target rate | achieved | commit → ack | commit → consumer | events |"
            );
            let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
            for l in &lat {
                let _ = writeln!(
                    s,
                    "| {} | {} | {}/s | {} | {} | {} |",
                    l.mode.label(),
                    l.target_rate
                        .map_or("max".into(), |r| format!("{}/s", rate(r as f64))),
                    rate(l.achieved.median),
                    ms(&l.ack),
                    ms(&l.consumer),
                    thousands(l.events),
                );
            }
        }

        let _ = writeln!(s, "\n## Noise: spread of events/s over the repeats\n");
        let _ = writeln!(
            s,
            "| workload | walrelay | decode limit | produce limit | polling |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|");
        for w in &self.workloads {
            let sp = |t| {
                self.summary(&w.id, t).map_or("–".into(), |x: ToolSummary| {
                    format!("{:.0} % (n={})", x.rate.spread_pct(), x.rate.n)
                })
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                w.label(),
                sp(Tool::Walrelay),
                sp(Tool::PgRecvlogical),
                sp(Tool::Producer),
                sp(Tool::Polling)
            );
        }
        if !lat.is_empty() {
            let _ = writeln!(
                s,
                "\nLatency, commit → ack p99 over the repeats (min – max ms):\n"
            );
            for l in &lat {
                let _ = writeln!(
                    s,
                    "- {}, {}: {:.1} – {:.1}",
                    l.mode.label(),
                    l.target_rate
                        .map_or("max".into(), |r| format!("{}/s", rate(r as f64))),
                    l.ack_p99.min,
                    l.ack_p99.max
                );
            }
        }

        s.push_str(&crate::consumer::report::markdown(
            &self.consumer,
            &self.consumer_latency,
        ));

        let _ = writeln!(s, "\n## Targets\n");
        let _ = writeln!(s, "| target | measured (medians) | met |");
        let _ = writeln!(s, "|---|---|---|");
        for t in self.targets() {
            let _ = writeln!(
                s,
                "| {} | {} | {} |",
                t.target,
                t.measured,
                match t.met {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "not measured",
                }
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
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
