//! Which database errors are an outage and which are the batch's own
//! (`python/src/walrelay_consumer/outage.py` applies the same rule).
//!
//! An outage is retried for as long as it lasts, without counting
//! attempts: the database is unreachable or going away, and any batch
//! would fail the same. An error of the batch itself (a constraint checked
//! at `COMMIT`, a serialization failure or deadlock, a statement the
//! handler let fail, a statement timeout) may fail this batch every time:
//! it counts as an attempt of the retry policy, after which the record is
//! parked or its partition stopped.
//!
//! Outage: a closed connection; an error without SQLSTATE that is about
//! the connection (I/O, connecting, its TLS handshake, a timeout waiting
//! for the server); class 08 (connection exception), 53 (insufficient
//! resources: disk full, too many connections) except 53200, 58 (system
//! error, e.g. an I/O error), and 57P01/57P02/57P03 (the server is shutting
//! down, crashed, or not accepting connections yet). Other client-side
//! errors without SQLSTATE (a parameter that cannot be encoded, a column
//! that cannot be decoded, a wrong parameter count) fail the same batch
//! every time: they are the batch's own.
//!
//! Between the two, errors that depend on the batch's size or on other
//! sessions, not on a record ([`ErrorClass::Shrink`]): `53200` (out of
//! shared memory, e.g. `max_locks_per_transaction` on a batch touching many
//! partitions), `40P01` (deadlock), `40001` (serialization failure),
//! `55P03` (lock not available) and `57014` (statement timeout). The batch
//! is retried smaller without counting an attempt; a batch of one record
//! counts it, so a record whose own handler always trips a statement
//! timeout is still parked or stops its partition.

/// SQLSTATE classes of an outage (but see [`SHRINK_STATES`]).
const OUTAGE_CLASSES: [&str; 3] = ["08", "53", "58"];

/// SQLSTATEs of contention or of a batch too large: retried smaller.
const SHRINK_STATES: [&str; 5] = ["53200", "40P01", "40001", "55P03", "57014"];

/// SQLSTATEs of a server going away.
const OUTAGE_STATES: [&str; 3] = ["57P01", "57P02", "57P03"];

/// What a failed batch's database error means for its retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    /// The database is unavailable: retried until it works, not counted.
    Outage,
    /// Contention or a batch too large: retried smaller, counted only at
    /// one record.
    Shrink,
    /// The batch's own error: counted as an attempt.
    Batch,
}

/// The class of an error with SQLSTATE `code`.
pub(crate) fn class_of_code(code: &str) -> ErrorClass {
    if SHRINK_STATES.contains(&code) {
        ErrorClass::Shrink
    } else if OUTAGE_STATES.contains(&code) || OUTAGE_CLASSES.iter().any(|c| code.starts_with(c)) {
        ErrorClass::Outage
    } else {
        ErrorClass::Batch
    }
}

/// The class of `error` (see the module's doc).
pub(crate) fn class_of(error: &tokio_postgres::Error) -> ErrorClass {
    if error.is_closed() {
        return ErrorClass::Outage;
    }
    match error.code() {
        None => {
            let text = error.to_string();
            if CONNECTION_ERRORS.iter().any(|p| text.starts_with(p)) {
                ErrorClass::Outage
            } else {
                ErrorClass::Batch
            }
        }
        Some(code) => class_of_code(code.code()),
    }
}

/// How tokio-postgres words its errors without SQLSTATE that are about the
/// connection (its `Kind` is private; its messages are stable).
const CONNECTION_ERRORS: [&str; 5] = [
    "error communicating with the server",
    "error connecting to server",
    "error performing TLS handshake",
    "timeout waiting for server",
    "connection closed",
];

/// Whether `error` is an outage rather than an error of the batch.
pub fn is_outage(error: &tokio_postgres::Error) -> bool {
    class_of(error) == ErrorClass::Outage
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_classes_are_sqlstate_prefixes() {
        // The rule compares the first two characters of the code.
        for class in super::OUTAGE_CLASSES {
            assert_eq!(class.len(), 2);
        }
    }

    #[test]
    fn codes_fall_in_their_class() {
        use super::{class_of_code, ErrorClass::*};
        // Outages: every batch would fail the same.
        for code in [
            "08006", "53100", "53300", "53000", "58030", "57P01", "57P02", "57P03",
        ] {
            assert_eq!(class_of_code(code), Outage, "{code}");
        }
        // Contention, or a batch too large: not the record's fault.
        for code in ["53200", "40P01", "40001", "55P03", "57014"] {
            assert_eq!(class_of_code(code), Shrink, "{code}");
        }
        // The batch's own.
        for code in [
            "23505", "23514", "22012", "25P02", "42P01", "40000", "57000",
        ] {
            assert_eq!(class_of_code(code), Batch, "{code}");
        }
    }
}
