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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use crate::config::KafkaConfig;
use crate::key::EventKey;
use crate::record::header;

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

// ---------------------------------------------------------------------
// The analysis: pure, no I/O.
// ---------------------------------------------------------------------

/// Something wrong with one record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// The key is below the high-water mark and was never seen before in
    /// this partition and source: a high-water-mark consumer drops it.
    OutOfOrder {
        offset: i64,
        key: EventKey,
        high_water_mark: EventKey,
    },
    /// `walrelay-prev-key` names a key never seen in this partition and
    /// source: the record the relay sent before this one is missing.
    Gap {
        offset: i64,
        key: EventKey,
        prev_key: EventKey,
    },
    /// A walrelay header that is not 32 lowercase hex digits.
    Malformed {
        offset: i64,
        header: &'static str,
        value: String,
    },
    /// A walrelay header (`idempotency-key`, `walrelay-*`) that occurs more
    /// than once: walrelay writes each of its headers once, so a copy came
    /// from elsewhere (an application header named like walrelay's) and
    /// neither can be trusted. The record is counted as malformed and not
    /// classified.
    DuplicateHeader { offset: i64, header: String },
}

/// Statistics of one source in one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceReport {
    /// The `walrelay-source` header; empty when the header is missing.
    pub source: String,
    /// Records with a valid idempotency key.
    pub records: u64,
    /// Distinct keys among them.
    pub distinct: u64,
    /// Records whose key was seen before in this partition and source: a
    /// replay, harmless.
    pub duplicates: u64,
    /// Keys below the high-water mark never seen before (see
    /// [`Finding::OutOfOrder`]).
    pub out_of_order: u64,
    /// Records whose prev-key names a key never seen (see [`Finding::Gap`]).
    pub gaps: u64,
    /// Keys that could not be classified: below the first key read, in a
    /// partition not read from offset 0, so their first copy may lie before
    /// the start of the read.
    pub unchecked: u64,
    /// The first key read.
    pub first_key: Option<EventKey>,
    /// The highest key read.
    pub high_water_mark: Option<EventKey>,
    /// The first [`MAX_FINDINGS`] out-of-order keys and gaps, in offset
    /// order.
    pub findings: Vec<Finding>,
}

/// Statistics of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionReport {
    pub topic: String,
    pub partition: i32,
    /// Offset of the first and last record read.
    pub first_offset: Option<i64>,
    pub last_offset: Option<i64>,
    /// Whether the first record read had offset 0: then every record of the
    /// partition was read, and every key can be classified.
    pub from_offset_zero: bool,
    /// Every record read, with or without walrelay headers.
    pub records: u64,
    /// Records without an `idempotency-key` header.
    pub without_headers: u64,
    /// Records with a malformed `idempotency-key` or `walrelay-prev-key`.
    pub malformed: u64,
    /// Per source, in source order.
    pub sources: Vec<SourceReport>,
    /// The first [`MAX_FINDINGS`] malformed headers.
    pub findings: Vec<Finding>,
}

/// Sums over all partitions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub partitions: u64,
    pub records: u64,
    pub without_headers: u64,
    pub malformed: u64,
    pub distinct: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    pub gaps: u64,
    pub unchecked: u64,
}

/// The result of an analysis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// In (topic, partition) order.
    pub partitions: Vec<PartitionReport>,
    pub totals: Totals,
}

/// The overall outcome, most severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    OutOfOrder,
    Gaps,
    Malformed,
    Clean,
}

impl Verdict {
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Clean => exit::CLEAN,
            Verdict::OutOfOrder => exit::OUT_OF_ORDER,
            Verdict::Gaps | Verdict::Malformed => exit::GAPS,
        }
    }
}

impl Report {
    pub fn verdict(&self) -> Verdict {
        let t = &self.totals;
        if t.out_of_order > 0 {
            Verdict::OutOfOrder
        } else if t.gaps > 0 {
            Verdict::Gaps
        } else if t.malformed > 0 {
            Verdict::Malformed
        } else {
            Verdict::Clean
        }
    }
}

/// The keys of one (topic, partition, source) read so far.
///
/// Keys that arrive above the high-water mark (all keys, in a healthy
/// stream) are appended to a sorted vector: 16 bytes per distinct key.
/// The rare keys that arrive below it go to a `BTreeSet`.
#[derive(Debug, Default)]
struct SourceState {
    records: u64,
    duplicates: u64,
    out_of_order: u64,
    gaps: u64,
    unchecked: u64,
    /// Keys first seen above the high-water mark, ascending: the first is
    /// the first key read, the last is the high-water mark.
    fresh: Vec<u128>,
    /// Keys first seen below the high-water mark.
    below: BTreeSet<u128>,
    findings: Vec<Finding>,
}

impl SourceState {
    fn seen(&self, key: u128) -> bool {
        self.fresh.binary_search(&key).is_ok() || self.below.contains(&key)
    }

    fn first(&self) -> Option<u128> {
        self.fresh.first().copied()
    }

    fn high_water_mark(&self) -> Option<u128> {
        self.fresh.last().copied()
    }

    fn note(&mut self, finding: Finding) {
        if self.findings.len() < MAX_FINDINGS {
            self.findings.push(finding);
        }
    }

    /// One record with a valid key. `complete`: the partition was read from
    /// offset 0, so a key's first copy cannot lie before the read.
    fn observe(&mut self, offset: i64, key: u128, prev: Option<u128>, complete: bool) {
        self.records += 1;
        // The record the relay sent before this one (same session, topic
        // and partition) must be here, at a lower offset.
        if let Some(prev) = prev {
            let judgeable = complete || self.first().is_some_and(|first| prev >= first);
            if judgeable && !self.seen(prev) {
                self.gaps += 1;
                self.note(Finding::Gap {
                    offset,
                    key: EventKey(key),
                    prev_key: EventKey(prev),
                });
            }
        }
        match (self.high_water_mark(), self.first()) {
            _ if self.seen(key) => self.duplicates += 1,
            (None, _) => self.fresh.push(key),
            (Some(hwm), _) if key > hwm => self.fresh.push(key),
            // Read from the middle of the partition: the first copy of a
            // key below the first key read may lie before the read.
            (Some(_), Some(first)) if !complete && key < first => {
                self.unchecked += 1;
                self.below.insert(key);
            }
            (Some(hwm), _) => {
                self.out_of_order += 1;
                self.below.insert(key);
                self.note(Finding::OutOfOrder {
                    offset,
                    key: EventKey(key),
                    high_water_mark: EventKey(hwm),
                });
            }
        }
    }

    fn report(&self, source: &str) -> SourceReport {
        SourceReport {
            source: source.to_owned(),
            records: self.records,
            distinct: (self.fresh.len() + self.below.len()) as u64,
            duplicates: self.duplicates,
            out_of_order: self.out_of_order,
            gaps: self.gaps,
            unchecked: self.unchecked,
            first_key: self.first().map(EventKey),
            high_water_mark: self.high_water_mark().map(EventKey),
            findings: self.findings.clone(),
        }
    }
}

#[derive(Debug, Default)]
struct PartitionState {
    first_offset: Option<i64>,
    last_offset: Option<i64>,
    records: u64,
    without_headers: u64,
    malformed: u64,
    sources: BTreeMap<String, SourceState>,
    findings: Vec<Finding>,
}

impl PartitionState {
    fn malformed(&mut self, offset: i64, header: &'static str, value: &[u8]) {
        self.malformed += 1;
        if self.findings.len() < MAX_FINDINGS {
            self.findings.push(Finding::Malformed {
                offset,
                header,
                value: String::from_utf8_lossy(value).chars().take(64).collect(),
            });
        }
    }
}

/// The first reserved header name ([`header::is_reserved`]) that occurs
/// more than once, if any.
fn duplicated_reserved<'h>(headers: &[(&'h str, &[u8])]) -> Option<&'h str> {
    headers.iter().enumerate().find_map(|(i, (name, _))| {
        (header::is_reserved(name) && headers[..i].iter().any(|(earlier, _)| earlier == name))
            .then_some(*name)
    })
}

/// The first header called `name`.
fn find_header<'h>(headers: &[(&str, &'h [u8])], name: &str) -> Option<&'h [u8]> {
    headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

/// A key as walrelay writes it: exactly 32 lowercase hex digits.
fn parse_key(value: &[u8]) -> Option<u128> {
    if value.len() != 32 || !value.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    EventKey::from_hex(text).ok().map(|k| k.0)
}

/// The incremental form of [`analyze`]: feed records in the order read
/// (per partition in offset order; partitions may interleave).
#[derive(Debug, Default)]
pub struct Analyzer {
    partitions: BTreeMap<String, BTreeMap<i32, PartitionState>>,
}

impl Analyzer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Lists a partition in the report even if no record arrives from it.
    pub fn expect_partition(&mut self, topic: &str, partition: i32) {
        self.partition(topic, partition);
    }

    fn partition(&mut self, topic: &str, partition: i32) -> &mut PartitionState {
        if !self.partitions.contains_key(topic) {
            self.partitions.insert(topic.to_owned(), BTreeMap::new());
        }
        self.partitions
            .get_mut(topic)
            .map(|p| p.entry(partition).or_default())
            .unwrap_or_else(|| unreachable!("inserted above"))
    }

    /// One record: its topic, partition, offset and headers (a header with
    /// a null value counts as empty).
    pub fn observe(&mut self, topic: &str, partition: i32, offset: i64, headers: &[(&str, &[u8])]) {
        let p = self.partition(topic, partition);
        p.records += 1;
        let first_offset = *p.first_offset.get_or_insert(offset);
        p.last_offset = Some(offset);
        if let Some(name) = duplicated_reserved(headers) {
            p.malformed += 1;
            if p.findings.len() < MAX_FINDINGS {
                p.findings.push(Finding::DuplicateHeader {
                    offset,
                    header: name.to_owned(),
                });
            }
            return;
        }
        let Some(raw_key) = find_header(headers, header::IDEMPOTENCY_KEY) else {
            p.without_headers += 1;
            return;
        };
        let Some(key) = parse_key(raw_key) else {
            p.malformed(offset, header::IDEMPOTENCY_KEY, raw_key);
            return;
        };
        let prev = match find_header(headers, header::PREV_KEY) {
            // No header (older relay) or a session's first record.
            None | Some(b"") => None,
            Some(raw) => match parse_key(raw) {
                Some(prev) => Some(prev),
                None => {
                    p.malformed(offset, header::PREV_KEY, raw);
                    None
                }
            },
        };
        let source = find_header(headers, header::SOURCE).unwrap_or_default();
        let source = String::from_utf8_lossy(source);
        if !p.sources.contains_key(source.as_ref()) {
            p.sources.insert(source.to_string(), SourceState::default());
        }
        if let Some(state) = p.sources.get_mut(source.as_ref()) {
            state.observe(offset, key, prev, first_offset == 0);
        }
    }

    /// The statistics so far.
    pub fn report(&self) -> Report {
        let mut totals = Totals::default();
        let mut partitions = Vec::new();
        for (topic, by_partition) in &self.partitions {
            for (&partition, p) in by_partition {
                let sources: Vec<SourceReport> =
                    p.sources.iter().map(|(s, st)| st.report(s)).collect();
                totals.partitions += 1;
                totals.records += p.records;
                totals.without_headers += p.without_headers;
                totals.malformed += p.malformed;
                for s in &sources {
                    totals.distinct += s.distinct;
                    totals.duplicates += s.duplicates;
                    totals.out_of_order += s.out_of_order;
                    totals.gaps += s.gaps;
                    totals.unchecked += s.unchecked;
                }
                partitions.push(PartitionReport {
                    topic: topic.clone(),
                    partition,
                    first_offset: p.first_offset,
                    last_offset: p.last_offset,
                    from_offset_zero: p.first_offset == Some(0),
                    records: p.records,
                    without_headers: p.without_headers,
                    malformed: p.malformed,
                    sources,
                    findings: p.findings.clone(),
                });
            }
        }
        Report { partitions, totals }
    }
}

/// Analyzes records given as (topic, partition, offset, headers), in the
/// order read (per partition in offset order).
pub fn analyze<'a, I>(records: I) -> Report
where
    I: IntoIterator<Item = (&'a str, i32, i64, &'a [(&'a str, &'a [u8])])>,
{
    let mut analyzer = Analyzer::new();
    for (topic, partition, offset, headers) in records {
        analyzer.observe(topic, partition, offset, headers);
    }
    analyzer.report()
}

// ---------------------------------------------------------------------
// Output.
// ---------------------------------------------------------------------

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
fn exit_code(report: &Report, consumer_errors: &[String]) -> i32 {
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

fn render_table(report: &Report) -> String {
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

fn render_findings(report: &Report) -> String {
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

fn render_verdict(
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

// ---------------------------------------------------------------------
// Kafka.
// ---------------------------------------------------------------------

/// The longest single poll, so that deadlines and interrupts are met
/// closely.
const POLL_STEP: Duration = Duration::from_millis(100);
/// The longest metadata lookup.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_ERRORS_KEPT: usize = 20;

/// `walrelay verify`'s reader: the one builder of Kafka client properties
/// ([`crate::kafka_client`], secrets resolved), with a group id of its own.
fn consumer_config(kafka: &KafkaConfig) -> anyhow::Result<ClientConfig> {
    let mut c =
        crate::kafka_client::client_config(kafka, crate::kafka_client::KafkaClient::Verify)?;
    c.set("group.id", format!("walrelay-verify-{:016x}", random_u64()));
    Ok(c)
}

/// Some bits that differ between runs, for a unique group id.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish()
}

/// Which partitions to read, from where.
fn plan(
    consumer: &BaseConsumer,
    args: &VerifyArgs,
    bootstrap: &str,
    timeout: Duration,
) -> anyhow::Result<BTreeMap<(String, i32), Offset>> {
    let md = consumer
        .fetch_metadata(None, timeout)
        .with_context(|| format!("fetching metadata from {bootstrap}"))?;
    let partitions_of = |topic: &str| -> anyhow::Result<Vec<i32>> {
        let t = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .ok_or_else(|| anyhow!("topic {topic:?} does not exist on {bootstrap}"))?;
        if let Some(err) = t.error() {
            bail!(
                "topic {topic:?} on {bootstrap}: {}",
                RDKafkaErrorCode::from(err)
            );
        }
        if t.partitions().is_empty() {
            bail!("topic {topic:?} on {bootstrap} has no partitions");
        }
        Ok(t.partitions().iter().map(|p| p.id()).collect())
    };
    let mut plan = BTreeMap::new();
    for topic in &args.topics {
        for p in partitions_of(topic)? {
            plan.insert((topic.clone(), p), Offset::Beginning);
        }
    }
    for s in &args.from {
        if !partitions_of(&s.topic)?.contains(&s.partition) {
            bail!("topic {:?} has no partition {}", s.topic, s.partition);
        }
        plan.insert((s.topic.clone(), s.partition), Offset::Offset(s.offset));
    }
    Ok(plan)
}

struct ReadOutcome {
    report: Report,
    stopped_by: StoppedBy,
    errors: Vec<String>,
}

fn read(
    kafka: &KafkaConfig,
    args: &VerifyArgs,
    started: Instant,
    stop: &AtomicBool,
) -> anyhow::Result<ReadOutcome> {
    let deadline = args.timeout.map(|t| started + t);
    let remaining = || deadline.map(|d| d.saturating_duration_since(Instant::now()));
    let consumer: BaseConsumer = consumer_config(kafka)?
        .create()
        .context("creating the Kafka consumer")?;
    let metadata_timeout = remaining().map_or(METADATA_TIMEOUT, |r| r.min(METADATA_TIMEOUT));
    let plan = plan(&consumer, args, &kafka.bootstrap_servers, metadata_timeout)?;
    let mut analyzer = Analyzer::new();
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in &plan {
        analyzer.expect_partition(topic, *partition);
        tpl.add_partition_offset(topic, *partition, *offset)?;
    }
    consumer.assign(&tpl).context("assigning partitions")?;

    let mut errors: Vec<String> = Vec::new();
    let mut last_record = Instant::now();
    let stopped_by = loop {
        if stop.load(Ordering::Relaxed) {
            break StoppedBy::Interrupted;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break StoppedBy::Timeout;
        }
        let idle_left = args.idle_timeout.saturating_sub(now - last_record);
        if idle_left.is_zero() {
            break StoppedBy::Idle;
        }
        let step = remaining()
            .map_or(POLL_STEP, |r| r.min(POLL_STEP))
            .min(idle_left);
        match consumer.poll(step) {
            Some(Ok(msg)) => {
                let headers: Vec<(&str, &[u8])> = msg
                    .headers()
                    .map(|hs| {
                        hs.iter()
                            .map(|h| (h.key, h.value.unwrap_or_default()))
                            .collect()
                    })
                    .unwrap_or_default();
                analyzer.observe(msg.topic(), msg.partition(), msg.offset(), &headers);
                last_record = Instant::now();
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => {
                let text = e.to_string();
                if !errors.contains(&text) {
                    tracing::warn!("reading from Kafka: {text}");
                    if errors.len() < MAX_ERRORS_KEPT {
                        errors.push(text);
                    }
                }
            }
            None => {}
        }
    };
    Ok(ReadOutcome {
        report: analyzer.report(),
        stopped_by,
        errors,
    })
}

/// Runs `walrelay verify` and returns the process exit code ([`exit`]).
/// Prints the report to stdout and errors to stderr.
///
/// `kafka` is all the configuration it needs: neither PostgreSQL nor the
/// rest of the relay's settings (the CLI builds it with
/// [`crate::cli::Options::kafka_config`]).
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

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "orders";
    const SRC: &str = "7301234567890123456/postgres/walrelay";

    /// A walrelay-style record: (offset, key, prev-key) with `source`.
    struct Rec {
        partition: i32,
        offset: i64,
        headers: Vec<(&'static str, Vec<u8>)>,
    }

    fn hex(k: u128) -> Vec<u8> {
        EventKey(k).to_hex().into_bytes()
    }

    fn rec(partition: i32, offset: i64, source: &str, key: u128, prev: Option<u128>) -> Rec {
        Rec {
            partition,
            offset,
            headers: vec![
                (header::IDEMPOTENCY_KEY, hex(key)),
                (header::SOURCE, source.as_bytes().to_vec()),
                (header::LSN, b"0/16B3748".to_vec()),
                (header::PREV_KEY, prev.map(hex).unwrap_or_default()),
            ],
        }
    }

    /// One session's records: keys in order, prev-key chained, the first
    /// with an empty prev-key.
    fn session(partition: i32, first_offset: i64, source: &str, keys: &[u128]) -> Vec<Rec> {
        let mut prev = None;
        keys.iter()
            .enumerate()
            .map(|(i, &k)| {
                let r = rec(partition, first_offset + i as i64, source, k, prev);
                prev = Some(k);
                r
            })
            .collect()
    }

    fn run(records: &[Rec]) -> Report {
        let headers: Vec<Vec<(&str, &[u8])>> = records
            .iter()
            .map(|r| r.headers.iter().map(|(k, v)| (*k, v.as_slice())).collect())
            .collect();
        analyze(
            records
                .iter()
                .zip(&headers)
                .map(|(r, h)| (T, r.partition, r.offset, h.as_slice())),
        )
    }

    fn only_source(report: &Report) -> &SourceReport {
        assert_eq!(report.partitions.len(), 1, "{report:#?}");
        assert_eq!(report.partitions[0].sources.len(), 1, "{report:#?}");
        &report.partitions[0].sources[0]
    }

    #[test]
    fn clean_stream() {
        let report = run(&session(0, 0, SRC, &[1, 2, 3, 4]));
        let s = only_source(&report);
        assert_eq!((s.records, s.distinct, s.duplicates), (4, 4, 0));
        assert_eq!((s.out_of_order, s.gaps, s.unchecked), (0, 0, 0));
        assert_eq!(s.high_water_mark, Some(EventKey(4)));
        assert_eq!(report.verdict(), Verdict::Clean);
        assert_eq!(report.verdict().exit_code(), exit::CLEAN);
    }

    #[test]
    fn replayed_tail_is_duplicates_only() {
        // Keys 1,2,3, then a new session replays from 2: 1,2,3,2,3,4.
        let mut records = session(0, 0, SRC, &[1, 2, 3]);
        records.extend(session(0, 3, SRC, &[2, 3, 4]));
        let report = run(&records);
        let s = only_source(&report);
        assert_eq!((s.records, s.distinct, s.duplicates), (6, 4, 2));
        assert_eq!((s.out_of_order, s.gaps), (0, 0));
        assert_eq!(report.verdict(), Verdict::Clean);
    }

    #[test]
    fn key_below_the_high_water_mark_never_seen_is_out_of_order() {
        // 1, 3, 2: the relay's prev-key chain is intact, but 2 arrives after
        // 3 and a high-water-mark consumer would drop it.
        let report = run(&session(0, 0, SRC, &[1, 3, 2]));
        let s = only_source(&report);
        assert_eq!((s.out_of_order, s.gaps, s.duplicates), (1, 0, 0));
        assert_eq!(
            s.findings,
            vec![Finding::OutOfOrder {
                offset: 2,
                key: EventKey(2),
                high_water_mark: EventKey(3)
            }]
        );
        assert_eq!(report.verdict().exit_code(), exit::OUT_OF_ORDER);
        // A later replay of 2 is a duplicate, not a second finding.
        let mut records = session(0, 0, SRC, &[1, 3, 2]);
        records.extend(session(0, 3, SRC, &[2, 3]));
        let s = run(&records).partitions[0].sources[0].clone();
        assert_eq!((s.out_of_order, s.duplicates, s.distinct), (1, 2, 3));
    }

    #[test]
    fn prev_key_never_seen_is_a_gap() {
        // 3 says the relay sent 2 before it; 2 is not there.
        let records = vec![
            rec(0, 0, SRC, 1, None),
            rec(0, 1, SRC, 3, Some(2)),
            rec(0, 2, SRC, 4, Some(3)),
        ];
        let report = run(&records);
        let s = only_source(&report);
        assert_eq!((s.gaps, s.out_of_order), (1, 0));
        assert_eq!(
            s.findings,
            vec![Finding::Gap {
                offset: 1,
                key: EventKey(3),
                prev_key: EventKey(2)
            }]
        );
        assert_eq!(report.verdict(), Verdict::Gaps);
        assert_eq!(report.verdict().exit_code(), exit::GAPS);
    }

    #[test]
    fn lost_first_records_are_a_gap_when_read_from_offset_zero() {
        let report = run(&[rec(0, 0, SRC, 5, Some(4)), rec(0, 1, SRC, 6, Some(5))]);
        assert_eq!(only_source(&report).gaps, 1);
    }

    #[test]
    fn out_of_order_wins_over_gaps() {
        let records = vec![
            rec(0, 0, SRC, 1, None),
            rec(0, 1, SRC, 5, Some(4)),
            rec(0, 2, SRC, 3, Some(5)),
        ];
        let report = run(&records);
        assert_eq!(report.totals.gaps, 1);
        assert_eq!(report.totals.out_of_order, 1);
        assert_eq!(report.verdict().exit_code(), exit::OUT_OF_ORDER);
    }

    #[test]
    fn sources_in_one_partition_are_kept_apart() {
        // Source B's keys are far below A's: not comparable, not out of order.
        let a = session(0, 0, "a/db/slot", &[100, 101, 102]);
        let b = session(0, 0, "b/db/slot", &[1, 2, 3]);
        let mut records = Vec::new();
        for (i, (x, y)) in a.into_iter().zip(b).enumerate() {
            records.push(Rec {
                offset: 2 * i as i64,
                ..x
            });
            records.push(Rec {
                offset: 2 * i as i64 + 1,
                ..y
            });
        }
        let report = run(&records);
        let p = &report.partitions[0];
        assert_eq!(p.sources.len(), 2);
        assert_eq!(p.sources[0].source, "a/db/slot");
        assert_eq!(p.sources[1].source, "b/db/slot");
        for s in &p.sources {
            assert_eq!((s.records, s.distinct), (3, 3));
            assert_eq!((s.out_of_order, s.gaps, s.duplicates), (0, 0, 0));
        }
        // The same key from two sources is not a duplicate either.
        let report = run(&[rec(0, 0, "a", 7, None), rec(0, 1, "b", 7, None)]);
        assert_eq!(report.totals.duplicates, 0);
        assert_eq!(report.totals.distinct, 2);
    }

    #[test]
    fn partitions_are_kept_apart() {
        let mut records = session(0, 0, SRC, &[5, 6]);
        records.extend(session(1, 0, SRC, &[1, 2]));
        let report = run(&records);
        assert_eq!(report.partitions.len(), 2);
        assert_eq!(report.totals.out_of_order, 0);
        assert_eq!(report.totals.records, 4);
    }

    #[test]
    fn records_without_headers_are_counted_per_partition() {
        let mut records = session(0, 0, SRC, &[1, 2]);
        records.push(Rec {
            partition: 0,
            offset: 2,
            headers: vec![("trace", b"t1".to_vec())],
        });
        records.push(Rec {
            partition: 1,
            offset: 0,
            headers: vec![],
        });
        let report = run(&records);
        assert_eq!(report.partitions[0].without_headers, 1);
        assert_eq!(report.partitions[0].records, 3);
        assert_eq!(report.partitions[0].sources[0].records, 2);
        assert_eq!(report.partitions[1].without_headers, 1);
        assert!(report.partitions[1].sources.is_empty());
        assert_eq!(report.totals.without_headers, 2);
        assert_eq!(report.verdict(), Verdict::Clean);
    }

    #[test]
    fn a_walrelay_header_carried_twice_makes_the_record_malformed() {
        let mut records = session(0, 0, SRC, &[1, 2, 3]);
        // An application header named like walrelay's prev-key would
        // otherwise report a gap that never happened; a second
        // idempotency-key would raise the high-water mark.
        records[1].headers.push((header::PREV_KEY, hex(0xabcd)));
        records[2]
            .headers
            .push((header::IDEMPOTENCY_KEY, hex(u128::MAX)));
        let report = run(&records);
        let p = &report.partitions[0];
        assert_eq!(p.malformed, 2, "{report:#?}");
        assert_eq!(
            p.findings,
            vec![
                Finding::DuplicateHeader {
                    offset: 1,
                    header: header::PREV_KEY.into()
                },
                Finding::DuplicateHeader {
                    offset: 2,
                    header: header::IDEMPOTENCY_KEY.into()
                },
            ]
        );
        assert_eq!(report.totals.gaps, 0, "the forged prev-key is not trusted");
        assert_eq!(report.verdict(), Verdict::Malformed);
        assert_eq!(report.verdict().exit_code(), exit::GAPS);
        assert!(render_findings(&report).contains("occurs more than once"));
        // Application headers may repeat.
        let mut records = session(0, 0, SRC, &[1]);
        records[0].headers.push(("trace", b"1".to_vec()));
        records[0].headers.push(("trace", b"2".to_vec()));
        assert_eq!(run(&records).verdict(), Verdict::Clean);
    }

    #[test]
    fn malformed_headers_are_reported() {
        let records = vec![
            Rec {
                partition: 0,
                offset: 0,
                headers: vec![(header::IDEMPOTENCY_KEY, b"not-a-key".to_vec())],
            },
            Rec {
                partition: 0,
                offset: 1,
                headers: vec![(
                    header::IDEMPOTENCY_KEY,
                    format!("{:0>32}", "A").into_bytes(),
                )],
            },
            Rec {
                partition: 0,
                offset: 2,
                headers: vec![
                    (header::IDEMPOTENCY_KEY, hex(3)),
                    (header::PREV_KEY, b"xyz".to_vec()),
                ],
            },
        ];
        let report = run(&records);
        let p = &report.partitions[0];
        assert_eq!(p.malformed, 3);
        assert_eq!(p.findings.len(), 3);
        // The record with a bad prev-key still counts with its key, under
        // the empty source.
        assert_eq!(p.sources[0].source, "");
        assert_eq!(p.sources[0].records, 1);
        assert_eq!(report.verdict(), Verdict::Malformed);
        assert_eq!(report.verdict().exit_code(), exit::GAPS);
    }

    #[test]
    fn read_from_the_middle_does_not_blame_what_came_before() {
        // The partition: session 1 sent 1..=6, session 2 replays 3..=8.
        let mut all = session(0, 0, SRC, &[1, 2, 3, 4, 5, 6]);
        all.extend(session(0, 6, SRC, &[3, 4, 5, 6, 7, 8]));
        // Reading from offset 4 (key 5): 3 and 4 of the replay may have
        // first copies before the read: unchecked, not out of order. The
        // first record's prev-key (4) lies before the read: not a gap.
        let report = run(&all[4..]);
        let s = only_source(&report);
        assert!(!report.partitions[0].from_offset_zero);
        assert_eq!((s.out_of_order, s.gaps), (0, 0), "{s:#?}");
        assert_eq!(s.unchecked, 2);
        assert_eq!(s.duplicates, 2);
        assert_eq!(report.verdict(), Verdict::Clean);

        // But a key between the first key read and the high-water mark
        // that was never read is out of order even then.
        let mut broken = session(0, 10, SRC, &[10, 11, 13]);
        broken.extend(session(0, 13, SRC, &[12]));
        assert_eq!(run(&broken).totals.out_of_order, 1);
        // And a prev-key at or above the first key read that never arrived
        // is a gap.
        let gap = vec![rec(0, 10, SRC, 10, Some(9)), rec(0, 11, SRC, 12, Some(11))];
        let s = run(&gap).partitions[0].sources[0].clone();
        assert_eq!((s.gaps, s.unchecked), (1, 0));
    }

    #[test]
    fn expected_partitions_appear_even_when_empty() {
        let mut a = Analyzer::new();
        a.expect_partition(T, 0);
        a.expect_partition(T, 1);
        let report = a.report();
        assert_eq!(report.partitions.len(), 2);
        assert_eq!(report.totals.partitions, 2);
        assert_eq!(report.partitions[1].records, 0);
        assert!(render_table(&report).contains("orders  1"));
    }

    #[test]
    fn from_flag_parses() {
        assert_eq!(
            parse_start_at("my.topic:3:1200"),
            Ok(StartAt {
                topic: "my.topic".into(),
                partition: 3,
                offset: 1200
            })
        );
        for bad in ["t:1", ":1:2", "t:-1:0", "t:1:x", "t:1:-5", "t"] {
            assert!(parse_start_at(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sources_are_shortened_for_the_table() {
        assert_eq!(shorten_source("a/b/c", 32), "a/b/c");
        assert_eq!(
            shorten_source("7301234567890123456/postgres/walrelay", 32),
            "..123456/postgres/walrelay"
        );
        let long = "x".repeat(100);
        let short = shorten_source(&long, 32);
        assert_eq!(short.chars().count(), 32);
        assert!(short.contains(".."));
        let long_slot = format!("7301234567890123456/app/{}", "s".repeat(60));
        assert_eq!(shorten_source(&long_slot, 32).chars().count(), 32);
        assert_eq!(shorten_source("", 32), "(no source header)");
    }

    #[test]
    fn table_findings_and_verdict() {
        let mut records = session(0, 0, SRC, &[1, 3, 2]);
        records.push(Rec {
            partition: 0,
            offset: 3,
            headers: vec![],
        });
        let report = run(&records);
        let table = render_table(&report);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "TOPIC",
                "PARTITION",
                "SOURCE",
                "RECORDS",
                "DISTINCT",
                "DUPLICATES",
                "OUT-OF-ORDER",
                "GAPS",
                "UNCHECKED"
            ]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "orders",
                "0",
                "..123456/postgres/walrelay",
                "3",
                "3",
                "0",
                "1",
                "0",
                "0"
            ]
        );
        assert!(
            lines[1].contains("  ..123456/postgres/walrelay  "),
            "{table}"
        );
        assert!(lines[2].contains("(no walrelay headers)"), "{table}");
        let findings = render_findings(&report);
        assert!(findings.contains("out-of-order: orders/0"), "{findings}");
        assert!(findings.contains(&EventKey(2).to_hex()), "{findings}");
        let verdict = render_verdict(&report, StoppedBy::Idle, Duration::ZERO, &[]);
        assert!(
            verdict.starts_with("FAIL: 1 key out of order in orders/0"),
            "{verdict}"
        );
        assert!(
            verdict.contains("1 record without walrelay headers"),
            "{verdict}"
        );
    }

    #[test]
    fn no_records_and_consumer_errors_is_an_error() {
        let report = Analyzer::new().report();
        assert_eq!(exit_code(&report, &[]), exit::CLEAN);
        assert_eq!(exit_code(&report, &["broker down".into()]), exit::ERROR);
    }
}

#[cfg(test)]
mod proptests {
    //! Streams that follow the contract (sessions replay from at or before
    //! the first unconfirmed key, never skip) are clean from any start
    //! offset; losing a record is noticed.

    use super::*;
    use proptest::prelude::*;

    /// (key, prev-key) per record, in offset order. Each session replays
    /// from at or before the end of the previous one plus one (what it
    /// could have confirmed), and sends a contiguous run of keys.
    fn stream() -> impl Strategy<Value = Vec<(u128, Option<u128>)>> {
        prop::collection::vec((0..6u128, 1..8u128), 1..8).prop_map(|sessions| {
            let mut out = Vec::new();
            let mut end = 0u128; // keys start at 1
            for (back, len) in sessions {
                let start = (end + 1).saturating_sub(back).max(1);
                let mut prev = None;
                for k in start..start + len {
                    out.push((k, prev));
                    prev = Some(k);
                }
                end = start + len - 1;
            }
            out
        })
    }

    type OwnedHeaders = Vec<(&'static str, Vec<u8>)>;

    fn analyze_from(records: &[(u128, Option<u128>)], start: usize, skip: Option<usize>) -> Report {
        let built: Vec<(i64, OwnedHeaders)> = records
            .iter()
            .enumerate()
            .skip(start)
            .filter(|(i, _)| Some(*i) != skip)
            .enumerate()
            // A lost record never got an offset: offsets stay contiguous.
            .map(|(n, (_, (k, prev)))| {
                (
                    (start + n) as i64,
                    vec![
                        (header::IDEMPOTENCY_KEY, EventKey(*k).to_hex().into_bytes()),
                        (header::SOURCE, b"s".to_vec()),
                        (
                            header::PREV_KEY,
                            prev.map(|p| EventKey(p).to_hex().into_bytes())
                                .unwrap_or_default(),
                        ),
                    ],
                )
            })
            .collect();
        let headers: Vec<Vec<(&str, &[u8])>> = built
            .iter()
            .map(|(_, h)| h.iter().map(|(k, v)| (*k, v.as_slice())).collect())
            .collect();
        analyze(
            built
                .iter()
                .zip(&headers)
                .map(|((o, _), h)| ("t", 0, *o, h.as_slice())),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn contract_streams_are_clean_from_any_offset(records in stream()) {
            let distinct = records.iter().map(|r| r.0).collect::<BTreeSet<_>>().len() as u64;
            for start in 0..records.len() {
                let report = analyze_from(&records, start, None);
                let t = &report.totals;
                prop_assert_eq!(t.out_of_order, 0, "from {}: {:?}", start, report);
                prop_assert_eq!(t.gaps, 0, "from {}: {:?}", start, report);
                if start == 0 {
                    prop_assert_eq!(t.distinct, distinct);
                    prop_assert_eq!(t.duplicates, records.len() as u64 - distinct);
                    prop_assert_eq!(t.unchecked, 0);
                }
            }
        }

        #[test]
        fn a_lost_record_is_noticed(records in stream(), pick in any::<prop::sample::Index>()) {
            // Lose the only copy of a key whose session sent something
            // after it: the next record's prev-key names it.
            let i = pick.index(records.len());
            let key = records[i].0;
            let unique = records.iter().filter(|r| r.0 == key).count() == 1;
            let followed = records.get(i + 1).is_some_and(|r| r.1 == Some(key));
            prop_assume!(unique && followed);
            let report = analyze_from(&records, 0, Some(i));
            prop_assert!(report.totals.gaps >= 1, "{:?}", report);
        }
    }
}
