//! What a failed batch means for its partition, decided from its error
//! alone (docs/consumer.md, "What a failed batch means"): retried on new
//! connections, retried smaller, counted as an attempt, or the partition
//! stops.

use rdkafka::message::Message;
use tokio_postgres::error::SqlState;

use super::handler_call::HandlerFailure;
use super::job::TopicPartition;
use super::partition::Queued;
use crate::apply::BatchError;
use crate::outage::{class_of, class_of_code, ErrorClass};

/// How a failed batch is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Retry {
    /// The database is unavailable: new connections, not counted.
    Outage,
    /// Contention or size: smaller batches, counted at one record.
    Shrink,
    /// The batch's own error: an attempt (of the record, when known).
    Attempt,
}

/// What a failed batch means.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Failure {
    Outage,
    Shrink,
    /// An attempt; the failing record's index when known.
    Attempt(Option<usize>),
    /// Never retried: the partition stops.
    Stop,
}

/// The rules of docs/consumer.md ("Failures") for a failed batch: its
/// error, whether its connection is gone, whether it parked a record.
pub(super) fn failure_of<E: 'static>(
    error: &BatchError<HandlerFailure<E>>,
    lost_connection: bool,
    parking: bool,
) -> Failure {
    let class = match error {
        // Atomicity broken, or marks that cannot be read: a retry cannot
        // help and must not move on.
        BatchError::HandlerEndedTransaction { .. } | BatchError::CorruptHwm { .. } => {
            return Failure::Stop
        }
        _ if lost_connection => return Failure::Outage,
        BatchError::Handler { index, source } => {
            return match source.sqlstate().map(|c| class_of_code(&c)) {
                Some(ErrorClass::Outage) => Failure::Outage,
                Some(ErrorClass::Shrink) => Failure::Shrink,
                Some(ErrorClass::Batch) | None => Failure::Attempt(*index),
            };
        }
        // The handler's own doing, like an error it returned.
        BatchError::HandlerSwallowedError => return Failure::Attempt(None),
        // Not the records' fault: a new connection prepares them again.
        _ if prepared_gone(error) => return Failure::Outage,
        BatchError::Db(db) => class_of(db),
        BatchError::NotParked { .. } | BatchError::RowVanished { .. } => ErrorClass::Batch,
    };
    match class {
        ErrorClass::Outage => Failure::Outage,
        ErrorClass::Shrink => Failure::Shrink,
        // Parking wrote nothing, for a reason that would come again: never
        // move on without the record.
        ErrorClass::Batch if parking => Failure::Stop,
        ErrorClass::Batch => Failure::Attempt(None),
    }
}

/// Whether the batch failed because the statements the loop prepared on
/// its connection no longer exist in the session.
pub(super) fn prepared_gone<E>(error: &BatchError<E>) -> bool {
    matches!(error, BatchError::Db(db) if db.code() == Some(&SqlState::INVALID_SQL_STATEMENT_NAME))
}

/// Appended to the error of a batch that [`prepared_gone`] failed.
pub(super) const PREPARED_GONE: &str =
    " (the statements prepared on the connection are gone; retried unprepared)";

/// The error a stopped partition reports: the records, and why.
pub(super) fn stop_message<E: std::fmt::Display>(
    tp: &TopicPartition,
    records: &[Queued],
    error: &BatchError<E>,
    parking: bool,
) -> String {
    let first = records.first().map_or(-1, |r| r.message.offset());
    let last = records.last().map_or(-1, |r| r.message.offset());
    let keys: Vec<String> = records
        .iter()
        .filter_map(|r| r.meta.as_ref().ok().map(|m| m.key.to_hex()))
        .collect();
    let keys = match keys.as_slice() {
        [] => String::new(),
        [one] => format!(" (key {one})"),
        [a, .., b] => format!(" (keys {a}..{b})"),
    };
    // A stop that is not about the batch itself is the parking's failure.
    let about_the_batch = matches!(
        error,
        BatchError::HandlerEndedTransaction { .. } | BatchError::CorruptHwm { .. }
    );
    if parking && !about_the_batch {
        format!(
            "parking record {}/{} at offset {last}{keys} failed, not for a database outage: \
             {error}",
            tp.0, tp.1
        )
    } else {
        format!(
            "records {}/{} at offsets {first}..{last}{keys}: {error}",
            tp.0, tp.1
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Error = BatchError<HandlerFailure<String>>;

    fn handler(index: Option<usize>) -> Error {
        BatchError::Handler {
            index,
            source: HandlerFailure::Returned("broken".to_owned()),
        }
    }

    #[test]
    fn a_broken_atomicity_stops_whatever_else_holds() {
        let ended: Error = BatchError::HandlerEndedTransaction {
            expected: "7".into(),
            found: "none".into(),
        };
        for (lost, parking) in [(false, false), (true, false), (false, true)] {
            assert_eq!(failure_of(&ended, lost, parking), Failure::Stop);
        }
    }

    #[test]
    fn handler_errors_are_attempts_unless_the_connection_is_gone() {
        assert_eq!(
            failure_of(&handler(Some(2)), false, false),
            Failure::Attempt(Some(2))
        );
        assert_eq!(failure_of(&handler(None), true, false), Failure::Outage);
        let panicked: Error = BatchError::Handler {
            index: None,
            source: HandlerFailure::Panicked("boom".into()),
        };
        assert_eq!(failure_of(&panicked, false, false), Failure::Attempt(None));
        let timed_out: Error = BatchError::Handler {
            index: None,
            source: HandlerFailure::TimedOut(std::time::Duration::from_secs(1)),
        };
        assert_eq!(failure_of(&timed_out, false, false), Failure::Attempt(None));
    }

    #[test]
    fn a_swallowed_error_is_an_attempt_even_in_a_parking_batch() {
        let swallowed: Error = BatchError::HandlerSwallowedError;
        assert_eq!(failure_of(&swallowed, false, false), Failure::Attempt(None));
        assert_eq!(failure_of(&swallowed, false, true), Failure::Attempt(None));
        assert_eq!(failure_of(&swallowed, true, true), Failure::Outage);
    }

    #[test]
    fn parking_that_fails_for_its_own_reason_stops() {
        let not_parked: Error = BatchError::NotParked {
            topic: "t".into(),
            partition: 0,
            offset: 3,
            key: walrelay_contract::EventKey(1),
            rows: 0,
        };
        assert_eq!(failure_of(&not_parked, false, true), Failure::Stop);
        assert_eq!(failure_of(&not_parked, true, true), Failure::Outage);
    }
}
