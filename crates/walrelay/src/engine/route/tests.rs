use super::*;
use crate::config::{MessageRoute as RouteConfig, OutboxColumns, OutboxConfig};
use crate::engine::record::Record;
use crate::envelope;
use walrelay_pgoutput::{
    ColumnValue, Message, Relation, RelationCache, RelationColumn, ReplicaIdentity, TupleData,
};

/// A raw route (`orders`), an ignored prefix (`debezium`) and the
/// outbox `public.outbox`; also the pipeline's event-step tests' routes.
pub(crate) fn config() -> Config {
    let mut c = Config::default();
    c.messages.push(RouteConfig {
        prefix: "orders".into(),
        topic: "orders-topic".into(),
    });
    c.relay.ignore_prefixes.push("debezium".into());
    c.outbox.push(OutboxConfig {
        table: "public.outbox".into(),
        topic: "outbox.event.{aggregatetype}".into(),
        columns: OutboxColumns::default(),
    });
    c
}

fn message(prefix: &str, content: Vec<u8>) -> Message {
    Message {
        xid: None,
        flags: 1,
        lsn: Lsn(0x100),
        prefix: Bytes::from(prefix.to_owned()),
        content: Bytes::from(content),
    }
}

fn tx() -> TxInfo {
    TxInfo::new(Lsn(0x16_B374_D848), 42, PgTimestamp(0))
}

fn header<'a>(r: &'a Record, name: &str) -> Option<&'a [u8]> {
    r.headers
        .iter()
        .find(|(k, _)| &**k == name)
        .map(|(_, v)| &v[..])
}

fn full() -> Config {
    let mut c = config();
    c.relay.headers = HeaderSet::Full;
    c
}

#[test]
fn raw_message_goes_to_its_topic_keyless() {
    let mut router = Router::new(&full(), "src");
    let msg = message("orders", b"{\"a\":1}".to_vec());
    let route = router.classify_message(&msg).unwrap();
    let key = EventKey::new(0x16_B374_D848, 0x100);
    let tx = router.tx_info(Lsn(0x16_B374_D848), 42, PgTimestamp(0));
    let r = router.message_record(&route, Some(&tx), key, &msg).unwrap();
    assert_eq!(&*r.topic, "orders-topic");
    assert_eq!(r.key, None);
    assert_eq!(r.value.as_deref(), Some(&b"{\"a\":1}"[..]));
    assert_eq!(
        header(&r, "idempotency-key"),
        Some(&b"00000016b374d8480000000000000100"[..])
    );
    assert_eq!(header(&r, "walrelay-source"), Some(&b"src"[..]));
    assert_eq!(header(&r, "walrelay-commit-lsn"), Some(&b"16/B374D848"[..]));
    assert_eq!(header(&r, "walrelay-lsn"), Some(&b"0/100"[..]));
    assert_eq!(header(&r, "walrelay-xid"), Some(&b"42"[..]));
    assert_eq!(
        header(&r, "walrelay-commit-time"),
        Some(&b"2000-01-01T00:00:00.000000Z"[..])
    );
    assert_eq!(r.timestamp_ms, Some(946_684_800_000));
}

#[test]
fn the_lean_set_is_the_default_key_and_source_with_the_commit_time_as_timestamp() {
    assert_eq!(Config::default().relay.headers, HeaderSet::Lean);
    let mut router = Router::new(&config(), "src");
    let msg = message("orders", b"{}".to_vec());
    let route = router.classify_message(&msg).unwrap();
    let key = EventKey::new(0x16_B374_D848, 0x100);
    let tx = router.tx_info(Lsn(0x16_B374_D848), 42, PgTimestamp(0));
    let r = router.message_record(&route, Some(&tx), key, &msg).unwrap();
    let names: Vec<&str> = r.headers.iter().map(|(k, _)| &**k).collect();
    // The pipeline adds walrelay-layout and walrelay-prev-key once the
    // partition is known; room for them is reserved.
    assert_eq!(names, ["idempotency-key", "walrelay-source"]);
    assert!(r.headers.capacity() >= 2 + Record::PLACEMENT_HEADERS);
    assert_eq!(
        header(&r, "idempotency-key"),
        Some(&b"00000016b374d8480000000000000100"[..])
    );
    assert_eq!(r.timestamp_ms, Some(946_684_800_000));
}

#[test]
fn envelope_message_names_topic_key_and_headers() {
    let mut router = Router::new(&full(), "src");
    let content = envelope::encode(
        "payments",
        Some("p-1"),
        &[("trace", "t")],
        Some(b"\x00\x01"),
    );
    let msg = message(envelope::PREFIX, content);
    let route = router.classify_message(&msg).unwrap();
    assert_eq!(route, MessageRoute::Envelope);
    let r = router
        .message_record(&route, None, EventKey::new(0xff, 0xff), &msg)
        .unwrap();
    assert_eq!(&*r.topic, "payments");
    assert_eq!(r.key.as_deref(), Some(&b"p-1"[..]));
    assert_eq!(r.value.as_deref(), Some(&b"\x00\x01"[..]));
    assert_eq!(header(&r, "trace"), Some(&b"t"[..]));
    // Non-transactional: no commit headers.
    assert_eq!(header(&r, "walrelay-commit-lsn"), None);
    assert_eq!(header(&r, "walrelay-xid"), None);
    assert_eq!(r.timestamp_ms, None);
}

#[test]
fn an_envelope_addressed_to_the_dead_letter_topic_is_a_bad_event() {
    let content = envelope::encode("dlq", Some("k"), &[], Some(b"{}"));
    let msg = message(envelope::PREFIX, content);
    let key = EventKey::new(0xff, 0xff);
    // Without a dead-letter topic the name is an ordinary topic.
    let mut router = Router::new(&config(), "src");
    let r = router
        .message_record(&MessageRoute::Envelope, None, key, &msg)
        .unwrap();
    assert_eq!(&*r.topic, "dlq");

    let mut c = config();
    c.dead_letter.topic = Some("dlq".into());
    let mut router = Router::new(&c, "src");
    let err = router
        .message_record(&MessageRoute::Envelope, None, key, &msg)
        .unwrap_err();
    assert_eq!(err.kind(), "dead-letter-topic");
    let text = err.to_string();
    assert!(
        text.contains("addressed to topic \"dlq\", which is the dead-letter topic"),
        "{text}"
    );
    assert!(text.contains("walrelay.emit envelope"), "{text}");
    // Its dead letter says so, under the event's key.
    let d = router
        .dead_letter(err, key, msg.lsn, None, BadEvent::Message(&msg))
        .unwrap()
        .record;
    assert_eq!(&*d.topic, "dlq");
    assert_eq!(
        header(&d, "walrelay-dead-letter-kind"),
        Some(&b"dead-letter-topic"[..])
    );
    assert_eq!(d.event_key, key);
}

#[test]
fn unknown_and_ignored_prefixes() {
    let router = Router::new(&config(), "src");
    assert_eq!(
        router
            .classify_message(&message("debezium", vec![]))
            .unwrap(),
        MessageRoute::Ignore
    );
    let err = router
        .classify_message(&message("mystery", vec![]))
        .unwrap_err();
    assert!(err.to_string().contains("\"mystery\"") && err.to_string().contains("ignore_prefixes"));
    let mut router = Router::new(&config(), "src");
    let msg = message(envelope::PREFIX, b"\0\0\0\x02{}".to_vec());
    let err = router
        .message_record(&MessageRoute::Envelope, None, EventKey::new(1, 1), &msg)
        .unwrap_err();
    assert!(err.to_string().contains("topic"), "{err}");
}

fn outbox_relation(columns: &[&str]) -> Relation {
    Relation {
        xid: None,
        id: 1,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: columns
            .iter()
            .map(|c| RelationColumn {
                flags: 0,
                name: (*c).into(),
                type_oid: 25,
                type_modifier: -1,
            })
            .collect(),
    }
}

fn text(s: &str) -> ColumnValue {
    ColumnValue::Text(Bytes::from(s.to_owned()))
}

/// An outbox row (`e-1`, order `o-1`, created) with `payload` and
/// `headers` through `router`, as a change at `lsn`.
fn outbox_row(
    router: &mut Router,
    payload: &str,
    headers: &str,
    lsn: Lsn,
) -> Result<Record, RouteError> {
    record_of(
        router,
        &[
            ("id", "e-1"),
            ("aggregatetype", "order"),
            ("aggregateid", "o-1"),
            ("type", "created"),
            ("payload", payload),
            ("headers", headers),
        ],
        lsn,
    )
}

/// The record of an outbox row whose table has the columns (name, text
/// value) in this order, checked and routed through `router`.
fn record_of(router: &Router, columns: &[(&str, &str)], lsn: Lsn) -> Result<Record, RouteError> {
    let names: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
    let rel = outbox_relation(&names);
    let at = router.check_relation(&rel, Lsn(1)).unwrap();
    let mut cache = RelationCache::new();
    cache.insert(rel);
    let tuple = TupleData {
        columns: columns.iter().map(|(_, value)| text(value)).collect(),
    };
    let row = cache.row(1, &tuple).unwrap();
    router.outbox_record(&tx(), EventKey::new(1, 2), lsn, &row, &at)
}

#[test]
fn outbox_row_maps_like_debezium() {
    let mut router = Router::new(&config(), "src");
    let r = outbox_row(
        &mut router,
        "{\"total\": 5}",
        "{\"trace\": \"t1\", \"n\": 2}",
        Lsn(2),
    )
    .unwrap();
    assert_eq!(&*r.topic, "outbox.event.order");
    assert_eq!(r.key.as_deref(), Some(&b"o-1"[..]));
    assert_eq!(r.value.as_deref(), Some(&b"{\"total\": 5}"[..]));
    assert_eq!(header(&r, "id"), Some(&b"e-1"[..]));
    assert_eq!(header(&r, "type"), Some(&b"created"[..]));
    assert_eq!(header(&r, "trace"), Some(&b"t1"[..]));
    assert_eq!(header(&r, "n"), Some(&b"2"[..]));
}

/// Columns are read by the positions the Relation gave: a table whose
/// columns are in another order (or were reordered by a later Relation,
/// after an ALTER TABLE) gives the same record.
#[test]
fn outbox_columns_are_read_where_each_relation_puts_them() {
    let mut router = Router::new(&config(), "src");
    let want = outbox_row(&mut router, "{}", "{\"h\": \"v\"}", Lsn(2)).unwrap();
    let shuffled = [
        ("note", "not read"),
        ("payload", "{}"),
        ("headers", "{\"h\": \"v\"}"),
        ("type", "created"),
        ("aggregateid", "o-1"),
        ("aggregatetype", "order"),
        ("id", "e-1"),
    ];
    let got = record_of(&router, &shuffled, Lsn(2)).unwrap();
    assert_eq!(
        (&got.topic, &got.key, &got.value, &got.headers),
        (&want.topic, &want.key, &want.value, &want.headers)
    );
    // Without the optional headers column: no application headers.
    let bare: Vec<_> = shuffled
        .into_iter()
        .filter(|(c, _)| *c != "headers")
        .collect();
    let got = record_of(&router, &bare, Lsn(2)).unwrap();
    assert_eq!(header(&got, "h"), None);
    assert_eq!(header(&got, "id"), Some(&b"e-1"[..]));
    assert_eq!(got.key.as_deref(), Some(&b"o-1"[..]));
}

#[test]
fn application_headers_with_reserved_names_are_bad_events() {
    let mut router = Router::new(&config(), "src");
    for forged in [
        "walrelay-prev-key",
        "idempotency-key",
        "Idempotency-Key",
        "walrelay-source",
    ] {
        let content = envelope::encode(
            "payments",
            Some("p-1"),
            &[("trace", "t"), (forged, "0000000000000000000000000000abcd")],
            Some(b"{}"),
        );
        let msg = message(envelope::PREFIX, content);
        let err = router
            .message_record(&MessageRoute::Envelope, None, EventKey::new(1, 1), &msg)
            .unwrap_err();
        assert_eq!(err.kind(), "reserved-header");
        assert!(err.dead_letterable());
        let text = err.to_string();
        assert!(
            text.contains(&format!("{forged:?}"))
                && text.starts_with("walrelay.emit envelope at 0/100")
                && text.contains("rename the application's header"),
            "{text}"
        );
    }

    let err = outbox_row(
        &mut router,
        "{}",
        "{\"idempotency-key\": \"ffffffffffffffffffffffffffffffff\"}",
        Lsn(0x200),
    )
    .unwrap_err();
    assert_eq!(err.kind(), "reserved-header");
    assert!(
        err.to_string().starts_with(
            "outbox row in public.outbox at 0/200 sets the header \"idempotency-key\""
        ),
        "{err}"
    );
}

#[test]
fn walrelays_headers_come_first_each_once() {
    let mut router = Router::new(&config(), "src");
    let content = envelope::encode(
        "payments",
        Some("p-1"),
        &[("trace", "t"), ("z", "1")],
        Some(b"{}"),
    );
    let msg = message(envelope::PREFIX, content);
    let r = router
        .message_record(
            &MessageRoute::Envelope,
            Some(&tx()),
            EventKey::new(1, 1),
            &msg,
        )
        .unwrap();
    let reserved: Vec<bool> = r
        .headers
        .iter()
        .map(|(k, _)| header::is_reserved(k))
        .collect();
    let first_app = reserved.iter().position(|r| !r).unwrap();
    assert!(reserved[..first_app].iter().all(|r| *r));
    assert!(reserved[first_app..].iter().all(|r| !r), "{:?}", r.headers);
    let mut names: Vec<&str> = r.headers[..first_app].iter().map(|(k, _)| &**k).collect();
    let n = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), n, "each walrelay header once");
}

#[test]
fn dead_letters_carry_the_original_bytes_key_and_reason() {
    let mut c = config();
    // Without a dead-letter topic, the error comes back.
    let mut router = Router::new(&c, "src");
    let msg = message("mystery", b"\x00raw".to_vec());
    let err = router.classify_message(&msg).unwrap_err();
    let key = EventKey::new(0x16_B374_D848, 0x100);
    let back = router
        .dead_letter(
            err.clone(),
            key,
            msg.lsn,
            Some(&tx()),
            BadEvent::Message(&msg),
        )
        .unwrap_err();
    assert_eq!(back, err);

    c.dead_letter.topic = Some("dlq".into());
    let mut router = Router::new(&c, "src");
    let r = router
        .dead_letter(
            err.clone(),
            key,
            msg.lsn,
            Some(&tx()),
            BadEvent::Message(&msg),
        )
        .unwrap();
    assert_eq!(r.kind, err.kind());
    assert_eq!(r.reason, err.to_string().as_bytes());
    assert_eq!(
        header(&r.record, "walrelay-dead-letter-reason"),
        Some(&r.reason[..])
    );
    let r = r.record;
    assert_eq!(&*r.topic, "dlq");
    assert_eq!(
        r.key.as_deref(),
        Some(&b"00000016b374d8480000000000000100"[..])
    );
    assert_eq!(r.value.as_deref(), Some(&b"\x00raw"[..]));
    assert_eq!(r.event_key, key);
    assert_eq!(
        header(&r, "idempotency-key"),
        Some(&b"00000016b374d8480000000000000100"[..])
    );
    assert_eq!(header(&r, "walrelay-xid"), Some(&b"42"[..]));
    assert_eq!(
        header(&r, "walrelay-dead-letter-reason"),
        Some(err.to_string().as_bytes())
    );
    assert_eq!(
        header(&r, "walrelay-dead-letter-kind"),
        Some(&b"unknown-prefix"[..])
    );
    assert_eq!(
        header(&r, "walrelay-dead-letter-prefix"),
        Some(&b"mystery"[..])
    );
    assert_eq!(r.timestamp_ms, Some(946_684_800_000));

    // Kinds of malformed envelopes.
    for (content, kind) in [
        (b"\0\0\0\x05{bad}".to_vec(), "malformed-envelope"),
        (b"\0\0\0\x02{}".to_vec(), "missing-topic"),
        (b"\0\0\0\x0f{\"topic\":\"a b\"}".to_vec(), "invalid-topic"),
        (b"\0\0".to_vec(), "malformed-envelope"),
    ] {
        let msg = message(envelope::PREFIX, content);
        let err = router
            .message_record(&MessageRoute::Envelope, None, key, &msg)
            .unwrap_err();
        assert_eq!(err.kind(), kind, "{err}");
        assert!(DEAD_LETTER_KINDS.contains(&err.kind()));
    }

    // An outbox row: the row as JSON, in column order, NULL as null.
    let cols = ["id", "aggregatetype", "aggregateid", "type", "payload"];
    let at = router
        .check_relation(&outbox_relation(&cols), Lsn(1))
        .unwrap();
    let mut cache = RelationCache::new();
    cache.insert(outbox_relation(&cols));
    let tuple = TupleData {
        columns: vec![
            text("e\"1"),
            text("order"),
            ColumnValue::Null,
            text("t"),
            text("{\"a\": 1}"),
        ],
    };
    let row = cache.row(1, &tuple).unwrap();
    let err = router
        .outbox_record(&tx(), key, Lsn(2), &row, &at)
        .unwrap_err();
    assert_eq!(err.kind(), "null-column");
    let r = router
        .dead_letter(err, key, Lsn(2), Some(&tx()), BadEvent::Row(&row))
        .unwrap()
        .record;
    assert_eq!(
        r.value.as_deref(),
        Some(&br#"{"id":"e\"1","aggregatetype":"order","aggregateid":null,"type":"t","payload":"{\"a\": 1}"}"#[..])
    );
    assert_eq!(
        header(&r, "walrelay-dead-letter-table"),
        Some(&b"public.outbox"[..])
    );
    assert_eq!(header(&r, "walrelay-dead-letter-prefix"), None);

    // Not about one event: never dead-lettered.
    let not_outbox = RouteError::NotAnOutbox {
        table: "public.orders".into(),
        lsn: Lsn(2),
    };
    assert!(router
        .dead_letter(not_outbox, key, Lsn(2), Some(&tx()), BadEvent::Row(&row))
        .is_err());
}

#[test]
fn with_a_dead_letter_topic_a_missing_column_fails_rows_not_the_relation() {
    let mut c = config();
    c.dead_letter.topic = Some("dlq".into());
    let router = Router::new(&c, "src");
    let rel = outbox_relation(&["id", "aggregatetype", "type", "payload"]);
    let at = router.check_relation(&rel, Lsn(1)).unwrap();
    let mut cache = RelationCache::new();
    cache.insert(rel);
    let tuple = TupleData {
        columns: vec![text("e"), text("order"), text("t"), text("{}")],
    };
    let row = cache.row(1, &tuple).unwrap();
    let err = router
        .outbox_record(&tx(), EventKey::new(1, 2), Lsn(2), &row, &at)
        .unwrap_err();
    assert!(
        matches!(&err, RouteError::MissingColumn { column, option: "aggregateid", .. } if column == "aggregateid"),
        "{err}"
    );
    assert_eq!(err.kind(), "missing-column");
}

#[test]
fn outbox_errors_name_the_problem() {
    let router = Router::new(&config(), "src");
    let err = router
        .check_relation(
            &outbox_relation(&["id", "aggregatetype", "type", "payload"]),
            Lsn(1),
        )
        .unwrap_err();
    assert!(err.to_string().contains("aggregateid"), "{err}");
    let mut other = outbox_relation(&["x"]);
    other.name = "orders".into();
    assert!(matches!(
        router.check_relation(&other, Lsn(1)),
        Err(RouteError::NotAnOutbox { .. })
    ));

    let cols = ["id", "aggregatetype", "aggregateid", "type", "payload"];
    let at = router
        .check_relation(&outbox_relation(&cols), Lsn(1))
        .unwrap();
    let mut cache = RelationCache::new();
    cache.insert(outbox_relation(&cols));
    let null_key = TupleData {
        columns: vec![
            text("e"),
            text("order"),
            ColumnValue::Null,
            text("t"),
            text("{}"),
        ],
    };
    let row = cache.row(1, &null_key).unwrap();
    let err = router
        .outbox_record(&tx(), EventKey::new(1, 2), Lsn(2), &row, &at)
        .unwrap_err();
    assert!(matches!(err, RouteError::NullColumn { .. }), "{err}");
    let bad_topic = TupleData {
        columns: vec![text("e"), text("or der"), text("k"), text("t"), text("{}")],
    };
    let row = cache.row(1, &bad_topic).unwrap();
    let err = router
        .outbox_record(&tx(), EventKey::new(1, 2), Lsn(2), &row, &at)
        .unwrap_err();
    assert!(matches!(err, RouteError::InvalidTopic { .. }), "{err}");
    let tombstone = TupleData {
        columns: vec![
            text("e"),
            text("order"),
            text("k"),
            text("t"),
            ColumnValue::Null,
        ],
    };
    let row = cache.row(1, &tombstone).unwrap();
    assert_eq!(
        router
            .outbox_record(&tx(), EventKey::new(1, 2), Lsn(2), &row, &at)
            .unwrap()
            .value,
        None
    );
}
