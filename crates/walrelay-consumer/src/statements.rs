//! The statements the consumer runs against the application's database:
//! the files of `sql/consumer/`, one per statement, which the Python
//! package ships too (see `sql/consumer/README.md`). Compiled in, without
//! the files' final newline.

macro_rules! statement {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../sql/consumer/",
            $name,
            ".sql"
        ))
        .trim_ascii_end()
    };
}

/// Creates the missing marks of a batch's sources (`$4`: the sources).
pub(crate) const HWM_ENSURE: &str = statement!("hwm_ensure");
/// Locks a batch's marks; returns each with the transaction id.
pub(crate) const HWM_LOCK: &str = statement!("hwm_lock");
/// Raises a batch's marks (`$4`, `$5`: sources and marks); returns the
/// transaction id per row.
pub(crate) const HWM_ADVANCE: &str = statement!("hwm_advance");
/// The transaction id if one is open, checked before COMMIT.
pub(crate) const HWM_GUARD: &str = statement!("hwm_guard");
/// The marks of a group's assigned partitions.
pub(crate) const HWM_LOAD: &str = statement!("hwm_load");
/// Reads one source's mark without locking it.
pub(crate) const HWM_READ_ONE: &str = statement!("hwm_read_one");
/// Parks a keyed record (a later attempt replaces it).
pub(crate) const PARKED_INSERT: &str = statement!("parked_insert");
/// Parks a record without a key (once per offset).
pub(crate) const PARKED_INSERT_UNKEYED: &str = statement!("parked_insert_unkeyed");
/// Whether the unkeyed record parked at an offset is this one.
pub(crate) const PARKED_SAME_UNKEYED: &str = statement!("parked_same_unkeyed");
/// The next parked record to re-drive, locked.
pub(crate) const PARKED_TAKE: &str = statement!("parked_take");
/// Removes a re-driven record.
pub(crate) const PARKED_DELETE: &str = statement!("parked_delete");
/// Counts a failed re-drive.
pub(crate) const PARKED_FAILED_AGAIN: &str = statement!("parked_failed_again");
/// The records a group has parked (`$1`: the group), for the gauge.
pub(crate) const PARKED_COUNT: &str = statement!("parked_count");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_whole_and_end_without_a_newline() {
        for s in [
            HWM_ENSURE,
            HWM_LOCK,
            HWM_ADVANCE,
            HWM_GUARD,
            HWM_LOAD,
            HWM_READ_ONE,
            PARKED_INSERT,
            PARKED_INSERT_UNKEYED,
            PARKED_SAME_UNKEYED,
            PARKED_TAKE,
            PARKED_DELETE,
            PARKED_FAILED_AGAIN,
            PARKED_COUNT,
        ] {
            assert!(
                !s.is_empty() && !s.ends_with('\n') && !s.contains(';'),
                "{s}"
            );
        }
        assert!(HWM_ADVANCE.ends_with("RETURNING pg_current_xact_id()::text"));
    }
}
