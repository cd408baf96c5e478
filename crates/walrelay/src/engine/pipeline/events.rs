//! The event step: one replication message in, what it asks of the
//! session out. Pure: no PostgreSQL, no Kafka, no clock.
//!
//! ```text
//!   XLogData ──▶ Decoder ──▶ Begin / Commit ──▶ KeyAssigner, the open transaction ──▶ Step::Committed
//!                    │
//!                    ├─ Relation ──▶ RelationCache, Router::check_relation (outbox column positions, refused tables)
//!                    │
//!                    └─ Insert / Update / Message ──▶ KeyAssigner::event ──▶ Router ──▶ Step::Send
//!                                                                     (bad event) └──▶ dead letter
//! ```
//!
//! Every event gets its key before it is routed, so a dead letter has the
//! key the event would have had, and the keys of all other events are the
//! same with or without a dead-letter topic. What a dead letter says (its
//! kind and reason) comes back as data in [`Event::dead_letter`].
//!
//! The open transaction is tracked here and only here: the session asks
//! [`EventStep::in_transaction`] when a keepalive comes.

use std::collections::HashMap;

use bytes::Bytes;
use tracing::{debug, info};
use walrelay_pgoutput::{Decoder, Lsn, PgOutputMessage, PgTimestamp, RelationCache, RowError};

use crate::config::Config;
use crate::engine::key::KeyAssigner;
use crate::engine::record::Record;
use crate::engine::route::{
    BadEvent, DeadLettered, MessageRoute, OutboxAt, RouteError, Router, TxInfo,
};
use crate::error::RelayError;

/// What one replication message asks of the session.
///
/// Returned by value and consumed at once, once per message: boxing the
/// large variant would cost an allocation per event for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Step {
    /// Nothing to send and nothing for the checkpoint: Begin, Relation,
    /// Delete, Truncate, Origin, Type, a message with an ignored prefix.
    Nothing,
    /// A transaction committed: `end_lsn` becomes confirmable once
    /// everything sent before it is acknowledged.
    Committed { end_lsn: Lsn },
    /// One record to send.
    Send(Event),
}

/// A record to send, with what the session needs to know about it.
#[derive(Debug)]
pub struct Event {
    pub record: Record,
    /// Set when the record is a dead letter standing in for a bad event.
    pub dead_letter: Option<DeadLetter>,
    /// The commit time of the event's transaction (`None` for a
    /// non-transactional message): the start of commit-to-ack latency.
    pub commit_time: Option<PgTimestamp>,
    /// A non-transactional message's position: confirmable on its own once
    /// the record is acknowledged (register the record first).
    pub standalone: Option<Lsn>,
}

/// What a dead-letter record stands in for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// [`RouteError::kind`].
    pub kind: &'static str,
    /// The error's text.
    pub reason: Bytes,
    /// The bad event's position.
    pub lsn: Lsn,
}

/// The decoder, relation cache, key assigner, router and open
/// transaction of one session.
#[derive(Debug)]
pub struct EventStep {
    decoder: Decoder,
    relations: RelationCache,
    keys: KeyAssigner,
    router: Router,
    tx: Option<TxInfo>,
    /// Each Relation's check, by relation id: where an outbox table's
    /// columns are, or why the table is refused (not an outbox, a
    /// configured column missing). The error is raised at the first change
    /// to the table, with that change's LSN (a Relation message carries
    /// none).
    routes: HashMap<u32, Result<OutboxAt, RouteError>>,
}

impl EventStep {
    /// A fresh step for a session whose records carry `source`: keys
    /// depend only on the WAL, so a new session replays the same keys.
    pub fn new(config: &Config, source: &str) -> EventStep {
        EventStep {
            decoder: Decoder::new(),
            relations: RelationCache::new(),
            keys: KeyAssigner::new(),
            router: Router::new(config, source),
            tx: None,
            routes: HashMap::new(),
        }
    }

    /// Whether a transaction is open: a keepalive inside one does not
    /// make its WAL end confirmable.
    pub fn in_transaction(&self) -> bool {
        self.tx.is_some()
    }

    /// Decodes the pgoutput message `data` that XLogData reported at
    /// `lsn`, and says what it asks of the session. An error is bad input
    /// or a broken protocol invariant: the session stops.
    pub fn step(&mut self, lsn: Lsn, data: Bytes) -> Result<Step, RelayError> {
        let decoded = self
            .decoder
            .decode(data)
            .map_err(|error| RelayError::Decode { lsn, error })?;
        match decoded {
            PgOutputMessage::Begin(b) => {
                self.keys.begin(b.final_lsn)?;
                self.tx = Some(self.router.tx_info(b.final_lsn, b.xid, b.timestamp));
                Ok(Step::Nothing)
            }
            PgOutputMessage::Commit(c) => {
                self.keys.commit(c.commit_lsn, c.end_lsn)?;
                self.tx = None;
                Ok(Step::Committed { end_lsn: c.end_lsn })
            }
            PgOutputMessage::Relation(r) => {
                self.routes
                    .insert(r.id, self.router.check_relation(&r, lsn));
                self.relations.insert(r);
                Ok(Step::Nothing)
            }
            PgOutputMessage::Insert(i) => {
                self.row_event(RowChange::Insert, lsn, i.relation_id, &i.new)
            }
            // Outbox rows are immutable events: an UPDATE would change an
            // event that may already be published, and publishes nothing
            // itself. It is bad input like any other, not something to
            // skip with a warning that nobody reads. It gets a key like an
            // INSERT, so that as a dead letter it sits in stream order.
            PgOutputMessage::Update(u) => {
                self.row_event(RowChange::Update, lsn, u.relation_id, &u.new)
            }
            // Deleting published outbox rows is how applications keep the
            // table small (often in the same transaction as the INSERT).
            PgOutputMessage::Delete(d) => {
                self.check_relation(d.relation_id, lsn)?;
                debug!(%lsn, "DELETE from an outbox table ignored");
                Ok(Step::Nothing)
            }
            PgOutputMessage::Truncate(t) => {
                for id in &t.relation_ids {
                    self.check_relation(*id, lsn)?;
                }
                info!(%lsn, "TRUNCATE of an outbox table ignored");
                Ok(Step::Nothing)
            }
            PgOutputMessage::Message(m) => self.message(&m),
            PgOutputMessage::Origin(_) | PgOutputMessage::Type(_) => Ok(Step::Nothing),
            other => Err(RelayError::Protocol {
                what: "pgoutput message",
                lsn,
                detail: format!(
                    "{} is not expected with proto_version 1 and streaming off",
                    other.kind()
                ),
            }),
        }
    }

    /// An INSERT into an outbox table is an event; an UPDATE of one is a
    /// bad event (a dead letter, or the error).
    fn row_event(
        &mut self,
        change: RowChange,
        lsn: Lsn,
        relation_id: u32,
        tuple: &walrelay_pgoutput::TupleData,
    ) -> Result<Step, RelayError> {
        let at = self.check_relation(relation_id, lsn)?;
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| outside_tx(change.name(), lsn))?;
        let row = self
            .relations
            .row(relation_id, tuple)
            .map_err(|error| RelayError::Row { lsn, error })?;
        let key = self.keys.event(lsn)?;
        let routed = if change == RowChange::Update {
            // A table that is not an outbox never gets here:
            // `check_relation` above raised what its Relation recorded.
            let relation = row.relation();
            Err(RouteError::OutboxUpdate {
                table: format!("{}.{}", relation.namespace, relation.name),
                lsn,
            })
        } else {
            self.router.outbox_record(tx, key, lsn, &row, &at)
        };
        let (record, dead_letter) = match routed {
            Ok(record) => (record, None),
            Err(e) => {
                let d = self
                    .router
                    .dead_letter(e, key, lsn, Some(tx), BadEvent::Row(&row))?;
                dead_lettered(d, lsn)
            }
        };
        Ok(Step::Send(Event {
            record,
            dead_letter,
            commit_time: Some(tx.commit_time),
            standalone: None,
        }))
    }

    /// A logical message: an ignored prefix gets no key; anything else
    /// gets its key before routing, so that a dead letter has the key the
    /// event would have had.
    fn message(&mut self, m: &walrelay_pgoutput::Message) -> Result<Step, RelayError> {
        let route = self.router.classify_message(m);
        if route == Ok(MessageRoute::Ignore) {
            return Ok(Step::Nothing);
        }
        let tx = match (m.transactional(), &self.tx) {
            (true, Some(tx)) => Some(tx),
            (true, None) => return Err(outside_tx("transactional message", m.lsn)),
            (false, Some(_)) => {
                return Err(RelayError::Protocol {
                    what: "non-transactional message",
                    lsn: m.lsn,
                    detail: "inside a transaction".into(),
                })
            }
            (false, None) => None,
        };
        let key = match tx {
            Some(_) => self.keys.event(m.lsn)?,
            None => self.keys.non_transactional(m.lsn)?,
        };
        let routed = route.and_then(|route| self.router.message_record(&route, tx, key, m));
        let (record, dead_letter) = match routed {
            Ok(record) => (record, None),
            Err(e) => {
                let d = self
                    .router
                    .dead_letter(e, key, m.lsn, tx, BadEvent::Message(m))?;
                dead_lettered(d, m.lsn)
            }
        };
        Ok(Step::Send(Event {
            record,
            dead_letter,
            commit_time: tx.map(|t| t.commit_time),
            standalone: tx.is_none().then_some(m.lsn),
        }))
    }

    /// Where the outbox columns of this change's table are, or the error
    /// of a table whose Relation failed its check, at the LSN of this
    /// change to it.
    fn check_relation(&self, relation_id: u32, lsn: Lsn) -> Result<OutboxAt, RelayError> {
        match self.routes.get(&relation_id) {
            Some(Ok(at)) => Ok(*at),
            Some(Err(e)) => Err(e.clone().at(lsn).into()),
            None => Err(RelayError::Row {
                lsn,
                error: RowError::UnknownRelation(relation_id),
            }),
        }
    }
}

/// The row changes that reach the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowChange {
    Insert,
    Update,
}

impl RowChange {
    fn name(self) -> &'static str {
        match self {
            RowChange::Insert => "INSERT",
            RowChange::Update => "UPDATE",
        }
    }
}

fn dead_lettered(d: DeadLettered, lsn: Lsn) -> (Record, Option<DeadLetter>) {
    let info = DeadLetter {
        kind: d.kind,
        reason: d.reason,
        lsn,
    };
    (d.record, Some(info))
}

fn outside_tx(what: &'static str, lsn: Lsn) -> RelayError {
    RelayError::Protocol {
        what,
        lsn,
        detail: "outside a transaction".into(),
    }
}

#[cfg(test)]
mod tests;
