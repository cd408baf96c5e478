//! A PostgreSQL logical replication client on tokio.
//!
//! Upstream `tokio-postgres` cannot open a replication connection, so
//! walrelay speaks the protocol itself, using `postgres-protocol` only for
//! message encoding and the SCRAM/MD5 primitives. The modules follow a byte
//! from the socket to the consumer:
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | libpq-compatible settings: URL or keywords, `PG*` variables, `.pgpass`; secrets never printed |
//! | [`tls`] | TCP/Unix connect and TLS with libpq `sslmode` semantics (rustls) |
//! | [`auth`] | the authentication state machine (trust, cleartext, MD5, SCRAM-SHA-256[-PLUS]) |
//! | [`framing`] | cutting the byte stream into frames; size limit; cancel-safe reads |
//! | [`backend`] | what a frame means (pure) |
//! | [`commands`] | replication command text, quoting, typed results (pure) |
//! | [`connection`] | startup, simple queries, `IDENTIFY_SYSTEM`, slots, `START_REPLICATION` |
//! | [`stream`] | the CopyBoth I/O task: backpressure and standby status updates |
//! | [`xlog`] | XLogData, keepalive and status-update messages (pure) |
//! | [`log_limit`] | rate limits for log lines that repeat (pure) |
//!
//! The pgoutput payloads are decoded by the pure `walrelay-pgoutput` crate.
//!
//! The client never confirms a position on its own: the consumer calls
//! [`StatusHandle::confirm`] once its events are safe, and only that
//! position is ever reported to the server.

#![forbid(unsafe_code)]

pub mod auth;
pub mod backend;
pub mod commands;
pub mod config;
pub mod connection;
pub mod error;
pub mod framing;
pub mod log_limit;
pub mod stream;
pub mod tls;
pub mod xlog;

pub use commands::{IdentifySystem, PgOutputOptions, SlotInfo};
pub use config::{
    ChannelBinding, Config, ConfigError, Password, RootCert, SslMode, TargetSessionAttrs,
};
pub use connection::{ReplicationConnection, Row, SlotStatus};
pub use error::{DbError, Error};
pub use framing::DEFAULT_MAX_FRAME_LEN;
pub use stream::{ReplicationStream, StatusHandle, StreamOptions, StreamStats};
pub use tls::{Stream, TlsError};
pub use walrelay_pgoutput::Lsn;
