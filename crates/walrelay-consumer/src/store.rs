//! The high-water mark store: check a record against its partition's mark
//! and advance the mark in the same transaction as the side effects.

use std::future::Future;
use std::sync::Arc;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, IsolationLevel, Transaction};
use walrelay_contract::{EventKey, ParseEventKeyError};

use crate::meta::RecordMeta;
use crate::metrics::Counters;
use crate::statements;

/// The high-water mark of a row that has seen nothing yet: 32 zeros, below
/// every key walrelay issues.
pub const INITIAL_HWM: EventKey = EventKey::MIN;

/// Where a record was consumed: the consumer group and the topic partition.
/// Together with the record's source it names one high-water mark.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Position {
    /// The consumer group (`group.id`), or any name that identifies one
    /// logical consumer whose side effects the marks protect.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
}

impl Position {
    /// A position from its parts.
    pub fn new(group: impl Into<String>, topic: impl Into<String>, partition: i32) -> Position {
        Position {
            group: group.into(),
            topic: topic.into(),
            partition,
        }
    }
}

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

/// Why a record could not be processed. In every case the transaction was
/// rolled back: the side effects are not committed and the high-water mark
/// is unchanged, so a redelivery of the record is processed normally.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError<E> {
    /// The handler returned an error.
    #[error("the record handler failed (rolled back; the high-water mark is unchanged): {0}")]
    Handler(E),
    /// A database error (connection lost, serialization failure, a
    /// statement of the handler that aborted the transaction, ...). Usually
    /// worth retrying the record.
    #[error("database error while processing a record (rolled back): {0}")]
    Db(#[from] tokio_postgres::Error),
    /// The stored high-water mark is not a key. The table's CHECK
    /// constraint prevents this unless it was changed.
    #[error("the stored high-water mark {value:?} is not a 32-hex-digit key: {source}")]
    CorruptHwm {
        /// The stored text.
        value: String,
        /// What is wrong with it.
        source: ParseEventKeyError,
    },
    /// The high-water mark row disappeared between creating and locking it
    /// (someone deleted it concurrently, or the session runs at an
    /// isolation level above READ COMMITTED).
    #[error(
        "the high-water mark row for {group}/{topic}/{partition}/{source_id} vanished between \
         creating and locking it (deleted concurrently, or not READ COMMITTED)"
    )]
    RowVanished {
        /// Consumer group.
        group: String,
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Source (`walrelay-source`).
        source_id: String,
    },
}

/// One stored high-water mark.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HwmRow {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Source (`walrelay-source`).
    pub source: String,
    /// The mark: the highest key processed.
    pub hwm: EventKey,
}

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
                crate::statements::HWM_READ_ONE,
                &params(position, &source)[..],
            )
            .await?;
        row.map(|row| parse_hwm(row.get(0))).transpose()
    }

    /// Processes one record exactly once.
    ///
    /// In one transaction (READ COMMITTED unless configured otherwise):
    ///
    /// 1. Lock the mark row of (`position`, `meta.source`) with
    ///    `SELECT ... FOR UPDATE`, creating it first at 32 zeros if it does
    ///    not exist (`INSERT ... ON CONFLICT DO NOTHING`). Concurrent
    ///    deliveries of the same partition and source wait here for each
    ///    other.
    /// 2. If `meta.key <= hwm`: roll back and return
    ///    [`Outcome::Duplicate`]. The handler does not run.
    /// 3. Run `handler` with the transaction. On error: roll back and
    ///    return [`ProcessError::Handler`]; nothing it did is committed
    ///    and the mark is unchanged.
    /// 4. Set the mark to `meta.key` and commit: [`Outcome::Processed`].
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
        let result = self.process_inner(client, position, meta, handler).await;
        match &result {
            Ok(Outcome::Processed(_)) => Counters::incr(&self.counters.processed),
            Ok(Outcome::Duplicate { .. }) => Counters::incr(&self.counters.duplicates),
            Err(_) => Counters::incr(&self.counters.errors),
        }
        result
    }

    async fn process_inner<T, E, F>(
        &self,
        client: &mut Client,
        position: &Position,
        meta: &RecordMeta,
        handler: F,
    ) -> Result<Outcome<T>, ProcessError<E>>
    where
        F: AsyncFnOnce(&Transaction<'_>) -> Result<T, E>,
    {
        let tx = client
            .build_transaction()
            .isolation_level(self.isolation)
            .start()
            .await?;
        let hwm = lock_hwm(&tx, position, &meta.source).await?;
        if meta.key <= hwm {
            tx.rollback().await?;
            tracing::debug!(
                topic = %position.topic,
                partition = position.partition,
                source = %meta.source,
                key = %meta.key,
                %hwm,
                "duplicate skipped"
            );
            return Ok(Outcome::Duplicate { hwm });
        }
        let gap = match meta.prev_key {
            Some(prev) if hwm != INITIAL_HWM && prev > hwm => Some(prev),
            _ => None,
        };

        let value = match handler(&tx).await {
            Ok(value) => value,
            Err(e) => {
                if let Err(rollback) = tx.rollback().await {
                    // The connection is likely gone; the server rolls back.
                    tracing::debug!("rollback after a handler error failed: {rollback}");
                }
                return Err(ProcessError::Handler(e));
            }
        };
        let key = meta.key.to_hex();
        let mut p = params(position, &meta.source);
        p.push((&key, Type::TEXT));
        let updated = tx
            .execute_typed(statements::HWM_ADVANCE_ONE, &p[..])
            .await?;
        if updated != 1 {
            return Err(vanished(position, &meta.source));
        }
        tx.commit().await?;

        if let Some(prev) = gap {
            Counters::incr(&self.counters.gaps);
            tracing::warn!(
                topic = %position.topic,
                partition = position.partition,
                source = %meta.source,
                %hwm,
                prev = %prev,
                key = %meta.key,
                "gap: the record sent before this one was never processed by group {:?} \
                 (high-water mark {hwm} < previous key {prev})",
                position.group
            );
        }
        Ok(Outcome::Processed(value))
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

/// Locks the mark row, creating it at [`INITIAL_HWM`] first if needed.
async fn lock_hwm<E>(
    tx: &Transaction<'_>,
    position: &Position,
    source: &str,
) -> Result<EventKey, ProcessError<E>> {
    let p = params(position, &source);
    if let Some(row) = tx.query_typed_opt(statements::HWM_LOCK_ONE, &p[..]).await? {
        return parse_hwm(row.get(0));
    }
    tx.execute_typed(statements::HWM_CREATE_ONE, &p[..]).await?;
    match tx.query_typed_opt(statements::HWM_LOCK_ONE, &p[..]).await? {
        Some(row) => parse_hwm(row.get(0)),
        None => Err(vanished(position, source)),
    }
}

fn params<'a>(
    position: &'a Position,
    source: &'a (dyn ToSql + Sync),
) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    vec![
        (&position.group, Type::TEXT),
        (&position.topic, Type::TEXT),
        (&position.partition, Type::INT4),
        (source, Type::TEXT),
    ]
}

fn parse_hwm<E>(text: String) -> Result<EventKey, ProcessError<E>> {
    EventKey::from_hex(&text).map_err(|source| ProcessError::CorruptHwm {
        value: text,
        source,
    })
}

fn vanished<E>(position: &Position, source: &str) -> ProcessError<E> {
    ProcessError::RowVanished {
        group: position.group.clone(),
        topic: position.topic.clone(),
        partition: position.partition,
        source_id: source.to_owned(),
    }
}
