//! pgoutput message types and the pure decoding function.
//!
//! One buffer in, one message out: [`decode`] (or [`decode_with`]) takes the
//! bytes of exactly one logical replication message — the payload of an
//! XLogData (`w`) frame — and returns it typed. The function has no state;
//! the one piece of context the format needs (whether we are inside a
//! streamed-transaction block, which adds a leading xid to data messages) is
//! passed in. [`crate::Decoder`] tracks that context for you.
//!
//! Field layouts follow "Logical Replication Message Formats" in the
//! PostgreSQL protocol documentation. All integers are big-endian.
//! Xids and oids are `Int32` on the wire but unsigned in PostgreSQL, so they
//! are `u32` here.

use bytes::Bytes;

use crate::error::DecodeError;
use crate::lsn::Lsn;
use crate::reader::Reader;
use crate::timestamp::PgTimestamp;
use crate::tuple::{OldTuple, TupleData};

/// A PostgreSQL transaction id.
pub type Xid = u32;
/// A PostgreSQL object id (relation or type id).
pub type Oid = u32;

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

/// Begin (`B`): start of a (non-streamed) transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begin {
    /// LSN of the transaction's commit record.
    pub final_lsn: Lsn,
    /// Commit timestamp.
    pub timestamp: PgTimestamp,
    /// Transaction id.
    pub xid: Xid,
}

/// Commit (`C`): end of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// Flags; currently unused by PostgreSQL (0). Kept raw.
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// End LSN of the transaction: the position to confirm once it is
    /// durably relayed.
    pub end_lsn: Lsn,
    /// Commit timestamp.
    pub timestamp: PgTimestamp,
}

/// Origin (`O`): the transaction was replayed from another origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Commit LSN on the origin server.
    pub commit_lsn: Lsn,
    /// Origin name.
    pub name: String,
}

/// `REPLICA IDENTITY` setting of a relation (`relreplident`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplicaIdentity {
    /// `'d'`: the primary key.
    Default,
    /// `'n'`: nothing; Update/Delete carry no old tuple.
    Nothing,
    /// `'f'`: all columns.
    Full,
    /// `'i'`: a specific unique index.
    Index,
}

impl ReplicaIdentity {
    fn from_byte(b: u8) -> Result<Self, DecodeError> {
        Ok(match b {
            b'd' => ReplicaIdentity::Default,
            b'n' => ReplicaIdentity::Nothing,
            b'f' => ReplicaIdentity::Full,
            b'i' => ReplicaIdentity::Index,
            other => {
                return Err(DecodeError::InvalidValue {
                    what: "relation replica identity",
                    value: other.into(),
                })
            }
        })
    }

    /// The `relreplident` character.
    #[must_use]
    pub fn as_byte(self) -> u8 {
        match self {
            ReplicaIdentity::Default => b'd',
            ReplicaIdentity::Nothing => b'n',
            ReplicaIdentity::Full => b'f',
            ReplicaIdentity::Index => b'i',
        }
    }
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Flags; bit 0 ([`RelationColumn::FLAG_KEY`]) marks replica identity
    /// key columns.
    pub flags: u8,
    /// Column name.
    pub name: String,
    /// Type oid.
    pub type_oid: Oid,
    /// Type modifier (`atttypmod`), -1 if none.
    pub type_modifier: i32,
}

impl RelationColumn {
    /// The flag bit marking a column as part of the replica identity key.
    pub const FLAG_KEY: u8 = 1;

    /// `true` if the column is part of the replica identity key.
    #[must_use]
    pub fn is_key(&self) -> bool {
        self.flags & Self::FLAG_KEY != 0
    }
}

/// Relation (`R`): the schema of a table, sent before its first change in a
/// session and again after it changes (e.g. `ALTER TABLE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// Xid of the streamed transaction, if inside a streamed block.
    pub xid: Option<Xid>,
    /// Relation oid.
    pub id: Oid,
    /// Schema name; PostgreSQL sends an empty string for `pg_catalog`.
    pub namespace: String,
    /// Table name.
    pub name: String,
    /// Replica identity setting.
    pub replica_identity: ReplicaIdentity,
    /// Published columns in tuple order (dropped and unpublished generated
    /// columns are not included, matching TupleData).
    pub columns: Vec<RelationColumn>,
}

/// Type (`Y`): a non-builtin data type used by a later Relation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Type {
    /// Xid of the streamed transaction, if inside a streamed block.
    pub xid: Option<Xid>,
    /// Type oid.
    pub id: Oid,
    /// Schema name; empty for `pg_catalog`.
    pub namespace: String,
    /// Type name.
    pub name: String,
}

/// Insert (`I`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    /// Xid of the streamed transaction, if inside a streamed block.
    pub xid: Option<Xid>,
    /// Relation oid.
    pub relation_id: Oid,
    /// The new row.
    pub new: TupleData,
}

/// Update (`U`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// Xid of the streamed transaction, if inside a streamed block.
    pub xid: Option<Xid>,
    /// Relation oid.
    pub relation_id: Oid,
    /// The old row, present only if the key changed (`K`) or the relation
    /// has `REPLICA IDENTITY FULL` (`O`).
    pub old: Option<OldTuple>,
    /// The new row.
    pub new: TupleData,
}

/// Delete (`D`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    /// Xid of the streamed transaction, if inside a streamed block.
    pub xid: Option<Xid>,
    /// Relation oid.
    pub relation_id: Oid,
    /// The deleted row's key (`K`) or full old row (`O`).
    pub old: OldTuple,
}

/// Truncate (`T`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    /// Xid of the streamed transaction, if inside a streamed block.
    pub xid: Option<Xid>,
    /// Option bits, see [`Truncate::CASCADE`] and
    /// [`Truncate::RESTART_IDENTITY`]. Unknown bits are kept.
    pub options: u8,
    /// The truncated relations.
    pub relation_ids: Vec<Oid>,
}

impl Truncate {
    /// `TRUNCATE ... CASCADE`.
    pub const CASCADE: u8 = 1;
    /// `TRUNCATE ... RESTART IDENTITY`.
    pub const RESTART_IDENTITY: u8 = 2;

    /// `true` if `CASCADE` was given.
    #[must_use]
    pub fn cascade(&self) -> bool {
        self.options & Self::CASCADE != 0
    }

    /// `true` if `RESTART IDENTITY` was given.
    #[must_use]
    pub fn restart_identity(&self) -> bool {
        self.options & Self::RESTART_IDENTITY != 0
    }
}

/// Message (`M`): a logical decoding message from `pg_logical_emit_message`.
///
/// `prefix` and `content` are zero-copy slices of the input buffer; use
/// [`Message::prefix_str`] / [`Message::content_str`] to view them as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Xid of the streamed transaction, if inside a streamed block.
    pub xid: Option<Xid>,
    /// Flags; bit 0 ([`Message::FLAG_TRANSACTIONAL`]) = transactional.
    pub flags: u8,
    /// LSN of the message.
    pub lsn: Lsn,
    /// Prefix, without its NUL terminator.
    pub prefix: Bytes,
    /// Content.
    pub content: Bytes,
}

impl Message {
    /// The flag bit for transactional messages.
    pub const FLAG_TRANSACTIONAL: u8 = 1;

    /// `true` if the message was emitted transactionally.
    #[must_use]
    pub fn transactional(&self) -> bool {
        self.flags & Self::FLAG_TRANSACTIONAL != 0
    }

    /// The prefix as `&str`, validated but not copied.
    pub fn prefix_str(&self) -> Result<&str, DecodeError> {
        std::str::from_utf8(&self.prefix).map_err(|_| DecodeError::InvalidUtf8 {
            what: "message prefix",
        })
    }

    /// The content as `&str`, validated but not copied.
    pub fn content_str(&self) -> Result<&str, DecodeError> {
        std::str::from_utf8(&self.content).map_err(|_| DecodeError::InvalidUtf8 {
            what: "message content",
        })
    }
}

/// Stream Start (`S`): begins a block of changes of an in-progress
/// transaction (protocol ≥ 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStart {
    /// Xid of the streamed transaction.
    pub xid: Xid,
    /// `true` for the first block of this transaction.
    pub first_segment: bool,
}

/// Stream Commit (`c`): a streamed transaction committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCommit {
    /// Xid of the transaction.
    pub xid: Xid,
    /// Flags; currently unused (0).
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// End LSN of the transaction.
    pub end_lsn: Lsn,
    /// Commit timestamp.
    pub timestamp: PgTimestamp,
}

/// Extra Stream Abort fields sent with `streaming = parallel` (protocol ≥ 4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParallelAbort {
    /// LSN of the abort.
    pub abort_lsn: Lsn,
    /// Abort timestamp.
    pub abort_timestamp: PgTimestamp,
}

/// Stream Abort (`A`): a streamed (sub)transaction aborted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamAbort {
    /// Xid of the top-level transaction.
    pub xid: Xid,
    /// Xid of the aborted subtransaction (equal to `xid` for the top level).
    pub subxid: Xid,
    /// Present only when decoded with
    /// [`DecodeOptions::parallel_streaming`].
    pub parallel: Option<ParallelAbort>,
}

/// Begin Prepare (`b`, protocol ≥ 3, two-phase).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginPrepare {
    /// LSN of the prepare.
    pub prepare_lsn: Lsn,
    /// End LSN of the prepared transaction.
    pub end_lsn: Lsn,
    /// Prepare timestamp.
    pub timestamp: PgTimestamp,
    /// Transaction id.
    pub xid: Xid,
    /// Global transaction identifier.
    pub gid: String,
}

/// Prepare (`P`) and Stream Prepare (`p`), protocol ≥ 3, two-phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare {
    /// Flags; currently unused (0).
    pub flags: u8,
    /// LSN of the prepare.
    pub prepare_lsn: Lsn,
    /// End LSN of the prepared transaction.
    pub end_lsn: Lsn,
    /// Prepare timestamp.
    pub timestamp: PgTimestamp,
    /// Transaction id.
    pub xid: Xid,
    /// Global transaction identifier.
    pub gid: String,
}

/// Commit Prepared (`K`, protocol ≥ 3, two-phase).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPrepared {
    /// Flags; currently unused (0).
    pub flags: u8,
    /// LSN of the commit of the prepared transaction.
    pub commit_lsn: Lsn,
    /// End LSN of the commit of the prepared transaction.
    pub end_lsn: Lsn,
    /// Commit timestamp.
    pub timestamp: PgTimestamp,
    /// Transaction id.
    pub xid: Xid,
    /// Global transaction identifier.
    pub gid: String,
}

/// Rollback Prepared (`r`, protocol ≥ 3, two-phase).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackPrepared {
    /// Flags; currently unused (0).
    pub flags: u8,
    /// End LSN of the prepared transaction.
    pub prepare_end_lsn: Lsn,
    /// End LSN of the rollback.
    pub rollback_end_lsn: Lsn,
    /// Prepare timestamp.
    pub prepare_timestamp: PgTimestamp,
    /// Rollback timestamp.
    pub rollback_timestamp: PgTimestamp,
    /// Transaction id.
    pub xid: Xid,
    /// Global transaction identifier.
    pub gid: String,
}

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgOutputMessage {
    /// `B`
    Begin(Begin),
    /// `C`
    Commit(Commit),
    /// `O`
    Origin(Origin),
    /// `R`
    Relation(Relation),
    /// `Y`
    Type(Type),
    /// `I`
    Insert(Insert),
    /// `U`
    Update(Update),
    /// `D`
    Delete(Delete),
    /// `T`
    Truncate(Truncate),
    /// `M`
    Message(Message),
    /// `S`
    StreamStart(StreamStart),
    /// `E`
    StreamStop,
    /// `c`
    StreamCommit(StreamCommit),
    /// `A`
    StreamAbort(StreamAbort),
    /// `b`
    BeginPrepare(BeginPrepare),
    /// `P`
    Prepare(Prepare),
    /// `K`
    CommitPrepared(CommitPrepared),
    /// `r`
    RollbackPrepared(RollbackPrepared),
    /// `p`
    StreamPrepare(Prepare),
}

impl PgOutputMessage {
    /// A human-readable name of the message kind, for logs and errors.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            PgOutputMessage::Begin(_) => "Begin",
            PgOutputMessage::Commit(_) => "Commit",
            PgOutputMessage::Origin(_) => "Origin",
            PgOutputMessage::Relation(_) => "Relation",
            PgOutputMessage::Type(_) => "Type",
            PgOutputMessage::Insert(_) => "Insert",
            PgOutputMessage::Update(_) => "Update",
            PgOutputMessage::Delete(_) => "Delete",
            PgOutputMessage::Truncate(_) => "Truncate",
            PgOutputMessage::Message(_) => "Message",
            PgOutputMessage::StreamStart(_) => "Stream Start",
            PgOutputMessage::StreamStop => "Stream Stop",
            PgOutputMessage::StreamCommit(_) => "Stream Commit",
            PgOutputMessage::StreamAbort(_) => "Stream Abort",
            PgOutputMessage::BeginPrepare(_) => "Begin Prepare",
            PgOutputMessage::Prepare(_) => "Prepare",
            PgOutputMessage::CommitPrepared(_) => "Commit Prepared",
            PgOutputMessage::RollbackPrepared(_) => "Rollback Prepared",
            PgOutputMessage::StreamPrepare(_) => "Stream Prepare",
        }
    }
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
