//! What `walrelay verify` prints: the table, the findings, the verdict, the
//! JSON output, and the exit code they imply. Pure: strings out, no I/O.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::analysis::{Finding, PartitionReport, Report, SourceReport, Totals, Verdict};
use super::{exit, MAX_FINDINGS};

/// Why reading stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoppedBy {
    /// Nothing new arrived for `--idle-timeout`.
    Idle,
    /// `--timeout` passed: the newest records may not have been read.
    Timeout,
    /// SIGINT or SIGTERM.
    Interrupted,
}

/// The document `--json` prints.
#[derive(Debug, Serialize)]
pub struct Output {
    pub verdict: Verdict,
    pub exit_code: i32,
    pub stopped_by: StoppedBy,
    pub elapsed_ms: u64,
    /// Consumer errors seen while reading (deduplicated, at most 20).
    pub consumer_errors: Vec<String>,
    pub totals: Totals,
    pub partitions: Vec<PartitionReport>,
}

/// The exit code for a finished read.
pub(super) fn exit_code(report: &Report, consumer_errors: &[String]) -> i32 {
    if report.totals.records == 0 && !consumer_errors.is_empty() {
        exit::ERROR
    } else {
        report.verdict().exit_code()
    }
}

/// A source id short enough for a table column: the default
/// `<system identifier>/<database>/<slot>` keeps the last digits of the
/// system identifier; anything else still too long loses its middle.
pub fn shorten_source(source: &str, max: usize) -> String {
    if source.is_empty() {
        return "(no source header)".to_owned();
    }
    if source.chars().count() <= max {
        return source.to_owned();
    }
    let mut text = source.to_owned();
    if let Some((first, rest)) = source.split_once('/') {
        let n = first.chars().count();
        if n > 8 {
            let tail: String = first.chars().skip(n - 6).collect();
            text = format!("..{tail}/{rest}");
        }
    }
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max {
        return text;
    }
    let keep = max.saturating_sub(2);
    let head = keep / 2;
    let tail = keep - head;
    let mut out: String = chars[..head].iter().collect();
    out.push_str("..");
    out.extend(&chars[chars.len() - tail..]);
    out
}

const SOURCE_WIDTH: usize = 32;
const MAX_PRINTED_FINDINGS: usize = 20;

pub(super) fn render_table(report: &Report) -> String {
    let header = [
        "TOPIC",
        "PARTITION",
        "SOURCE",
        "RECORDS",
        "DISTINCT",
        "DUPLICATES",
        "OUT-OF-ORDER",
        "GAPS",
        "UNCHECKED",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    let dash = || "-".to_owned();
    for p in &report.partitions {
        let row = |source: String, cells: [String; 6]| {
            let mut r = vec![p.topic.clone(), p.partition.to_string(), source];
            r.extend(cells);
            r
        };
        for s in &p.sources {
            rows.push(row(
                shorten_source(&s.source, SOURCE_WIDTH),
                [
                    s.records.to_string(),
                    s.distinct.to_string(),
                    s.duplicates.to_string(),
                    s.out_of_order.to_string(),
                    s.gaps.to_string(),
                    s.unchecked.to_string(),
                ],
            ));
        }
        if p.without_headers > 0 {
            rows.push(row(
                "(no walrelay headers)".into(),
                [
                    p.without_headers.to_string(),
                    dash(),
                    dash(),
                    dash(),
                    dash(),
                    dash(),
                ],
            ));
        }
        if p.malformed > 0 {
            rows.push(row(
                "(malformed headers)".into(),
                [
                    p.malformed.to_string(),
                    dash(),
                    dash(),
                    dash(),
                    dash(),
                    dash(),
                ],
            ));
        }
        if p.records == 0 {
            rows.push(row(
                "-".into(),
                ["0".into(), dash(), dash(), dash(), dash(), dash()],
            ));
        }
    }
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i > 0 {
                text.push_str("  ");
            }
            // Text columns left-aligned, numbers right-aligned.
            if i < 3 {
                text.push_str(cell);
                text.extend(std::iter::repeat_n(' ', pad));
            } else {
                text.extend(std::iter::repeat_n(' ', pad));
                text.push_str(cell);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for r in &rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

pub(super) fn render_findings(report: &Report) -> String {
    let mut lines = Vec::new();
    let mut total = 0u64;
    for p in &report.partitions {
        let at = format!("{}/{}", p.topic, p.partition);
        for f in &p.findings {
            match f {
                Finding::Malformed {
                    offset,
                    header,
                    value,
                } => lines.push(format!(
                    "malformed: {at} offset {offset}: {header} {value:?} is not 32 lowercase hex digits"
                )),
                Finding::DuplicateHeader { offset, header } => lines.push(format!(
                    "malformed: {at} offset {offset}: the walrelay header {header} occurs more than \
                     once (a copy was added by someone else, e.g. an application header named \
                     like walrelay's); the record is not trusted"
                )),
                _ => {}
            }
        }
        total += p.malformed;
        for s in &p.sources {
            total += s.out_of_order + s.gaps;
            let source = shorten_source(&s.source, SOURCE_WIDTH);
            for f in &s.findings {
                lines.push(match f {
                    Finding::OutOfOrder {
                        offset,
                        key,
                        high_water_mark,
                    } => format!(
                        "out-of-order: {at} source {source} offset {offset}: key {key} is below the \
                         high-water mark {high_water_mark} and was never seen before"
                    ),
                    Finding::Gap {
                        offset,
                        key,
                        prev_key,
                    } => format!(
                        "gap: {at} source {source} offset {offset}: key {key} follows prev-key \
                         {prev_key}, which never arrived"
                    ),
                    Finding::Malformed { .. } | Finding::DuplicateHeader { .. } => continue,
                });
            }
        }
    }
    let mut out = String::new();
    for l in lines.iter().take(MAX_PRINTED_FINDINGS) {
        out.push_str(l);
        out.push('\n');
    }
    let shown = lines.len().min(MAX_PRINTED_FINDINGS) as u64;
    if total > shown {
        let _ = writeln!(
            out,
            "... and {} more (--json lists up to {MAX_FINDINGS} per partition and source)",
            total - shown
        );
    }
    out
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

pub(super) fn render_verdict(
    report: &Report,
    stopped_by: StoppedBy,
    elapsed: Duration,
    errors: &[String],
) -> String {
    let t = &report.totals;
    let affected = |f: fn(&SourceReport) -> u64| -> String {
        let names: Vec<String> = report
            .partitions
            .iter()
            .filter(|p| p.sources.iter().any(|s| f(s) > 0))
            .map(|p| format!("{}/{}", p.topic, p.partition))
            .collect();
        names.join(", ")
    };
    let read = format!(
        "{} in {}",
        plural(t.records, "record", "records"),
        plural(t.partitions, "partition", "partitions")
    );
    let mut out = match report.verdict() {
        Verdict::Clean => format!(
            "OK: {read}; {}, no key out of order, no gap",
            plural(t.duplicates, "replayed duplicate", "replayed duplicates")
        ),
        Verdict::OutOfOrder => format!(
            "FAIL: {} in {} (a high-water-mark consumer would drop them); {}; {read}",
            plural(t.out_of_order, "key out of order", "keys out of order"),
            affected(|s| s.out_of_order),
            plural(t.gaps, "gap", "gaps")
        ),
        Verdict::Gaps => format!(
            "FAIL: {} in {} (records missing); no key out of order; {read}",
            plural(t.gaps, "gap", "gaps"),
            affected(|s| s.gaps)
        ),
        Verdict::Malformed => format!(
            "FAIL: {} with malformed walrelay headers; no key out of order, no gap; {read}",
            plural(t.malformed, "record", "records")
        ),
    };
    out.push('\n');
    if t.without_headers > 0 {
        let _ = writeln!(
            out,
            "note: {} without walrelay headers (not checked)",
            plural(t.without_headers, "record", "records")
        );
    }
    if t.unchecked > 0 {
        let _ = writeln!(
            out,
            "note: {} below the first key read of a partition not read from offset 0 (could not be checked)",
            plural(t.unchecked, "key", "keys")
        );
    }
    match stopped_by {
        StoppedBy::Idle => {}
        StoppedBy::Timeout => {
            let _ = writeln!(
                out,
                "note: stopped by --timeout after {}; newer records were not read",
                humantime::format_duration(Duration::from_millis(elapsed.as_millis() as u64))
            );
        }
        StoppedBy::Interrupted => {
            out.push_str("note: interrupted; newer records were not read\n");
        }
    }
    if !errors.is_empty() {
        let _ = writeln!(
            out,
            "note: {} while reading (see stderr); the read may be incomplete",
            plural(
                errors.len() as u64,
                "consumer error",
                "distinct consumer errors"
            )
        );
    }
    out
}
