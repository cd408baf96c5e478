//! The performance targets the bench checks (drain against the decode
//! limit, latency, memory, CPU, polling, the tail fence, the consumer) and
//! the ratios behind them. Pure computations over [`Results`]; rendering
//! them is `markdown`'s job.

use serde::Serialize;

use super::{LatencySummary, Stat};
use crate::runs::{Mode, Results, Tool};
use crate::workload::{Kind, Workload};

/// One target and how the run did.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    pub target: String,
    pub measured: String,
    pub met: Option<bool>,
}

impl Results {
    /// Per workload, `a`'s drain rate over `b`'s, taken pair by pair in
    /// the same repeat and summarised over repeats (the two run back to
    /// back, so a pair shares the machine's speed of the moment; a ratio
    /// of medians would not).
    pub(super) fn paired_ratios(&self, a: Tool, b: Tool) -> Vec<(String, Stat)> {
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
                    let (x, y) = (rate(a, r)?, rate(b, r)?);
                    (y > 0.0).then_some(x / y)
                });
                Some((w.id.clone(), Stat::of(pairs)?))
            })
            .collect()
    }

    /// The tail fence's drain ratio per workload: with the fence over
    /// without it.
    pub(super) fn fence_ratios(&self) -> Vec<(String, Stat)> {
        self.paired_ratios(Tool::Walrelay, Tool::WalrelayNoFence)
    }

    /// This build's drain over the baseline binary's, per workload (empty
    /// without `--baseline-bin`).
    pub(super) fn baseline_ratios(&self) -> Vec<(String, Stat)> {
        self.paired_ratios(Tool::Walrelay, Tool::WalrelayBaseline)
    }

    /// Per workload: the fence's read at start (median ms) as a share of
    /// the drain without the fence (median seconds): the part of the
    /// difference that is the fence's own, free of the machine's noise.
    pub(super) fn fence_read_share(&self, workload: &str) -> Option<f64> {
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

    /// Only with `--baseline-bin`: no slowdown against the baseline build.
    fn baseline_target(&self) -> Option<TargetCheck> {
        let ratios = self.baseline_ratios();
        (!ratios.is_empty()).then(|| TargetCheck {
            target: "this build: drain >= 0.98x the baseline binary's on every workload".into(),
            measured: ratios
                .iter()
                .map(|(w, r)| format!("{w} {:.3}x ({:.3}-{:.3})", r.median, r.min, r.max))
                .collect::<Vec<_>>()
                .join(", "),
            met: Some(ratios.iter().all(|(_, r)| r.median >= 0.98)),
        })
    }

    /// The lean header set (the default) against the full set, on the
    /// records read back after the same drain.
    fn header_bytes_target(&self) -> Option<TargetCheck> {
        let shares: Vec<(String, f64)> = self
            .workloads
            .iter()
            .filter_map(|w| {
                let bytes = |t| self.summary(&w.id, t)?.header_bytes_per_record;
                let (lean, full) = (bytes(Tool::Walrelay)?, bytes(Tool::WalrelayFullHeaders)?);
                (full.median > 0.0).then(|| (w.id.clone(), lean.median / full.median))
            })
            .collect();
        (!shares.is_empty()).then(|| TargetCheck {
            target: "lean header set: walrelay's header bytes per record <= 60 % of the full set's on every workload".into(),
            measured: shares
                .iter()
                .map(|(w, r)| format!("{w} {:.0} %", r * 100.0))
                .collect::<Vec<_>>()
                .join(", "),
            met: Some(shares.iter().all(|(_, r)| *r <= 0.6)),
        })
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
}

impl Results {
    /// Commit-to-ack p99 at 5k events/s (<= 10 ms) and at 20k, or the
    /// highest rate run if not 20k (<= 25 ms), for walrelay's default
    /// modes, each beside the references' p99 at the same rate: the plain
    /// producer (what the broker costs) and the dual write (the same
    /// database load, then a produce).
    fn latency_targets(&self) -> Vec<TargetCheck> {
        let lat = self.latency_summary();
        let p99_of = |mode: Mode, rate: Option<u64>| {
            lat.iter()
                .find(|l| l.mode == mode && l.target_rate == rate)
                .map(|l| l.ack.p99)
        };
        let high = lat
            .iter()
            .filter_map(|l| l.target_rate)
            .filter(|r| *r > 5000)
            .max();
        let mut out = Vec::new();
        for (rate, limit) in [(Some(5000), 10.0), (high, 25.0)] {
            let Some(rate) = rate else { continue };
            let rows: Vec<&LatencySummary> = lat
                .iter()
                // The target is about the defaults: the linger.ms=20 row is
                // reported, not judged.
                .filter(|l| {
                    l.target_rate == Some(rate)
                        && matches!(l.mode, Mode::WalrelayMessages | Mode::WalrelayOutbox)
                })
                .collect();
            let refs: Vec<String> = [Mode::PlainProducer, Mode::DualWrite]
                .into_iter()
                .filter_map(|m| p99_of(m, Some(rate)).map(|p| format!("{} {p:.1} ms", m.tag())))
                .collect();
            out.push(TargetCheck {
                target: format!(
                    "latency: walrelay commit-to-ack p99 <= {limit} ms at {}k events/s",
                    rate / 1000
                ),
                measured: rows
                    .iter()
                    .map(|l| {
                        format!(
                            "{} {:.1} ms at {:.1}k/s",
                            l.mode.label(),
                            l.ack.p99,
                            l.achieved.median / 1000.0
                        )
                    })
                    .chain((!refs.is_empty()).then(|| format!("(references: {})", refs.join(", "))))
                    .collect::<Vec<_>>()
                    .join(", "),
                met: (!rows.is_empty()).then(|| rows.iter().all(|l| l.ack.p99 <= limit)),
            });
        }
        out.extend(latency_ratio_target(
            &lat,
            p99_of(Mode::PlainProducer, Some(5000)),
        ));
        out.extend(latency_ab_target(&lat));
        out
    }

    pub fn targets(&self) -> Vec<TargetCheck> {
        let mut out = Vec::new();
        let ratio = |w: &Workload, other: Tool| -> Option<f64> {
            let a = self.summary(&w.id, Tool::Walrelay)?.rate.median;
            let b = self.summary(&w.id, other)?.rate.median;
            Some(a / b)
        };
        // Issue 23: the lower of the two limits bounds any relay that
        // decodes the WAL and produces to Kafka.
        let drains: Vec<(String, f64, &str)> = self
            .workloads
            .iter()
            .filter_map(|w| {
                let decode = ratio(w, Tool::PgRecvlogical);
                let produce = ratio(w, Tool::Producer);
                match (decode, produce) {
                    // The lower limit gives the higher ratio.
                    (Some(d), Some(p)) if p > d => Some((w.id.clone(), p, "produce")),
                    (Some(d), _) => Some((w.id.clone(), d, "decode")),
                    (None, Some(p)) => Some((w.id.clone(), p, "produce")),
                    (None, None) => None,
                }
            })
            .collect();
        out.push(TargetCheck {
            target: "drain: walrelay >= 0.9x the lower of the decode and produce limits on every workload".into(),
            measured: drains
                .iter()
                .map(|(w, r, lim)| format!("{w} {r:.2}x ({lim})"))
                .collect::<Vec<_>>()
                .join(", "),
            met: (!drains.is_empty()).then(|| drains.iter().all(|(_, r, _)| *r >= 0.9)),
        });
        out.extend(self.latency_targets());
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
        let cpu: Vec<(String, f64)> = self
            .workloads
            .iter()
            .filter_map(|w| {
                let a = self.summary(&w.id, Tool::Walrelay)?.cpu_per_m?.median;
                let b = self.summary(&w.id, Tool::Producer)?.cpu_per_m?.median;
                (b > 0.0).then(|| (w.id.clone(), a / b))
            })
            .collect();
        out.push(TargetCheck {
            target: "cost: walrelay CPU per event <= 1.3x the plain producer's on every workload"
                .into(),
            measured: cpu
                .iter()
                .map(|(w, r)| format!("{w} {r:.2}x"))
                .collect::<Vec<_>>()
                .join(", "),
            met: (!cpu.is_empty()).then(|| cpu.iter().all(|(_, r)| *r <= 1.3)),
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
        out.extend(self.header_bytes_target());
        out.extend(self.baseline_target());
        out.extend(self.python_relay_targets());
        out.extend(self.debezium_targets());
        out.extend(super::consumer::targets(&self.consumer));
        out.extend(super::e2e::targets(&self.consumer_latency));
        out
    }
}

/// At 5k events/s walrelay's commit-to-ack p99 is at most 1.2x the
/// plain producer's in the same run: the broker's cost is the
/// machine's, the rest is the replication path's.
fn latency_ratio_target(lat: &[LatencySummary], plain: Option<f64>) -> Option<TargetCheck> {
    let plain = plain?;
    let rows: Vec<(&LatencySummary, f64)> = lat
        .iter()
        .filter(|l| {
            l.target_rate == Some(5000)
                && matches!(l.mode, Mode::WalrelayMessages | Mode::WalrelayOutbox)
        })
        .map(|l| (l, l.ack.p99 / plain))
        .collect();
    Some(TargetCheck {
        target: "latency: walrelay commit-to-ack p99 <= 1.2x the plain producer's at 5k events/s"
            .into(),
        measured: rows
            .iter()
            .map(|(l, r)| format!("{} {r:.2}x", l.mode.label()))
            .collect::<Vec<_>>()
            .join(", "),
        met: (!rows.is_empty()).then(|| rows.iter().all(|(_, r)| *r <= 1.2)),
    })
}

/// The latency A/B of two builds, both run as their own process: this
/// build's commit-to-consumer p99 at each fixed rate over the baseline's, at
/// most 1.2x (one stall moves a p99 by more than 10 %, so a smaller
/// regression needs more repeats to be seen).
fn latency_ab_target(lat: &[LatencySummary]) -> Option<TargetCheck> {
    let pairs: Vec<(Option<u64>, f64)> = lat
        .iter()
        // At "max" the two load the database at different rates: not a
        // comparison.
        .filter(|l| l.mode == Mode::WalrelayBinary && l.target_rate.is_some())
        .filter_map(|l| {
            let base = lat
                .iter()
                .find(|b| b.mode == Mode::BaselineBinary && b.target_rate == l.target_rate)?;
            Some((l.target_rate, l.consumer.p99 / base.consumer.p99))
        })
        .collect();
    if pairs.is_empty() {
        return None;
    }
    Some(TargetCheck {
        target: "latency A/B: this build's commit-to-consumer p99 <= 1.2x the baseline binary's"
            .into(),
        measured: pairs
            .iter()
            .map(|(rate, r)| {
                let rate = rate.map_or("max".into(), |r| format!("{:.1}k/s", r as f64 / 1000.0));
                format!("{rate} {r:.2}x")
            })
            .collect::<Vec<_>>()
            .join(", "),
        met: Some(pairs.iter().all(|(_, r)| *r <= 1.2)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::LatencyRun;

    fn run(mode: Mode, p99_ack: f64, p99_consumer: f64) -> LatencyRun {
        LatencyRun::for_tests(mode, 5000, p99_ack, p99_consumer)
    }

    fn targets(latency: Vec<LatencyRun>) -> Vec<TargetCheck> {
        Results {
            latency,
            ..Results::for_tests(Vec::new(), 1)
        }
        .latency_targets()
    }

    #[test]
    fn walrelays_p99_is_judged_against_the_plain_producers() {
        let t = targets(vec![
            run(Mode::PlainProducer, 8.0, 8.5),
            run(Mode::WalrelayMessages, 9.0, 9.5),
            run(Mode::WalrelayOutbox, 9.8, 10.0),
        ]);
        let ratio = t
            .iter()
            .find(|t| t.target.contains("1.2x the plain"))
            .unwrap();
        // 9.8 / 8.0 = 1.225: over 1.2x although under 10 ms.
        assert_eq!(ratio.met, Some(false), "{ratio:?}");
        assert!(
            ratio.measured.contains("walrelay, messages 1.12x"),
            "{ratio:?}"
        );
        let absolute = t.iter().find(|t| t.target.contains("<= 10 ms")).unwrap();
        assert_eq!(absolute.met, Some(true), "{absolute:?}");
        assert!(
            !t.iter().any(|t| t.target.contains("A/B")),
            "no A/B without both binaries"
        );
    }

    #[test]
    fn the_ab_compares_the_binaries_commit_to_consumer() {
        let t = targets(vec![
            run(Mode::WalrelayBinary, 0.0, 12.0),
            run(Mode::BaselineBinary, 0.0, 10.5),
        ]);
        let ab = t.iter().find(|t| t.target.contains("A/B")).unwrap();
        assert_eq!(ab.measured, "5.0k/s 1.14x");
        assert_eq!(ab.met, Some(true));
        let t = targets(vec![
            run(Mode::WalrelayBinary, 0.0, 13.0),
            run(Mode::BaselineBinary, 0.0, 10.0),
        ]);
        let ab = t.iter().find(|t| t.target.contains("A/B")).unwrap();
        assert_eq!(ab.met, Some(false), "1.3x is a regression");
    }
}
