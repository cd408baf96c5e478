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
//!
//! | module | owns |
//! |---|---|
//! | this one | [`Router`], its construction, [`TxInfo`] and the base headers every record starts with |
//! | `message` | logical messages: classifying by prefix, raw routes and `walrelay.emit` envelopes |
//! | `outbox` | outbox rows and the check of an outbox table's Relation |
//! | `topic_template` | an outbox table's topic template, compiled once, and the topics it rendered |
//! | `dead_letter` | [`RouteError`] and its kinds, and the dead-letter record that stands in for a bad event |

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use walrelay_pgoutput::{Lsn, PgTimestamp};

use crate::config::{Config, HeaderSet};
use crate::engine::key::EventKey;
use crate::engine::record::{header, Record};

mod dead_letter;
mod message;
mod outbox;
#[cfg(test)]
pub(crate) mod tests;
mod topic_template;

pub use dead_letter::{row_json, BadEvent, DeadLettered, RouteError, DEAD_LETTER_KINDS};
pub use message::MessageRoute;
pub use outbox::OutboxAt;

use outbox::OutboxRoute;
use topic_template::TopicTemplate;

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
    /// With the header values of the full set formatted (tests, and
    /// [`Router::tx_info`] under `relay.headers = "full"`).
    pub fn new(final_lsn: Lsn, xid: u32, commit_time: PgTimestamp) -> TxInfo {
        let system_time = commit_time.to_system_time();
        TxInfo {
            commit_lsn_text: Bytes::from(final_lsn.to_string()),
            xid_text: Bytes::from(xid.to_string()),
            commit_time_text: system_time
                .map(|t| Bytes::from(humantime::format_rfc3339_micros(t).to_string()))
                .unwrap_or_default(),
            ..TxInfo::lean(final_lsn, xid, commit_time)
        }
    }

    /// Without them: the lean set sends none of the three, so nothing is
    /// formatted per transaction.
    fn lean(final_lsn: Lsn, xid: u32, commit_time: PgTimestamp) -> TxInfo {
        TxInfo {
            final_lsn,
            xid,
            commit_time,
            commit_lsn_text: Bytes::new(),
            xid_text: Bytes::new(),
            commit_time_text: Bytes::new(),
            timestamp_ms: i64::try_from(commit_time.unix_micros().div_euclid(1000)).ok(),
        }
    }
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
    /// `relay.headers`: whether records carry the four derivable headers
    /// too.
    header_set: HeaderSet,
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
                        topic: TopicTemplate::new(&o.topic, &schema, &table),
                        schema,
                        table,
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
            header_set: config.relay.headers,
            dead_letter: config.dead_letter.topic.as_deref().map(Arc::from),
        }
    }

    /// What the records of a transaction share, from its BEGIN: with the
    /// full header set, its header values formatted once.
    pub fn tx_info(&self, final_lsn: Lsn, xid: u32, commit_time: PgTimestamp) -> TxInfo {
        match self.header_set {
            HeaderSet::Lean => TxInfo::lean(final_lsn, xid, commit_time),
            HeaderSet::Full => TxInfo::new(final_lsn, xid, commit_time),
        }
    }

    /// The configured dead-letter topic, if any.
    pub fn dead_letter_topic(&self) -> Option<&str> {
        self.dead_letter.as_deref()
    }

    /// The shared name of an envelope's topic. Bounded like the outbox
    /// templates' topics: envelopes name any topic they like.
    fn intern(&mut self, topic: &str) -> Arc<str> {
        if let Some(t) = self.topics.get(topic) {
            return t.clone();
        }
        if self.topics.len() >= topic_template::CACHE_LIMIT {
            self.topics.clear();
        }
        let t: Arc<str> = Arc::from(topic);
        self.topics.insert(topic.to_owned(), t.clone());
        t
    }

    /// walrelay's own headers, first on every record: the key and the
    /// source, then with the full set the commit LSN, the event's LSN,
    /// the xid and the commit time (the last three of the four are absent
    /// for a non-transactional message, which has no transaction).
    fn base_headers(
        &self,
        key: EventKey,
        lsn: Lsn,
        tx: Option<&TxInfo>,
        extra: usize,
    ) -> Vec<(Arc<str>, Bytes)> {
        self.headers_of(self.header_set, key, lsn, tx, extra)
    }

    /// [`Router::base_headers`] of the set `set`; with the full set, `tx`
    /// must have its texts formatted ([`TxInfo::new`]).
    fn headers_of(
        &self,
        set: HeaderSet,
        key: EventKey,
        lsn: Lsn,
        tx: Option<&TxInfo>,
        extra: usize,
    ) -> Vec<(Arc<str>, Bytes)> {
        let own = match set {
            HeaderSet::Lean => 2,
            HeaderSet::Full => 6,
        };
        // walrelay's, the ones the pipeline adds once the partition is
        // known, and the caller's: one allocation.
        let mut h = Vec::with_capacity(own + Record::PLACEMENT_HEADERS + extra);
        let mut hex = [0u8; 32];
        key.write_hex(&mut hex);
        h.push((self.names.key.clone(), Bytes::copy_from_slice(&hex)));
        h.push((self.names.source.clone(), self.source.clone()));
        if set == HeaderSet::Lean {
            return h;
        }
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
}

/// The first application header name that walrelay reserves, if any.
fn reserved_header<'a>(mut names: impl Iterator<Item = &'a String>) -> Option<&'a String> {
    names.find(|k| header::is_reserved(k))
}
