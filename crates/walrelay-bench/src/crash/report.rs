//! The crash comparison's report: `crash-<stamp>.json` (everything) and
//! `crash-<stamp>.md` (the table, the definitions, the kill moments),
//! and the verdict.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Result};
use serde::Serialize;

use super::run::ToolRun;
use super::{CrashTool, Settings};
use crate::env::{BenchEnv, PARTITIONS};
use crate::runs::Machine;

#[derive(Debug, Serialize)]
pub struct CrashReport {
    pub command: String,
    pub started: String,
    pub finished: Option<String>,
    pub machine: Machine,
    pub settings: Settings,
    pub notes: Vec<String>,
    pub runs: Vec<ToolRun>,
    /// Tools whose run failed, and why.
    pub failures: Vec<(CrashTool, String)>,
}

fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

impl CrashReport {
    pub fn new(env: &BenchEnv, settings: &Settings, notes: &[String]) -> CrashReport {
        let args: Vec<String> = std::env::args().skip(1).collect();
        CrashReport {
            command: format!(
                "cargo run --release -p walrelay-bench -- {}",
                args.join(" ")
            ),
            started: now(),
            finished: None,
            machine: Machine::detect(
                env.cluster.version(),
                format!(
                    "Apache Kafka {} (one KRaft node)",
                    walrelay_testkit::KAFKA_VERSION
                ),
            ),
            settings: settings.clone(),
            notes: notes.to_vec(),
            runs: Vec::new(),
            failures: Vec::new(),
        }
    }

    pub fn finish(&mut self) {
        self.finished = Some(now());
    }

    /// Writes both files; returns their paths.
    pub fn write(&self, out: &Path, stamp: &str) -> Result<(PathBuf, PathBuf)> {
        let json = out.join(format!("crash-{stamp}.json"));
        let md = out.join(format!("crash-{stamp}.md"));
        std::fs::write(&json, serde_json::to_string_pretty(self)?)?;
        std::fs::write(&md, self.markdown())?;
        Ok((json, md))
    }

    /// Fails when walrelay lost or duplicated an event (or put one out of
    /// order), when any tool lost one, or when a tool's run failed.
    pub fn verdict(&self) -> Result<()> {
        let mut bad = Vec::new();
        for r in &self.runs {
            let c = &r.counts;
            if c.lost > 0 {
                bad.push(format!("{}: {} events lost", r.tool, c.lost));
            }
            if r.tool == CrashTool::Walrelay && (c.duplicates > 0 || c.out_of_order > 0) {
                bad.push(format!(
                    "walrelay: {} duplicates, {} out of order on the wire",
                    c.duplicates, c.out_of_order
                ));
            }
        }
        for (tool, e) in &self.failures {
            bad.push(format!("{tool}: the run failed: {e}"));
        }
        if !bad.is_empty() {
            bail!("crash comparison: {}", bad.join("; "));
        }
        Ok(())
    }

    pub fn markdown(&self) -> String {
        let s = &self.settings;
        let mut m = String::new();
        let _ = writeln!(m, "# Crashes: walrelay beside Debezium (issue 24)\n");
        let _ = writeln!(m, "Command: `{}`  ", self.command);
        let _ = writeln!(
            m,
            "Started {}, finished {}. {} ({} cores), PostgreSQL {}, {}, {PARTITIONS} partitions per topic.\n",
            self.started,
            self.finished.as_deref().unwrap_or("(running)"),
            self.machine.cpu,
            self.machine.cores,
            self.machine.postgres,
            self.machine.broker
        );
        let _ = writeln!(
            m,
            "Workload: one transaction after another, 1-4 transactional logical messages then 1-3 outbox rows each, 200-byte payloads, {} events/s{}. Each tool streamed {:?} to {:?} (seeded: `--seed {}`) before each of its {} `kill -9`, each followed by a restart.\n",
            s.rate,
            if s.events > 0 { format!(", at least {} events", s.events) } else { String::new() },
            s.min_gap,
            s.max_gap,
            s.seed,
            s.kills
        );
        let _ = writeln!(m, "| tool | kills | committed events | records on the wire | records per event | lost | duplicates on the wire | events applied twice by a plain consumer | out of order | CPU s | peak RSS MiB | restart s (mean / max) |");
        let _ = writeln!(
            m,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for r in &self.runs {
            let c = &r.counts;
            let restarts: Vec<f64> = r.kills.iter().map(|k| k.restart_s).collect();
            let mean = restarts.iter().sum::<f64>() / restarts.len().max(1) as f64;
            let max = restarts.iter().copied().fold(0.0, f64::max);
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {:.3} | {} | {} | {} | {} | {:.1} | {:.0} | {mean:.1} / {max:.1} |",
                r.tool,
                r.kills.len(),
                c.committed,
                c.records,
                r.records_per_event,
                c.lost,
                c.duplicates,
                c.events_applied_twice,
                c.out_of_order,
                r.cost.cpu_seconds,
                r.cost.peak_rss_bytes as f64 / (1024.0 * 1024.0),
            );
        }
        for (tool, e) in &self.failures {
            let _ = writeln!(m, "| {tool} | failed: {} |||||||||||", e.replace('\n', " "));
        }
        let _ = writeln!(m, "\n{DEFINITIONS}");
        for r in &self.runs {
            let _ = writeln!(
                m,
                "\n**{}**: slot `{}`, topics {:?}, first start {:.1} s, workload {:.0} s ({} transactions, {} messages, {} outbox rows), drain after it {:.1} s, final stop {}, duplicates {} of messages and {} of outbox rows, the most records of one event {}, records of no event of the run {}. Kills at (s, events committed): {}.",
                r.tool,
                r.slot,
                r.topics,
                r.start_s,
                r.load_s,
                r.transactions,
                r.messages,
                r.outbox_rows,
                r.drain_s,
                if r.stopped_cleanly { "clean" } else { "killed after 30 s" },
                r.counts.duplicate_messages,
                r.counts.duplicate_outbox_rows,
                r.counts.max_copies,
                r.counts.other,
                r.kills
                    .iter()
                    .map(|k| format!("{:.1}/{}", k.at_s, k.committed))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        for n in &self.notes {
            let _ = writeln!(m, "\nNote: {n}");
        }
        m
    }
}

/// What the columns mean (see `crash/wire.rs`).
const DEFINITIONS: &str = "Columns: *records on the wire* are the records of the run's events in the tool's topics; *lost*: committed events with no record; *duplicates*: records beyond one per event; *events applied twice by a plain consumer*: events with two or more records, which a consumer that applies every record it reads (no deduplication) applies more than once (its extra applications are the duplicates); *out of order*: per partition in offset order, a record of an event new to that partition whose sequence number (= commit order) is below one before it, which a high-water-mark consumer would skip. CPU is every process of the tool, summed over its restarts; peak RSS is the largest of one process.";

/// The log line of one tool's counts.
pub fn summary_line(r: &ToolRun) -> String {
    let c = &r.counts;
    format!(
        "{}: {} kills, {} committed, {} records ({:.3}/event), {} lost, {} duplicates, {} applied twice, {} out of order, {:.1} CPU s",
        r.tool,
        r.kills.len(),
        c.committed,
        c.records,
        r.records_per_event,
        c.lost,
        c.duplicates,
        c.events_applied_twice,
        c.out_of_order,
        r.cost.cpu_seconds
    )
}
