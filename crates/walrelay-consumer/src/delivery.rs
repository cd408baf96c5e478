//! A consumed record as the handlers see it: the Kafka record, its walrelay
//! metadata and where it was consumed.

use rdkafka::message::{Message, OwnedMessage};

use crate::meta::RecordMeta;
use crate::position::Position;

/// A record handed to a handler.
///
/// The loop copies each record out of librdkafka's buffers once
/// ([`OwnedMessage`]) so that it can be queued per partition and applied in
/// a batch while the loop goes on polling.
#[derive(Clone, Copy, Debug)]
pub struct Delivery<'a> {
    /// The Kafka record.
    pub message: &'a OwnedMessage,
    /// Its walrelay metadata.
    pub meta: &'a RecordMeta,
    /// Group, topic and partition.
    pub position: &'a Position,
}

impl Delivery<'_> {
    /// The record's value (`None` for a tombstone).
    pub fn payload(&self) -> Option<&[u8]> {
        self.message.payload()
    }

    /// The record's Kafka key (`None` for a keyless record).
    pub fn key(&self) -> Option<&[u8]> {
        self.message.key()
    }

    /// The record's offset.
    pub fn offset(&self) -> i64 {
        self.message.offset()
    }
}
