//! The consumer runs' rows: which consumer ([`Consumer`]), its drain of a
//! topic and its latency under live load. The consumer bench
//! (`consumer`) fills them; the report reads them.

use serde::Serialize;

use super::Percentiles;

/// The consumers compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Consumer {
    #[serde(rename = "walrelay, batch handler")]
    WalrelayBatch,
    #[serde(rename = "walrelay, per-record handler")]
    WalrelayRecord,
    #[serde(rename = "inbox table, 1 record/tx")]
    Inbox1,
    /// Two statements per record, 500 records per transaction.
    #[serde(rename = "inbox table, 500 records/tx")]
    Inbox500,
    /// Ids and effects each one multi-row statement per 500 records.
    #[serde(rename = "inbox table, careful (multi-row, 500/tx)")]
    InboxCareful,
    /// The careful loop's effects with no deduplication at all.
    #[serde(rename = "apply limit (multi-row effects, no dedupe)")]
    ApplyLimit,
    /// A plain rdkafka consumer that only counts: the broker's read limit.
    #[serde(rename = "read limit (rdkafka, no processing)")]
    ReadLimit,
    #[serde(rename = "Python package, batch handler")]
    PythonBatch,
    #[serde(rename = "Python package, per-record handler")]
    PythonRecord,
    #[serde(rename = "Python inbox table, careful (multi-row, 500/tx)")]
    PythonInboxCareful,
    #[serde(rename = "Python apply limit (multi-row effects, no dedupe)")]
    PythonApplyLimit,
    #[serde(rename = "Java library, batch handler")]
    JavaBatch,
    /// A loop per partition, each poll's ids and effects one multi-row
    /// statement each.
    #[serde(rename = "Java inbox table, careful (a loop per partition, multi-row)")]
    JavaInboxCareful,
    /// The best plain loop: a loop per partition, each poll one
    /// transaction of multi-row effects, no dedupe, offsets committed
    /// asynchronously after the database commit.
    #[serde(rename = "Java plain loop (a loop per partition, no dedupe)")]
    JavaApplyLimit,
}

impl Consumer {
    pub fn label(self) -> &'static str {
        match self {
            Consumer::WalrelayBatch => "walrelay, batch handler",
            Consumer::WalrelayRecord => "walrelay, per-record handler",
            Consumer::Inbox1 => "inbox table, 1 record/tx",
            Consumer::Inbox500 => "inbox table, a statement per record, 500/tx",
            Consumer::InboxCareful => "inbox table, careful (multi-row, 500/tx)",
            Consumer::ApplyLimit => "apply limit (multi-row effects, no dedupe)",
            Consumer::ReadLimit => "read limit (rdkafka, no processing)",
            Consumer::PythonBatch => "Python package, batch handler",
            Consumer::PythonRecord => "Python package, per-record handler",
            Consumer::PythonInboxCareful => "Python inbox table, careful (multi-row, 500/tx)",
            Consumer::PythonApplyLimit => "Python apply limit (multi-row effects, no dedupe)",
            Consumer::JavaBatch => "Java library, batch handler",
            Consumer::JavaInboxCareful => {
                "Java inbox table, careful (a loop per partition, multi-row)"
            }
            Consumer::JavaApplyLimit => "Java plain loop (a loop per partition, no dedupe)",
        }
    }

    /// The consumer's short name (`--consumers`, database names).
    pub fn tag(self) -> &'static str {
        match self {
            Consumer::WalrelayBatch => "wr_batch",
            Consumer::WalrelayRecord => "wr_record",
            Consumer::Inbox1 => "inbox_1",
            Consumer::Inbox500 => "inbox_500",
            Consumer::InboxCareful => "inbox_careful",
            Consumer::ApplyLimit => "apply_limit",
            Consumer::ReadLimit => "read",
            Consumer::PythonBatch => "py_batch",
            Consumer::PythonRecord => "py_record",
            Consumer::PythonInboxCareful => "py_inbox_careful",
            Consumer::PythonApplyLimit => "py_apply_limit",
            Consumer::JavaBatch => "java_batch",
            Consumer::JavaInboxCareful => "java_inbox_careful",
            Consumer::JavaApplyLimit => "java_apply_limit",
        }
    }

    /// Whether it is the Python package's or a Python reference: held
    /// against the Python apply limit.
    pub fn is_python(self) -> bool {
        matches!(
            self,
            Consumer::PythonBatch
                | Consumer::PythonRecord
                | Consumer::PythonInboxCareful
                | Consumer::PythonApplyLimit
        )
    }

    /// Whether it is the Java library's or a Java reference: held against
    /// the Java apply limit.
    pub fn is_java(self) -> bool {
        matches!(
            self,
            Consumer::JavaBatch | Consumer::JavaInboxCareful | Consumer::JavaApplyLimit
        )
    }
}

/// One consumer draining one topic.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerRun {
    pub consumer: Consumer,
    pub partitions: i32,
    pub repeat: u32,
    pub records: u64,
    /// From the consumer's start (client created, group joined, offsets
    /// fetched) to the first record handed to it: what a deploy waits
    /// before anything is applied.
    pub first_record_s: f64,
    pub seconds: f64,
    pub records_per_s: f64,
    pub cpu_us_per_record: f64,
    pub db_cpu_us_per_record: f64,
    /// Rows of the dedupe state after the run.
    pub state_rows: i64,
    /// Bytes of the dedupe state (table and indexes) after the run.
    pub state_bytes: i64,
    /// walrelay's consumer: batch transactions committed, and partition
    /// pauses (each one a refetch of the partition's prefetched records).
    pub batches: Option<u64>,
    pub pauses: Option<u64>,
    /// walrelay's consumer: partition-seconds per phase of its loop
    /// (`LoopMetrics::time_breakdown`: polling, paused, pool, ...).
    pub phases: Option<Vec<(String, f64)>>,
}

/// One consumer under live load at one rate: end to end, from the
/// application's commit to the consumer's committed effect (see the
/// consumer bench's `live` module for how each end is timed).
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerLatencyRun {
    /// The consumer; [`Consumer::ApplyLimit`] is the plain reference (the
    /// application produces the record itself after its commit, a plain
    /// loop applies it, no walrelay, no dedupe).
    pub consumer: Consumer,
    pub partitions: i32,
    /// Keyed records (outbox rows, 1,000 distinct keys) or keyless ones
    /// (logical messages).
    pub keyed: bool,
    pub repeat: u32,
    pub target_rate: u64,
    pub achieved_rate: f64,
    pub events: u64,
    /// Commit → the consumer's transaction holding the effect committed.
    pub commit_to_effect: Percentiles,
    /// Commit → the producer's delivery report (walrelay's, in this
    /// process; the plain reference's own producer's).
    pub commit_to_ack: Percentiles,
    /// Delivery report → committed effect: the consumer's part.
    pub ack_to_effect: Percentiles,
    /// Events per consumer transaction (effect rows over the distinct
    /// transactions that wrote them).
    pub events_per_tx: f64,
    /// The database server's CPU over the stretch and its catch-up, in
    /// cores (CPU seconds per second): the load's commits, the walsender
    /// and the consumer's transactions.
    pub db_cores: f64,
}
