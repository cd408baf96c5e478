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

use std::collections::BTreeMap;

use rdkafka::message::Message;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Transaction};
use walrelay_contract::{EventKey, ParseEventKeyError};

use crate::batch::{self, Plan};
use crate::delivery::Delivery;
use crate::metrics::Counters;
use crate::parked;
use crate::store::{PgHwmStore, Position};

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

const ENSURE_SQL: &str = "INSERT INTO walrelay_consumer_hwm \
     (consumer_group, topic, partition, source, hwm) \
     SELECT $1, $2, $3, s, '00000000000000000000000000000000' FROM unnest($4::text[]) AS s \
     ON CONFLICT DO NOTHING";
const LOCK_SQL: &str = "SELECT source, hwm FROM walrelay_consumer_hwm \
     WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND source = ANY($4::text[]) \
     ORDER BY source FOR UPDATE";
const ADVANCE_SQL: &str = "UPDATE walrelay_consumer_hwm AS h \
     SET hwm = v.hwm, updated_at = now() \
     FROM unnest($4::text[], $5::text[]) AS v(source, hwm) \
     WHERE h.consumer_group = $1 AND h.topic = $2 AND h.partition = $3 AND h.source = v.source";

impl PgHwmStore {
    /// Applies a batch of records of **one partition** exactly once, in one
    /// transaction.
    ///
    /// 1. Locks the mark rows of every source in the batch
    ///    (`SELECT ... FOR UPDATE`, sorted by source so two members never
    ///    deadlock), creating missing ones at 32 zeros.
    /// 2. Walks the batch with a running mark per source
    ///    ([`crate::batch::plan`]): records at or below it are duplicates.
    /// 3. Raises each mark to the highest new key and runs `handler` once
    ///    with the new records (in batch order), unless there are none. The
    ///    update is sent first and the handler's statements follow it in
    ///    the connection's pipeline: inside the transaction the handler
    ///    already sees the raised marks.
    /// 4. Commits once both succeeded.
    ///
    /// Every record must come from `position`'s partition, in offset order.
    /// An error rolls everything back: no side effect, no mark moved.
    pub async fn process_batch<E, F>(
        &self,
        client: &mut Client,
        position: &Position,
        records: &[Delivery<'_>],
        handler: F,
    ) -> Result<BatchOutcome, BatchError<E>>
    where
        F: AsyncFnOnce(&Transaction<'_>, &[Delivery<'_>]) -> Result<(), E>,
    {
        let single = records.len() == 1;
        self.apply_batch(client, position, records, None, false, async |tx, new| {
            handler(tx, new).await.map_err(|error| Failed {
                index: single.then_some(0),
                error,
            })
        })
        .await
    }

    /// [`PgHwmStore::process_batch`] with the loop's extras: the last
    /// record may be parked instead of applied, `known` skips the row
    /// creation when the marks are known to exist, and the handler may say
    /// which record failed (an index into the slice it was given).
    pub(crate) async fn apply_batch<E, F>(
        &self,
        client: &mut Client,
        position: &Position,
        records: &[Delivery<'_>],
        park: Option<&Park>,
        known: bool,
        handler: F,
    ) -> Result<BatchOutcome, BatchError<E>>
    where
        F: AsyncFnOnce(&Transaction<'_>, &[Delivery<'_>]) -> Result<(), Failed<E>>,
    {
        let result = self
            .apply_inner(client, position, records, park, known, handler)
            .await;
        let c = self.counters();
        match &result {
            Ok(outcome) => {
                c.processed.inc_by(outcome.applied as u64);
                c.duplicates.inc_by(outcome.duplicates as u64);
                c.gaps.inc_by(outcome.gaps as u64);
                if outcome.parked {
                    c.parked.inc();
                }
            }
            Err(_) => Counters::incr(&c.errors),
        }
        result
    }

    async fn apply_inner<E, F>(
        &self,
        client: &mut Client,
        position: &Position,
        records: &[Delivery<'_>],
        park: Option<&Park>,
        known: bool,
        handler: F,
    ) -> Result<BatchOutcome, BatchError<E>>
    where
        F: AsyncFnOnce(&Transaction<'_>, &[Delivery<'_>]) -> Result<(), Failed<E>>,
    {
        let sources = batch::sources(records.iter().map(|d| d.meta));
        let tx = client
            .build_transaction()
            .isolation_level(self.isolation())
            .start()
            .await?;
        let marks = lock_marks(&tx, position, &sources, known).await?;
        let plan = batch::plan(&marks, records.iter().map(|d| d.meta));

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
                Ok(())
            } else {
                advance(&tx, position, &plan).await
            }
        };
        let run = async {
            if apply.is_empty() {
                return Ok(());
            }
            let new: Vec<Delivery<'_>> = apply.iter().map(|&i| records[i]).collect();
            handler(&tx, &new).await
        };
        let (raised, ran) = futures_util::future::join(raise, run).await;
        // A failed update aborts the transaction, so the handler's later
        // statements fail too: the update's error is the cause, and it is
        // not the records' fault (no attempt is counted against them).
        if let Err(e) = raised {
            rollback(tx).await;
            return Err(e);
        }
        if let Err(failed) = ran {
            rollback(tx).await;
            return Err(BatchError::Handler {
                index: failed.index.and_then(|i| apply.get(i).copied()),
                source: failed.error,
            });
        }
        if let (Some(park), true, Some(i)) = (park, parked_is_new, parked_index) {
            let rows = parked::insert(&tx, &records[i], &park.error, park.attempts).await?;
            if rows != 1 {
                return Err(BatchError::NotParked {
                    topic: position.topic.clone(),
                    partition: position.partition,
                    offset: records[i].message.offset(),
                    key: records[i].meta.key,
                    rows,
                });
            }
        }
        tx.commit().await?;

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
}

async fn rollback(tx: Transaction<'_>) {
    if let Err(e) = tx.rollback().await {
        tracing::debug!("rollback after a failed batch failed: {e}");
    }
}

/// Locks the mark rows of `sources` (sorted) and returns their marks,
/// creating missing rows first.
async fn lock_marks<E>(
    tx: &Transaction<'_>,
    position: &Position,
    sources: &[String],
    known: bool,
) -> Result<BTreeMap<String, EventKey>, BatchError<E>> {
    let p = params(position, &sources);
    if !known {
        tx.execute_typed(ENSURE_SQL, &p[..]).await?;
    }
    let mut rows = tx.query_typed(LOCK_SQL, &p[..]).await?;
    if rows.len() < sources.len() {
        if known {
            // Rows deleted by hand since they were seen: create them.
            tx.execute_typed(ENSURE_SQL, &p[..]).await?;
            rows = tx.query_typed(LOCK_SQL, &p[..]).await?;
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
        let text: String = row.get(1);
        match EventKey::from_hex(&text) {
            Ok(key) => {
                marks.insert(source, key);
            }
            Err(e) => {
                return Err(BatchError::CorruptHwm {
                    source_id: source,
                    value: text,
                    source: e,
                })
            }
        }
    }
    Ok(marks)
}

async fn advance<E>(
    tx: &Transaction<'_>,
    position: &Position,
    plan: &Plan,
) -> Result<(), BatchError<E>> {
    let sources: Vec<&str> = plan.raised.keys().map(String::as_str).collect();
    let keys: Vec<String> = plan.raised.values().map(EventKey::to_hex).collect();
    let mut p = params(position, &sources);
    p.push((&keys, Type::TEXT_ARRAY));
    let updated = tx.execute_typed(ADVANCE_SQL, &p[..]).await?;
    if updated != sources.len() as u64 {
        return Err(BatchError::RowVanished {
            source_id: sources.join(","),
        });
    }
    Ok(())
}

fn params<'a>(
    position: &'a Position,
    sources: &'a (dyn ToSql + Sync),
) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    vec![
        (&position.group, Type::TEXT),
        (&position.topic, Type::TEXT),
        (&position.partition, Type::INT4),
        (sources, Type::TEXT_ARRAY),
    ]
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
