//! Unit tests of `walrelay verify`: the analysis, the rendering and the
//! exit codes, on records built in memory.

use crate::engine::key::EventKey;
use crate::engine::record::header;

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

/// `records` with their previous keys in the lean set's compact form
/// (`walrelay-prev`) instead of `walrelay-prev-key`.
fn lean(mut records: Vec<Rec>) -> Vec<Rec> {
    for r in &mut records {
        for (name, value) in &mut r.headers {
            if *name == header::PREV_KEY {
                *name = header::PREV;
                if !value.is_empty() {
                    let key = EventKey::from_hex(std::str::from_utf8(value).unwrap()).unwrap();
                    *value = key.to_compact().into_bytes();
                }
            }
        }
        r.headers.retain(|(name, _)| *name != header::LSN);
    }
    records
}

#[test]
fn both_header_sets_chain_in_one_partition_and_gaps_show_in_either() {
    // Full, then a lean session, then full again: one clean chain.
    let keys = [1u128 << 64 | 5, 2 << 64 | 7, 3 << 64 | 9, 4 << 64 | 11];
    let mut records = session(0, 0, SRC, &keys[..2]);
    records.extend(lean(vec![rec(0, 2, SRC, keys[2], Some(keys[1]))]));
    records.push(rec(0, 3, SRC, keys[3], Some(keys[2])));
    let report = run(&records);
    let s = only_source(&report);
    assert_eq!(
        (s.records, s.distinct, s.gaps, s.out_of_order),
        (4, 4, 0, 0)
    );
    assert_eq!(report.verdict(), Verdict::Clean);

    // A lean record whose predecessor is missing is a gap.
    let gap = lean(vec![
        rec(0, 0, SRC, keys[0], None),
        rec(0, 1, SRC, keys[2], Some(keys[1])),
    ]);
    assert_eq!(only_source(&run(&gap)).gaps, 1);

    // Both forms on one record: not walrelay's, not trusted.
    let mut both = session(0, 0, SRC, &keys[..2]);
    both[1]
        .headers
        .push((header::PREV, EventKey(keys[0]).to_compact().into_bytes()));
    let p = &run(&both).partitions[0];
    assert_eq!(p.malformed, 1);
    assert!(
        matches!(&p.findings[0], Finding::DuplicateHeader { header, .. } if header.contains("walrelay-prev")),
        "{:?}",
        p.findings
    );

    // A compact key that is not one.
    let mut bad = lean(session(0, 0, SRC, &keys[..2]));
    bad[1].headers[2].1 = b"12345".to_vec();
    assert_eq!(run(&bad).partitions[0].malformed, 1);
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
