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
//! Outage: no SQLSTATE (the client lost or could not open the connection),
//! a closed connection, class 08 (connection exception), 53 (insufficient
//! resources: disk full, out of memory, too many connections), 58 (system
//! error, e.g. an I/O error), and 57P01/57P02/57P03 (the server is shutting
//! down, crashed, or not accepting connections yet).

use tokio_postgres::error::SqlState;

/// SQLSTATE classes of an outage.
const OUTAGE_CLASSES: [&str; 3] = ["08", "53", "58"];

/// Whether `error` is an outage rather than an error of the batch.
pub fn is_outage(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        None => true,
        Some(code) => {
            OUTAGE_CLASSES
                .iter()
                .any(|class| code.code().starts_with(class))
                || [
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::CANNOT_CONNECT_NOW,
                ]
                .contains(code)
        }
    }
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
}
