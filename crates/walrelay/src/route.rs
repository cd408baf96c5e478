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
//! dropped silently. Events skipped on purpose (configured ignore prefixes,
//! outbox UPDATE/DELETE) are skipped *before* a key is assigned.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use walrelay_pgoutput::{Lsn, Message, PgTimestamp, Relation, Row};

use crate::config::{Config, OutboxColumns};
use crate::envelope::{self, is_valid_topic};
use crate::key::EventKey;
use crate::record::{header, Record};

/// Why an event cannot become a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error(
        "logical message with prefix {prefix:?} at {lsn} has no route; add a [[messages]] route \
         for it, list it in relay.ignore_prefixes if another tool writes it, or use walrelay.emit()"
    )]
    UnknownPrefix { prefix: String, lsn: Lsn },
    #[error("logical message at {lsn} has a prefix that is not valid UTF-8")]
    PrefixNotUtf8 { lsn: Lsn },
    #[error("malformed walrelay.emit envelope at {lsn}: {error}")]
    Envelope {
        lsn: Lsn,
        error: envelope::EnvelopeError,
    },
    #[error(
        "change to table {table} at {lsn}, which is not a configured outbox table; remove it from \
         the publication or add an [[outbox]] entry for it"
    )]
    NotAnOutbox { table: String, lsn: Lsn },
    #[error("outbox table {table} has no column {column:?} (configured as outbox.columns.{option}); fix the column mapping or the table")]
    MissingColumn {
        table: String,
        column: String,
        option: &'static str,
    },
    #[error(
        "outbox row at {lsn} in {table}: column {column:?} is NULL, but it is required ({why})"
    )]
    NullColumn {
        table: String,
        column: String,
        lsn: Lsn,
        why: &'static str,
    },
    #[error("outbox row at {lsn} in {table}: column {column:?} cannot be read: {error}")]
    BadColumn {
        table: String,
        column: String,
        lsn: Lsn,
        error: String,
    },
    #[error("outbox row at {lsn} in {table}: topic {topic:?} from the template is not a valid Kafka topic name")]
    InvalidTopic {
        table: String,
        topic: String,
        lsn: Lsn,
    },
    #[error("outbox row at {lsn} in {table}: headers column is not a JSON object: {error}")]
    BadHeaders {
        table: String,
        lsn: Lsn,
        error: String,
    },
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
            },
        }
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
        let mut h = Vec::with_capacity(6 + extra);
        let mut hex = [0u8; 32];
        key.write_hex(&mut hex);
        h.push((self.names.key.clone(), Bytes::copy_from_slice(&hex)));
        h.push((self.names.source.clone(), self.source.clone()));
        if let Some(tx) = tx {
            h.push((self.names.commit_lsn.clone(), tx.commit_lsn_text.clone()));
        }
        h.push((self.names.lsn.clone(), Bytes::from(lsn.to_string())));
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
    pub fn check_relation(&self, relation: &Relation, lsn: Lsn) -> Result<(), RouteError> {
        let Some(i) = self.outbox_index(relation) else {
            return Err(RouteError::NotAnOutbox {
                table: format!("{}.{}", relation.namespace, relation.name),
                lsn,
            });
        };
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
        let read = |column: &str| -> Result<Option<&Bytes>, RouteError> {
            row.bytes(column).map_err(|e| RouteError::BadColumn {
                table: table(),
                column: column.to_owned(),
                lsn,
                error: e.to_string(),
            })
        };
        let required = |column: &str, why: &'static str| -> Result<&Bytes, RouteError> {
            read(column)?.ok_or_else(|| RouteError::NullColumn {
                table: table(),
                column: column.to_owned(),
                lsn,
                why,
            })
        };
        let aggregatetype = required(&o.columns.aggregatetype, "it picks the topic")?;
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
        let record_key = required(&o.columns.aggregateid, "it is the record key")?.clone();
        let value = read(&o.columns.payload)?.cloned();
        let id = read(&o.columns.id)?.cloned();
        let event_type = read(&o.columns.event_type)?.cloned();
        let app_headers: Vec<(String, String)> = match row.get(&o.columns.headers) {
            None => Vec::new(),
            Some(_) => match read(&o.columns.headers)? {
                None => Vec::new(),
                Some(json) => parse_headers(json).map_err(|error| RouteError::BadHeaders {
                    table: table(),
                    lsn,
                    error,
                })?,
            },
        };

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

    #[test]
    fn outbox_row_maps_like_debezium() {
        let cols = [
            "id",
            "aggregatetype",
            "aggregateid",
            "type",
            "payload",
            "headers",
        ];
        let rel = outbox_relation(&cols);
        let mut router = Router::new(&config(), "src");
        router.check_relation(&rel, Lsn(1)).unwrap();
        let mut cache = RelationCache::new();
        cache.insert(rel);
        let tuple = TupleData {
            columns: vec![
                text("e-1"),
                text("order"),
                text("o-1"),
                text("created"),
                text("{\"total\": 5}"),
                text("{\"trace\": \"t1\", \"n\": 2}"),
            ],
        };
        let row = cache.row(1, &tuple).unwrap();
        let r = router
            .outbox_record(&tx(), EventKey::new(1, 2), Lsn(2), &row)
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
