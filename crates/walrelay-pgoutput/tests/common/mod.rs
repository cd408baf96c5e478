//! Test-only byte builder and hand-written fixtures for every pgoutput
//! message kind. Each fixture spells out its fields explicitly, in wire
//! order, so the tests double as documentation of the format.

#![allow(dead_code)] // each test binary uses a different subset

use bytes::Bytes;
use walrelay_pgoutput::DecodeOptions;

pub use walrelay_testkit::wire::{Col, B};

pub const TS: i64 = 777_888_999_000_123; // microseconds since 2000-01-01
pub const LSN1: u64 = 0x16_B374_D848;
pub const LSN2: u64 = 0x16_B374_D900;
pub const XID: u32 = 0xDEAD_BEEF; // > i32::MAX: xids are unsigned
pub const REL: u32 = 16_384;

pub fn begin() -> Bytes {
    B::tag(b'B').u64(LSN1).i64(TS).u32(XID).build()
}

pub fn commit() -> Bytes {
    B::tag(b'C').u8(0).u64(LSN1).u64(LSN2).i64(TS).build()
}

pub fn origin() -> Bytes {
    B::tag(b'O').u64(LSN1).cstr(b"pg_1234").build()
}

/// `public.users (id int4 key, name text, payload bytea varchar(10))`.
pub fn relation(xid: Option<u32>) -> Bytes {
    B::tag(b'R')
        .xid(xid)
        .u32(REL)
        .cstr(b"public")
        .cstr(b"users")
        .u8(b'f')
        .i16(4)
        .u8(1)
        .cstr(b"id")
        .u32(23)
        .i32(-1)
        .u8(0)
        .cstr(b"name")
        .u32(25)
        .i32(-1)
        .u8(0)
        .cstr(b"payload")
        .u32(17)
        .i32(-1)
        .u8(0)
        .cstr(b"note")
        .u32(1043)
        .i32(14)
        .build()
}

pub fn type_msg(xid: Option<u32>) -> Bytes {
    B::tag(b'Y')
        .xid(xid)
        .u32(90_001)
        .cstr(b"")
        .cstr(b"mood")
        .build()
}

/// All four column kinds, matching [`relation`].
pub const ROW: [Col<'static>; 4] = [
    Col::Text(b"42"),
    Col::Null,
    Col::Bin(b"\x00\xffbin"),
    Col::Toast,
];

pub fn insert(xid: Option<u32>) -> Bytes {
    B::tag(b'I').xid(xid).u32(REL).u8(b'N').tuple(&ROW).build()
}

pub const KEY: [Col<'static>; 4] = [Col::Text(b"41"), Col::Null, Col::Null, Col::Null];
pub const NEW: [Col<'static>; 4] = [
    Col::Text(b"42"),
    Col::Text("Zoë".as_bytes()),
    Col::Null,
    Col::Toast,
];

/// `old`: None, Some(b'K') or Some(b'O').
pub fn update(xid: Option<u32>, old: Option<u8>) -> Bytes {
    let mut b = B::tag(b'U').xid(xid).u32(REL);
    match old {
        Some(b'K') => b = b.u8(b'K').tuple(&KEY),
        Some(b'O') => b = b.u8(b'O').tuple(&ROW),
        Some(other) => panic!("bad fixture marker {other}"),
        None => {}
    }
    b.u8(b'N').tuple(&NEW).build()
}

pub fn delete(xid: Option<u32>, kind: u8) -> Bytes {
    let cols: &[Col<'_>] = if kind == b'K' { &KEY } else { &ROW };
    B::tag(b'D').xid(xid).u32(REL).u8(kind).tuple(cols).build()
}

pub fn truncate(xid: Option<u32>, options: u8) -> Bytes {
    B::tag(b'T')
        .xid(xid)
        .i32(3)
        .u8(options)
        .u32(REL)
        .u32(REL + 1)
        .u32(u32::MAX)
        .build()
}

pub fn message(xid: Option<u32>, flags: u8, content: &[u8]) -> Bytes {
    B::tag(b'M')
        .xid(xid)
        .u8(flags)
        .u64(LSN1)
        .cstr(b"walrelay")
        .i32(content.len() as i32)
        .raw(content)
        .build()
}

pub fn stream_start(first: bool) -> Bytes {
    B::tag(b'S').u32(XID).u8(u8::from(first)).build()
}

pub fn stream_stop() -> Bytes {
    B::tag(b'E').build()
}

pub fn stream_commit() -> Bytes {
    B::tag(b'c')
        .u32(XID)
        .u8(0)
        .u64(LSN1)
        .u64(LSN2)
        .i64(TS)
        .build()
}

pub fn stream_abort(parallel: bool) -> Bytes {
    let b = B::tag(b'A').u32(XID).u32(XID + 5);
    if parallel {
        b.u64(LSN2).i64(TS + 1).build()
    } else {
        b.build()
    }
}

pub fn begin_prepare() -> Bytes {
    B::tag(b'b')
        .u64(LSN1)
        .u64(LSN2)
        .i64(TS)
        .u32(XID)
        .cstr(b"gid-1")
        .build()
}

/// Prepare (`P`) or Stream Prepare (`p`).
pub fn prepare(tag: u8) -> Bytes {
    B::tag(tag)
        .u8(0)
        .u64(LSN1)
        .u64(LSN2)
        .i64(TS)
        .u32(XID)
        .cstr(b"gid-2")
        .build()
}

pub fn commit_prepared() -> Bytes {
    B::tag(b'K')
        .u8(0)
        .u64(LSN1)
        .u64(LSN2)
        .i64(TS)
        .u32(XID)
        .cstr(b"gid-3")
        .build()
}

pub fn rollback_prepared() -> Bytes {
    B::tag(b'r')
        .u8(0)
        .u64(LSN1)
        .u64(LSN2)
        .i64(TS)
        .i64(TS + 10)
        .u32(XID)
        .cstr(b"gid-4")
        .build()
}

pub fn opts(in_stream: bool, parallel_streaming: bool) -> DecodeOptions {
    DecodeOptions {
        in_stream,
        parallel_streaming,
    }
}

/// Every valid fixture with the options it must be decoded with.
pub fn all() -> Vec<(&'static str, Bytes, DecodeOptions)> {
    let plain = opts(false, false);
    let streamed = opts(true, false);
    let s = Some(XID);
    vec![
        ("begin", begin(), plain),
        ("commit", commit(), plain),
        ("origin", origin(), plain),
        ("relation", relation(None), plain),
        ("relation_stream", relation(s), streamed),
        ("type", type_msg(None), plain),
        ("type_stream", type_msg(s), streamed),
        ("insert", insert(None), plain),
        ("insert_stream", insert(s), streamed),
        ("update", update(None, None), plain),
        ("update_key", update(None, Some(b'K')), plain),
        ("update_old", update(None, Some(b'O')), plain),
        ("update_key_stream", update(s, Some(b'K')), streamed),
        ("delete_key", delete(None, b'K'), plain),
        ("delete_old", delete(None, b'O'), plain),
        ("delete_stream", delete(s, b'O'), streamed),
        ("truncate", truncate(None, 3), plain),
        ("truncate_stream", truncate(s, 0), streamed),
        ("message", message(None, 1, b"hello"), plain),
        ("message_empty", message(None, 0, b""), plain),
        ("message_stream", message(s, 1, b"{\"k\":1}"), streamed),
        ("stream_start", stream_start(true), plain),
        ("stream_stop", stream_stop(), streamed),
        ("stream_commit", stream_commit(), plain),
        ("stream_abort", stream_abort(false), plain),
        (
            "stream_abort_parallel",
            stream_abort(true),
            opts(false, true),
        ),
        ("begin_prepare", begin_prepare(), plain),
        ("prepare", prepare(b'P'), plain),
        ("stream_prepare", prepare(b'p'), plain),
        ("commit_prepared", commit_prepared(), plain),
        ("rollback_prepared", rollback_prepared(), plain),
    ]
}
