//! Debezium's start and the relays' restarts (issue 24): the rows the
//! Debezium runs (`debezium`) fill beside their drains' [`super::ToolRun`],
//! which the report's start and restart table reads.

use serde::Serialize;

use super::Tool;

/// A worker's start, from the JVM's spawn (seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Startup {
    /// Until the REST API reported the connector and its task `RUNNING`.
    pub running_s: f64,
    /// Until the task's walsender held the slot: the drain is timed from
    /// here.
    pub streaming_s: f64,
    /// Until the first record was in Kafka.
    pub first_record_s: f64,
    /// The JVM's CPU seconds by the time it streamed (class loading, JIT,
    /// Connect's and the connector's start), not counted in the drain's.
    pub cpu_seconds: f64,
}

/// A stop (SIGTERM: Connect commits the offsets; walrelay confirms what
/// Kafka acknowledged) and a start of the same relay on the same slot and
/// offsets, one event committed while it was down.
#[derive(Debug, Clone, Serialize)]
pub struct RestartRun {
    pub tool: Tool,
    pub workload: String,
    /// Whether the relay exited by itself on SIGTERM (else killed after
    /// 30 s).
    pub stopped_cleanly: bool,
    /// From the new process's spawn until the connector ran (Debezium).
    pub running_s: Option<f64>,
    /// ... until it streamed (Debezium).
    pub streaming_s: Option<f64>,
    /// ... until the event committed while it was down was in Kafka.
    pub first_new_record_s: f64,
    /// Records of events from before the stop written again at the
    /// restart (0 when the offsets committed at the stop hold).
    pub replayed_records: u64,
    /// walrelay only (Debezium's is in its drains' [`Startup`]): from its
    /// first spawn, on a new slot holding one committed event, until that
    /// event's record was in Kafka.
    pub start_first_record_s: Option<f64>,
}
