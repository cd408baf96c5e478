//! Events that cannot be routed: [`RouteError`] (each names the event and
//! the fix, with a stable kind) and the dead-letter record that stands in
//! for such an event when a dead-letter topic is configured.

use bytes::Bytes;
use walrelay_pgoutput::{ColumnValue, Lsn, Message, Row};

use super::{Router, TxInfo};
use crate::config::HeaderSet;
use crate::engine::key::EventKey;
use crate::engine::record::Record;
use crate::envelope;

/// Why an event cannot become a record. Each message names the event and
/// what to change; [`RouteError::kind`] is the stable name of the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error(
        "logical message with prefix {prefix:?} at {lsn} has no route; add a [[messages]] route \
         for it, list it in relay.ignore_prefixes if another tool writes it, or use walrelay.emit()"
    )]
    UnknownPrefix { prefix: String, lsn: Lsn },
    #[error(
        "logical message at {lsn} has a prefix that is not valid UTF-8; fix the application \
         that writes it (walrelay routes messages by their prefix)"
    )]
    PrefixNotUtf8 { lsn: Lsn },
    #[error(
        "malformed walrelay.emit envelope at {lsn}: {error}; publish envelope messages with \
         walrelay.emit(...) or walrelay::envelope::encode, never by hand with the reserved \
         prefix walrelay.v1"
    )]
    Envelope {
        lsn: Lsn,
        error: envelope::EnvelopeError,
    },
    #[error(
        "change to table {table} at {lsn}, which is not a configured outbox table; remove it from \
         the publication or add an [[outbox]] entry for it"
    )]
    NotAnOutbox { table: String, lsn: Lsn },
    #[error(
        "outbox table {table} has no column {column:?} (configured as outbox.columns.{option}), \
         seen at {lsn}; fix the column mapping or the table (add the column back, or map \
         outbox.columns.{option} to an existing column)"
    )]
    MissingColumn {
        table: String,
        column: String,
        option: &'static str,
        lsn: Lsn,
    },
    #[error(
        "outbox row at {lsn} in {table}: column {column:?} is NULL, but it is required ({why}); \
         declare the column NOT NULL so that the application's transaction fails instead"
    )]
    NullColumn {
        table: String,
        column: String,
        lsn: Lsn,
        why: &'static str,
    },
    #[error(
        "outbox row at {lsn} in {table}: column {column:?} cannot be read: {error}; walrelay \
         reads the outbox columns as text values of the row"
    )]
    BadColumn {
        table: String,
        column: String,
        lsn: Lsn,
        error: String,
    },
    #[error(
        "outbox row at {lsn} in {table}: topic {topic:?} from the template is not a valid Kafka \
         topic name; keep the values the template uses to 1-249 characters of a-zA-Z0-9._- \
         in total, or change outbox[].topic"
    )]
    InvalidTopic {
        table: String,
        topic: String,
        lsn: Lsn,
    },
    #[error(
        "outbox row at {lsn} in {table}: headers column is not a JSON object: {error}; store a \
         JSON object of header names and values there, or NULL"
    )]
    BadHeaders {
        table: String,
        lsn: Lsn,
        error: String,
    },
    /// An envelope addressed to the dead-letter topic: published there,
    /// the event could not be told from a dead letter. Routes and outbox
    /// templates that can reach that topic are refused at start-up
    /// (`Config::validate`); only an envelope names its topic at run time.
    #[error(
        "walrelay.emit envelope at {lsn} is addressed to topic {topic:?}, which is the \
         dead-letter topic (dead_letter.topic): its consumers could not tell it from a dead \
         letter; send the event to another topic, or give dead letters a topic of their own"
    )]
    DeadLetterTopic { topic: String, lsn: Lsn },
    #[error(
        "UPDATE of an outbox row at {lsn} in {table}: outbox rows are immutable events and an \
         UPDATE publishes nothing; insert a new row for a new event instead of updating one \
         (deleting published rows is fine)"
    )]
    OutboxUpdate { table: String, lsn: Lsn },
    /// An application header with a name walrelay reserves for itself
    /// ([`header::is_reserved`](crate::engine::record::header::is_reserved)): published, it would sit next to
    /// walrelay's own and could forge a key or a gap.
    #[error(
        "{origin} at {lsn} sets the header {header:?}, whose name is reserved for walrelay \
         (idempotency-key and every walrelay-* header): a consumer or `walrelay verify` could \
         take it for walrelay's own (a forged key or gap); rename the application's header"
    )]
    ReservedHeader {
        /// `walrelay.emit envelope` or `outbox row in schema.table`.
        origin: String,
        header: String,
        lsn: Lsn,
    },
}

/// Every [`RouteError::kind`], for metrics that list each kind from the
/// start.
pub const DEAD_LETTER_KINDS: &[&str] = &[
    "unknown-prefix",
    "prefix-not-utf8",
    "malformed-envelope",
    "missing-topic",
    "invalid-topic",
    "missing-column",
    "null-column",
    "bad-column",
    "bad-headers",
    "outbox-update",
    "dead-letter-topic",
    "reserved-header",
];

impl RouteError {
    /// A stable, machine-readable name of the problem: the
    /// `walrelay-dead-letter-kind` header and the `kind` label of
    /// `walrelay_dead_letter_records_total`. One of [`DEAD_LETTER_KINDS`],
    /// or `not-an-outbox`.
    pub fn kind(&self) -> &'static str {
        match self {
            RouteError::UnknownPrefix { .. } => "unknown-prefix",
            RouteError::PrefixNotUtf8 { .. } => "prefix-not-utf8",
            RouteError::Envelope { error, .. } => match error {
                envelope::EnvelopeError::MissingTopic => "missing-topic",
                envelope::EnvelopeError::InvalidTopic(_) => "invalid-topic",
                _ => "malformed-envelope",
            },
            RouteError::NotAnOutbox { .. } => "not-an-outbox",
            RouteError::MissingColumn { .. } => "missing-column",
            RouteError::NullColumn { .. } => "null-column",
            RouteError::BadColumn { .. } => "bad-column",
            RouteError::InvalidTopic { .. } => "invalid-topic",
            RouteError::BadHeaders { .. } => "bad-headers",
            RouteError::OutboxUpdate { .. } => "outbox-update",
            RouteError::DeadLetterTopic { .. } => "dead-letter-topic",
            RouteError::ReservedHeader { .. } => "reserved-header",
        }
    }

    /// The same error, reported at `lsn`: a problem found in a Relation
    /// message (which carries no position of its own, the server sends
    /// 0/0) is reported at the first change to that table.
    pub fn at(mut self, at: Lsn) -> RouteError {
        match &mut self {
            RouteError::NotAnOutbox { lsn, .. } | RouteError::MissingColumn { lsn, .. } => {
                *lsn = at
            }
            _ => {}
        }
        self
    }

    /// Whether one event is bad, so that a dead-letter record can stand in
    /// for it. A change to a table that is not an outbox is not: it means
    /// the publication and the configuration disagree, and dead-lettering
    /// every change to such a table (possibly a busy one) would hide that.
    pub fn dead_letterable(&self) -> bool {
        !matches!(self, RouteError::NotAnOutbox { .. })
    }
}

/// A dead-letter record and what it says about the bad event, as data:
/// the pipeline logs and counts it from these fields, not by reading the
/// record's headers back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLettered {
    pub record: Record,
    /// [`RouteError::kind`]: the `walrelay-dead-letter-kind` header.
    pub kind: &'static str,
    /// The error's text: the `walrelay-dead-letter-reason` header.
    pub reason: Bytes,
}

/// The original event behind a dead-letter record.
#[derive(Debug, Clone, Copy)]
pub enum BadEvent<'a, 'r> {
    /// A logical message: the record's value is its content.
    Message(&'a Message),
    /// An outbox row (INSERT or the new row of an UPDATE): the record's
    /// value is the row as a JSON object (see [`row_json`]).
    Row(&'a Row<'r>),
}

impl Router {
    /// The dead-letter record that stands in for an event that could not be
    /// routed, or `error` back if there is no dead-letter topic or the error
    /// is not about one event ([`RouteError::dead_letterable`]).
    ///
    /// `key` is the key the event was assigned like any other, so the keys
    /// of all other events are the same with or without a dead-letter topic,
    /// and a replay gives the dead-letter record the same key too.
    ///
    /// - value: the original bytes: a message's content, or an outbox row as
    ///   a JSON object ([`row_json`]);
    /// - Kafka key: the idempotency key's 32 hex digits. Unique, so a
    ///   compacted dead-letter topic keeps every record (it would reject
    ///   keyless ones), and deterministic, so a replayed dead letter lands in
    ///   the same partition; per partition, keys still increase;
    /// - headers: walrelay's usual ones, then `walrelay-dead-letter-reason`
    ///   (the error's text), `walrelay-dead-letter-kind`
    ///   ([`RouteError::kind`]) and `walrelay-dead-letter-prefix` or
    ///   `walrelay-dead-letter-table`;
    /// - timestamp: the commit time, as for any record.
    pub fn dead_letter(
        &mut self,
        error: RouteError,
        key: EventKey,
        lsn: Lsn,
        tx: Option<&TxInfo>,
        event: BadEvent<'_, '_>,
    ) -> Result<DeadLettered, RouteError> {
        let Some(topic) = self.dead_letter.clone() else {
            return Err(error);
        };
        if !error.dead_letterable() {
            return Err(error);
        }
        // Always the full set: whoever looks into a dead-letter topic wants
        // the event's LSN and transaction to find it in the WAL, and such
        // records are rare.
        let full_tx = tx.map(|t| TxInfo::new(t.final_lsn, t.xid, t.commit_time));
        let mut headers = self.headers_of(HeaderSet::Full, key, lsn, full_tx.as_ref(), 3);
        let reason = Bytes::from(error.to_string());
        let kind = error.kind();
        headers.push((self.names.reason.clone(), reason.clone()));
        headers.push((self.names.kind.clone(), Bytes::from_static(kind.as_bytes())));
        let value = match event {
            BadEvent::Message(m) => {
                headers.push((self.names.prefix.clone(), m.prefix.clone()));
                m.content.clone()
            }
            BadEvent::Row(row) => {
                let r = row.relation();
                headers.push((
                    self.names.table.clone(),
                    Bytes::from(format!("{}.{}", r.namespace, r.name)),
                ));
                Bytes::from(row_json(row))
            }
        };
        let mut hex = [0u8; 32];
        key.write_hex(&mut hex);
        Ok(DeadLettered {
            record: Record {
                topic,
                key: Some(Bytes::copy_from_slice(&hex)),
                value: Some(value),
                headers,
                event_key: key,
                timestamp_ms: tx.and_then(|t| t.timestamp_ms),
            },
            kind,
            reason,
        })
    }
}

/// An outbox row as the value of its dead-letter record: a JSON object of
/// column name → the column's text value (a string, as PostgreSQL sends
/// it: `jsonb` columns as JSON text, numbers and booleans as text) or
/// `null`, in the table's column order. A value PostgreSQL did not send
/// (an unchanged TOAST value in an UPDATE) is left out. Bytes that are not
/// UTF-8 (a database encoding other than UTF8) are replaced by U+FFFD.
pub fn row_json(row: &Row<'_>) -> String {
    let mut out = String::from("{");
    for (column, value) in row.iter() {
        let text = match value {
            ColumnValue::UnchangedToast => continue,
            ColumnValue::Null => None,
            ColumnValue::Text(b) | ColumnValue::Binary(b) => Some(String::from_utf8_lossy(b)),
        };
        if out.len() > 1 {
            out.push(',');
        }
        // Serializing a string cannot fail.
        out.push_str(&serde_json::to_string(&column.name).unwrap_or_default());
        out.push(':');
        match text {
            Some(t) => out.push_str(&serde_json::to_string(&t).unwrap_or_default()),
            None => out.push_str("null"),
        }
    }
    out.push('}');
    out
}
