//! The high-water mark store: check a record against its partition's mark
//! and advance the mark in the same transaction as the side effects.
//!
//! A façade over the batch transaction ([`crate::apply`]): [`PgHwmStore`]
//! holds what its transactions share (the isolation level, the counters),
//! and each of its ways in ([`PgHwmStore::process`], a record alone;
//! [`PgHwmStore::process_batch`]; the loop's batches, which may park their
//! last record) is one call of that transaction, counted the same way.
//! The dependency goes one way: the transaction knows nothing of the store.
//! The types both name ([`Position`], [`INITIAL_HWM`], [`HwmRow`]) live in
//! a leaf module and are re-exported here.

use std::future::Future;
use std::sync::Arc;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, IsolationLevel, Transaction};
use walrelay_contract::EventKey;

use crate::apply::{self, BatchError, BatchOutcome, Failed, Keyed, Park};
use crate::delivery::Delivery;
use crate::meta::RecordMeta;
use crate::metrics::Counters;
use crate::statements::{self, Statements};

// Their public paths under `store` from before they moved to the leaf
// module, kept.
pub use crate::position::{HwmRow, Position, INITIAL_HWM};

/// What happened to a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The handler ran and its side effects were committed together with
    /// the new high-water mark. Carries the handler's result.
    Processed(T),
    /// The key was not above the high-water mark: the record (or a later
    /// one) was processed before. Nothing ran, nothing was written.
    Duplicate {
        /// The high-water mark the key was compared with.
        hwm: EventKey,
    },
}

impl<T> Outcome<T> {
    /// Whether the handler ran and committed.
    pub fn is_processed(&self) -> bool {
        matches!(self, Outcome::Processed(_))
    }

    /// Whether the record was skipped as a duplicate.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate { .. })
    }
}

/// Why a record could not be processed: the batch transaction's error
/// ([`PgHwmStore::process`] is a batch of one). In every case the
/// transaction was rolled back: the side effects are not committed and the
/// high-water mark is unchanged, so a redelivery of the record is
/// processed normally.
pub type ProcessError<E> = BatchError<E>;

/// Storage of high-water marks with transactional check-and-advance.
///
/// [`PgHwmStore`] is the implementation on `tokio-postgres`. The trait
/// exists so that services can wrap it (instrumentation, a different table)
/// without changing the code that uses it.
pub trait HwmStore {
    /// The stored marks of `group` for the given `(topic, partition)`
    /// pairs, all sources.
    fn load(
        &self,
        client: &Client,
        group: &str,
        partitions: &[(String, i32)],
    ) -> impl Future<Output = Result<Vec<HwmRow>, tokio_postgres::Error>> + Send;

    /// Runs `handler` in a transaction if and only if `meta.key` is above
    /// the mark of (`position`, `meta.source`), and advances the mark to
    /// `meta.key` in that same transaction. See [`PgHwmStore::process`].
    fn process<T, E, F>(
        &self,
        client: &mut Client,
        position: &Position,
        meta: &RecordMeta,
        handler: F,
    ) -> impl Future<Output = Result<Outcome<T>, ProcessError<E>>>
    where
        F: AsyncFnOnce(&Transaction<'_>) -> Result<T, E>;
}

/// High-water marks in the table `walrelay_consumer_hwm` (created by
/// [`crate::migrate`]), through `tokio-postgres`.
///
/// Cheap to clone; clones share the [`Counters`].
#[derive(Clone, Debug)]
pub struct PgHwmStore {
    counters: Arc<Counters>,
    isolation: IsolationLevel,
}

impl Default for PgHwmStore {
    fn default() -> Self {
        PgHwmStore::new()
    }
}

impl PgHwmStore {
    /// A store with fresh counters; transactions run at READ COMMITTED.
    pub fn new() -> PgHwmStore {
        PgHwmStore {
            counters: Arc::new(Counters::default()),
            isolation: IsolationLevel::ReadCommitted,
        }
    }

    /// Runs the processing transactions at `isolation` instead of READ
    /// COMMITTED. Above READ COMMITTED, two concurrent deliveries of one
    /// record make the second fail with a serialization error
    /// ([`ProcessError::Db`], retryable) instead of waiting and seeing a
    /// duplicate; correctness is the same.
    #[must_use]
    pub fn with_isolation_level(mut self, isolation: IsolationLevel) -> PgHwmStore {
        self.isolation = isolation;
        self
    }

    /// Counts into `counters` (e.g. shared with other stores).
    #[must_use]
    pub fn with_counters(mut self, counters: Arc<Counters>) -> PgHwmStore {
        self.counters = counters;
        self
    }

    /// The store's counters.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// The isolation level of the processing transactions.
    pub fn isolation(&self) -> IsolationLevel {
        self.isolation
    }

    /// The stored marks of `group` for the given `(topic, partition)`
    /// pairs, all sources, ordered by topic, partition and source.
    pub async fn load(
        &self,
        client: &Client,
        group: &str,
        partitions: &[(String, i32)],
    ) -> Result<Vec<HwmRow>, tokio_postgres::Error> {
        let topics: Vec<&str> = partitions.iter().map(|(t, _)| t.as_str()).collect();
        let numbers: Vec<i32> = partitions.iter().map(|(_, p)| *p).collect();
        let rows = client
            .query(statements::HWM_LOAD, &[&group, &topics, &numbers])
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let text: String = row.get(3);
            match EventKey::from_hex(&text) {
                Ok(hwm) => out.push(HwmRow {
                    topic: row.get(0),
                    partition: row.get(1),
                    source: row.get(2),
                    hwm,
                }),
                // Only a cache hint: a bad row fails loudly in `process`.
                Err(e) => tracing::warn!(hwm = %text, "ignoring a corrupt high-water mark: {e}"),
            }
        }
        Ok(out)
    }

    /// The stored mark of one (position, source), if the row exists.
    pub async fn hwm(
        &self,
        client: &Client,
        position: &Position,
        source: &str,
    ) -> Result<Option<EventKey>, ProcessError<std::convert::Infallible>> {
        let row = client
            .query_typed_opt(
                statements::HWM_READ_ONE,
                &apply::params(position, &source, Type::TEXT)[..],
            )
            .await?;
        row.map(|row| apply::parse_hwm(source, row.get(0)))
            .transpose()
    }

    /// Processes one record exactly once: a batch of one
    /// ([`PgHwmStore::process_batch`]), in one transaction (READ COMMITTED
    /// unless configured otherwise):
    ///
    /// 1. Lock the mark row of (`position`, `meta.source`) with
    ///    `SELECT ... FOR UPDATE`, creating it first at 32 zeros if it does
    ///    not exist (`INSERT ... ON CONFLICT DO NOTHING`). Concurrent
    ///    deliveries of the same partition and source wait here for each
    ///    other.
    /// 2. If `meta.key <= hwm`: roll back and return
    ///    [`Outcome::Duplicate`]. The handler does not run.
    /// 3. Raise the mark to `meta.key` and run `handler` with the
    ///    transaction. On error: roll back and return
    ///    [`BatchError::Handler`]; nothing it did is committed and the mark
    ///    is unchanged.
    /// 4. Check that the handler left the transaction whole (see
    ///    [`crate::apply`]) and commit: [`Outcome::Processed`].
    ///
    /// **Gap detection.** If `meta.prev_key` is above the mark, the record
    /// the relay sent just before this one to this partition was never
    /// processed by this group: a warning is logged (topic, partition,
    /// source, mark, previous key) and [`Counters::gaps`] is incremented
    /// once the record commits. The record itself is still processed: it is
    /// valid, and refusing it would not bring the missing one back. When
    /// the mark is still at its initial 32 zeros nothing is reported: a new
    /// group routinely starts in the middle of a session (retention, or a
    /// group created after the relay started), and reporting every new
    /// partition as a gap would drown real ones. What it cannot detect is
    /// described in the crate docs.
    ///
    /// The handler must do all its database work through the transaction
    /// it gets and must not end it. Side effects outside the database
    /// (HTTP calls, e-mails) are not covered: they may happen again if the
    /// transaction then fails.
    pub async fn process<T, E, F>(
        &self,
        client: &mut Client,
        position: &Position,
        meta: &RecordMeta,
        handler: F,
    ) -> Result<Outcome<T>, ProcessError<E>>
    where
        F: AsyncFnOnce(&Transaction<'_>) -> Result<T, E>,
    {
        let mut value = None;
        let outcome = self
            .apply_counted(
                client,
                Statements::Unnamed,
                position,
                std::slice::from_ref(meta),
                None,
                false,
                async |tx, _new| match handler(tx).await {
                    Ok(v) => {
                        value = Some(v);
                        Ok(())
                    }
                    Err(error) => Err(Failed {
                        index: Some(0),
                        error,
                    }),
                },
            )
            .await?;
        Ok(match value {
            Some(v) => Outcome::Processed(v),
            None => Outcome::Duplicate {
                hwm: outcome
                    .marks
                    .get(&meta.source)
                    .copied()
                    .unwrap_or(INITIAL_HWM),
            },
        })
    }

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
        self.apply_counted(
            client,
            Statements::Unnamed,
            position,
            records,
            None,
            false,
            async |tx, new| {
                handler(tx, new).await.map_err(|error| Failed {
                    index: single.then_some(0),
                    error,
                })
            },
        )
        .await
    }

    /// [`PgHwmStore::process_batch`] with the loop's extras: the last
    /// record may be parked instead of applied, `known` skips the row
    /// creation when the marks are known to exist, and the handler may say
    /// which record failed (an index into the slice it was given).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn apply_batch<E, F>(
        &self,
        client: &mut Client,
        statements: Statements<'_>,
        position: &Position,
        records: &[Delivery<'_>],
        park: Option<&Park>,
        known: bool,
        handler: F,
    ) -> Result<BatchOutcome, BatchError<E>>
    where
        F: AsyncFnOnce(&Transaction<'_>, &[Delivery<'_>]) -> Result<(), Failed<E>>,
    {
        let park = park.zip(records.last());
        self.apply_counted(client, statements, position, records, park, known, handler)
            .await
    }

    /// The batch transaction ([`crate::apply`]) at the store's isolation
    /// level, its outcome counted in the store's counters: the one way
    /// every method above reaches it, so that each counts the same way.
    #[allow(clippy::too_many_arguments)]
    async fn apply_counted<R, E, F>(
        &self,
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
        let result = apply::apply(
            self.isolation,
            client,
            statements,
            position,
            records,
            park,
            known,
            handler,
        )
        .await;
        let c = &self.counters;
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
}

impl HwmStore for PgHwmStore {
    fn load(
        &self,
        client: &Client,
        group: &str,
        partitions: &[(String, i32)],
    ) -> impl Future<Output = Result<Vec<HwmRow>, tokio_postgres::Error>> + Send {
        PgHwmStore::load(self, client, group, partitions)
    }

    fn process<T, E, F>(
        &self,
        client: &mut Client,
        position: &Position,
        meta: &RecordMeta,
        handler: F,
    ) -> impl Future<Output = Result<Outcome<T>, ProcessError<E>>>
    where
        F: AsyncFnOnce(&Transaction<'_>) -> Result<T, E>,
    {
        PgHwmStore::process(self, client, position, meta, handler)
    }
}
