//! Field-by-field decoding of hand-built fixtures for every message kind.

mod common;

use bytes::Bytes;
use common::*;
use walrelay_pgoutput::*;

fn ok(buf: Bytes, in_stream: bool) -> PgOutputMessage {
    decode(buf, in_stream).expect("fixture decodes")
}

fn text(s: &'static [u8]) -> ColumnValue {
    ColumnValue::Text(Bytes::from_static(s))
}

fn row() -> TupleData {
    TupleData {
        columns: vec![
            text(b"42"),
            ColumnValue::Null,
            ColumnValue::Binary(Bytes::from_static(b"\x00\xffbin")),
            ColumnValue::UnchangedToast,
        ],
    }
}

fn key() -> TupleData {
    TupleData {
        columns: vec![
            text(b"41"),
            ColumnValue::Null,
            ColumnValue::Null,
            ColumnValue::Null,
        ],
    }
}

fn new_row() -> TupleData {
    TupleData {
        columns: vec![
            text(b"42"),
            ColumnValue::Text(Bytes::from("Zoë")),
            ColumnValue::Null,
            ColumnValue::UnchangedToast,
        ],
    }
}

#[test]
fn begin_fields() {
    let PgOutputMessage::Begin(m) = ok(begin(), false) else {
        panic!()
    };
    assert_eq!(m.final_lsn, Lsn(LSN1));
    assert_eq!(m.final_lsn.to_string(), "16/B374D848");
    assert_eq!(m.timestamp, PgTimestamp(TS));
    assert_eq!(m.xid, XID);
}

#[test]
fn commit_fields() {
    assert_eq!(
        ok(commit(), false),
        PgOutputMessage::Commit(Commit {
            flags: 0,
            commit_lsn: Lsn(LSN1),
            end_lsn: Lsn(LSN2),
            timestamp: PgTimestamp(TS),
        })
    );
}

#[test]
fn origin_fields() {
    assert_eq!(
        ok(origin(), false),
        PgOutputMessage::Origin(Origin {
            commit_lsn: Lsn(LSN1),
            name: "pg_1234".into()
        })
    );
}

fn expected_relation(xid: Option<u32>) -> Relation {
    let col = |flags, name: &str, type_oid, type_modifier| RelationColumn {
        flags,
        name: name.into(),
        type_oid,
        type_modifier,
    };
    Relation {
        xid,
        id: REL,
        namespace: "public".into(),
        name: "users".into(),
        replica_identity: ReplicaIdentity::Full,
        columns: vec![
            col(1, "id", 23, -1),
            col(0, "name", 25, -1),
            col(0, "payload", 17, -1),
            col(0, "note", 1043, 14),
        ],
    }
}

#[test]
fn relation_fields_plain_and_streamed() {
    assert_eq!(
        ok(relation(None), false),
        PgOutputMessage::Relation(expected_relation(None))
    );
    assert_eq!(
        ok(relation(Some(XID)), true),
        PgOutputMessage::Relation(expected_relation(Some(XID)))
    );
    let PgOutputMessage::Relation(r) = ok(relation(None), false) else {
        panic!()
    };
    assert!(r.columns[0].is_key());
    assert!(!r.columns[1].is_key());
    assert_eq!(r.replica_identity.as_byte(), b'f');
}

#[test]
fn replica_identities() {
    for (byte, ri) in [
        (b'd', ReplicaIdentity::Default),
        (b'n', ReplicaIdentity::Nothing),
        (b'f', ReplicaIdentity::Full),
        (b'i', ReplicaIdentity::Index),
    ] {
        let buf = B::tag(b'R')
            .u32(1)
            .cstr(b"s")
            .cstr(b"t")
            .u8(byte)
            .i16(0)
            .build();
        let PgOutputMessage::Relation(r) = ok(buf, false) else {
            panic!()
        };
        assert_eq!(r.replica_identity, ri);
        assert!(r.columns.is_empty());
    }
    let bad = B::tag(b'R')
        .u32(1)
        .cstr(b"s")
        .cstr(b"t")
        .u8(b'x')
        .i16(0)
        .build();
    assert_eq!(
        decode(bad, false),
        Err(DecodeError::InvalidValue {
            what: "relation replica identity",
            value: i64::from(b'x')
        })
    );
}

#[test]
fn type_fields() {
    for xid in [None, Some(XID)] {
        assert_eq!(
            ok(type_msg(xid), xid.is_some()),
            PgOutputMessage::Type(Type {
                xid,
                id: 90_001,
                namespace: String::new(),
                name: "mood".into()
            })
        );
    }
}

#[test]
fn insert_fields_all_column_kinds() {
    for xid in [None, Some(XID)] {
        let buf = insert(xid);
        let msg = ok(buf.clone(), xid.is_some());
        assert_eq!(
            msg,
            PgOutputMessage::Insert(Insert {
                xid,
                relation_id: REL,
                new: row()
            })
        );
        // Zero-copy: the text value points into the input buffer.
        let PgOutputMessage::Insert(ins) = msg else {
            panic!()
        };
        let v = ins.new.columns[0].bytes().unwrap();
        let base = buf.as_ptr() as usize;
        let p = v.as_ptr() as usize;
        assert!(p >= base && p < base + buf.len());
        assert!(ins.new.columns[1].is_null());
    }
}

#[test]
fn update_without_old_tuple() {
    assert_eq!(
        ok(update(None, None), false),
        PgOutputMessage::Update(Update {
            xid: None,
            relation_id: REL,
            old: None,
            new: new_row()
        })
    );
}

#[test]
fn update_with_key_old_tuple() {
    for xid in [None, Some(XID)] {
        let PgOutputMessage::Update(u) = ok(update(xid, Some(b'K')), xid.is_some()) else {
            panic!()
        };
        assert_eq!(u.xid, xid);
        assert_eq!(u.relation_id, REL);
        assert_eq!(u.old, Some(OldTuple::Key(key())));
        assert!(u.old.as_ref().unwrap().is_key());
        assert_eq!(u.new, new_row());
    }
}

#[test]
fn update_with_full_old_tuple() {
    let PgOutputMessage::Update(u) = ok(update(None, Some(b'O')), false) else {
        panic!()
    };
    assert_eq!(u.old, Some(OldTuple::Full(row())));
    assert_eq!(u.old.as_ref().unwrap().tuple(), &row());
    assert!(!u.old.unwrap().is_key());
    assert_eq!(u.new, new_row());
}

#[test]
fn delete_fields() {
    assert_eq!(
        ok(delete(None, b'K'), false),
        PgOutputMessage::Delete(Delete {
            xid: None,
            relation_id: REL,
            old: OldTuple::Key(key())
        })
    );
    assert_eq!(
        ok(delete(Some(XID), b'O'), true),
        PgOutputMessage::Delete(Delete {
            xid: Some(XID),
            relation_id: REL,
            old: OldTuple::Full(row())
        })
    );
}

#[test]
fn truncate_fields_and_options() {
    for (options, cascade, restart) in [
        (0, false, false),
        (1, true, false),
        (2, false, true),
        (3, true, true),
    ] {
        let PgOutputMessage::Truncate(t) = ok(truncate(None, options), false) else {
            panic!()
        };
        assert_eq!(t.xid, None);
        assert_eq!(t.options, options);
        assert_eq!(t.cascade(), cascade);
        assert_eq!(t.restart_identity(), restart);
        assert_eq!(t.relation_ids, vec![REL, REL + 1, u32::MAX]);
    }
    let PgOutputMessage::Truncate(t) = ok(truncate(Some(XID), 0), true) else {
        panic!()
    };
    assert_eq!(t.xid, Some(XID));
    // Zero relations is valid too.
    let empty = B::tag(b'T').i32(0).u8(0).build();
    let PgOutputMessage::Truncate(t) = ok(empty, false) else {
        panic!()
    };
    assert!(t.relation_ids.is_empty());
}

#[test]
fn message_transactional_with_content() {
    let buf = message(None, 1, b"hello");
    let PgOutputMessage::Message(m) = ok(buf.clone(), false) else {
        panic!()
    };
    assert_eq!(m.xid, None);
    assert!(m.transactional());
    assert_eq!(m.lsn, Lsn(LSN1));
    assert_eq!(m.prefix_str(), Ok("walrelay"));
    assert_eq!(m.content_str(), Ok("hello"));
    assert_eq!(&m.content[..], b"hello");
    // Zero-copy: prefix and content are slices of the input.
    assert_eq!(m.prefix.as_ptr(), buf[1 + 1 + 8..].as_ptr());
    assert_eq!(m.content.as_ptr(), buf[buf.len() - 5..].as_ptr());
}

#[test]
fn message_empty_non_transactional() {
    let PgOutputMessage::Message(m) = ok(message(None, 0, b""), false) else {
        panic!()
    };
    assert!(!m.transactional());
    assert_eq!(m.flags, 0);
    assert!(m.content.is_empty());
    assert_eq!(m.prefix_str(), Ok("walrelay"));
}

#[test]
fn message_streamed_and_invalid_utf8_accessors() {
    let PgOutputMessage::Message(m) = ok(message(Some(XID), 1, b"{\"k\":1}"), true) else {
        panic!()
    };
    assert_eq!(m.xid, Some(XID));
    assert_eq!(m.content_str(), Ok("{\"k\":1}"));

    let buf = B::tag(b'M')
        .u8(0)
        .u64(1)
        .cstr(b"\xff")
        .i32(1)
        .raw(b"\xfe")
        .build();
    let PgOutputMessage::Message(m) = ok(buf, false) else {
        panic!()
    };
    assert_eq!(
        m.prefix_str(),
        Err(DecodeError::InvalidUtf8 {
            what: "message prefix"
        })
    );
    assert_eq!(
        m.content_str(),
        Err(DecodeError::InvalidUtf8 {
            what: "message content"
        })
    );
}

#[test]
fn stream_start_stop_commit() {
    assert_eq!(
        ok(stream_start(true), false),
        PgOutputMessage::StreamStart(StreamStart {
            xid: XID,
            first_segment: true
        })
    );
    assert_eq!(
        ok(stream_start(false), false),
        PgOutputMessage::StreamStart(StreamStart {
            xid: XID,
            first_segment: false
        })
    );
    assert_eq!(ok(stream_stop(), true), PgOutputMessage::StreamStop);
    assert_eq!(
        ok(stream_commit(), false),
        PgOutputMessage::StreamCommit(StreamCommit {
            xid: XID,
            flags: 0,
            commit_lsn: Lsn(LSN1),
            end_lsn: Lsn(LSN2),
            timestamp: PgTimestamp(TS)
        })
    );
    let bad = B::tag(b'S').u32(1).u8(2).build();
    assert_eq!(
        decode(bad, false),
        Err(DecodeError::InvalidValue {
            what: "stream start first segment flag",
            value: 2
        })
    );
}

#[test]
fn stream_abort_both_forms() {
    assert_eq!(
        ok(stream_abort(false), false),
        PgOutputMessage::StreamAbort(StreamAbort {
            xid: XID,
            subxid: XID + 5,
            parallel: None
        })
    );
    assert_eq!(
        decode_with(stream_abort(true), opts(false, true)),
        Ok(PgOutputMessage::StreamAbort(StreamAbort {
            xid: XID,
            subxid: XID + 5,
            parallel: Some(ParallelAbort {
                abort_lsn: Lsn(LSN2),
                abort_timestamp: PgTimestamp(TS + 1)
            })
        }))
    );
    // The option decides the form: the wrong one is an error, not a guess.
    assert_eq!(
        decode(stream_abort(true), false),
        Err(DecodeError::TrailingBytes {
            message: "Stream Abort",
            remaining: 16
        })
    );
    assert!(matches!(
        decode_with(stream_abort(false), opts(false, true)),
        Err(DecodeError::UnexpectedEof { .. })
    ));
}

#[test]
fn two_phase_messages() {
    assert_eq!(
        ok(begin_prepare(), false),
        PgOutputMessage::BeginPrepare(BeginPrepare {
            prepare_lsn: Lsn(LSN1),
            end_lsn: Lsn(LSN2),
            timestamp: PgTimestamp(TS),
            xid: XID,
            gid: "gid-1".into()
        })
    );
    let prep = Prepare {
        flags: 0,
        prepare_lsn: Lsn(LSN1),
        end_lsn: Lsn(LSN2),
        timestamp: PgTimestamp(TS),
        xid: XID,
        gid: "gid-2".into(),
    };
    assert_eq!(
        ok(prepare(b'P'), false),
        PgOutputMessage::Prepare(prep.clone())
    );
    assert_eq!(
        ok(prepare(b'p'), false),
        PgOutputMessage::StreamPrepare(prep)
    );
    assert_eq!(
        ok(commit_prepared(), false),
        PgOutputMessage::CommitPrepared(CommitPrepared {
            flags: 0,
            commit_lsn: Lsn(LSN1),
            end_lsn: Lsn(LSN2),
            timestamp: PgTimestamp(TS),
            xid: XID,
            gid: "gid-3".into()
        })
    );
    assert_eq!(
        ok(rollback_prepared(), false),
        PgOutputMessage::RollbackPrepared(RollbackPrepared {
            flags: 0,
            prepare_end_lsn: Lsn(LSN1),
            rollback_end_lsn: Lsn(LSN2),
            prepare_timestamp: PgTimestamp(TS),
            rollback_timestamp: PgTimestamp(TS + 10),
            xid: XID,
            gid: "gid-4".into()
        })
    );
}

#[test]
fn every_fixture_decodes_with_its_options() {
    for (name, buf, options) in all() {
        let msg = decode_with(buf, options).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!msg.kind().is_empty());
    }
}

#[test]
fn stateful_decoder_tracks_stream_blocks() {
    let mut d = Decoder::new();
    assert!(matches!(d.decode(begin()), Ok(PgOutputMessage::Begin(_))));
    assert!(matches!(
        d.decode(insert(None)),
        Ok(PgOutputMessage::Insert(Insert { xid: None, .. }))
    ));
    assert!(matches!(d.decode(commit()), Ok(PgOutputMessage::Commit(_))));
    assert!(!d.in_stream());

    d.decode(stream_start(true)).unwrap();
    assert!(d.in_stream());
    for buf in [
        relation(Some(XID)),
        type_msg(Some(XID)),
        insert(Some(XID)),
        update(Some(XID), Some(b'K')),
        delete(Some(XID), b'O'),
        truncate(Some(XID), 0),
        message(Some(XID), 1, b"x"),
    ] {
        let msg = d.decode(buf).unwrap();
        let xid = match &msg {
            PgOutputMessage::Relation(m) => m.xid,
            PgOutputMessage::Type(m) => m.xid,
            PgOutputMessage::Insert(m) => m.xid,
            PgOutputMessage::Update(m) => m.xid,
            PgOutputMessage::Delete(m) => m.xid,
            PgOutputMessage::Truncate(m) => m.xid,
            PgOutputMessage::Message(m) => m.xid,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(xid, Some(XID), "{}", msg.kind());
    }
    // A second Stream Start inside the block is a protocol error and
    // leaves the state alone.
    assert_eq!(
        d.decode(stream_start(false)),
        Err(DecodeError::UnexpectedStreamState {
            message: "Stream Start",
            in_stream: true
        })
    );
    assert!(d.in_stream());
    assert_eq!(d.decode(stream_stop()), Ok(PgOutputMessage::StreamStop));
    assert!(!d.in_stream());
    assert_eq!(
        d.decode(stream_stop()),
        Err(DecodeError::UnexpectedStreamState {
            message: "Stream Stop",
            in_stream: false
        })
    );
    d.decode(stream_commit()).unwrap();
    assert!(matches!(
        d.decode(insert(None)),
        Ok(PgOutputMessage::Insert(Insert { xid: None, .. }))
    ));

    d.decode(stream_start(false)).unwrap();
    d.reset();
    assert!(!d.in_stream());

    let mut p = Decoder::new().with_parallel_streaming(true);
    assert!(matches!(
        p.decode(stream_abort(true)),
        Ok(PgOutputMessage::StreamAbort(StreamAbort {
            parallel: Some(_),
            ..
        }))
    ));
}

#[test]
fn relation_cache_with_decoded_messages() {
    let mut cache = RelationCache::new();
    let PgOutputMessage::Relation(rel) = ok(relation(None), false) else {
        panic!()
    };
    cache.insert(rel);
    let PgOutputMessage::Update(u) = ok(update(None, Some(b'K')), false) else {
        panic!()
    };
    let new = cache.row(u.relation_id, &u.new).unwrap();
    assert_eq!(new.text("id"), Ok(Some("42")));
    assert_eq!(new.text("name"), Ok(Some("Zoë")));
    assert_eq!(new.text("payload"), Ok(None));
    assert_eq!(
        new.text("note"),
        Err(ColumnError::UnchangedToast("note".into()))
    );
    let old = cache
        .row(u.relation_id, u.old.as_ref().unwrap().tuple())
        .unwrap();
    assert_eq!(old.text("id"), Ok(Some("41")));
    assert_eq!(
        cache.row(REL + 1, &u.new).unwrap_err(),
        RowError::UnknownRelation(REL + 1)
    );
}
