//! Outbox rows: the configured outbox tables, the check of a table's
//! Relation, and the Debezium-compatible record a row becomes.

use std::sync::Arc;

use bytes::Bytes;
use walrelay_pgoutput::{ColumnError, Lsn, Relation, Row};

use super::topic_template::TopicTemplate;
use super::{reserved_header, RouteError, Router, TxInfo};
use crate::config::OutboxColumns;
use crate::engine::key::EventKey;
use crate::engine::record::Record;

/// An outbox table, resolved against its Relation.
#[derive(Debug, Clone)]
pub(super) struct OutboxRoute {
    pub(super) schema: String,
    pub(super) table: String,
    pub(super) topic: TopicTemplate,
    pub(super) columns: OutboxColumns,
}

/// Where an outbox table's configured columns sit in its Relation: found
/// once per Relation by [`Router::check_relation`], so a row is read by
/// position, without a lookup by name. `None`: the Relation has no such
/// column (a row then fails with [`RouteError::MissingColumn`]; without a
/// dead-letter topic the Relation itself is refused, except for the
/// optional headers column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxAt {
    /// Which configured outbox table.
    outbox: usize,
    id: Option<usize>,
    aggregatetype: Option<usize>,
    aggregateid: Option<usize>,
    event_type: Option<usize>,
    payload: Option<usize>,
    headers: Option<usize>,
}

impl Router {
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
    ///
    /// Returns where the configured columns are, for
    /// [`Self::outbox_record`].
    pub fn check_relation(&self, relation: &Relation, lsn: Lsn) -> Result<OutboxAt, RouteError> {
        let Some(i) = self.outbox_index(relation) else {
            return Err(RouteError::NotAnOutbox {
                table: format!("{}.{}", relation.namespace, relation.name),
                lsn,
            });
        };
        let o = &self.outbox[i];
        let at = |c: &str| relation.columns.iter().position(|rc| rc.name == c);
        let found = OutboxAt {
            outbox: i,
            id: at(&o.columns.id),
            aggregatetype: at(&o.columns.aggregatetype),
            aggregateid: at(&o.columns.aggregateid),
            event_type: at(&o.columns.event_type),
            payload: at(&o.columns.payload),
            headers: at(&o.columns.headers),
        };
        if self.dead_letter.is_some() {
            return Ok(found);
        }
        let required: [(Option<usize>, &str, &'static str); 5] = [
            (found.id, &o.columns.id, "id"),
            (
                found.aggregatetype,
                &o.columns.aggregatetype,
                "aggregatetype",
            ),
            (found.aggregateid, &o.columns.aggregateid, "aggregateid"),
            (found.event_type, &o.columns.event_type, "type"),
            (found.payload, &o.columns.payload, "payload"),
        ];
        for (position, column, option) in required {
            if position.is_none() {
                return Err(RouteError::MissingColumn {
                    table: format!("{}.{}", o.schema, o.table),
                    column: column.to_owned(),
                    option,
                    lsn,
                });
            }
        }
        Ok(found)
    }

    /// The record for an INSERT into an outbox table, whose columns `at`
    /// says where they are ([`Self::check_relation`] of the row's
    /// Relation).
    pub fn outbox_record(
        &self,
        tx: &TxInfo,
        key: EventKey,
        lsn: Lsn,
        row: &Row<'_>,
        at: &OutboxAt,
    ) -> Result<Record, RouteError> {
        let o = &self.outbox[at.outbox];
        let table = || format!("{}.{}", o.schema, o.table);
        // `option`: the column's name in [outbox.columns], for the error.
        let read = |position: Option<usize>,
                    column: &str,
                    option: &'static str|
         -> Result<Option<&Bytes>, RouteError> {
            let missing = || RouteError::MissingColumn {
                table: table(),
                column: column.to_owned(),
                option,
                lsn,
            };
            row.bytes_at(position.ok_or_else(missing)?)
                .map_err(|e| match e {
                    ColumnError::NoSuchColumn(_) => missing(),
                    e => RouteError::BadColumn {
                        table: table(),
                        column: column.to_owned(),
                        lsn,
                        error: e.to_string(),
                    },
                })
        };
        let required = |position: Option<usize>,
                        column: &str,
                        option: &'static str,
                        why: &'static str|
         -> Result<&Bytes, RouteError> {
            read(position, column, option)?.ok_or_else(|| RouteError::NullColumn {
                table: table(),
                column: column.to_owned(),
                lsn,
                why,
            })
        };
        let aggregatetype = required(
            at.aggregatetype,
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
            .topic
            .render(aggregatetype)
            .map_err(|topic| RouteError::InvalidTopic {
                table: table(),
                topic,
                lsn,
            })?;
        let record_key = required(
            at.aggregateid,
            &o.columns.aggregateid,
            "aggregateid",
            "it is the record key",
        )?
        .clone();
        let value = read(at.payload, &o.columns.payload, "payload")?.cloned();
        let id = read(at.id, &o.columns.id, "id")?.cloned();
        let event_type = read(at.event_type, &o.columns.event_type, "type")?.cloned();
        // The headers column is optional: a table without it has none.
        let app_headers: Vec<(String, String)> = match at.headers {
            None => Vec::new(),
            Some(_) => match read(at.headers, &o.columns.headers, "headers")? {
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
            topic,
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
