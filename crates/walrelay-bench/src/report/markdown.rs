//! The markdown report: its tables (drain, tail fence, cost, latency,
//! noise, targets) and the number formatting they share. Only renders what
//! [`Results`] and the target checks computed.

use std::fmt::Write as _;

use super::{LatencySummary, Stat, ToolSummary};
use crate::runs::{FenceCost, Percentiles, Results, Tool};

pub(super) fn rate(x: f64) -> String {
    if x >= 10_000.0 {
        format!("{:.0}k", x / 1000.0)
    } else if x >= 1000.0 {
        format!("{:.1}k", x / 1000.0)
    } else {
        format!("{x:.0}")
    }
}

pub(super) fn thousands(n: u64) -> String {
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

/// The latency section (nothing without latency runs): commit → ack and
/// commit → consumer per relay and rate.
fn latency_markdown(s: &mut String, lat: &[LatencySummary]) {
    if lat.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n## Latency: live load, one event per transaction, ms (p50 / p99 / p99.9 / max)\n"
    );
    let _ = writeln!(
        s,
        "| relay, workload | target rate | achieved | commit → ack | commit → consumer | events |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
    for l in lat {
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

impl Results {
    /// The report: drain, cost, latency, noise and targets, each section
    /// rendered by a function of its own, in this order.
    pub fn markdown(&self, svg_name: Option<&str>) -> String {
        let mut s = String::new();
        self.header_markdown(&mut s, svg_name);
        self.drain_markdown(&mut s);
        self.fence_markdown(&mut s);
        self.baseline_markdown(&mut s);
        self.cost_markdown(&mut s);
        self.python_relay_markdown(&mut s);
        self.cores_markdown(&mut s);
        self.bytes_markdown(&mut s);
        self.debezium_markdown(&mut s);
        // One summary for the latency section and the noise section's
        // latency lines.
        let lat = self.latency_summary();
        latency_markdown(&mut s, &lat);
        self.noise_markdown(&mut s, &lat);
        s.push_str(&super::consumer::markdown(
            &self.consumer,
            &self.consumer_latency,
        ));
        self.targets_markdown(&mut s);
        s
    }

    /// The title and the run's facts: when, where, how, the notes and the
    /// chart.
    fn header_markdown(&self, s: &mut String, svg_name: Option<&str>) {
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
    }

    /// The drain table: walrelay's events/s against the decode and
    /// produce limits, both limits and the polling relay.
    fn drain_markdown(&self, s: &mut String) {
        let _ = writeln!(s, "\n## Drain: a committed backlog, events/s\n");
        let _ = writeln!(
            s,
            "The limits each run half of a relay's work alone on the machine. *Both limits* is the rate of the two halves sharing its cores, 1 / (1/decode + 1/produce): what `pg_recvlogical | producer` would reach where each half keeps the cores busy (see \"Where the cores go\").\n"
        );
        let _ = writeln!(
            s,
            "| workload | events | walrelay | decode limit (pg_recvlogical) | walrelay / decode | produce limit (rdkafka) | walrelay / produce | walrelay / both limits | polling relay | walrelay / polling |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
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
            let both = match (d, p) {
                (Some(d), Some(p)) if d.median > 0.0 && p.median > 0.0 => Some(Stat {
                    median: 1.0 / (1.0 / d.median + 1.0 / p.median),
                    ..d
                }),
                _ => None,
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | **{}** | {} | **{}** | {} | {} | {} |",
                w.label(),
                thousands(w.events),
                cell(a, rate),
                cell(d, rate),
                ratio(a, d),
                cell(p, rate),
                ratio(a, p),
                ratio(a, both),
                cell(q, rate),
                ratio(a, q),
            );
        }
    }

    /// The cost table: CPU seconds per million events and peak RSS of
    /// each tool, and the database's CPU during each drain.
    fn cost_markdown(&self, s: &mut String) {
        let _ = writeln!(s, "\n## Cost: CPU seconds per million events, peak RSS\n");
        let _ = writeln!(
            s,
            "| workload | walrelay CPU | pg_recvlogical CPU | walrelay peak RSS | DB CPU, walrelay drain | DB CPU, pg_recvlogical drain | DB CPU, polling drain | polling relay CPU | rdkafka producer CPU | walrelay / producer | walrelay / (pg_recvlogical + producer) |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let f2 = |x: f64| format!("{x:.2}");
        for w in &self.workloads {
            let get = |t| self.summary(&w.id, t);
            let (a, d, p, q) = (
                get(Tool::Walrelay),
                get(Tool::PgRecvlogical),
                get(Tool::Producer),
                get(Tool::Polling),
            );
            let cpu = |x: Option<ToolSummary>| x.and_then(|x| x.cpu_per_m).map(|c| c.median);
            let over = |x: Option<f64>, y: Option<f64>| match (x, y) {
                (Some(x), Some(y)) if y > 0.0 => format!("{:.2}x", x / y),
                _ => "–".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
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
                over(cpu(a), cpu(p)),
                over(cpu(a), cpu(d).zip(cpu(p)).map(|(d, p)| d + p)),
            );
        }
    }

    /// The noise section: the spread of each tool's events/s over the
    /// repeats, and the range of the latency runs' ack p99.
    fn noise_markdown(&self, s: &mut String, lat: &[LatencySummary]) {
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
            for l in lat {
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
    }

    /// The targets table: each target, what was measured and whether it
    /// was met.
    fn targets_markdown(&self, s: &mut String) {
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
    }

    /// With `--baseline-bin`: this build against the baseline, drained in
    /// the same repeats.
    fn baseline_markdown(&self, s: &mut String) {
        let ratios = self.baseline_ratios();
        if ratios.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "\n## This build against the baseline binary\n\nBoth with the tail fence on, one relay start per backlog, drained in the same repeats back to back, which of the two goes first alternating, after a warm-up drain that is not counted.\n"
        );
        let _ = writeln!(
            s,
            "| workload | walrelay (this build) | walrelay, baseline binary | this / baseline (median of pairs, min-max) |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|");
        for (id, r) in &ratios {
            let Some(w) = self.workloads.iter().find(|w| w.id == *id) else {
                continue;
            };
            let get = |t| self.summary(id, t).map(|x| x.rate);
            let _ = writeln!(
                s,
                "| {} | {} | {} | **{:.3}x** ({:.3}-{:.3}) |",
                w.label(),
                cell(get(Tool::Walrelay), rate),
                cell(get(Tool::WalrelayBaseline), rate),
                r.median,
                r.min,
                r.max
            );
        }
    }

    /// Cores busy during each drain: the tool, PostgreSQL and the broker,
    /// each its CPU per event times the drain's rate (medians). A total
    /// near the machine's cores says the drain is bound by the machine:
    /// each limit alone leaves out one of the three (the decode limit has
    /// no broker, the produce limit no walsender), so on a small machine
    /// their lower one is not reachable by a process that needs both.
    fn cores_markdown(&self, s: &mut String) {
        let cores = |x: Option<ToolSummary>| {
            let x = x?;
            let per = |c: Option<Stat>| c.map(|c| c.median * x.rate.median / 1e6);
            Some((
                per(x.cpu_per_m),
                per(x.db_cpu_per_m),
                per(x.broker_cpu_per_m),
            ))
        };
        let have = self
            .workloads
            .iter()
            .any(|w| cores(self.summary(&w.id, Tool::Walrelay)).is_some_and(|c| c.2.is_some()));
        if !have {
            return;
        }
        let _ = writeln!(
            s,
            "\n## Where the cores go during a drain\n\nCores busy (CPU seconds per second of drain, medians) of the tool, the whole PostgreSQL server and the broker (net of its idle CPU), on a machine of {} cores.\n",
            self.machine.cores
        );
        let _ = writeln!(
            s,
            "| workload | walrelay: relay + PostgreSQL + broker | total | decode limit: pg_recvlogical + PostgreSQL | total | produce limit: producer + broker | total |"
        );
        let _ = writeln!(s, "|---|---|---:|---|---:|---|---:|");
        let c2 = |x: Option<f64>| x.map_or("–".into(), |x| format!("{x:.2}"));
        let sum = |xs: &[Option<f64>]| -> String {
            let t: f64 = xs.iter().flatten().sum();
            if xs.iter().any(Option::is_some) {
                format!("**{t:.2}**")
            } else {
                "–".into()
            }
        };
        for w in &self.workloads {
            let (a, d, p) = (
                cores(self.summary(&w.id, Tool::Walrelay)),
                cores(self.summary(&w.id, Tool::PgRecvlogical)),
                cores(self.summary(&w.id, Tool::Producer)),
            );
            let (a0, a1, a2) = a.unwrap_or_default();
            let (d0, d1, _) = d.unwrap_or_default();
            let (p0, _, p2) = p.unwrap_or_default();
            let _ = writeln!(
                s,
                "| {} | {} + {} + {} | {} | {} + {} | {} | {} + {} | {} |",
                w.label(),
                c2(a0),
                c2(a1),
                c2(a2),
                sum(&[a0, a1, a2]),
                c2(d0),
                c2(d1),
                sum(&[d0, d1]),
                c2(p0),
                c2(p2),
                sum(&[p0, p2]),
            );
        }
    }

    /// Bytes in Kafka and broker CPU per event: walrelay with its default
    /// (lean) header set, with the full set, and the plain producer with
    /// the lean set's headers, same run.
    fn bytes_markdown(&self, s: &mut String) {
        let have = self.workloads.iter().any(|w| {
            self.summary(&w.id, Tool::WalrelayFullHeaders)
                .is_some_and(|x| x.header_bytes_per_record.is_some())
        });
        if !have {
            return;
        }
        let _ = writeln!(
            s,
            "\n## Bytes and broker CPU per event: the lean header set (default) against the full set\n"
        );
        let _ = writeln!(
            s,
            "walrelay's header bytes are names and values of `idempotency-key` and every `walrelay-*` header, per record read back; bytes in Kafka are the topic's log segments per event (batch, record and header framing included; none on Tansu); broker CPU is the broker process's CPU seconds per million events during the drain, net of its idle CPU (measured for 3 s before each workload, in the notes). The plain producer sends the lean set's headers.\n"
        );
        let _ = writeln!(
            s,
            "| workload | header bytes, lean | header bytes, full | lean / full | bytes in Kafka per event, lean | full | plain producer | broker CPU, lean | full | plain producer |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let f0 = |x: f64| format!("{x:.0}");
        let f2 = |x: f64| format!("{x:.2}");
        for w in &self.workloads {
            let get = |t| self.summary(&w.id, t);
            let (a, f, p) = (
                get(Tool::Walrelay),
                get(Tool::WalrelayFullHeaders),
                get(Tool::Producer),
            );
            let hb = |x: Option<ToolSummary>| x.and_then(|x| x.header_bytes_per_record);
            let ratio = match (hb(a), hb(f)) {
                (Some(x), Some(y)) if y.median > 0.0 => {
                    format!("{:.0} %", x.median / y.median * 100.0)
                }
                _ => "–".into(),
            };
            let kb = |x: Option<ToolSummary>| x.and_then(|x| x.kafka_bytes_per_event);
            let bc = |x: Option<ToolSummary>| x.and_then(|x| x.broker_cpu_per_m);
            let _ = writeln!(
                s,
                "| {} | {} | {} | **{}** | {} | {} | {} | {} | {} | {} |",
                w.label(),
                cell(hb(a), f0),
                cell(hb(f), f0),
                ratio,
                cell(kb(a), f0),
                cell(kb(f), f0),
                cell(kb(p), f0),
                cell(bc(a), f2),
                cell(bc(f), f2),
                cell(bc(p), f2),
            );
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
            let costs: Vec<FenceCost> = self
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
