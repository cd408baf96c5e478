//! The analysis of `walrelay verify`: a pure function over records given as
//! (topic, partition, offset, headers), no I/O. Per (topic, partition,
//! source) it keeps the keys seen so far and classifies every record: new,
//! duplicate (a replay), out of order (below the high-water mark and never
//! seen), and whether its `walrelay-prev-key` names a key that never arrived.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::engine::key::EventKey;
use crate::engine::record::header;

use super::{exit, MAX_FINDINGS};

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

/// How a previous-key header's value becomes a key.
type KeyParser = fn(&[u8]) -> Option<u128>;

/// The compact form of a key (`HIGH/LOW`, `walrelay-prev`).
fn parse_compact_key(value: &[u8]) -> Option<u128> {
    let text = std::str::from_utf8(value).ok()?;
    EventKey::from_compact(text).ok().map(|k| k.0)
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
        let both_prev = find_header(headers, header::PREV_KEY).is_some()
            && find_header(headers, header::PREV).is_some();
        let duplicated = duplicated_reserved(headers).map(str::to_owned).or_else(|| {
            // The previous key in both forms: walrelay writes one of them.
            both_prev.then(|| format!("{} and {}", header::PREV_KEY, header::PREV))
        });
        if let Some(name) = duplicated {
            p.malformed += 1;
            if p.findings.len() < MAX_FINDINGS {
                p.findings.push(Finding::DuplicateHeader {
                    offset,
                    header: name,
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
        // The full set's 32 hex digits, or the lean set's compact form.
        let (name, raw, parse): (_, _, KeyParser) = match find_header(headers, header::PREV) {
            Some(raw) => (header::PREV, Some(raw), parse_compact_key),
            None => (
                header::PREV_KEY,
                find_header(headers, header::PREV_KEY),
                parse_key,
            ),
        };
        let prev = match raw {
            // No header (older relay) or a session's first record.
            None | Some(b"") => None,
            Some(raw) => match parse(raw) {
                Some(prev) => Some(prev),
                None => {
                    p.malformed(offset, name, raw);
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
