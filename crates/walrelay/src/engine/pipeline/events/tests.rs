//! The event step on hand-written pgoutput bytes: every message kind, the
//! dead-letter and COPY cases, without PostgreSQL or Kafka.

use walrelay_testkit::wire::{Col, B};

use super::*;
use crate::engine::key::EventKey;
use crate::engine::record::header;
use crate::envelope;

const FINAL: u64 = 0x16_B374_D848;
const END: u64 = 0x16_B374_D900;
const TS: i64 = 777_888_999_000_123;
const OUTBOX: u32 = 16_384;
const ORDERS: u32 = 16_390;
const OUTBOX_COLUMNS: [&str; 5] = ["id", "aggregatetype", "aggregateid", "type", "payload"];

fn config(dead_letter: bool) -> Config {
    let mut c = crate::engine::route::tests::config();
    if dead_letter {
        c.dead_letter.topic = Some("dlq".into());
    }
    c
}

fn step(dead_letter: bool) -> EventStep {
    EventStep::new(&config(dead_letter), "src")
}

fn begin(final_lsn: u64) -> Bytes {
    B::tag(b'B').u64(final_lsn).i64(TS).u32(7).build()
}

fn commit(commit_lsn: u64, end_lsn: u64) -> Bytes {
    B::tag(b'C')
        .u8(0)
        .u64(commit_lsn)
        .u64(end_lsn)
        .i64(TS)
        .build()
}

/// A Relation message for `public.<name>` with text columns.
fn relation(id: u32, name: &str, columns: &[&str]) -> Bytes {
    let mut b = B::tag(b'R')
        .u32(id)
        .cstr(b"public")
        .cstr(name.as_bytes())
        .u8(b'd')
        .i16(i16::try_from(columns.len()).unwrap());
    for c in columns {
        b = b.u8(0).cstr(c.as_bytes()).u32(25).i32(-1);
    }
    b.build()
}

fn outbox_row(id: &str) -> [Col<'_>; 5] {
    [
        Col::Text(id.as_bytes()),
        Col::Text(b"order"),
        Col::Text(b"o-1"),
        Col::Text(b"created"),
        Col::Text(b"{}"),
    ]
}

fn insert(relation: u32, row: &[Col<'_>]) -> Bytes {
    B::tag(b'I').u32(relation).u8(b'N').tuple(row).build()
}

fn update(relation: u32, row: &[Col<'_>]) -> Bytes {
    B::tag(b'U').u32(relation).u8(b'N').tuple(row).build()
}

fn delete(relation: u32) -> Bytes {
    B::tag(b'D')
        .u32(relation)
        .u8(b'K')
        .tuple(&[
            Col::Text(b"e-1"),
            Col::Null,
            Col::Null,
            Col::Null,
            Col::Null,
        ])
        .build()
}

fn truncate(relation: u32) -> Bytes {
    B::tag(b'T').i32(1).u8(0).u32(relation).build()
}

fn message(transactional: bool, lsn: u64, prefix: &str, content: &[u8]) -> Bytes {
    B::tag(b'M')
        .u8(u8::from(transactional))
        .u64(lsn)
        .cstr(prefix.as_bytes())
        .i32(i32::try_from(content.len()).unwrap())
        .raw(content)
        .build()
}

/// The record of a step that must send one.
fn sent(step: Step) -> Event {
    match step {
        Step::Send(e) => e,
        other => panic!("expected a record, got {other:?}"),
    }
}

fn nothing(step: Step) {
    assert!(
        matches!(step, Step::Nothing),
        "expected nothing, got {step:?}"
    );
}

fn header_of<'a>(r: &'a Record, name: &str) -> Option<&'a [u8]> {
    r.headers
        .iter()
        .find(|(k, _)| &**k == name)
        .map(|(_, v)| &v[..])
}

/// Begin, the outbox Relation, and nothing to send for either.
fn open_outbox_tx(s: &mut EventStep) {
    nothing(s.step(Lsn(FINAL - 0x100), begin(FINAL)).unwrap());
    nothing(
        s.step(Lsn(0), relation(OUTBOX, "outbox", &OUTBOX_COLUMNS))
            .unwrap(),
    );
}

#[test]
fn a_transaction_opens_on_begin_and_commits_with_its_end() {
    let mut s = step(false);
    assert!(!s.in_transaction());
    nothing(s.step(Lsn(FINAL - 0x100), begin(FINAL)).unwrap());
    assert!(
        s.in_transaction(),
        "a keepalive now is inside a transaction"
    );
    match s.step(Lsn(FINAL), commit(FINAL, END)).unwrap() {
        Step::Committed { end_lsn } => assert_eq!(end_lsn, Lsn(END)),
        other => panic!("{other:?}"),
    }
    assert!(!s.in_transaction());
}

#[test]
fn an_outbox_insert_is_a_record_keyed_by_commit_and_position() {
    let mut s = step(false);
    open_outbox_tx(&mut s);
    let e = sent(
        s.step(Lsn(FINAL - 0x80), insert(OUTBOX, &outbox_row("e-1")))
            .unwrap(),
    );
    assert_eq!(e.record.event_key, EventKey::new(FINAL, FINAL - 0x80));
    assert_eq!(&*e.record.topic, "outbox.event.order");
    assert_eq!(e.record.key.as_deref(), Some(&b"o-1"[..]));
    assert!(e.dead_letter.is_none());
    assert!(e.standalone.is_none(), "confirmed by its commit");
    assert_eq!(e.commit_time, Some(PgTimestamp(TS)));
    assert!(
        e.record.headers.capacity() >= e.record.headers.len() + Record::PLACEMENT_HEADERS,
        "room for the placement headers"
    );
}

#[test]
fn rows_sharing_one_lsn_get_strictly_increasing_keys() {
    // COPY reports every row at the same position.
    let mut s = step(false);
    open_outbox_tx(&mut s);
    let at = Lsn(FINAL - 0x80);
    let keys: Vec<EventKey> = (0..3)
        .map(|i| {
            sent(
                s.step(at, insert(OUTBOX, &outbox_row(&format!("e-{i}"))))
                    .unwrap(),
            )
            .record
            .event_key
        })
        .collect();
    assert_eq!(
        keys,
        [0, 1, 2].map(|i| EventKey::new(FINAL, FINAL - 0x80 + i)),
        "positions after the first follow by one"
    );
}

#[test]
fn an_outbox_update_is_a_dead_letter_with_the_key_an_insert_would_have() {
    let mut s = step(true);
    open_outbox_tx(&mut s);
    let e = sent(
        s.step(Lsn(FINAL - 0x80), update(OUTBOX, &outbox_row("e-1")))
            .unwrap(),
    );
    let d = e.dead_letter.expect("a dead letter");
    assert_eq!(d.kind, "outbox-update");
    assert_eq!(d.lsn, Lsn(FINAL - 0x80));
    assert!(
        String::from_utf8_lossy(&d.reason).contains("public.outbox"),
        "{:?}",
        d.reason
    );
    assert_eq!(&*e.record.topic, "dlq");
    assert_eq!(e.record.event_key, EventKey::new(FINAL, FINAL - 0x80));
    assert_eq!(
        header_of(&e.record, header::DEAD_LETTER_KIND),
        Some(&b"outbox-update"[..])
    );

    // Without a dead-letter topic the update stops the relay.
    let mut s = step(false);
    open_outbox_tx(&mut s);
    let err = s
        .step(Lsn(FINAL - 0x80), update(OUTBOX, &outbox_row("e-1")))
        .unwrap_err();
    assert!(
        matches!(err, RelayError::Route(RouteError::OutboxUpdate { .. })),
        "{err:?}"
    );
}

#[test]
fn a_bad_outbox_row_is_dead_lettered_and_the_next_keeps_its_key() {
    let mut s = step(true);
    open_outbox_tx(&mut s);
    let mut bad = outbox_row("e-1");
    bad[1] = Col::Null; // aggregatetype names the topic
    let e = sent(s.step(Lsn(FINAL - 0x80), insert(OUTBOX, &bad)).unwrap());
    assert_eq!(e.dead_letter.as_ref().map(|d| d.kind), Some("null-column"));
    assert_eq!(e.record.event_key, EventKey::new(FINAL, FINAL - 0x80));
    let next = sent(
        s.step(Lsn(FINAL - 0x40), insert(OUTBOX, &outbox_row("e-2")))
            .unwrap(),
    );
    assert!(next.dead_letter.is_none());
    assert_eq!(next.record.event_key, EventKey::new(FINAL, FINAL - 0x40));
}

#[test]
fn deletes_and_truncates_of_an_outbox_are_ignored() {
    let mut s = step(false);
    open_outbox_tx(&mut s);
    nothing(s.step(Lsn(FINAL - 0x80), delete(OUTBOX)).unwrap());
    nothing(s.step(Lsn(FINAL - 0x40), truncate(OUTBOX)).unwrap());
}

#[test]
fn a_change_to_a_table_that_is_not_an_outbox_stops_even_with_a_dead_letter_topic() {
    let mut s = step(true);
    nothing(s.step(Lsn(FINAL - 0x100), begin(FINAL)).unwrap());
    // The Relation itself passes: the error waits for a change, so it
    // names that change's position.
    nothing(s.step(Lsn(0), relation(ORDERS, "orders", &["id"])).unwrap());
    for change in [
        insert(ORDERS, &[Col::Text(b"1")]),
        delete(ORDERS),
        truncate(ORDERS),
    ] {
        let err = s.step(Lsn(FINAL - 0x80), change).unwrap_err();
        match err {
            RelayError::Route(RouteError::NotAnOutbox { table, lsn }) => {
                assert_eq!(table, "public.orders");
                assert_eq!(lsn, Lsn(FINAL - 0x80));
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_row_outside_a_transaction_is_a_protocol_error() {
    let mut s = step(false);
    nothing(
        s.step(Lsn(0), relation(OUTBOX, "outbox", &OUTBOX_COLUMNS))
            .unwrap(),
    );
    let err = s
        .step(Lsn(FINAL), insert(OUTBOX, &outbox_row("e-1")))
        .unwrap_err();
    assert!(
        matches!(err, RelayError::Protocol { what: "INSERT", .. }),
        "{err:?}"
    );
}

#[test]
fn transactional_messages_take_their_route_and_the_transaction_key() {
    let mut s = step(false);
    nothing(s.step(Lsn(FINAL - 0x100), begin(FINAL)).unwrap());
    let content = envelope::encode("payments", Some("p-1"), &[], Some(b"v"));
    let e = sent(
        s.step(
            Lsn(FINAL - 0x80),
            message(true, FINAL - 0x80, envelope::PREFIX, &content),
        )
        .unwrap(),
    );
    assert_eq!(&*e.record.topic, "payments");
    assert_eq!(e.record.event_key, EventKey::new(FINAL, FINAL - 0x80));
    assert!(e.standalone.is_none());
    let raw = sent(
        s.step(
            Lsn(FINAL - 0x40),
            message(true, FINAL - 0x40, "orders", b"x"),
        )
        .unwrap(),
    );
    assert_eq!(&*raw.record.topic, "orders-topic");
    assert_eq!(raw.record.event_key, EventKey::new(FINAL, FINAL - 0x40));
}

#[test]
fn an_ignored_prefix_gets_no_key_and_no_record() {
    let mut s = step(false);
    nothing(s.step(Lsn(FINAL - 0x100), begin(FINAL)).unwrap());
    nothing(
        s.step(
            Lsn(FINAL - 0x80),
            message(true, FINAL - 0x80, "debezium", b"x"),
        )
        .unwrap(),
    );
    // Had it taken a key, this message at the same position would get
    // the next one.
    let e = sent(
        s.step(
            Lsn(FINAL - 0x80),
            message(true, FINAL - 0x80, "orders", b"x"),
        )
        .unwrap(),
    );
    assert_eq!(e.record.event_key, EventKey::new(FINAL, FINAL - 0x80));
}

#[test]
fn a_non_transactional_message_is_confirmable_on_its_own() {
    let mut s = step(false);
    let lsn = 0x20_0000;
    let e = sent(
        s.step(Lsn(lsn), message(false, lsn, "orders", b"x"))
            .unwrap(),
    );
    assert_eq!(e.record.event_key, EventKey::new(lsn - 1, lsn - 1));
    assert_eq!(e.standalone, Some(Lsn(lsn)));
    assert_eq!(e.commit_time, None);
    assert_eq!(e.record.timestamp_ms, None);
}

#[test]
fn messages_in_the_wrong_place_are_protocol_errors() {
    let mut s = step(false);
    let err = s
        .step(Lsn(FINAL), message(true, FINAL, "orders", b"x"))
        .unwrap_err();
    assert!(
        matches!(
            err,
            RelayError::Protocol {
                what: "transactional message",
                ..
            }
        ),
        "{err:?}"
    );
    nothing(s.step(Lsn(FINAL - 0x100), begin(FINAL)).unwrap());
    let err = s
        .step(Lsn(FINAL), message(false, FINAL, "orders", b"x"))
        .unwrap_err();
    assert!(
        matches!(
            err,
            RelayError::Protocol {
                what: "non-transactional message",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn an_unknown_prefix_is_a_dead_letter_or_the_error() {
    let lsn = 0x20_0000;
    let mut s = step(true);
    let e = sent(
        s.step(Lsn(lsn), message(false, lsn, "mystery", b"\x00raw"))
            .unwrap(),
    );
    let d = e.dead_letter.expect("a dead letter");
    assert_eq!(d.kind, "unknown-prefix");
    assert_eq!(d.lsn, Lsn(lsn));
    assert_eq!(e.record.event_key, EventKey::new(lsn - 1, lsn - 1));
    assert_eq!(e.record.value.as_deref(), Some(&b"\x00raw"[..]));
    assert_eq!(e.standalone, Some(Lsn(lsn)), "confirmable like any message");

    let mut s = step(false);
    let err = s
        .step(Lsn(lsn), message(false, lsn, "mystery", b"\x00raw"))
        .unwrap_err();
    assert!(
        matches!(err, RelayError::Route(RouteError::UnknownPrefix { .. })),
        "{err:?}"
    );
}

#[test]
fn streamed_transactions_and_garbage_are_errors() {
    let mut s = step(false);
    let err = s
        .step(Lsn(FINAL), B::tag(b'S').u32(7).u8(1).build())
        .unwrap_err();
    assert!(
        matches!(
            err,
            RelayError::Protocol {
                what: "pgoutput message",
                ..
            }
        ),
        "{err:?}"
    );
    let err = s.step(Lsn(FINAL), B::tag(b'?').build()).unwrap_err();
    assert!(
        matches!(
            err,
            RelayError::Decode {
                lsn: Lsn(FINAL),
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn the_same_wal_gives_the_same_records_on_replay() {
    let wal = [
        (Lsn(FINAL - 0x100), begin(FINAL)),
        (Lsn(0), relation(OUTBOX, "outbox", &OUTBOX_COLUMNS)),
        (Lsn(FINAL - 0x80), insert(OUTBOX, &outbox_row("e-1"))),
        (Lsn(FINAL - 0x80), insert(OUTBOX, &outbox_row("e-2"))),
        (
            Lsn(FINAL - 0x40),
            message(true, FINAL - 0x40, "orders", b"x"),
        ),
        (Lsn(FINAL - 0x20), update(OUTBOX, &outbox_row("e-1"))),
        (Lsn(FINAL), commit(FINAL, END)),
        (Lsn(END + 0x10), message(false, END + 0x10, "mystery", b"y")),
    ];
    let run = || -> Vec<Record> {
        let mut s = step(true);
        wal.iter()
            .filter_map(|(lsn, data)| match s.step(*lsn, data.clone()).unwrap() {
                Step::Send(e) => Some(e.record),
                _ => None,
            })
            .collect()
    };
    let first = run();
    assert_eq!(first.len(), 5);
    assert_eq!(first, run());
    assert!(
        first.windows(2).all(|w| w[0].event_key < w[1].event_key),
        "keys increase in stream order"
    );
}
