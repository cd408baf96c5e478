//! What the operator learns of dead-letter records as the session sends
//! them: a counter per kind and a rate-limited WARN, with a summary of
//! the lines left out when the session ends. Nobody has to read the
//! dead-letter topic to find out that events went there.

use std::time::Duration;

use tracing::warn;
use walrelay_pg::log_limit::KeyedLogLimit;

use super::events::DeadLetter;
use crate::engine::record::Record;
use crate::metrics::Metrics;

/// At most one "event diverted to the dead-letter topic" line per kind in
/// this interval; the next says how many were not logged.
pub const DEAD_LETTER_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// One session's dead-letter reporting.
pub(super) struct DeadLetters {
    slot: String,
    /// One WARN per kind and [`DEAD_LETTER_LOG_INTERVAL`]: a stream of
    /// bad events must not flood the log (the metric counts each one).
    logs: KeyedLogLimit,
}

impl DeadLetters {
    pub(super) fn new(slot: &str) -> DeadLetters {
        DeadLetters {
            slot: slot.to_owned(),
            logs: KeyedLogLimit::new(DEAD_LETTER_LOG_INTERVAL, 64),
        }
    }

    /// A dead-letter record is being sent for `d`.
    pub(super) fn sent(&self, d: &DeadLetter, record: &Record, metrics: Option<&Metrics>) {
        if let Some(m) = metrics {
            m.dead_letter_record(d.kind);
        }
        let Some(suppressed) = self.logs.check(d.kind) else {
            return;
        };
        warn!(
            slot = %self.slot,
            lsn = %d.lsn,
            key = %record.event_key,
            kind = d.kind,
            topic = %record.topic,
            reason = %String::from_utf8_lossy(&d.reason),
            suppressed,
            "event diverted to the dead-letter topic"
        );
    }

    /// The dead letters of this session not logged one by one, per kind.
    pub(super) fn log_summary(&self) {
        for (kind, suppressed) in self.logs.take_suppressed() {
            warn!(
                slot = %self.slot,
                %kind,
                suppressed,
                "more events diverted to the dead-letter topic than were logged one by one"
            );
        }
    }
}
