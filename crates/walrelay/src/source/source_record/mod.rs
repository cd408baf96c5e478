//! What each source published, in a place no retention deletes: one
//! record per source id in a compacted topic walrelay owns
//! (`relay.source_record_topic`, default `walrelay.sources`, created by
//! `walrelay setup`), and the decision a session start and `setup` make
//! from it.
//!
//! # Why
//!
//! A database restored from a volume snapshot (a cloud disk snapshot, a
//! ZFS or LVM snapshot, a Kubernetes VolumeSnapshot) comes back whole:
//! the replication slot and `walrelay.slots` as they were when the
//! snapshot was taken, the system identifier and so the default source id
//! unchanged, and the WAL back at the snapshot's position. Everything
//! walrelay published after that position was applied by consumers, and
//! the transactions the application writes next get keys at or below
//! those: every high-water-mark consumer would skip them. The data
//! topics' tails catch that only while they still hold the keys
//! ([`crate::engine::fence::ReplayCheck`]); retention, compaction, a topic first
//! written after the replay passed a key, or a partition full of other
//! sources' records all blind them. This record does not depend on the
//! data topics: it names a recent event this source published, and the
//! WAL position that event came from.
//!
//! # What is recorded
//!
//! A sampled event that the session confirmed (Kafka acknowledged it and
//! everything before it), with what identifies it beyond its key
//! ([`EventIdentity`]: its transaction's commit time, or a digest of a
//! non-transactional message's value), and the server and slot it came
//! from. Written as confirmation advances, at most once per
//! `postgres.status_interval` ([`sampler`]), and once more by a clean
//! stop. It is evidence, never a resume position: the slot's confirmed
//! flush LSN stays the only checkpoint.
//!
//! # The rule ([`assess`])
//!
//! The same WAL gives the same events with the same keys. So, with `K`
//! the recorded key:
//!
//! - a server whose WAL position is at or below `K`'s LSN never wrote the
//!   WAL `K` came from (or lost it): refused;
//! - a slot whose replay starts at or below `K`'s LSN must reproduce the
//!   recorded event, same key and same identity, before any larger key or
//!   position ([`Verdict::Reproduce`], enforced by the replay check):
//!   otherwise refused;
//! - a replay that starts after `K` produces keys above it only.
//!
//! The window it leaves: events published after the last record was
//! written and before the relay was killed (at most one status interval,
//! plus the write's own time), when the restored snapshot is from inside
//! that window. The data topics' tails still cover it unless those
//! records expired too. docs/contract.md lists what is detected and what
//! is not.

pub mod kafka;
pub mod sampler;
pub mod start;
pub mod status;

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use walrelay_pgoutput::Lsn;

use crate::engine::key::EventKey;

/// The format of [`SourceRecord`]'s JSON, bumped on an incompatible
/// change (a reader refuses formats it does not know, as unreadable).
pub const FORMAT: u32 = 1;

/// What identifies an event beyond its key: a WAL that went back can
/// assign the same key (same commit position, same event position) to
/// another event, and then this differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventIdentity {
    /// The transaction's commit time in milliseconds since the Unix epoch
    /// (the record's timestamp): the WAL's, whatever the configuration.
    CommitTime(i64),
    /// A non-transactional message has no commit time: the first 8 bytes
    /// of the SHA-256 of the record's value.
    ValueDigest(u64),
}

impl EventIdentity {
    /// The identity of a record with this timestamp and value.
    #[must_use]
    pub fn of(timestamp_ms: Option<i64>, value: Option<&[u8]>) -> EventIdentity {
        match timestamp_ms {
            Some(t) => EventIdentity::CommitTime(t),
            None => {
                let digest = Sha256::digest(value.unwrap_or_default());
                let mut first = [0u8; 8];
                first.copy_from_slice(&digest[..8]);
                EventIdentity::ValueDigest(u64::from_be_bytes(first))
            }
        }
    }

    fn parse(text: &str) -> Option<EventIdentity> {
        let (kind, value) = text.split_once(':')?;
        match kind {
            "commit-time-ms" => value.parse().ok().map(EventIdentity::CommitTime),
            "value-sha256" if value.len() == 16 => u64::from_str_radix(value, 16)
                .ok()
                .map(EventIdentity::ValueDigest),
            _ => None,
        }
    }
}

impl fmt::Display for EventIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventIdentity::CommitTime(t) => write!(f, "commit-time-ms:{t}"),
            EventIdentity::ValueDigest(d) => write!(f, "value-sha256:{d:016x}"),
        }
    }
}

/// One event of the source, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedEvent {
    pub key: EventKey,
    pub topic: String,
    pub partition: u32,
    pub identity: EventIdentity,
}

/// The record of one source (the topic's record value; its key is the
/// source id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRecord {
    pub source_id: String,
    pub system_identifier: String,
    pub timeline: u32,
    pub slot: String,
    /// A recent event of the source that Kafka acknowledged with
    /// everything before it (what the session confirms); `None`
    /// until the source confirmed one (`setup` writes the record first).
    pub event: Option<RecordedEvent>,
    /// The slot's confirmed position when this was written.
    pub confirmed: Lsn,
    /// When it was written (RFC 3339, UTC), for people.
    pub written_at: String,
}

/// The JSON form, strings where a number would lose bits.
#[derive(Serialize, Deserialize)]
struct Wire {
    format: u32,
    source_id: String,
    system_identifier: String,
    timeline: u32,
    slot: String,
    event: Option<WireEvent>,
    confirmed_lsn: String,
    written_at: String,
}

#[derive(Serialize, Deserialize)]
struct WireEvent {
    key: String,
    /// The key's high 64 bits as an LSN, for people.
    lsn: String,
    topic: String,
    partition: u32,
    identity: String,
}

/// Why a record's value could not be read as a [`SourceRecord`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the record of source \"{source_id}\" is not one this walrelay reads: {why}")]
pub struct Unreadable {
    pub source_id: String,
    pub why: String,
}

impl SourceRecord {
    /// The record's value.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let wire = Wire {
            format: FORMAT,
            source_id: self.source_id.clone(),
            system_identifier: self.system_identifier.clone(),
            timeline: self.timeline,
            slot: self.slot.clone(),
            event: self.event.as_ref().map(|e| WireEvent {
                key: e.key.to_hex(),
                lsn: Lsn(e.key.high()).to_string(),
                topic: e.topic.clone(),
                partition: e.partition,
                identity: e.identity.to_string(),
            }),
            confirmed_lsn: self.confirmed.to_string(),
            written_at: self.written_at.clone(),
        };
        serde_json::to_vec(&wire).expect("a struct of strings and numbers serializes")
    }

    /// Reads the value of the record keyed `source_id`.
    pub fn decode(source_id: &str, value: &[u8]) -> Result<SourceRecord, Unreadable> {
        let unreadable = |why: String| Unreadable {
            source_id: source_id.to_owned(),
            why,
        };
        let wire: Wire = serde_json::from_slice(value).map_err(|e| unreadable(e.to_string()))?;
        if wire.format != FORMAT {
            return Err(unreadable(format!(
                "format {} (this walrelay writes and reads {FORMAT}); a newer walrelay wrote it",
                wire.format
            )));
        }
        if wire.source_id != source_id {
            return Err(unreadable(format!(
                "it names source \"{}\"",
                wire.source_id
            )));
        }
        let event = match wire.event {
            None => None,
            Some(e) => Some(RecordedEvent {
                key: EventKey::from_hex(&e.key).map_err(|x| unreadable(format!("key: {x}")))?,
                identity: EventIdentity::parse(&e.identity)
                    .ok_or_else(|| unreadable(format!("identity {:?}", e.identity)))?,
                topic: e.topic,
                partition: e.partition,
            }),
        };
        let confirmed = wire
            .confirmed_lsn
            .parse::<Lsn>()
            .map_err(|_| unreadable(format!("confirmed_lsn {:?}", wire.confirmed_lsn)))?;
        Ok(SourceRecord {
            source_id: wire.source_id,
            system_identifier: wire.system_identifier,
            timeline: wire.timeline,
            slot: wire.slot,
            event,
            confirmed,
            written_at: wire.written_at,
        })
    }
}

/// The source, server and slot a session (or `setup`) works on: what
/// every record it writes says besides its event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub source_id: String,
    pub system_identifier: String,
    pub timeline: u32,
    pub slot: String,
}

/// What a session (or `setup`) knows of the server and the slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Now<'a> {
    pub identity: &'a Identity,
    /// Where the replay starts: the slot's confirmed position, or the
    /// server's WAL position for a slot about to be created.
    pub start: Lsn,
    /// The server's WAL position.
    pub server_wal: Lsn,
}

/// What the record asks of this session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The replay starts after the recorded event: its keys are all
    /// above it.
    Clear,
    /// The replay passes the recorded event's position: it must
    /// reproduce it, same key and identity, before any larger key or
    /// position.
    Reproduce(RecordedEvent),
}

/// The server's WAL is at or behind the recorded event: new events would
/// get keys at or below keys consumers already applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "source \"{source_id}\" published key {key} (WAL position {key_lsn}, topic \"{topic}\" partition \
     {partition}) according to its record in Kafka (written {written_at} by slot \"{slot}\" on \
     system {system}, timeline {timeline}, the slot then confirmed at {confirmed}), but this server's \
     WAL is only at {server_wal} (slot \"{now_slot}\" replays from {start}{other_system}): the database's WAL went back \
     (a volume snapshot or a backup restored, a point-in-time recovery, or a failover to a server \
     that had not received that WAL), so the events written from here on would get keys at or below \
     keys every high-water-mark consumer already applied, and would be skipped; walrelay stopped \
     before writing anything; fix: set relay.source_id to a new value (for example \
     \"{source_id}@restored-1\") so that this database's events form a new key sequence, then run \
     walrelay setup and start walrelay again (docs/operations.md, \"Restoring the database or \
     failing over\")",
    key = event.key,
    key_lsn = Lsn(event.key.high()),
    topic = event.topic,
    partition = event.partition,
    written_at = record.written_at,
    slot = record.slot,
    system = record.system_identifier,
    timeline = record.timeline,
    confirmed = record.confirmed,
    source_id = record.source_id,
)]
pub struct WentBack {
    pub record: SourceRecord,
    /// The record's event.
    pub event: RecordedEvent,
    pub server_wal: Lsn,
    pub now_slot: String,
    pub start: Lsn,
    /// ", system ..." when the server is another system than the one
    /// that wrote the record.
    pub other_system: String,
}

/// What the record asks of a session on `now` (see the module docs).
pub fn assess(record: &SourceRecord, now: &Now<'_>) -> Result<Verdict, Box<WentBack>> {
    let Some(event) = &record.event else {
        return Ok(Verdict::Clear);
    };
    let key_lsn = event.key.high();
    if key_lsn >= now.server_wal.0 {
        let system = &now.identity.system_identifier;
        let other_system = if *system == record.system_identifier {
            String::new()
        } else {
            format!(", system {system}")
        };
        return Err(Box::new(WentBack {
            record: record.clone(),
            event: event.clone(),
            server_wal: now.server_wal,
            now_slot: now.identity.slot.clone(),
            start: now.start,
            other_system,
        }));
    }
    if key_lsn >= now.start.0 {
        return Ok(Verdict::Reproduce(event.clone()));
    }
    Ok(Verdict::Clear)
}

#[cfg(test)]
mod tests;
