//! The pure decoding function: one message's bytes in, the typed message out.

use bytes::Bytes;

use super::{
    Begin, BeginPrepare, Commit, CommitPrepared, Delete, Insert, Message, Origin, ParallelAbort,
    PgOutputMessage, Prepare, Relation, RelationColumn, ReplicaIdentity, RollbackPrepared,
    StreamAbort, StreamCommit, StreamStart, Truncate, Type, Update, Xid,
};
use crate::error::DecodeError;
use crate::reader::Reader;
use crate::timestamp::PgTimestamp;
use crate::tuple::{OldTuple, TupleData};

/// Context the wire format does not carry itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecodeOptions {
    /// Inside a Stream Start … Stream Stop block (protocol ≥ 2): Relation,
    /// Type, Insert, Update, Delete, Truncate and Message carry a leading
    /// xid.
    pub in_stream: bool,
    /// The subscription uses `streaming = parallel` (protocol ≥ 4): Stream
    /// Abort additionally carries the abort LSN and abort timestamp.
    pub parallel_streaming: bool,
}

/// Decodes one pgoutput message.
///
/// `in_stream` says whether the message is inside a Stream Start … Stream
/// Stop block (see [`DecodeOptions::in_stream`]). Stream Abort is decoded in
/// its short (non-parallel) form; use [`decode_with`] for the other.
pub fn decode(buf: Bytes, in_stream: bool) -> Result<PgOutputMessage, DecodeError> {
    decode_with(
        buf,
        DecodeOptions {
            in_stream,
            parallel_streaming: false,
        },
    )
}

/// Decodes one pgoutput message with explicit [`DecodeOptions`].
///
/// The whole buffer must be one message: leftover bytes are
/// [`DecodeError::TrailingBytes`].
pub fn decode_with(buf: Bytes, options: DecodeOptions) -> Result<PgOutputMessage, DecodeError> {
    let mut r = Reader::new(buf);
    let tag = r.u8("message tag")?;
    let xid = |r: &mut Reader| -> Result<Option<Xid>, DecodeError> {
        if options.in_stream {
            r.u32("streamed transaction xid").map(Some)
        } else {
            Ok(None)
        }
    };
    let msg = match tag {
        b'B' => PgOutputMessage::Begin(Begin {
            final_lsn: r.lsn("begin final lsn")?,
            timestamp: PgTimestamp(r.i64("begin timestamp")?),
            xid: r.u32("begin xid")?,
        }),
        b'C' => PgOutputMessage::Commit(Commit {
            flags: r.u8("commit flags")?,
            commit_lsn: r.lsn("commit lsn")?,
            end_lsn: r.lsn("commit end lsn")?,
            timestamp: PgTimestamp(r.i64("commit timestamp")?),
        }),
        b'O' => PgOutputMessage::Origin(Origin {
            commit_lsn: r.lsn("origin commit lsn")?,
            name: r.string("origin name")?,
        }),
        b'R' => {
            let xid = xid(&mut r)?;
            PgOutputMessage::Relation(decode_relation(&mut r, xid)?)
        }
        b'Y' => PgOutputMessage::Type(Type {
            xid: xid(&mut r)?,
            id: r.u32("type oid")?,
            namespace: r.string("type namespace")?,
            name: r.string("type name")?,
        }),
        b'I' => {
            let xid = xid(&mut r)?;
            PgOutputMessage::Insert(decode_insert(&mut r, xid)?)
        }
        b'U' => {
            let xid = xid(&mut r)?;
            PgOutputMessage::Update(decode_update(&mut r, xid)?)
        }
        b'D' => {
            let xid = xid(&mut r)?;
            PgOutputMessage::Delete(decode_delete(&mut r, xid)?)
        }
        b'T' => {
            let xid = xid(&mut r)?;
            PgOutputMessage::Truncate(decode_truncate(&mut r, xid)?)
        }
        b'M' => PgOutputMessage::Message(Message {
            xid: xid(&mut r)?,
            flags: r.u8("message flags")?,
            lsn: r.lsn("message lsn")?,
            prefix: r.cstr("message prefix")?,
            content: r.len_prefixed("message content")?,
        }),
        b'S' => PgOutputMessage::StreamStart(StreamStart {
            xid: r.u32("stream start xid")?,
            first_segment: r.bool("stream start first segment flag")?,
        }),
        b'E' => PgOutputMessage::StreamStop,
        b'c' => PgOutputMessage::StreamCommit(StreamCommit {
            xid: r.u32("stream commit xid")?,
            flags: r.u8("stream commit flags")?,
            commit_lsn: r.lsn("stream commit lsn")?,
            end_lsn: r.lsn("stream commit end lsn")?,
            timestamp: PgTimestamp(r.i64("stream commit timestamp")?),
        }),
        b'A' => PgOutputMessage::StreamAbort(StreamAbort {
            xid: r.u32("stream abort xid")?,
            subxid: r.u32("stream abort subtransaction xid")?,
            parallel: if options.parallel_streaming {
                Some(ParallelAbort {
                    abort_lsn: r.lsn("stream abort lsn")?,
                    abort_timestamp: PgTimestamp(r.i64("stream abort timestamp")?),
                })
            } else {
                None
            },
        }),
        b'b' => PgOutputMessage::BeginPrepare(BeginPrepare {
            prepare_lsn: r.lsn("begin prepare lsn")?,
            end_lsn: r.lsn("begin prepare end lsn")?,
            timestamp: PgTimestamp(r.i64("begin prepare timestamp")?),
            xid: r.u32("begin prepare xid")?,
            gid: r.string("begin prepare gid")?,
        }),
        b'P' => PgOutputMessage::Prepare(decode_prepare(&mut r)?),
        b'p' => PgOutputMessage::StreamPrepare(decode_prepare(&mut r)?),
        b'K' => PgOutputMessage::CommitPrepared(CommitPrepared {
            flags: r.u8("commit prepared flags")?,
            commit_lsn: r.lsn("commit prepared lsn")?,
            end_lsn: r.lsn("commit prepared end lsn")?,
            timestamp: PgTimestamp(r.i64("commit prepared timestamp")?),
            xid: r.u32("commit prepared xid")?,
            gid: r.string("commit prepared gid")?,
        }),
        b'r' => PgOutputMessage::RollbackPrepared(RollbackPrepared {
            flags: r.u8("rollback prepared flags")?,
            prepare_end_lsn: r.lsn("rollback prepared prepare end lsn")?,
            rollback_end_lsn: r.lsn("rollback prepared end lsn")?,
            prepare_timestamp: PgTimestamp(r.i64("rollback prepared prepare timestamp")?),
            rollback_timestamp: PgTimestamp(r.i64("rollback prepared timestamp")?),
            xid: r.u32("rollback prepared xid")?,
            gid: r.string("rollback prepared gid")?,
        }),
        other => return Err(DecodeError::UnknownMessage(other)),
    };
    r.finish(msg.kind())?;
    Ok(msg)
}

fn decode_relation(r: &mut Reader, xid: Option<Xid>) -> Result<Relation, DecodeError> {
    let id = r.u32("relation oid")?;
    let namespace = r.string("relation namespace")?;
    let name = r.string("relation name")?;
    let replica_identity = ReplicaIdentity::from_byte(r.u8("relation replica identity")?)?;
    let n = r.i16("relation column count")?;
    let n = Reader::count(n.into(), "relation column count")?;
    // A column is at least 10 bytes (flags, empty name + NUL, type oid,
    // typmod): reserve no more than the buffer could possibly hold.
    let mut columns = Vec::with_capacity(n.min(r.remaining() / 10));
    for _ in 0..n {
        columns.push(RelationColumn {
            flags: r.u8("relation column flags")?,
            name: r.string("relation column name")?,
            type_oid: r.u32("relation column type oid")?,
            type_modifier: r.i32("relation column type modifier")?,
        });
    }
    Ok(Relation {
        xid,
        id,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn decode_insert(r: &mut Reader, xid: Option<Xid>) -> Result<Insert, DecodeError> {
    let relation_id = r.u32("insert relation oid")?;
    match r.u8("insert tuple marker")? {
        b'N' => Ok(Insert {
            xid,
            relation_id,
            new: TupleData::decode(r)?,
        }),
        other => Err(DecodeError::InvalidValue {
            what: "insert tuple marker",
            value: other.into(),
        }),
    }
}

/// The old tuple is optional: the byte after the relation id is `K`/`O`
/// (old tuple follows, then `N`) or directly `N`.
fn decode_update(r: &mut Reader, xid: Option<Xid>) -> Result<Update, DecodeError> {
    let relation_id = r.u32("update relation oid")?;
    let mut marker = r.u8("update tuple marker")?;
    let old = match marker {
        b'K' => Some(OldTuple::Key(TupleData::decode(r)?)),
        b'O' => Some(OldTuple::Full(TupleData::decode(r)?)),
        _ => None,
    };
    if old.is_some() {
        marker = r.u8("update new tuple marker")?;
    }
    if marker != b'N' {
        return Err(DecodeError::InvalidValue {
            what: "update tuple marker",
            value: marker.into(),
        });
    }
    Ok(Update {
        xid,
        relation_id,
        old,
        new: TupleData::decode(r)?,
    })
}

fn decode_delete(r: &mut Reader, xid: Option<Xid>) -> Result<Delete, DecodeError> {
    let relation_id = r.u32("delete relation oid")?;
    let old = match r.u8("delete tuple marker")? {
        b'K' => OldTuple::Key(TupleData::decode(r)?),
        b'O' => OldTuple::Full(TupleData::decode(r)?),
        other => {
            return Err(DecodeError::InvalidValue {
                what: "delete tuple marker",
                value: other.into(),
            })
        }
    };
    Ok(Delete {
        xid,
        relation_id,
        old,
    })
}

fn decode_truncate(r: &mut Reader, xid: Option<Xid>) -> Result<Truncate, DecodeError> {
    let n = r.i32("truncate relation count")?;
    let n = Reader::count(n.into(), "truncate relation count")?;
    let options = r.u8("truncate options")?;
    // Check the whole id array fits before allocating for it, so a count
    // of i32::MAX in a short message fails without reserving 8 GiB.
    r.ensure(n.saturating_mul(4), "truncate relation ids")?;
    let mut relation_ids = Vec::with_capacity(n);
    for _ in 0..n {
        relation_ids.push(r.u32("truncate relation oid")?);
    }
    Ok(Truncate {
        xid,
        options,
        relation_ids,
    })
}

/// Prepare and Stream Prepare share one layout.
fn decode_prepare(r: &mut Reader) -> Result<Prepare, DecodeError> {
    Ok(Prepare {
        flags: r.u8("prepare flags")?,
        prepare_lsn: r.lsn("prepare lsn")?,
        end_lsn: r.lsn("prepare end lsn")?,
        timestamp: PgTimestamp(r.i64("prepare timestamp")?),
        xid: r.u32("prepare xid")?,
        gid: r.string("prepare gid")?,
    })
}
