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
//!
//! The message types are here; the decoding functions in `decode.rs`.

use bytes::Bytes;

use crate::error::DecodeError;
use crate::lsn::Lsn;
use crate::timestamp::PgTimestamp;
use crate::tuple::{OldTuple, TupleData};

mod decode;

pub use decode::{decode, decode_with, DecodeOptions};

/// A PostgreSQL transaction id.
pub type Xid = u32;
/// A PostgreSQL object id (relation or type id).
pub type Oid = u32;

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
