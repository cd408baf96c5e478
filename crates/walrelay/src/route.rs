//! Routing: which Kafka record a decoded event becomes.
//!
//! Three sources of events:
//! - envelope messages (prefix `walrelay.v1`, written by `walrelay.emit`)
//!   name their topic, key and headers themselves;
//! - raw messages: a configured prefix → topic, content as the value;
//! - outbox rows: Debezium-compatible column mapping.
//!
//! Routing is a pure function of the event, its key and the configuration,
//! so a replayed event becomes the same record. Anything that cannot be
//! routed is a [`RouteError`] that names the event and the fix; nothing is
//! dropped silently. With a dead-letter topic configured, such an event
//! becomes a dead-letter record instead ([`Router::dead_letter`]), under
//! the key it would have had anyway. Events skipped on purpose (configured
//! ignore prefixes, outbox DELETE and TRUNCATE) are skipped *before* a key
//! is assigned.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use walrelay_pgoutput::{ColumnError, ColumnValue, Lsn, Message, PgTimestamp, Relation, Row};

use crate::config::{Config, OutboxColumns};
use crate::envelope::{self, is_valid_topic};
use crate::key::EventKey;
use crate::record::{header, Record};

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
    /// ([`header::is_reserved`]): published, it would sit next to
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

/// The original event behind a dead-letter record.
#[derive(Debug, Clone, Copy)]
pub enum BadEvent<'a, 'r> {
    /// A logical message: the record's value is its content.
    Message(&'a Message),
    /// An outbox row (INSERT or the new row of an UPDATE): the record's
    /// value is the row as a JSON object (see [`row_json`]).
    Row(&'a Row<'r>),
}

/// How a logical message is routed, decided from its prefix alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageRoute {
    Envelope,
    Raw(Arc<str>),
    /// A configured ignore prefix: skip, assign no key.
    Ignore,
}

/// Per-transaction header values, formatted once per transaction.
#[derive(Debug, Clone)]
pub struct TxInfo {
    pub final_lsn: Lsn,
    pub xid: u32,
    pub commit_time: PgTimestamp,
    commit_lsn_text: Bytes,
    xid_text: Bytes,
    commit_time_text: Bytes,
    timestamp_ms: Option<i64>,
}

impl TxInfo {
    pub fn new(final_lsn: Lsn, xid: u32, commit_time: PgTimestamp) -> TxInfo {
        let system_time = commit_time.to_system_time();
        TxInfo {
            final_lsn,
            xid,
            commit_time,
            commit_lsn_text: Bytes::from(final_lsn.to_string()),
            xid_text: Bytes::from(xid.to_string()),
            commit_time_text: system_time
                .map(|t| Bytes::from(humantime::format_rfc3339_micros(t).to_string()))
                .unwrap_or_default(),
            timestamp_ms: i64::try_from(commit_time.unix_micros().div_euclid(1000)).ok(),
        }
    }
}

/// An outbox table, resolved against its Relation.
#[derive(Debug, Clone)]
struct OutboxRoute {
    schema: String,
    table: String,
    topic_template: String,
    columns: OutboxColumns,
}

/// Interned header names.
#[derive(Debug, Clone)]
struct Names {
    key: Arc<str>,
    source: Arc<str>,
    commit_lsn: Arc<str>,
    lsn: Arc<str>,
    xid: Arc<str>,
    commit_time: Arc<str>,
    id: Arc<str>,
    event_type: Arc<str>,
    reason: Arc<str>,
    kind: Arc<str>,
    prefix: Arc<str>,
    table: Arc<str>,
}

/// Routes decoded events to records.
#[derive(Debug)]
pub struct Router {
    source: Bytes,
    raw: HashMap<String, Arc<str>>,
    ignore: HashSet<String>,
    outbox: Vec<OutboxRoute>,
    topics: HashMap<String, Arc<str>>,
    names: Names,
    /// `dead_letter.topic`: where events that cannot be routed go; `None`
    /// stops the relay at them instead.
    dead_letter: Option<Arc<str>>,
}

impl Router {
    /// `source` is the value of the `walrelay-source` header.
    pub fn new(config: &Config, source: &str) -> Router {
        Router {
            source: Bytes::copy_from_slice(source.as_bytes()),
            raw: config
                .messages
                .iter()
                .map(|m| (m.prefix.clone(), Arc::from(m.topic.as_str())))
                .collect(),
            ignore: config.relay.ignore_prefixes.iter().cloned().collect(),
            outbox: config
                .outbox
                .iter()
                .map(|o| {
                    let (schema, table) = o.qualified_name();
                    OutboxRoute {
                        schema,
                        table,
                        topic_template: o.topic.clone(),
                        columns: o.columns.clone(),
                    }
                })
                .collect(),
            topics: HashMap::new(),
            names: Names {
                key: header::IDEMPOTENCY_KEY.into(),
                source: header::SOURCE.into(),
                commit_lsn: header::COMMIT_LSN.into(),
                lsn: header::LSN.into(),
                xid: header::XID.into(),
                commit_time: header::COMMIT_TIME.into(),
                id: "id".into(),
                event_type: "type".into(),
                reason: header::DEAD_LETTER_REASON.into(),
                kind: header::DEAD_LETTER_KIND.into(),
                prefix: header::DEAD_LETTER_PREFIX.into(),
                table: header::DEAD_LETTER_TABLE.into(),
            },
            dead_letter: config.dead_letter.topic.as_deref().map(Arc::from),
        }
    }

    /// The configured dead-letter topic, if any.
    pub fn dead_letter_topic(&self) -> Option<&str> {
        self.dead_letter.as_deref()
    }

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
    ) -> Result<Record, RouteError> {
        let Some(topic) = self.dead_letter.clone() else {
            return Err(error);
        };
        if !error.dead_letterable() {
            return Err(error);
        }
        let mut headers = self.base_headers(key, lsn, tx, 3);
        headers.push((self.names.reason.clone(), Bytes::from(error.to_string())));
        headers.push((
            self.names.kind.clone(),
            Bytes::from_static(error.kind().as_bytes()),
        ));
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
        Ok(Record {
            topic,
            key: Some(Bytes::copy_from_slice(&hex)),
            value: Some(value),
            headers,
            event_key: key,
            timestamp_ms: tx.and_then(|t| t.timestamp_ms),
        })
    }

    fn intern(&mut self, topic: &str) -> Arc<str> {
        if let Some(t) = self.topics.get(topic) {
            return t.clone();
        }
        let t: Arc<str> = Arc::from(topic);
        self.topics.insert(topic.to_owned(), t.clone());
        t
    }

    /// Decide, from the prefix alone, what a message is.
    pub fn classify_message(&self, msg: &Message) -> Result<MessageRoute, RouteError> {
        let prefix = msg
            .prefix_str()
            .map_err(|_| RouteError::PrefixNotUtf8 { lsn: msg.lsn })?;
        if prefix == envelope::PREFIX {
            Ok(MessageRoute::Envelope)
        } else if let Some(topic) = self.raw.get(prefix) {
            Ok(MessageRoute::Raw(topic.clone()))
        } else if self.ignore.contains(prefix) {
            Ok(MessageRoute::Ignore)
        } else {
            Err(RouteError::UnknownPrefix {
                prefix: prefix.to_owned(),
                lsn: msg.lsn,
            })
        }
    }

    /// walrelay's own headers, first on every record.
    fn base_headers(
        &self,
        key: EventKey,
        lsn: Lsn,
        tx: Option<&TxInfo>,
        extra: usize,
    ) -> Vec<(Arc<str>, Bytes)> {
        // Room for the pipeline's layout and prev-key headers too.
        let mut h = Vec::with_capacity(8 + extra);
        let mut hex = [0u8; 32];
        key.write_hex(&mut hex);
        h.push((self.names.key.clone(), Bytes::copy_from_slice(&hex)));
        h.push((self.names.source.clone(), self.source.clone()));
        if let Some(tx) = tx {
            h.push((self.names.commit_lsn.clone(), tx.commit_lsn_text.clone()));
        }
        let mut text = [0u8; Lsn::MAX_TEXT_LEN];
        let n = lsn.write_text(&mut text);
        h.push((self.names.lsn.clone(), Bytes::copy_from_slice(&text[..n])));
        if let Some(tx) = tx {
            h.push((self.names.xid.clone(), tx.xid_text.clone()));
            h.push((self.names.commit_time.clone(), tx.commit_time_text.clone()));
        }
        h
    }

    /// The record for a message classified as Envelope or Raw.
    pub fn message_record(
        &mut self,
        route: &MessageRoute,
        tx: Option<&TxInfo>,
        key: EventKey,
        msg: &Message,
    ) -> Result<Record, RouteError> {
        match route {
            MessageRoute::Raw(topic) => Ok(Record {
                topic: topic.clone(),
                key: None,
                value: Some(msg.content.clone()),
                headers: self.base_headers(key, msg.lsn, tx, 0),
                event_key: key,
                timestamp_ms: tx.and_then(|t| t.timestamp_ms),
            }),
            MessageRoute::Envelope => {
                let env = envelope::parse(&msg.content).map_err(|error| RouteError::Envelope {
                    lsn: msg.lsn,
                    error,
                })?;
                if self.dead_letter.as_deref() == Some(env.topic.as_str()) {
                    return Err(RouteError::DeadLetterTopic {
                        topic: env.topic,
                        lsn: msg.lsn,
                    });
                }
                if let Some(name) = reserved_header(env.headers.iter().map(|(k, _)| k)) {
                    return Err(RouteError::ReservedHeader {
                        origin: "walrelay.emit envelope".to_owned(),
                        header: name.clone(),
                        lsn: msg.lsn,
                    });
                }
                let mut headers = self.base_headers(key, msg.lsn, tx, env.headers.len());
                for (k, v) in env.headers {
                    headers.push((Arc::from(k.as_str()), Bytes::from(v)));
                }
                Ok(Record {
                    topic: self.intern(&env.topic),
                    key: env.key.map(Bytes::from),
                    value: env.payload,
                    headers,
                    event_key: key,
                    timestamp_ms: tx.and_then(|t| t.timestamp_ms),
                })
            }
            MessageRoute::Ignore => unreachable!("ignored messages are not routed"),
        }
    }

    fn outbox_index(&self, relation: &Relation) -> Option<usize> {
        let schema = if relation.namespace.is_empty() {
            "pg_catalog"
        } else {
            relation.namespace.as_str()
        };
        self.outbox
            .iter()
            .position(|o| o.schema == schema && o.table == relation.name)
    }

    /// Whether changes to this relation are outbox events; an error for a
    /// table that is not configured (its events would otherwise vanish).
    ///
    /// A Relation also arrives in the middle of the stream after an ALTER
    /// TABLE. Without a dead-letter topic, a configured column that is
    /// missing stops the relay here, before any row of the new shape. With
    /// one, the Relation is accepted and each such row becomes a dead
    /// letter ([`RouteError::MissingColumn`] from [`Self::outbox_record`]):
    /// the column may come back, and rows are what carry the data.
    pub fn check_relation(&self, relation: &Relation, lsn: Lsn) -> Result<(), RouteError> {
        let Some(i) = self.outbox_index(relation) else {
            return Err(RouteError::NotAnOutbox {
                table: format!("{}.{}", relation.namespace, relation.name),
                lsn,
            });
        };
        if self.dead_letter.is_some() {
            return Ok(());
        }
        let o = &self.outbox[i];
        let has = |c: &str| relation.columns.iter().any(|rc| rc.name == c);
        let required: [(&str, &'static str); 5] = [
            (&o.columns.id, "id"),
            (&o.columns.aggregatetype, "aggregatetype"),
            (&o.columns.aggregateid, "aggregateid"),
            (&o.columns.event_type, "type"),
            (&o.columns.payload, "payload"),
        ];
        for (column, option) in required {
            if !has(column) {
                return Err(RouteError::MissingColumn {
                    table: format!("{}.{}", o.schema, o.table),
                    column: column.to_owned(),
                    option,
                    lsn,
                });
            }
        }
        Ok(())
    }

    /// The record for an INSERT into an outbox table (checked with
    /// [`Self::check_relation`] when its Relation arrived).
    pub fn outbox_record(
        &mut self,
        tx: &TxInfo,
        key: EventKey,
        lsn: Lsn,
        row: &Row<'_>,
    ) -> Result<Record, RouteError> {
        let relation = row.relation();
        let i = self
            .outbox_index(relation)
            .ok_or_else(|| RouteError::NotAnOutbox {
                table: format!("{}.{}", relation.namespace, relation.name),
                lsn,
            })?;
        let o = &self.outbox[i];
        let table = || format!("{}.{}", o.schema, o.table);
        // `option`: the column's name in [outbox.columns], for the error.
        let read = |column: &str, option: &'static str| -> Result<Option<&Bytes>, RouteError> {
            row.bytes(column).map_err(|e| match e {
                ColumnError::NoSuchColumn(_) => RouteError::MissingColumn {
                    table: table(),
                    column: column.to_owned(),
                    option,
                    lsn,
                },
                e => RouteError::BadColumn {
                    table: table(),
                    column: column.to_owned(),
                    lsn,
                    error: e.to_string(),
                },
            })
        };
        let required =
            |column: &str, option: &'static str, why: &'static str| -> Result<&Bytes, RouteError> {
                read(column, option)?.ok_or_else(|| RouteError::NullColumn {
                    table: table(),
                    column: column.to_owned(),
                    lsn,
                    why,
                })
            };
        let aggregatetype = required(
            &o.columns.aggregatetype,
            "aggregatetype",
            "it picks the topic",
        )?;
        let aggregatetype =
            std::str::from_utf8(aggregatetype).map_err(|e| RouteError::BadColumn {
                table: table(),
                column: o.columns.aggregatetype.clone(),
                lsn,
                error: e.to_string(),
            })?;
        let topic = o
            .topic_template
            .replace("{aggregatetype}", aggregatetype)
            .replace("{schema}", &o.schema)
            .replace("{table}", &o.table);
        if !is_valid_topic(&topic) {
            return Err(RouteError::InvalidTopic {
                table: table(),
                topic,
                lsn,
            });
        }
        let record_key = required(
            &o.columns.aggregateid,
            "aggregateid",
            "it is the record key",
        )?
        .clone();
        let value = read(&o.columns.payload, "payload")?.cloned();
        let id = read(&o.columns.id, "id")?.cloned();
        let event_type = read(&o.columns.event_type, "type")?.cloned();
        let app_headers: Vec<(String, String)> = match row.get(&o.columns.headers) {
            None => Vec::new(),
            Some(_) => match read(&o.columns.headers, "headers")? {
                None => Vec::new(),
                Some(json) => parse_headers(json).map_err(|error| RouteError::BadHeaders {
                    table: table(),
                    lsn,
                    error,
                })?,
            },
        };
        if let Some(name) = reserved_header(app_headers.iter().map(|(k, _)| k)) {
            return Err(RouteError::ReservedHeader {
                origin: format!("outbox row in {}", table()),
                header: name.clone(),
                lsn,
            });
        }

        let mut headers = self.base_headers(key, lsn, Some(tx), 2 + app_headers.len());
        if let Some(id) = id {
            headers.push((self.names.id.clone(), id));
        }
        if let Some(t) = event_type {
            headers.push((self.names.event_type.clone(), t));
        }
        for (k, v) in app_headers {
            headers.push((Arc::from(k.as_str()), Bytes::from(v)));
        }
        Ok(Record {
            topic: self.intern(&topic),
            key: Some(record_key),
            value,
            headers,
            event_key: key,
            timestamp_ms: tx.timestamp_ms,
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

/// The first application header name that walrelay reserves, if any.
fn reserved_header<'a>(mut names: impl Iterator<Item = &'a String>) -> Option<&'a String> {
    names.find(|k| header::is_reserved(k))
}

fn parse_headers(json: &[u8]) -> Result<Vec<(String, String)>, String> {
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(json).map_err(|e| e.to_string())?;
    Ok(map
        .into_iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{MessageRoute as RouteConfig, OutboxConfig};
    use walrelay_pgoutput::{
        ColumnValue, RelationCache, RelationColumn, ReplicaIdentity, TupleData,
    };

    fn config() -> Config {
        let mut c = Config::default();
        c.messages.push(RouteConfig {
            prefix: "orders".into(),
            topic: "orders-topic".into(),
        });
        c.relay.ignore_prefixes.push("debezium".into());
        c.outbox.push(OutboxConfig {
            table: "public.outbox".into(),
            topic: "outbox.event.{aggregatetype}".into(),
            columns: OutboxColumns::default(),
        });
        c
    }

    fn message(prefix: &str, content: Vec<u8>) -> Message {
        Message {
            xid: None,
            flags: 1,
            lsn: Lsn(0x100),
            prefix: Bytes::from(prefix.to_owned()),
            content: Bytes::from(content),
        }
    }

    fn tx() -> TxInfo {
        TxInfo::new(Lsn(0x16_B374_D848), 42, PgTimestamp(0))
    }

    fn header<'a>(r: &'a Record, name: &str) -> Option<&'a [u8]> {
        r.headers
            .iter()
            .find(|(k, _)| &**k == name)
            .map(|(_, v)| &v[..])
    }

    #[test]
    fn raw_message_goes_to_its_topic_keyless() {
        let mut router = Router::new(&config(), "src");
        let msg = message("orders", b"{\"a\":1}".to_vec());
        let route = router.classify_message(&msg).unwrap();
        let key = EventKey::new(0x16_B374_D848, 0x100);
        let r = router
            .message_record(&route, Some(&tx()), key, &msg)
            .unwrap();
        assert_eq!(&*r.topic, "orders-topic");
        assert_eq!(r.key, None);
        assert_eq!(r.value.as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(
            header(&r, "idempotency-key"),
            Some(&b"00000016b374d8480000000000000100"[..])
        );
        assert_eq!(header(&r, "walrelay-source"), Some(&b"src"[..]));
        assert_eq!(header(&r, "walrelay-commit-lsn"), Some(&b"16/B374D848"[..]));
        assert_eq!(header(&r, "walrelay-lsn"), Some(&b"0/100"[..]));
        assert_eq!(header(&r, "walrelay-xid"), Some(&b"42"[..]));
        assert_eq!(
            header(&r, "walrelay-commit-time"),
            Some(&b"2000-01-01T00:00:00.000000Z"[..])
        );
        assert_eq!(r.timestamp_ms, Some(946_684_800_000));
    }

    #[test]
    fn envelope_message_names_topic_key_and_headers() {
        let mut router = Router::new(&config(), "src");
        let content = envelope::encode(
            "payments",
            Some("p-1"),
            &[("trace", "t")],
            Some(b"\x00\x01"),
        );
        let msg = message(envelope::PREFIX, content);
        let route = router.classify_message(&msg).unwrap();
        assert_eq!(route, MessageRoute::Envelope);
        let r = router
            .message_record(&route, None, EventKey::new(0xff, 0xff), &msg)
            .unwrap();
        assert_eq!(&*r.topic, "payments");
        assert_eq!(r.key.as_deref(), Some(&b"p-1"[..]));
        assert_eq!(r.value.as_deref(), Some(&b"\x00\x01"[..]));
        assert_eq!(header(&r, "trace"), Some(&b"t"[..]));
        // Non-transactional: no commit headers.
        assert_eq!(header(&r, "walrelay-commit-lsn"), None);
        assert_eq!(header(&r, "walrelay-xid"), None);
        assert_eq!(r.timestamp_ms, None);
    }

    #[test]
    fn an_envelope_addressed_to_the_dead_letter_topic_is_a_bad_event() {
        let content = envelope::encode("dlq", Some("k"), &[], Some(b"{}"));
        let msg = message(envelope::PREFIX, content);
        let key = EventKey::new(0xff, 0xff);
        // Without a dead-letter topic the name is an ordinary topic.
        let mut router = Router::new(&config(), "src");
        let r = router
            .message_record(&MessageRoute::Envelope, None, key, &msg)
            .unwrap();
        assert_eq!(&*r.topic, "dlq");

        let mut c = config();
        c.dead_letter.topic = Some("dlq".into());
        let mut router = Router::new(&c, "src");
        let err = router
            .message_record(&MessageRoute::Envelope, None, key, &msg)
            .unwrap_err();
        assert_eq!(err.kind(), "dead-letter-topic");
        let text = err.to_string();
        assert!(
            text.contains("addressed to topic \"dlq\", which is the dead-letter topic"),
            "{text}"
        );
        assert!(text.contains("walrelay.emit envelope"), "{text}");
        // Its dead letter says so, under the event's key.
        let d = router
            .dead_letter(err, key, msg.lsn, None, BadEvent::Message(&msg))
            .unwrap();
        assert_eq!(&*d.topic, "dlq");
        assert_eq!(
            header(&d, "walrelay-dead-letter-kind"),
            Some(&b"dead-letter-topic"[..])
        );
        assert_eq!(d.event_key, key);
    }

    #[test]
    fn unknown_and_ignored_prefixes() {
        let router = Router::new(&config(), "src");
        assert_eq!(
            router
                .classify_message(&message("debezium", vec![]))
                .unwrap(),
            MessageRoute::Ignore
        );
        let err = router
            .classify_message(&message("mystery", vec![]))
            .unwrap_err();
        assert!(
            err.to_string().contains("\"mystery\"") && err.to_string().contains("ignore_prefixes")
        );
        let mut router = Router::new(&config(), "src");
        let msg = message(envelope::PREFIX, b"\0\0\0\x02{}".to_vec());
        let err = router
            .message_record(&MessageRoute::Envelope, None, EventKey::new(1, 1), &msg)
            .unwrap_err();
        assert!(err.to_string().contains("topic"), "{err}");
    }

    fn outbox_relation(columns: &[&str]) -> Relation {
        Relation {
            xid: None,
            id: 1,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: columns
                .iter()
                .map(|c| RelationColumn {
                    flags: 0,
                    name: (*c).into(),
                    type_oid: 25,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    fn text(s: &str) -> ColumnValue {
        ColumnValue::Text(Bytes::from(s.to_owned()))
    }

    /// An outbox row (`e-1`, order `o-1`, created) with `payload` and
    /// `headers` through `router`, as a change at `lsn`.
    fn outbox_row(
        router: &mut Router,
        payload: &str,
        headers: &str,
        lsn: Lsn,
    ) -> Result<Record, RouteError> {
        let rel = outbox_relation(&[
            "id",
            "aggregatetype",
            "aggregateid",
            "type",
            "payload",
            "headers",
        ]);
        router.check_relation(&rel, Lsn(1)).unwrap();
        let mut cache = RelationCache::new();
        cache.insert(rel);
        let tuple = TupleData {
            columns: vec![
                text("e-1"),
                text("order"),
                text("o-1"),
                text("created"),
                text(payload),
                text(headers),
            ],
        };
        let row = cache.row(1, &tuple).unwrap();
        router.outbox_record(&tx(), EventKey::new(1, 2), lsn, &row)
    }

    #[test]
    fn outbox_row_maps_like_debezium() {
        let mut router = Router::new(&config(), "src");
        let r = outbox_row(
            &mut router,
            "{\"total\": 5}",
            "{\"trace\": \"t1\", \"n\": 2}",
            Lsn(2),
        )
        .unwrap();
        assert_eq!(&*r.topic, "outbox.event.order");
        assert_eq!(r.key.as_deref(), Some(&b"o-1"[..]));
        assert_eq!(r.value.as_deref(), Some(&b"{\"total\": 5}"[..]));
        assert_eq!(header(&r, "id"), Some(&b"e-1"[..]));
        assert_eq!(header(&r, "type"), Some(&b"created"[..]));
        assert_eq!(header(&r, "trace"), Some(&b"t1"[..]));
        assert_eq!(header(&r, "n"), Some(&b"2"[..]));
    }

    #[test]
    fn application_headers_with_reserved_names_are_bad_events() {
        let mut router = Router::new(&config(), "src");
        for forged in [
            "walrelay-prev-key",
            "idempotency-key",
            "Idempotency-Key",
            "walrelay-source",
        ] {
            let content = envelope::encode(
                "payments",
                Some("p-1"),
                &[("trace", "t"), (forged, "0000000000000000000000000000abcd")],
                Some(b"{}"),
            );
            let msg = message(envelope::PREFIX, content);
            let err = router
                .message_record(&MessageRoute::Envelope, None, EventKey::new(1, 1), &msg)
                .unwrap_err();
            assert_eq!(err.kind(), "reserved-header");
            assert!(err.dead_letterable());
            let text = err.to_string();
            assert!(
                text.contains(&format!("{forged:?}"))
                    && text.starts_with("walrelay.emit envelope at 0/100")
                    && text.contains("rename the application's header"),
                "{text}"
            );
        }

        let err = outbox_row(
            &mut router,
            "{}",
            "{\"idempotency-key\": \"ffffffffffffffffffffffffffffffff\"}",
            Lsn(0x200),
        )
        .unwrap_err();
        assert_eq!(err.kind(), "reserved-header");
        assert!(
            err.to_string().starts_with(
                "outbox row in public.outbox at 0/200 sets the header \"idempotency-key\""
            ),
            "{err}"
        );
    }

    #[test]
    fn walrelays_headers_come_first_each_once() {
        let mut router = Router::new(&config(), "src");
        let content = envelope::encode(
            "payments",
            Some("p-1"),
            &[("trace", "t"), ("z", "1")],
            Some(b"{}"),
        );
        let msg = message(envelope::PREFIX, content);
        let r = router
            .message_record(
                &MessageRoute::Envelope,
                Some(&tx()),
                EventKey::new(1, 1),
                &msg,
            )
            .unwrap();
        let reserved: Vec<bool> = r
            .headers
            .iter()
            .map(|(k, _)| header::is_reserved(k))
            .collect();
        let first_app = reserved.iter().position(|r| !r).unwrap();
        assert!(reserved[..first_app].iter().all(|r| *r));
        assert!(reserved[first_app..].iter().all(|r| !r), "{:?}", r.headers);
        let mut names: Vec<&str> = r.headers[..first_app].iter().map(|(k, _)| &**k).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "each walrelay header once");
    }

    #[test]
    fn dead_letters_carry_the_original_bytes_key_and_reason() {
        let mut c = config();
        // Without a dead-letter topic, the error comes back.
        let mut router = Router::new(&c, "src");
        let msg = message("mystery", b"\x00raw".to_vec());
        let err = router.classify_message(&msg).unwrap_err();
        let key = EventKey::new(0x16_B374_D848, 0x100);
        let back = router
            .dead_letter(
                err.clone(),
                key,
                msg.lsn,
                Some(&tx()),
                BadEvent::Message(&msg),
            )
            .unwrap_err();
        assert_eq!(back, err);

        c.dead_letter.topic = Some("dlq".into());
        let mut router = Router::new(&c, "src");
        let r = router
            .dead_letter(
                err.clone(),
                key,
                msg.lsn,
                Some(&tx()),
                BadEvent::Message(&msg),
            )
            .unwrap();
        assert_eq!(&*r.topic, "dlq");
        assert_eq!(
            r.key.as_deref(),
            Some(&b"00000016b374d8480000000000000100"[..])
        );
        assert_eq!(r.value.as_deref(), Some(&b"\x00raw"[..]));
        assert_eq!(r.event_key, key);
        assert_eq!(
            header(&r, "idempotency-key"),
            Some(&b"00000016b374d8480000000000000100"[..])
        );
        assert_eq!(header(&r, "walrelay-xid"), Some(&b"42"[..]));
        assert_eq!(
            header(&r, "walrelay-dead-letter-reason"),
            Some(err.to_string().as_bytes())
        );
        assert_eq!(
            header(&r, "walrelay-dead-letter-kind"),
            Some(&b"unknown-prefix"[..])
        );
        assert_eq!(
            header(&r, "walrelay-dead-letter-prefix"),
            Some(&b"mystery"[..])
        );
        assert_eq!(r.timestamp_ms, Some(946_684_800_000));

        // Kinds of malformed envelopes.
        for (content, kind) in [
            (b"\0\0\0\x05{bad}".to_vec(), "malformed-envelope"),
            (b"\0\0\0\x02{}".to_vec(), "missing-topic"),
            (b"\0\0\0\x0f{\"topic\":\"a b\"}".to_vec(), "invalid-topic"),
            (b"\0\0".to_vec(), "malformed-envelope"),
        ] {
            let msg = message(envelope::PREFIX, content);
            let err = router
                .message_record(&MessageRoute::Envelope, None, key, &msg)
                .unwrap_err();
            assert_eq!(err.kind(), kind, "{err}");
            assert!(DEAD_LETTER_KINDS.contains(&err.kind()));
        }

        // An outbox row: the row as JSON, in column order, NULL as null.
        let cols = ["id", "aggregatetype", "aggregateid", "type", "payload"];
        let mut cache = RelationCache::new();
        cache.insert(outbox_relation(&cols));
        let tuple = TupleData {
            columns: vec![
                text("e\"1"),
                text("order"),
                ColumnValue::Null,
                text("t"),
                text("{\"a\": 1}"),
            ],
        };
        let row = cache.row(1, &tuple).unwrap();
        let err = router.outbox_record(&tx(), key, Lsn(2), &row).unwrap_err();
        assert_eq!(err.kind(), "null-column");
        let r = router
            .dead_letter(err, key, Lsn(2), Some(&tx()), BadEvent::Row(&row))
            .unwrap();
        assert_eq!(
            r.value.as_deref(),
            Some(&br#"{"id":"e\"1","aggregatetype":"order","aggregateid":null,"type":"t","payload":"{\"a\": 1}"}"#[..])
        );
        assert_eq!(
            header(&r, "walrelay-dead-letter-table"),
            Some(&b"public.outbox"[..])
        );
        assert_eq!(header(&r, "walrelay-dead-letter-prefix"), None);

        // Not about one event: never dead-lettered.
        let not_outbox = RouteError::NotAnOutbox {
            table: "public.orders".into(),
            lsn: Lsn(2),
        };
        assert!(router
            .dead_letter(not_outbox, key, Lsn(2), Some(&tx()), BadEvent::Row(&row))
            .is_err());
    }

    #[test]
    fn with_a_dead_letter_topic_a_missing_column_fails_rows_not_the_relation() {
        let mut c = config();
        c.dead_letter.topic = Some("dlq".into());
        let mut router = Router::new(&c, "src");
        let rel = outbox_relation(&["id", "aggregatetype", "type", "payload"]);
        router.check_relation(&rel, Lsn(1)).unwrap();
        let mut cache = RelationCache::new();
        cache.insert(rel);
        let tuple = TupleData {
            columns: vec![text("e"), text("order"), text("t"), text("{}")],
        };
        let row = cache.row(1, &tuple).unwrap();
        let err = router
            .outbox_record(&tx(), EventKey::new(1, 2), Lsn(2), &row)
            .unwrap_err();
        assert!(
            matches!(&err, RouteError::MissingColumn { column, option: "aggregateid", .. } if column == "aggregateid"),
            "{err}"
        );
        assert_eq!(err.kind(), "missing-column");
    }

    #[test]
    fn outbox_errors_name_the_problem() {
        let mut router = Router::new(&config(), "src");
        let err = router
            .check_relation(
                &outbox_relation(&["id", "aggregatetype", "type", "payload"]),
                Lsn(1),
            )
            .unwrap_err();
        assert!(err.to_string().contains("aggregateid"), "{err}");
        let mut other = outbox_relation(&["x"]);
        other.name = "orders".into();
        assert!(matches!(
            router.check_relation(&other, Lsn(1)),
            Err(RouteError::NotAnOutbox { .. })
        ));

        let cols = ["id", "aggregatetype", "aggregateid", "type", "payload"];
        let mut cache = RelationCache::new();
        cache.insert(outbox_relation(&cols));
        let null_key = TupleData {
            columns: vec![
                text("e"),
                text("order"),
                ColumnValue::Null,
                text("t"),
                text("{}"),
            ],
        };
        let row = cache.row(1, &null_key).unwrap();
        let err = router
            .outbox_record(&tx(), EventKey::new(1, 2), Lsn(2), &row)
            .unwrap_err();
        assert!(matches!(err, RouteError::NullColumn { .. }), "{err}");
        let bad_topic = TupleData {
            columns: vec![text("e"), text("or der"), text("k"), text("t"), text("{}")],
        };
        let row = cache.row(1, &bad_topic).unwrap();
        let err = router
            .outbox_record(&tx(), EventKey::new(1, 2), Lsn(2), &row)
            .unwrap_err();
        assert!(matches!(err, RouteError::InvalidTopic { .. }), "{err}");
        let tombstone = TupleData {
            columns: vec![
                text("e"),
                text("order"),
                text("k"),
                text("t"),
                ColumnValue::Null,
            ],
        };
        let row = cache.row(1, &tombstone).unwrap();
        assert_eq!(
            router
                .outbox_record(&tx(), EventKey::new(1, 2), Lsn(2), &row)
                .unwrap()
                .value,
            None
        );
    }
}
