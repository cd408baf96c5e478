//! The relay's error type: why a session (or `setup`, or `status`) ended,
//! each variant telling what failed and how to fix it, and whether a new
//! session may succeed without a change ([`RelayError::is_transient`]).
//!
//! Its own module so that `setup` and `status` need not import the
//! pipeline for it.

use walrelay_pgoutput::{DecodeError, Lsn, RowError};

use crate::engine::checkpoint::AckError;
use crate::engine::fence::FenceError;
use crate::engine::key::KeyError;
use crate::engine::route::RouteError;
use crate::engine::sink::SinkError;
use crate::kafka::ClientError;
use crate::source::publication::{self, PublicationError};

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Postgres(#[from] walrelay_pg::Error),
    #[error(transparent)]
    Kafka(#[from] SinkError),
    #[error("cannot decode the pgoutput stream at {lsn}: {error}")]
    Decode { lsn: Lsn, error: DecodeError },
    #[error("cannot read a row at {lsn}: {error}")]
    Row { lsn: Lsn, error: RowError },
    #[error("idempotency key invariant broken: {0}; stopping rather than publishing a wrong key")]
    Key(#[from] KeyError),
    /// An event that cannot be routed, with no dead-letter topic to take
    /// it (or one that is not about a single event).
    #[error("{0}{hint}", hint = if .0.dead_letterable() { DEAD_LETTER_HINT } else { "" })]
    Route(#[from] RouteError),
    #[error("delivery report inconsistent with what was sent: {0}")]
    Checkpoint(#[from] AckError),
    #[error("unexpected {what} at {lsn}: {detail}")]
    Protocol {
        what: &'static str,
        lsn: Lsn,
        detail: String,
    },
    #[error("{problem}; {fix}")]
    Setup { problem: String, fix: String },
    /// The tail fence could not read what a topic already holds.
    #[error(transparent)]
    Fence(#[from] FenceError),
    /// The server's WAL is behind the event the source record names.
    #[error(transparent)]
    WentBack(#[from] Box<crate::source::source_record::WentBack>),
    /// The publication does not cover the configured outbox tables (at
    /// start, or it changed while the relay ran): rows would be skipped.
    #[error("{0}")]
    Publication(#[from] PublicationError),
    #[error(
        "replication slot \"{slot}\" is active for PID {}: another walrelay or client streams from it, and a slot serves one connection at a time",
        pid.map_or_else(|| "?".to_owned(), |p| p.to_string())
    )]
    SlotInUse { slot: String, pid: Option<i32> },
    /// `wal_status = lost` (SQLSTATE 55000 "can no longer get changes"):
    /// the server removed WAL the slot still needed. Reconnecting cannot
    /// help, and the events in that WAL are gone from the stream.
    #[error(
        "replication slot \"{slot}\" is invalidated (wal_status = lost): PostgreSQL removed WAL \
         the slot still needed (it held more than max_slot_wal_keep_size, or on PostgreSQL 18 \
         stayed idle longer than idle_replication_slot_timeout), so events committed after its \
         confirmed position {} cannot be relayed from it; fix: drop the slot (SELECT \
         pg_drop_replication_slot('{slot}')) and create a new one with `walrelay setup \
         --accept-slot-loss`, under a new relay.source_id; backfill or reconcile the events committed since that position \
         from the application's data; then raise max_slot_wal_keep_size and alert when \
         `walrelay status` reports wal_status 'unreserved' (exit code 4), before the slot is lost \
         (docs/operations.md, \"The slot was invalidated or dropped\")",
        confirmed.map_or_else(|| "(unknown)".to_owned(), |l| l.to_string())
    )]
    SlotInvalidated {
        slot: String,
        confirmed: Option<Lsn>,
    },
    /// The slot existed earlier in this process and is gone now. walrelay
    /// does not create a new one by itself: it would start at the current
    /// WAL position and skip what was committed in between.
    #[error(
        "replication slot \"{slot}\" disappeared while walrelay was running (it had confirmed up \
         to {confirmed}): someone dropped it (pg_drop_replication_slot, after terminating its \
         walsender), or PostgreSQL failed over to a server without it; events committed after \
         {confirmed} may be missing from Kafka, and walrelay does not create a new slot by itself \
         because a new slot starts at the current WAL position and would skip them; fix: find out \
         what dropped it, create a new slot with `walrelay setup --accept-slot-loss` under a new \
         relay.source_id, and \
         backfill or reconcile the events committed after {confirmed} (docs/operations.md, \"The \
         slot was invalidated or dropped\")"
    )]
    SlotDropped { slot: String, confirmed: Lsn },
    /// The publication check found the server shutting down or restarting
    /// (see `monitor::Outcome::ServerGoingAway`): the session ends so that
    /// the walsender can exit, and a new one starts when the server is back.
    #[error(
        "PostgreSQL is shutting down or restarting ({why}); ending the replication session so \
         that it does not hold the shutdown (a stopping walsender waits for its client to confirm \
         everything it sent, and walrelay confirms nothing a publication check has not vouched \
         for); the next session resumes from the slot's confirmed position {confirmed} and \
         relays the rest again with the same keys"
    )]
    ServerGoingAway { why: String, confirmed: Lsn },
}

/// A Kafka client's properties refused (the fence's reader, its admin
/// client): the session ends as it does when the producer's are, with
/// [`RelayError::Kafka`] and the same message, metric label and fix.
impl From<ClientError> for RelayError {
    fn from(error: ClientError) -> Self {
        RelayError::Kafka(error.into())
    }
}

impl RelayError {
    /// Another connection is streaming from the slot (SQLSTATE 55006).
    pub fn is_slot_in_use(&self) -> bool {
        match self {
            RelayError::SlotInUse { .. } => true,
            RelayError::Postgres(e) => {
                e.code() == Some(walrelay_pg::error::sqlstate::OBJECT_IN_USE)
            }
            _ => false,
        }
    }

    /// No host of the connection string is a primary (with
    /// `target_session_attrs=read-write` or `primary`): a failover in
    /// progress, until a standby is promoted.
    pub fn is_waiting_for_primary(&self) -> bool {
        matches!(
            self,
            RelayError::Postgres(walrelay_pg::Error::NoSuitableHost { .. })
        )
    }

    /// Whether a new session may succeed without a change by the user.
    /// Bad input, broken invariants and set-up problems would fail again
    /// at the same event: walrelay stops and says why instead of looping.
    pub fn is_transient(&self) -> bool {
        match self {
            RelayError::Postgres(e) => e.is_transient(),
            RelayError::Kafka(e) => e.restarts_pipeline(),
            RelayError::SlotInUse { .. } | RelayError::ServerGoingAway { .. } => true,
            RelayError::Fence(e) => e.is_transient(),
            _ => false,
        }
    }

    /// The walsender's "publication ... does not exist" (42704, up to
    /// PostgreSQL 17, when the publication is dropped while streaming),
    /// told with its fix like the periodic check tells it.
    pub(crate) fn about_publication(self, publication: &str) -> RelayError {
        let RelayError::Postgres(e) = &self else {
            return self;
        };
        match e.db_error() {
            Some(db)
                if db.code == walrelay_pg::error::sqlstate::UNDEFINED_OBJECT
                    && db.message.starts_with("publication ") =>
            {
                RelayError::Publication(PublicationError {
                    problems: vec![publication::Problem::PublicationMissing {
                        publication: publication.to_owned(),
                    }],
                })
            }
            _ => self,
        }
    }

    /// Server errors about the slot itself, told as what they mean for
    /// this relay: START_REPLICATION on an invalidated slot (55000), or on
    /// a slot that was dropped after this process had used it (42704, a
    /// drop between the check and START_REPLICATION). `known` is the
    /// highest confirmed position this process saw for the slot.
    pub(crate) fn about_slot(self, slot: &str, known: Option<Lsn>) -> RelayError {
        use walrelay_pg::error::sqlstate;
        let RelayError::Postgres(e) = &self else {
            return self;
        };
        let Some(db) = e.db_error() else {
            return self;
        };
        let names_slot = db.message.contains("replication slot");
        if names_slot && db.is_slot_invalidated() {
            return RelayError::SlotInvalidated {
                slot: slot.to_owned(),
                confirmed: known,
            };
        }
        match known {
            Some(confirmed) if db.code == sqlstate::UNDEFINED_OBJECT && names_slot => {
                RelayError::SlotDropped {
                    slot: slot.to_owned(),
                    confirmed,
                }
            }
            _ => self,
        }
    }
}

/// The second fix every per-event routing error offers.
pub const DEAD_LETTER_HINT: &str =
    "; or configure [dead_letter] topic to divert such events to a dead-letter topic and keep relaying";
