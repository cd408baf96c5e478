//! Pure decoder for PostgreSQL's `pgoutput` logical replication protocol.
//!
//! walrelay reads a logical replication slot and forwards its changes to
//! Kafka. This crate is the part that turns the bytes of one pgoutput
//! message into typed Rust values, plus the two small pieces of state that
//! interpretation needs: whether we are inside a streamed-transaction block
//! ([`Decoder`]) and the latest table definition per relation
//! ([`RelationCache`]).
//!
//! # Why it is pure
//!
//! There is no I/O, no async and no logging here: input is a
//! [`bytes::Bytes`] buffer holding one message, output is a value or a typed
//! [`DecodeError`]. That keeps the parser easy to test with hand-built byte
//! fixtures and easy to fuzz (see `fuzz/`), and lets the connection code in
//! other crates own retries, timeouts and back-pressure. Malformed input
//! never panics and never makes the decoder allocate more than the input
//! could describe.
//!
//! # Why it is zero-copy
//!
//! Column values and logical-message payloads are the bulk of the stream.
//! They are returned as [`Bytes::slice`](bytes::Bytes::slice)s sharing the
//! input buffer, so decoding a change costs a few small allocations (the
//! column vector) rather than a copy of every value. Only rare, small names
//! (relation, type, origin, column names) are copied into `String`s.
//!
//! # Protocol versions
//!
//! Protocol 1 messages, the protocol 2 streaming messages (Stream Start /
//! Stop / Commit / Abort and the leading xid inside streamed blocks), the
//! protocol 3 two-phase messages (Begin Prepare, Prepare, Commit Prepared,
//! Rollback Prepared, Stream Prepare) and the protocol 4 long Stream Abort
//! form ([`DecodeOptions::parallel_streaming`]) are decoded.
//!
//! ```
//! use bytes::Bytes;
//! use walrelay_pgoutput::{Decoder, PgOutputMessage};
//!
//! let mut decoder = Decoder::new();
//! // Stream Stop is just its tag, but only valid inside a streamed block.
//! assert!(decoder.decode(Bytes::from_static(b"E")).is_err());
//! let start = Bytes::from_static(b"S\x00\x00\x02\x01\x01");
//! assert!(matches!(decoder.decode(start), Ok(PgOutputMessage::StreamStart(_))));
//! assert!(decoder.in_stream());
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod decoder;
mod error;
mod lsn;
mod message;
mod reader;
mod relation;
mod timestamp;
mod tuple;

pub use decoder::Decoder;
pub use error::DecodeError;
pub use lsn::{Lsn, LsnHalf, ParseLsnError};
pub use message::{
    decode, decode_with, Begin, BeginPrepare, Commit, CommitPrepared, DecodeOptions, Delete,
    Insert, Message, Oid, Origin, ParallelAbort, PgOutputMessage, Prepare, Relation,
    RelationColumn, ReplicaIdentity, RollbackPrepared, StreamAbort, StreamCommit, StreamStart,
    Truncate, Type, Update, Xid,
};
pub use relation::{ColumnError, RelationCache, Row, RowError};
pub use timestamp::{PgTimestamp, PG_EPOCH_UNIX_SECS};
pub use tuple::{ColumnValue, OldTuple, TupleData};
