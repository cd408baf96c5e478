//! Why the fence stopped a session, or could not read a topic's tail:
//! each error names what failed and the fix, and says whether a new
//! session may get past it ([`FenceError::is_transient`]).

use std::time::Duration;

use rdkafka::types::RDKafkaErrorCode;
use walrelay_pgoutput::Lsn;

use crate::engine::key::EventKey;
use crate::kafka::requests::readable;

/// Why the tail of a topic could not be read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FenceError {
    #[error("cannot create the Kafka reader of the tail fence: {0}")]
    Client(String),
    #[error(
        "reading the tail of topic \"{topic}\" for the tail fence did not reach the end of partition(s) {partitions:?} within relay.fence_timeout ({timeout:?}){last}; \
         the broker is slow or unreachable: check it, raise relay.fence_timeout, or set relay.fence = false \
         (replayed events are then written to Kafka again, as duplicates for readers without a high-water mark)",
        last = last_error.as_ref().map_or_else(String::new, |e| format!(" (last error: {e})"))
    )]
    Timeout {
        topic: String,
        partitions: Vec<u32>,
        timeout: Duration,
        last_error: Option<String>,
    },
    #[error(
        "the tail fence may not read topic \"{topic}\": {}; the relay reads the last records of each \
         partition it writes to, so that a replay after a crash does not write them again (or set \
         relay.fence = false to write replays again)",
        fence_denied(*code, topic)
    )]
    Denied {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("reading the tail of topic \"{topic}\" for the tail fence failed: {message}")]
    Read { topic: String, message: String },
    /// Records the leader holds are not all readable yet.
    #[error(
        "the tail fence waited relay.fence_timeout ({timeout:?}) for the leaders of topic \"{topic}\" to make \
         what they hold readable, and {}; walrelay confirms nothing meanwhile and tries again, and goes on \
         by itself once the partitions are whole again",
        readable::describe(behind)
    )]
    Behind {
        topic: String,
        behind: Vec<readable::Behind>,
        timeout: Duration,
    },
    /// A key of this source in Kafka lies ahead of the server's WAL.
    #[error(
        "partition {partition} of topic \"{topic}\" already holds key {key} of source \"{source_id}\", \
         assigned at WAL position {key_lsn}, but the server's WAL is only at {server_wal}: the database's \
         WAL went back (it was restored from a base backup, recovered to an earlier point, or failed \
         over to a standby that had not received that WAL), so new events would get keys at or below \
         keys already published, and the tail fence and every high-water-mark consumer would skip them; \
         walrelay stopped before writing to this topic and confirms nothing; fix: set relay.source_id \
         to a new value (for example \"{source_id}@restored-1\") so that the restored database's events \
         form a new key sequence, which consumers track on their own, and start walrelay again \
         (docs/operations.md, \"Restoring the database or failing over\")",
        key_lsn = Lsn(key.high())
    )]
    WalWentBack {
        topic: String,
        partition: u32,
        key: EventKey,
        server_wal: Lsn,
        source_id: String,
    },
    /// The replay went past the event the source record names without
    /// reproducing it ([`crate::source::source_record`]).
    #[error(transparent)]
    RecordNotReproduced(Box<RecordNotReproduced>),
    /// The replay went past a fence key without reproducing its record.
    #[error(
        "partition {partition} of topic \"{topic}\" ends with key {key} of source \"{source_id}\", and \
         {passed}: the same WAL always gives the same records, so the WAL this slot replays is not the \
         WAL that record came from (the database was restored from a backup, recovered to an earlier \
         point, or failed over to a server that had not received it), or something other than walrelay \
         wrote that record there; walrelay stopped without confirming anything past the slot's position, \
         so no event is lost; fix: after a restore or a failover, set relay.source_id to a new value \
         (for example \"{source_id}@restored-1\") and start walrelay again; if the record was copied \
         there, delete the copy or remove its walrelay headers \
         (docs/operations.md, \"Restoring the database or failing over\")"
    )]
    NotReproduced {
        topic: String,
        partition: u32,
        key: EventKey,
        passed: String,
        source_id: String,
    },
}

/// The replay went past the event the source record names without
/// reproducing it ([`crate::source::source_record`]). Boxed in [`FenceError`],
/// which stays small on the per-record path.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "source \"{source_id}\" published key {key} ({identity}, topic \"{topic}\" partition {partition}) \
     according to its record in Kafka (relay.source_record_topic), the slot replays from {start}, \
     before that key, and {passed}: the same WAL always gives the same events, so the WAL this slot \
     replays is not the WAL that event came from (the database was restored from a volume snapshot \
     or a backup, recovered to an earlier point, or failed over to a server that had not received \
     it), and new events would get keys consumers already applied; walrelay stopped without \
     confirming anything past the slot's position, so no event is lost; fix: set relay.source_id \
     to a new value (for example \"{source_id}@restored-1\") so that this database's events form a \
     new key sequence, and start walrelay again (docs/operations.md, \"Restoring the database or \
     failing over\")"
)]
pub struct RecordNotReproduced {
    pub topic: String,
    pub partition: u32,
    pub key: EventKey,
    pub identity: String,
    pub start: Lsn,
    pub passed: String,
    pub source_id: String,
}

impl FenceError {
    /// Whether a new session may get past it without a change to
    /// walrelay's configuration. A missing ACL is: it can be granted while
    /// the relay retries with backoff, confirming nothing meanwhile (the
    /// same as a producer denied Write).
    #[must_use]
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            FenceError::Timeout { .. }
                | FenceError::Read { .. }
                | FenceError::Denied { .. }
                | FenceError::Behind { .. }
        )
    }
}

/// The fence's reader needs Read on the topic (which implies the Describe
/// its metadata request needs), and no group.
fn fence_denied(code: RDKafkaErrorCode, topic: &str) -> String {
    crate::kafka::acl::denied(
        code,
        &format!("Read on topic \"{topic}\""),
        &[crate::kafka::acl::Acl::topic("Read", topic)],
    )
    .unwrap_or_else(|| code.to_string())
}
