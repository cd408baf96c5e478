//! Errors of the replication client.
//!
//! Every error a user can meet says what failed, why, and what to do. Server
//! errors keep the SQLSTATE and the server's own words ([`DbError`]); a
//! [`Error::Server`] adds walrelay's advice for the SQLSTATEs a replication
//! client commonly meets (wrong password, missing REPLICATION attribute, a
//! slot in use, `wal_level` too low, a missing publication).

use std::fmt;

use crate::config::{ConfigError, TargetSessionAttrs};
use crate::tls::TlsError;

/// An ErrorResponse or NoticeResponse as the server sent it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DbError {
    /// `ERROR`, `FATAL`, `PANIC`, `WARNING`, `NOTICE`, ... (non-localized).
    pub severity: String,
    /// The SQLSTATE, e.g. `28P01`.
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
    /// The server's "where" context line(s).
    pub context: Option<String>,
}

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.severity, self.code, self.message)?;
        if let Some(d) = &self.detail {
            write!(f, " (detail: {d})")?;
        }
        if let Some(h) = &self.hint {
            write!(f, " (server hint: {h})")?;
        }
        Ok(())
    }
}

/// Well-known SQLSTATEs a replication client meets.
pub mod sqlstate {
    pub const INVALID_PASSWORD: &str = "28P01";
    pub const INVALID_AUTHORIZATION: &str = "28000";
    pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
    pub const OBJECT_IN_USE: &str = "55006";
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
    pub const UNDEFINED_OBJECT: &str = "42704";
    pub const DUPLICATE_OBJECT: &str = "42710";
    pub const CONFIGURATION_LIMIT_EXCEEDED: &str = "53400";
    pub const INVALID_CATALOG_NAME: &str = "3D000";
    pub const TOO_MANY_CONNECTIONS: &str = "53300";
    pub const ADMIN_SHUTDOWN: &str = "57P01";
    pub const CRASH_SHUTDOWN: &str = "57P02";
    pub const CANNOT_CONNECT_NOW: &str = "57P03";
}

impl DbError {
    /// Whether this error says that a replication slot was invalidated
    /// (its WAL removed): PostgreSQL 15 says "cannot read from logical
    /// replication slot" with the reason in the detail, 16 and 17 "can no
    /// longer get changes from replication slot", 18 "can no longer access
    /// replication slot".
    pub fn is_slot_invalidated(&self) -> bool {
        self.code == sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE
            && (self.message.contains("can no longer")
                || self.message.contains("invalidated")
                || self
                    .detail
                    .as_deref()
                    .is_some_and(|d| d.contains("invalidated")))
    }

    /// walrelay's advice for this server error, if it knows one.
    pub fn advice(&self) -> Option<&'static str> {
        use sqlstate::*;
        let m = self.message.as_str();
        Some(match self.code.as_str() {
            INVALID_PASSWORD => {
                "check the password for this user: it comes from the connection URL, the \
                 password option, PGPASSWORD or the password file (~/.pgpass)"
            }
            INVALID_AUTHORIZATION if m.contains("pg_hba.conf") => {
                "allow this client in pg_hba.conf: a line for the database (logical \
                 replication connections match the database name, not 'replication'), then \
                 reload PostgreSQL (SELECT pg_reload_conf())"
            }
            // PostgreSQL 15 says "must be superuser or replication role to
            // start walsender", 16 and later "permission denied to start WAL
            // sender" (with the REPLICATION attribute in the detail).
            INSUFFICIENT_PRIVILEGE
                if m.contains("replication")
                    || m.contains("walsender")
                    || m.contains("WAL sender") =>
            {
                "the role needs the REPLICATION attribute: ALTER ROLE <name> WITH REPLICATION \
                 (or connect as a role that has it)"
            }
            OBJECT_IN_USE if m.contains("replication slot") => {
                "another connection is streaming from this slot and a slot serves one \
                 connection at a time: stop the other walrelay or client (see active_pid in \
                 pg_replication_slots), or use a different slot"
            }
            OBJECT_NOT_IN_PREREQUISITE_STATE if m.contains("wal_level") => {
                "set wal_level=logical in postgresql.conf (or ALTER SYSTEM SET wal_level = \
                 logical) and restart PostgreSQL"
            }
            OBJECT_NOT_IN_PREREQUISITE_STATE if self.is_slot_invalidated() => {
                "the slot was invalidated (its WAL was removed, e.g. by max_slot_wal_keep_size): \
                 events in the lost WAL cannot be recovered; drop the slot \
                 (pg_drop_replication_slot) and recreate it (`walrelay setup --accept-slot-loss`), tell consumers \
                 that keys restart from the new slot's position, backfill or reconcile the lost \
                 events, and raise max_slot_wal_keep_size"
            }
            UNDEFINED_OBJECT if m.contains("publication") => {
                "create the publication in this database (`walrelay setup` does it, or CREATE \
                 PUBLICATION <name> FOR TABLE <outbox table>) or fix publication_names"
            }
            UNDEFINED_OBJECT if m.contains("replication slot") => {
                "create the slot (`walrelay setup` does it) or fix the slot name; if the slot \
                 existed before, it was dropped and the events committed since its confirmed \
                 position may be missing: create a new one (`walrelay setup --accept-slot-loss`), \
                 backfill or reconcile them"
            }
            CONFIGURATION_LIMIT_EXCEEDED if m.contains("replication slot") => {
                "all replication slots are in use: raise max_replication_slots (restart needed) \
                 or drop unused slots (pg_drop_replication_slot)"
            }
            TOO_MANY_CONNECTIONS | CONFIGURATION_LIMIT_EXCEEDED
                if m.contains("wal sender") || m.contains("walsender") =>
            {
                "all WAL senders are in use: raise max_wal_senders (restart needed) or stop \
                 other replication clients"
            }
            INVALID_CATALOG_NAME => "check the database name (dbname) in the connection settings",
            _ => return None,
        })
    }
}

/// Errors of the replication client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("invalid connection settings: {0}")]
    Config(#[from] ConfigError),

    #[error(transparent)]
    Tls(#[from] TlsError),

    #[error("I/O error while {context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// The server answered with an ErrorResponse.
    #[error("{context} failed: {error}{}", advice_suffix(.error))]
    Server {
        context: String,
        /// Boxed: server errors are rare and large, and every `Result`
        /// in the hot path carries this enum.
        error: Box<DbError>,
    },

    #[error("authentication failed: {0}")]
    Auth(String),

    #[error(
        "the server sent a message ('{}') of {len} bytes, more than the configured limit of \
         {limit} bytes; raise max_frame_len if events this large are expected",
        char::from(*.tag).escape_default()
    )]
    FrameTooLarge { tag: u8, len: usize, limit: usize },

    #[error("protocol violation: {0}")]
    Protocol(String),

    #[error("connecting to {target} timed out after {after:?}; check that the server is up and reachable, or raise connect_timeout")]
    ConnectTimeout {
        target: String,
        after: std::time::Duration,
    },

    #[error("the server closed the connection{}", .0.as_deref().map(|c| format!(" while {c}")).unwrap_or_default())]
    Closed(Option<&'static str>),

    /// A precondition checked by walrelay itself (not a server error).
    #[error("{problem}; {fix}")]
    Precondition { problem: String, fix: String },

    /// `target_session_attrs` asked for a primary (`read-write`,
    /// `primary`) and none of the hosts was one. During a failover that
    /// is a matter of seconds: transient.
    #[error(
        "no server among the hosts is {wanted} ({tried}); during a failover this lasts until \
         a standby is promoted, and walrelay keeps trying; otherwise list the primary's host \
         in the connection string"
    )]
    NoSuitableHost {
        wanted: TargetSessionAttrs,
        tried: String,
        /// A host refused as it shut down or restarted (57P01, 57P02,
        /// 57P03): see [`Error::is_server_going_away`].
        going_away: bool,
    },

    /// `target_session_attrs=any` reached a standby: walrelay reads its
    /// slot on the primary only, and keeping the connection would fail
    /// later with a less clear error (or, for a synchronized failover
    /// slot, read it where it must not be read).
    #[error(
        "{peer} is a standby (in recovery), and walrelay reads its replication slot on the \
         primary only (a standby's synchronized slot cannot be read before a promotion); add \
         target_session_attrs=read-write to the connection string, with every host of the \
         cluster listed, so that walrelay skips standbys and waits for a promotion"
    )]
    Standby { peer: String },

    #[error("the replication stream has stopped")]
    StreamStopped,

    /// The server ended the replication stream on its own (a CopyDone, or
    /// the CommandComplete a walsender sends when PostgreSQL shuts down
    /// cleanly: `pg_ctl stop/restart -m fast` or `-m smart`). Nothing is
    /// wrong with the stream: the server is going away, and a new
    /// connection resumes from the slot's confirmed position.
    #[error(
        "the server ended the replication stream ({by}), as PostgreSQL does when it shuts down \
         or restarts cleanly; reconnecting resumes from the slot's confirmed position"
    )]
    StreamEndedByServer {
        /// What the server sent: `CopyDone` or `CommandComplete "COPY 0"`.
        by: String,
    },
}

fn advice_suffix(e: &DbError) -> String {
    e.advice()
        .map(|a| format!("; fix: {a}"))
        .unwrap_or_default()
}

impl Error {
    /// Adapter for `map_err` on I/O results.
    pub(crate) fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> Error {
        move |source| Error::Io { context, source }
    }

    pub(crate) fn server(context: impl Into<String>, error: DbError) -> Error {
        Error::Server {
            context: context.into(),
            error: Box::new(error),
        }
    }

    /// The server error behind this error, if it is one.
    pub fn db_error(&self) -> Option<&DbError> {
        match self {
            Error::Server { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The SQLSTATE, if this is a server error.
    pub fn code(&self) -> Option<&str> {
        self.db_error().map(|e| e.code.as_str())
    }

    /// Whether the server ended or refused this connection because it is
    /// going down or not taking connections: 57P01 (a fast or smart
    /// shutdown terminates every backend with it), 57P02 (another backend
    /// crashed) or 57P03 ("the database system is shutting down", or
    /// still starting up).
    pub fn is_server_going_away(&self) -> bool {
        // Found on one host of a list where none is a primary: a
        // session that streams from that host must end, so that it
        // does not hold the shutdown (a switchover's clean stop).
        if let Error::NoSuitableHost { going_away, .. } = self {
            return *going_away;
        }
        matches!(
            self.code(),
            Some(
                sqlstate::ADMIN_SHUTDOWN | sqlstate::CRASH_SHUTDOWN | sqlstate::CANNOT_CONNECT_NOW
            )
        )
    }

    /// Whether reconnecting later may succeed without a change of
    /// configuration (connection lost, server restarting, slot busy).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Io { .. }
            | Error::Closed(_)
            | Error::StreamStopped
            | Error::StreamEndedByServer { .. }
            | Error::NoSuitableHost { .. }
            | Error::ConnectTimeout { .. } => true,
            // The server is down, restarting or unreachable: try again.
            // Certificate and TLS configuration problems are not.
            Error::Tls(e) => matches!(
                e,
                TlsError::Connect { .. }
                    | TlsError::UnixConnect { .. }
                    | TlsError::Timeout { .. }
                    | TlsError::Io { .. }
            ),
            Error::Server { error, .. } => matches!(
                error.code.as_str(),
                sqlstate::OBJECT_IN_USE
                    | sqlstate::ADMIN_SHUTDOWN
                    | sqlstate::CRASH_SHUTDOWN
                    | sqlstate::CANNOT_CONNECT_NOW
                    | sqlstate::TOO_MANY_CONNECTIONS
            ),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(code: &str, message: &str) -> DbError {
        DbError {
            severity: "ERROR".into(),
            code: code.into(),
            message: message.into(),
            ..DbError::default()
        }
    }

    #[test]
    fn wal_level_error_names_the_fix() {
        let e = Error::server(
            "CREATE_REPLICATION_SLOT",
            db("55000", "logical decoding requires wal_level >= logical"),
        );
        let s = e.to_string();
        assert!(s.contains("55000"), "{s}");
        assert!(s.contains("set wal_level=logical"), "{s}");
        assert!(s.contains("restart PostgreSQL"), "{s}");
    }

    #[test]
    fn unknown_codes_have_no_advice() {
        let e = Error::server("query", db("22P02", "invalid input"));
        assert_eq!(e.to_string(), "query failed: ERROR 22P02: invalid input");
        assert_eq!(e.code(), Some("22P02"));
    }

    #[test]
    fn replication_privilege_advice_covers_old_and_new_wording() {
        for m in [
            "must be superuser or replication role to start walsender",
            "permission denied to start WAL sender",
        ] {
            let e = Error::server("connecting", db("42501", m));
            assert!(e.to_string().contains("WITH REPLICATION"), "{m}");
        }
    }

    #[test]
    fn unreachable_servers_are_transient_certificate_problems_are_not() {
        let refused = Error::Tls(TlsError::Connect {
            host: "h".into(),
            port: 5432,
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        });
        assert!(refused.is_transient());
        let timeout = Error::ConnectTimeout {
            target: "h:5432".into(),
            after: std::time::Duration::from_secs(1),
        };
        assert!(timeout.is_transient());
        assert!(!Error::Tls(TlsError::TlsNotSupported {
            host: "h".into(),
            port: 1,
            sslmode: crate::config::SslMode::Require
        })
        .is_transient());
    }

    #[test]
    fn invalidated_slots_are_recognized_in_every_wording() {
        let pg15 = DbError {
            detail: Some(
                "This slot has been invalidated because it exceeded the maximum reserved size."
                    .into(),
            ),
            ..db("55000", "cannot read from logical replication slot \"s\"")
        };
        for e in [
            pg15,
            db(
                "55000",
                "can no longer get changes from replication slot \"s\"",
            ),
            db("55000", "can no longer access replication slot \"s\""),
        ] {
            assert!(e.is_slot_invalidated(), "{e}");
            let text = Error::server("START_REPLICATION", e).to_string();
            assert!(text.contains("fix: the slot was invalidated"), "{text}");
        }
        assert!(
            !db("55000", "logical decoding requires wal_level >= logical").is_slot_invalidated()
        );
    }

    #[test]
    fn the_server_ending_the_stream_is_transient() {
        let e = Error::StreamEndedByServer {
            by: "CommandComplete \"COPY 0\"".into(),
        };
        assert!(e.is_transient());
        assert!(
            e.to_string()
                .contains("as PostgreSQL does when it shuts down or restarts cleanly"),
            "{e}"
        );
        // A clean shutdown terminates the walsender with 57P01.
        let shutdown = Error::server(
            "streaming from the slot",
            db(
                "57P01",
                "terminating connection due to administrator command",
            ),
        );
        assert!(shutdown.is_transient());
        assert!(shutdown.is_server_going_away());
    }

    #[test]
    fn a_server_going_away_is_told_by_sqlstate_only() {
        for (code, message) in [
            (
                "57P01",
                "terminating connection due to administrator command",
            ),
            (
                "57P02",
                "terminating connection because of crash of another server process",
            ),
            ("57P03", "the database system is shutting down"),
            ("57P03", "the database system is starting up"),
        ] {
            let e = Error::server("connecting", db(code, message));
            assert!(e.is_server_going_away(), "{code} {message}");
        }
        // A translated message (lc_messages) is told by its code alone.
        assert!(Error::server(
            "connecting",
            db("57P03", "das Datenbanksystem fährt herunter")
        )
        .is_server_going_away());
        for e in [
            Error::server("query", db("55006", "replication slot \"s\" is active")),
            Error::server("connecting", db("53300", "too many connections")),
            Error::Closed(None),
        ] {
            assert!(!e.is_server_going_away(), "{e}");
        }
    }

    #[test]
    fn no_primary_among_the_hosts_is_transient_and_says_if_one_is_going_away() {
        let e = |going_away| Error::NoSuitableHost {
            wanted: TargetSessionAttrs::ReadWrite,
            tried: "a:1: in hot standby (recovery)".into(),
            going_away,
        };
        assert!(e(false).is_transient() && e(true).is_transient());
        assert!(e(true).is_server_going_away());
        assert!(!e(false).is_server_going_away());
        assert!(e(false).to_string().contains("until a standby is promoted"));
    }

    #[test]
    fn slot_in_use_is_transient_and_explained() {
        let e = Error::server(
            "START_REPLICATION",
            db("55006", "replication slot \"s\" is active for PID 42"),
        );
        assert!(e.is_transient());
        assert!(e.to_string().contains("one connection at a time"));
    }
}
