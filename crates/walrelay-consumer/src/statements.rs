//! The statements the consumer runs against the application's database:
//! the files of `sql/consumer/`, one per statement, which the Python
//! package ships too (see `sql/consumer/README.md`). Compiled in, without
//! the files' final newline.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Statement, Transaction};

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

/// The parameter types of the statements on one position's marks
/// (`$1`..`$4`: group, topic, partition, the batch's sources; see
/// [`crate::apply::params`]).
const MARK_TYPES: [Type; 4] = [Type::TEXT, Type::TEXT, Type::INT4, Type::TEXT_ARRAY];

/// The statements every batch runs, each once per batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Batch {
    Ensure,
    Lock,
    Advance,
    Guard,
}

impl Batch {
    const ALL: [Batch; 4] = [Batch::Ensure, Batch::Lock, Batch::Advance, Batch::Guard];

    fn sql(self) -> &'static str {
        match self {
            Batch::Ensure => HWM_ENSURE,
            Batch::Lock => HWM_LOCK,
            Batch::Advance => HWM_ADVANCE,
            Batch::Guard => HWM_GUARD,
        }
    }

    fn types(self) -> &'static [Type] {
        const ADVANCE: [Type; 5] = [
            Type::TEXT,
            Type::TEXT,
            Type::INT4,
            Type::TEXT_ARRAY,
            Type::TEXT_ARRAY,
        ];
        match self {
            Batch::Ensure | Batch::Lock => &MARK_TYPES,
            Batch::Advance => &ADVANCE,
            Batch::Guard => &[],
        }
    }
}

/// The batch statements prepared on one connection, once, when the loop
/// first uses it ([`crate::Settings::prepared_statements`]). Sent unnamed,
/// the server parses and plans each of them in every batch: on one-event
/// batches that was most of the database CPU the marks cost (about half of
/// it, measured with pgbench on the same statements).
#[derive(Debug)]
pub(crate) struct Prepared {
    statements: [Statement; 4],
}

impl Prepared {
    /// Prepares the batch statements on `client`, in one pipeline.
    pub(crate) async fn prepare(client: &Client) -> Result<Prepared, tokio_postgres::Error> {
        let [a, b, c, d] = Batch::ALL.map(|s| client.prepare_typed(s.sql(), s.types()));
        let (a, b, c, d) = futures_util::future::try_join4(a, b, c, d).await?;
        Ok(Prepared {
            statements: [a, b, c, d],
        })
    }

    fn get(&self, which: Batch) -> &Statement {
        &self.statements[which as usize]
    }
}

/// How a batch sends its statements: prepared on the connection (the
/// loop's own connections), or unnamed with typed parameters (a client
/// the application passes in, whose session walrelay does not own).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Statements<'a> {
    Unnamed,
    Prepared(&'a Prepared),
}

impl<'a> Statements<'a> {
    pub(crate) fn of(prepared: Option<&'a Prepared>) -> Statements<'a> {
        prepared.map_or(Statements::Unnamed, Statements::Prepared)
    }

    /// Runs `which` in `tx` with `params` (typed as [`Batch::types`]).
    pub(crate) async fn query(
        self,
        tx: &Transaction<'_>,
        which: Batch,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match self {
            Statements::Unnamed => tx.query_typed(which.sql(), params).await,
            Statements::Prepared(p) => {
                let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
                tx.query(p.get(which), &values).await
            }
        }
    }
}

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

    #[test]
    fn each_batch_statement_is_typed_for_every_parameter_it_has() {
        for (i, s) in Batch::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?} indexes Prepared");
            let highest = (1..=9)
                .rev()
                .find(|n| s.sql().contains(&format!("${n}")))
                .unwrap_or(0);
            assert_eq!(s.types().len(), highest, "{s:?}");
        }
    }
}
