//! Logical messages: which route a prefix names (a raw route, a
//! `walrelay.emit` envelope, or a prefix to ignore) and the record each
//! becomes.

use std::sync::Arc;

use bytes::Bytes;
use walrelay_pgoutput::Message;

use super::{reserved_header, RouteError, Router, TxInfo};
use crate::engine::key::EventKey;
use crate::engine::record::Record;
use crate::envelope;

/// How a logical message is routed, decided from its prefix alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageRoute {
    Envelope,
    Raw(Arc<str>),
    /// A configured ignore prefix: skip, assign no key.
    Ignore,
}

impl Router {
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
}
