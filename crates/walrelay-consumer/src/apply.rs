//! One batch of one partition in one transaction: lock the marks, drop
//! what they already cover, run the handler on the rest, raise the marks,
//! commit.
//!
//! Round trips per batch: `BEGIN`, the lock of the batch's mark rows (one
//! statement for every source, plus one insert the first time a source is
//! seen), the handler's own statements and `COMMIT`. The `UPDATE` that
//! raises the marks costs no round trip of its own: the lock tells which
//! records are new and how far each mark goes, so the update is sent
//! before the handler's first statement, in the same pipeline, and its
//! outcome is checked before `COMMIT`. So a batch of a thousand records
//! costs about what one record costs, and the handler decides how cheap
//! its part is (one multi-row `INSERT`, `COPY`, `unnest`).
//!
//! `COMMIT` alone cannot tell that the handler left the transaction in a
//! state where committing means losing its work: PostgreSQL answers
//! `COMMIT` in an aborted transaction with `ROLLBACK` and no error (a
//! handler that swallowed a failed statement), and outside a transaction
//! with a warning (a handler that ran `COMMIT` or `ROLLBACK` itself), and
//! tokio-postgres reports neither. So a guard statement goes out just
//! before `COMMIT`, in the same pipeline: it compares the transaction id
//! the marks' update returned with the session's current one. It fails in
//! an aborted transaction (the batch is rolled back and retried) and
//! returns another id, or none, when the handler ended the transaction
//! itself (the marks may then be committed apart from part of the side
//! effects, which no library can repair: the loop stops the partition).

use std::collections::BTreeMap;

use rdkafka::message::Message;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, IsolationLevel, Transaction};
use walrelay_contract::{EventKey, ParseEventKeyError};

use crate::batch::{self, Plan};
use crate::delivery::Delivery;
use crate::meta::RecordMeta;
use crate::parked;
use crate::position::Position;
use crate::statements::{Batch, Statements};

/// What a committed batch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Records whose side effects were committed.
    pub applied: usize,
    /// Records dropped because the marks already covered them.
    pub duplicates: usize,
    /// Gaps found (see [`crate::batch`]).
    pub gaps: usize,
    /// Whether the batch's last record was parked instead of applied.
    pub parked: bool,
    /// The committed marks of the batch's sources.
    pub marks: BTreeMap<String, EventKey>,
}

/// Why a batch was not committed. In every case the transaction was rolled
/// back (or never committed): no side effect and no mark moved.
#[derive(Debug, thiserror::Error)]
pub enum BatchError<E> {
    /// The handler failed. `index` is the failing record's index in the
    /// batch when known (the per-record handler, or a batch of one).
    #[error("the handler failed (rolled back; the high-water marks are unchanged): {source}")]
    Handler {
        /// Index in the batch of the failing record, when known.
        index: Option<usize>,
        /// The handler's error.
        source: E,
    },
    /// A database error (connection lost, failed commit, ...).
    #[error("database error while applying a batch (rolled back): {0}")]
    Db(#[from] tokio_postgres::Error),
    /// A stored mark is not a key (the table's CHECK prevents this unless
    /// it was changed).
    #[error("the stored high-water mark {value:?} of source {source_id:?} is not a 32-hex-digit key: {source}")]
    CorruptHwm {
        /// The source.
        source_id: String,
        /// The stored text.
        value: String,
        /// What is wrong with it.
        source: ParseEventKeyError,
    },
    /// Parking a record wrote no row (or more than one): the batch is not
    /// committed, since its mark would move past a record neither applied
    /// nor parked.
    #[error(
        "parking record {topic}/{partition} at offset {offset} (key {key}) wrote {rows} rows of \
         walrelay_consumer_parked instead of 1, so the batch was rolled back (its mark would \
         have moved past a record neither applied nor parked): check the table's unique \
         indexes (run the migration again)"
    )]
    NotParked {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The record's offset.
        offset: i64,
        /// The record's key.
        key: EventKey,
        /// The rows written.
        rows: u64,
    },
    /// The handler returned success, but one of its statements had failed
    /// and aborted the transaction (an error it caught and did not
    /// return, without a savepoint): `COMMIT` would have rolled back its
    /// side effects while the loop moved on. Rolled back; retried like a
    /// handler error.
    #[error(
        "the handler's transaction was aborted by an error it did not return (a failed \
         statement whose error the handler swallowed; use a savepoint around a statement that \
         may fail, or return the error): rolled back, the high-water marks are unchanged"
    )]
    HandlerSwallowedError,
    /// The handler ended the batch's transaction itself (it ran `COMMIT`
    /// or `ROLLBACK`): the marks and part of its side effects may have
    /// been committed apart, so the batch's atomicity was broken. Never
    /// retried: the loop stops the partition.
    #[error(
        "the handler ended the batch's transaction itself (it ran COMMIT or ROLLBACK; the \
         transaction that raised the high-water marks was {expected}, the session's is now \
         {found}): atomicity was broken, the marks and part of the side effects may be \
         committed apart; fix the handler (it must not commit or roll back), check the \
         records' side effects and the marks by hand"
    )]
    HandlerEndedTransaction {
        /// The id of the transaction that raised the marks.
        expected: String,
        /// The session's transaction id after the handler (`none`: no
        /// transaction, or one that wrote nothing yet).
        found: String,
    },
    /// A mark row disappeared between creating and locking it.
    #[error(
        "the high-water mark row of source {source_id:?} vanished between creating and locking \
         it (deleted concurrently, or not READ COMMITTED)"
    )]
    RowVanished {
        /// The source.
        source_id: String,
    },
}

/// A handler's failure inside a batch: the error and, when the handler
/// knows it, which of the records it was given failed.
#[derive(Debug)]
pub(crate) struct Failed<E> {
    pub index: Option<usize>,
    pub error: E,
}

/// The last record of a batch is parked instead of applied.
#[derive(Clone, Debug)]
pub(crate) struct Park {
    pub error: String,
    pub attempts: u32,
}

/// What the batch transaction needs of a record: its walrelay metadata.
/// A loop's [`Delivery`], or a bare [`RecordMeta`] for
/// [`crate::PgHwmStore::process`], a batch of one. (An owned `RecordMeta`, not a
/// reference: a lifetime in this type parameter would make the futures of
/// `process` callers unprovably `Send` under `tokio::spawn`.)
pub(crate) trait Keyed: Clone {
    fn meta(&self) -> &RecordMeta;
}

impl Keyed for Delivery<'_> {
    fn meta(&self) -> &RecordMeta {
        self.meta
    }
}

impl Keyed for RecordMeta {
    fn meta(&self) -> &RecordMeta {
        self
    }
}

/// Applies `records` (of `position`'s partition, in offset order) in one
/// transaction at `isolation`. `park`: the batch's last record is parked
/// with this error instead of applied. `known`: the marks' rows are known
/// to exist (no insert first). Counting the outcome is the caller's (the
/// store's counters): this module knows nothing of the store, which is
/// built on it.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn apply<R, E, F>(
    isolation: IsolationLevel,
    client: &mut Client,
    statements: Statements<'_>,
    position: &Position,
    records: &[R],
    park: Option<(&Park, &Delivery<'_>)>,
    known: bool,
    handler: F,
) -> Result<BatchOutcome, BatchError<E>>
where
    R: Keyed,
    F: AsyncFnOnce(&Transaction<'_>, &[R]) -> Result<(), Failed<E>>,
{
    let sources = batch::sources(records.iter().map(Keyed::meta));
    let tx = client
        .build_transaction()
        .isolation_level(isolation)
        .start()
        .await?;
    let marks = lock_marks(&tx, statements, position, &sources, known).await?;
    let plan = batch::plan(&marks, records.iter().map(Keyed::meta));

    // A parked last record is taken out of what the handler sees but
    // still raises its mark (it is "done" for this group).
    let parked_index = park.map(|_| records.len() - 1);
    let parked_is_new = parked_index.is_some_and(|i| plan.apply.last() == Some(&i));
    let apply: Vec<usize> = plan
        .apply
        .iter()
        .copied()
        .filter(|&i| Some(i) != parked_index)
        .collect();
    // The marks' update goes out first; the handler's statements follow
    // it in the connection's pipeline without waiting for its reply.
    let raise = async {
        if plan.raised.is_empty() {
            Ok(None)
        } else {
            advance(&tx, statements, position, &plan).await
        }
    };
    let run = async {
        if apply.is_empty() {
            return Ok(());
        }
        let new: Vec<R> = apply.iter().map(|&i| records[i].clone()).collect();
        handler(&tx, &new).await
    };
    let (raised, ran) = futures_util::future::join(raise, run).await;
    // A failed update aborts the transaction, so the handler's later
    // statements fail too: the update's error is the cause, and it is
    // not the records' fault (no attempt is counted against them).
    let xid = match raised {
        Ok(xid) => xid,
        Err(e) => {
            rollback(tx).await;
            return Err(e);
        }
    };
    if let Err(failed) = ran {
        rollback(tx).await;
        return Err(BatchError::Handler {
            index: failed.index.and_then(|i| apply.get(i).copied()),
            source: failed.error,
        });
    }
    // The handler ran only where something was new, and then the
    // update returned the transaction's id.
    let guard = xid.filter(|_| !apply.is_empty());
    let park_row = park.filter(|_| parked_is_new);
    match (guard, park_row) {
        (Some(xid), None) => guard_and_commit(tx, statements, &xid).await?,
        (guard, Some((park, record))) => {
            // Parking is checked before COMMIT (a wrong row count must
            // not commit the mark past the record): one more round trip.
            let check = async {
                match &guard {
                    Some(xid) => check_guard(&tx, statements, xid).await,
                    None => Ok(()),
                }
            };
            let insert = parked::insert(&tx, record, &park.error, park.attempts);
            let (checked, inserted) = futures_util::future::join(check, insert).await;
            if let Err(e) = checked {
                rollback(tx).await;
                return Err(e);
            }
            let rows = inserted?;
            if rows != 1 {
                return Err(BatchError::NotParked {
                    topic: position.topic.clone(),
                    partition: position.partition,
                    offset: record.message.offset(),
                    key: record.meta.key,
                    rows,
                });
            }
            tx.commit().await?;
        }
        (None, None) => tx.commit().await?,
    }

    log_gaps(position, &plan);
    let mut committed = marks;
    committed.extend(plan.raised.iter().map(|(s, k)| (s.clone(), *k)));
    Ok(BatchOutcome {
        applied: apply.len(),
        duplicates: plan.duplicates,
        gaps: plan.gaps.len(),
        parked: parked_is_new,
        marks: committed,
    })
}

async fn rollback(tx: Transaction<'_>) {
    if let Err(e) = tx.rollback().await {
        tracing::debug!("rollback after a failed batch failed: {e}");
    }
}

/// Sends the guard and `COMMIT` in one pipeline (no round trip of the
/// guard's own), then reads what the guard saw. Whatever the outcome, the
/// session is outside a transaction afterwards: `COMMIT` committed, or
/// ended an aborted transaction, or (outside one) did nothing.
async fn guard_and_commit<E>(
    tx: Transaction<'_>,
    statements: Statements<'_>,
    xid: &str,
) -> Result<(), BatchError<E>> {
    let (checked, committed) = futures_util::future::join(
        check_guard(&tx, statements, xid),
        tx.batch_execute("COMMIT"),
    )
    .await;
    // `COMMIT` was sent as a statement, not through `Transaction::commit`
    // (which takes the transaction by value while the guard borrows it):
    // forgetting it skips the `ROLLBACK` its drop would send after the
    // transaction ended. It owns no heap memory (no savepoint name).
    std::mem::forget(tx);
    checked?;
    committed?;
    Ok(())
}

/// What the guard says about the transaction that raised the marks.
async fn check_guard<E>(
    tx: &Transaction<'_>,
    statements: Statements<'_>,
    xid: &str,
) -> Result<(), BatchError<E>> {
    match statements.query(tx, Batch::Guard, &[]).await {
        Ok(rows) => {
            let found: Option<String> = rows.first().and_then(|r| r.get(0));
            guard_verdict(xid, found.as_deref())
        }
        Err(e) if e.code() == Some(&SqlState::IN_FAILED_SQL_TRANSACTION) => {
            Err(BatchError::HandlerSwallowedError)
        }
        Err(e) => Err(BatchError::Db(e)),
    }
}

/// The guard's verdict: the same transaction id, or the handler ended it.
fn guard_verdict<E>(expected: &str, found: Option<&str>) -> Result<(), BatchError<E>> {
    if found == Some(expected) {
        Ok(())
    } else {
        Err(BatchError::HandlerEndedTransaction {
            expected: expected.to_owned(),
            found: found.unwrap_or("none").to_owned(),
        })
    }
}

/// Locks the mark rows of `sources` (sorted) and returns their marks,
/// creating missing rows first.
async fn lock_marks<E>(
    tx: &Transaction<'_>,
    statements: Statements<'_>,
    position: &Position,
    sources: &[String],
    known: bool,
) -> Result<BTreeMap<String, EventKey>, BatchError<E>> {
    let p = params(position, &sources, Type::TEXT_ARRAY);
    if !known {
        statements.query(tx, Batch::Ensure, &p).await?;
    }
    let mut rows = statements.query(tx, Batch::Lock, &p).await?;
    if rows.len() < sources.len() {
        if known {
            // Rows deleted by hand since they were seen: create them.
            statements.query(tx, Batch::Ensure, &p).await?;
            rows = statements.query(tx, Batch::Lock, &p).await?;
        }
        if let Some(missing) = sources
            .iter()
            .find(|s| !rows.iter().any(|r| r.get::<_, &str>(0) == s.as_str()))
        {
            return Err(BatchError::RowVanished {
                source_id: missing.clone(),
            });
        }
    }
    let mut marks = BTreeMap::new();
    for row in rows {
        let source: String = row.get(0);
        let key = parse_hwm(&source, row.get(1))?;
        marks.insert(source, key);
    }
    Ok(marks)
}

/// Raises the marks; returns the id of the transaction (see
/// [`crate::statements::HWM_GUARD`]).
async fn advance<E>(
    tx: &Transaction<'_>,
    statements: Statements<'_>,
    position: &Position,
    plan: &Plan,
) -> Result<Option<String>, BatchError<E>> {
    let sources: Vec<&str> = plan.raised.keys().map(String::as_str).collect();
    let keys: Vec<String> = plan.raised.values().map(EventKey::to_hex).collect();
    let mut p = params(position, &sources, Type::TEXT_ARRAY);
    p.push((&keys, Type::TEXT_ARRAY));
    let updated = statements.query(tx, Batch::Advance, &p).await?;
    if updated.len() != sources.len() {
        return Err(BatchError::RowVanished {
            source_id: sources.join(","),
        });
    }
    Ok(updated.first().map(|row| row.get(0)))
}

/// The parameters the statements on one position's marks start with
/// (`$1`..`$4`: group, topic, partition, then the source as `source_type`:
/// an array of them in a batch's statements, one in `hwm_read_one`), typed
/// so that no statement needs a round trip to be prepared.
pub(crate) fn params<'a>(
    position: &'a Position,
    source: &'a (dyn ToSql + Sync),
    source_type: Type,
) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    vec![
        (&position.group, Type::TEXT),
        (&position.topic, Type::TEXT),
        (&position.partition, Type::INT4),
        (source, source_type),
    ]
}

/// A stored mark as a key. The table's CHECK keeps out anything else
/// unless it was changed; a corrupt mark fails the batch instead of being
/// read as some other key.
pub(crate) fn parse_hwm<E>(source: &str, text: String) -> Result<EventKey, BatchError<E>> {
    EventKey::from_hex(&text).map_err(|e| BatchError::CorruptHwm {
        source_id: source.to_owned(),
        value: text,
        source: e,
    })
}

fn log_gaps(position: &Position, plan: &Plan) {
    for gap in &plan.gaps {
        tracing::warn!(
            topic = %position.topic,
            partition = position.partition,
            source = %gap.source,
            hwm = %gap.hwm,
            prev = %gap.prev,
            "gap: the record sent before this one was never processed by group {:?} \
             (high-water mark {} < previous key {})",
            position.group,
            gap.hwm,
            gap.prev
        );
    }
}
