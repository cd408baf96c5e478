//! `walrelay verify`: read topics back from Kafka and check that every
//! partition holds what a high-water-mark consumer needs (docs/verify.md).
//!
//! Two halves:
//!
//! - The analysis ([`Analyzer`], [`analyze`]) is a pure function over
//!   records given as (topic, partition, offset, headers). It keeps, per
//!   (topic, partition, source), the keys seen so far and classifies every
//!   record: new, duplicate (a replay), out of order (below the high-water
//!   mark and never seen: a high-water-mark consumer would drop it), and
//!   whether its `walrelay-prev-key` names a key that never arrived (a gap).
//! - The Kafka side ([`main`]) assigns every partition of the requested
//!   topics without joining a group, reads until nothing new arrived for
//!   `--idle-timeout` (never trusting high watermarks or EOF, which some
//!   brokers get wrong), and prints a table or JSON.
//!
//! Exit codes: see [`exit`].

mod analysis;
mod kafka;
mod render;
#[cfg(test)]
mod tests;

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

use crate::kafka::properties::KafkaConfig;

pub use analysis::{
    analyze, Analyzer, Finding, PartitionReport, Report, SourceReport, Totals, Verdict,
};
use kafka::read;
use render::{exit_code, render_findings, render_table, render_verdict};
pub use render::{shorten_source, Output, StoppedBy};

/// Exit codes of `walrelay verify`, most severe finding first.
pub mod exit {
    /// Every partition is clean: duplicates (replays) and records without
    /// walrelay headers are fine.
    pub const CLEAN: i32 = 0;
    /// At least one key is out of order: a high-water-mark consumer would
    /// silently drop that event. Gaps may be present too.
    pub const OUT_OF_ORDER: i32 = 1;
    /// The command line is invalid (clap's own exit code for usage errors).
    pub const USAGE: i32 = 2;
    /// Gaps (a `walrelay-prev-key` names a key that never arrived) or
    /// malformed walrelay headers, but no key out of order.
    pub const GAPS: i32 = 3;
    /// Nothing could be verified: Kafka unreachable, a topic or partition
    /// missing, a bad configuration, or consumer errors and no record read.
    pub const ERROR: i32 = 4;
}

/// Most findings kept (and printed) per partition and source; counts stay
/// exact.
pub const MAX_FINDINGS: usize = 100;

/// Default `--idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT: &str = "2s";

/// Where to start reading one partition (`--from TOPIC:PARTITION:OFFSET`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartAt {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

fn parse_start_at(s: &str) -> Result<StartAt, String> {
    let bad = || format!("expected TOPIC:PARTITION:OFFSET, got {s:?}");
    // Topic names cannot contain ':', so split from the right.
    let mut parts = s.rsplitn(3, ':');
    let offset = parts.next().ok_or_else(bad)?;
    let partition = parts.next().ok_or_else(bad)?;
    let topic = parts.next().filter(|t| !t.is_empty()).ok_or_else(bad)?;
    let partition: i32 = partition
        .parse()
        .ok()
        .filter(|p| *p >= 0)
        .ok_or_else(|| format!("{s:?}: partition must be a number >= 0"))?;
    let offset: i64 = offset
        .parse()
        .ok()
        .filter(|o| *o >= 0)
        .ok_or_else(|| format!("{s:?}: offset must be a number >= 0"))?;
    Ok(StartAt {
        topic: topic.to_owned(),
        partition,
        offset,
    })
}

/// `walrelay verify`: read topics back and check their idempotency keys.
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// Topic to read, every partition from the beginning (repeatable).
    /// Required unless --from is given.
    #[arg(long = "topic", value_name = "TOPIC", required_unless_present = "from")]
    pub topics: Vec<String>,

    /// Read partition PARTITION of TOPIC from OFFSET instead of from the
    /// beginning (repeatable). A topic named only here is read only in the
    /// partitions named here.
    #[arg(long = "from", value_name = "TOPIC:PARTITION:OFFSET", value_parser = parse_start_at)]
    pub from: Vec<StartAt>,

    /// Stop once no new record arrived for this long. High watermarks and
    /// end-of-partition events are not trusted.
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_IDLE_TIMEOUT, value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// Stop after this long in any case (metadata lookup included), and
    /// report what was read [default: no limit].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,

    /// Print one JSON document (per-partition statistics, findings, totals)
    /// instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `walrelay verify` and returns the process exit code ([`exit`]).
/// Prints the report to stdout and errors to stderr.
///
/// `kafka` is all the configuration it needs: neither PostgreSQL nor the
/// rest of the relay's settings (the CLI builds it with
/// [`crate::commands::cli::Options::kafka_config`]).
pub async fn main(kafka: KafkaConfig, args: &VerifyArgs) -> i32 {
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let signal_stop = Arc::clone(&stop);
    let signals = tokio::spawn(async move {
        crate::shutdown::wait_for_stop_signal().await;
        signal_stop.store(true, Ordering::Relaxed);
    });
    let outcome = {
        let stop = Arc::clone(&stop);
        let args = args.clone();
        tokio::task::spawn_blocking(move || read(&kafka, &args, started, &stop)).await
    };
    signals.abort();
    let outcome = match outcome {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => {
            eprintln!("walrelay verify: {e:#}");
            return exit::ERROR;
        }
        Err(e) => {
            eprintln!("walrelay verify: the reader failed: {e}");
            return exit::ERROR;
        }
    };
    let elapsed = started.elapsed();
    let code = exit_code(&outcome.report, &outcome.errors);
    let text = if args.json {
        let output = Output {
            verdict: outcome.report.verdict(),
            exit_code: code,
            stopped_by: outcome.stopped_by,
            elapsed_ms: elapsed.as_millis() as u64,
            consumer_errors: outcome.errors,
            totals: outcome.report.totals,
            partitions: outcome.report.partitions,
        };
        match serde_json::to_string_pretty(&output) {
            Ok(mut t) => {
                t.push('\n');
                t
            }
            Err(e) => {
                eprintln!("walrelay verify: rendering JSON: {e}");
                return exit::ERROR;
            }
        }
    } else {
        let mut t = render_table(&outcome.report);
        let findings = render_findings(&outcome.report);
        if !findings.is_empty() {
            t.push('\n');
            t.push_str(&findings);
        }
        t.push('\n');
        t.push_str(&render_verdict(
            &outcome.report,
            outcome.stopped_by,
            elapsed,
            &outcome.errors,
        ));
        if code == exit::ERROR {
            t.push_str("ERROR: no record could be read\n");
        }
        t
    };
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return exit::ERROR;
    }
    code
}
