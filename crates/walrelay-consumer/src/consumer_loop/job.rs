//! The database jobs the loop starts: a batch of records, or parking a
//! record without walrelay's headers, each on a leased connection, and
//! what each reports back when it finishes.
//!
//! A batch job is where the service's handler is called, so the [`Apply`]
//! trait (a per-record or a batch handler, behind one call per batch)
//! lives here, beside its one caller, rather than in the loop's public
//! façade (`mod.rs`), which only picks the implementation.

use std::time::{Duration, Instant};

use tokio_postgres::Transaction;

use super::handler_call::{Bound, HandlerFailure};
use super::partition::Queued;
use crate::apply::{BatchError, BatchOutcome, Failed, Park};
use crate::delivery::Delivery;
use crate::parked::{self, ParkUnkeyedError};
use crate::pool::{Conn, Lease};
use crate::position::Position;
use crate::store::PgHwmStore;

pub(super) type TopicPartition = (String, i32);

/// What a finished database job reports back.
pub(super) struct Done<E> {
    pub(super) tp: TopicPartition,
    pub(super) generation: u64,
    pub(super) records: Vec<Queued>,
    pub(super) client: Option<Conn>,
    pub(super) started: Instant,
    /// Spent waiting for the connection, and in the handler.
    pub(super) connecting: Duration,
    pub(super) handler: Duration,
    /// When the job ended.
    pub(super) ended: Instant,
    /// The batch parked its last record.
    pub(super) parking: bool,
    /// The handler timed out: the connection is not given back (its
    /// statement was cancelled; it may still be busy).
    pub(super) discard: bool,
    pub(super) result: JobResult<HandlerFailure<E>>,
}

pub(super) enum JobResult<E> {
    Batch(Result<BatchOutcome, BatchError<E>>),
    ParkedUnkeyed(Result<bool, ParkUnkeyedError>),
}

/// A database job to start: a batch, or parking a record without headers.
pub(super) struct Job {
    pub(super) lease: Lease,
    pub(super) position: Position,
    pub(super) generation: u64,
    pub(super) records: Vec<Queued>,
    pub(super) kind: JobKind,
}

pub(super) enum JobKind {
    Batch { park: Option<Park>, known: bool },
    ParkUnkeyed { error: String },
}

/// How the loop hands records to the service: one at a time or a whole
/// batch, always inside the batch's transaction, each call through
/// `bound` (panics caught, the handler timeout).
pub(super) trait Apply<E> {
    async fn apply(
        &self,
        tx: &Transaction<'_>,
        records: &[Delivery<'_>],
        bound: &mut Bound<'_>,
    ) -> Result<(), Failed<HandlerFailure<E>>>;
}

/// The per-record handler, called for each new record of a batch.
pub(super) struct PerRecord<H>(pub(super) H);

impl<E, H> Apply<E> for PerRecord<H>
where
    H: AsyncFn(&Transaction<'_>, &Delivery<'_>) -> Result<(), E>,
{
    async fn apply(
        &self,
        tx: &Transaction<'_>,
        records: &[Delivery<'_>],
        bound: &mut Bound<'_>,
    ) -> Result<(), Failed<HandlerFailure<E>>> {
        for (index, record) in records.iter().enumerate() {
            bound
                .call((self.0)(tx, record))
                .await
                .map_err(|error| Failed {
                    index: Some(index),
                    error,
                })?;
        }
        Ok(())
    }
}

/// The batch handler, called once with the new records of a batch.
pub(super) struct PerBatch<H>(pub(super) H);

impl<E, H> Apply<E> for PerBatch<H>
where
    H: AsyncFn(&Transaction<'_>, &[Delivery<'_>]) -> Result<(), E>,
{
    async fn apply(
        &self,
        tx: &Transaction<'_>,
        records: &[Delivery<'_>],
        bound: &mut Bound<'_>,
    ) -> Result<(), Failed<HandlerFailure<E>>> {
        bound
            .call((self.0)(tx, records))
            .await
            .map_err(|error| Failed {
                index: (records.len() == 1).then_some(0),
                error,
            })
    }
}

/// Runs a job on its connection and reports back. A handler call longer
/// than `handler_timeout` fails the batch.
pub(super) async fn run_job<E, A: Apply<E>>(
    apply: &A,
    store: &PgHwmStore,
    handler_timeout: Option<Duration>,
    job: Job,
) -> Done<E> {
    let Job {
        lease,
        position,
        generation,
        records,
        kind,
    } = job;
    let started = Instant::now();
    let tp = (position.topic.clone(), position.partition);
    let parking = matches!(&kind, JobKind::Batch { park: Some(_), .. });
    let leased = lease.conn().await;
    // Not a `Cell`: the loop's future must stay `Send`.
    let mut handler = Duration::ZERO;
    let mut conn = match leased {
        Ok(conn) => conn,
        Err(e) => {
            let connecting = started.elapsed();
            let result = match kind {
                JobKind::Batch { .. } => JobResult::Batch(Err(BatchError::Db(e))),
                JobKind::ParkUnkeyed { .. } => JobResult::ParkedUnkeyed(Err(e.into())),
            };
            return Done {
                tp,
                generation,
                records,
                client: None,
                started,
                connecting,
                handler: Duration::ZERO,
                ended: Instant::now(),
                parking,
                discard: false,
                result,
            };
        }
    };
    let connecting = started.elapsed();
    let mut discard = false;
    let result = match kind {
        JobKind::Batch { park, known } => 'batch: {
            // Preparing fails like the batch's own statements would: the
            // error is classified the same way.
            if let Err(e) = conn.prepare().await {
                break 'batch JobResult::Batch(Err(BatchError::Db(e)));
            }
            let (client, statements) = conn.parts();
            let cancel = client.cancel_token();
            let mut bound = Bound::new(handler_timeout, &cancel);
            let deliveries: Vec<Delivery<'_>> = records
                .iter()
                .filter_map(|r| {
                    r.meta.as_ref().ok().map(|meta| Delivery {
                        message: &r.message,
                        meta,
                        position: &position,
                    })
                })
                .collect();
            let result = store
                .apply_batch(
                    client,
                    statements,
                    &position,
                    &deliveries,
                    park.as_ref(),
                    known,
                    async |tx, new| {
                        let t = Instant::now();
                        let result = apply.apply(tx, new, &mut bound).await;
                        handler += t.elapsed();
                        result
                    },
                )
                .await;
            discard = bound.timed_out();
            JobResult::Batch(result)
        }
        JobKind::ParkUnkeyed { error } => JobResult::ParkedUnkeyed(match records.first() {
            Some(record) => {
                parked::insert_unkeyed(&mut conn.client, &position, &record.message, &error).await
            }
            None => Ok(false),
        }),
    };
    Done {
        tp,
        generation,
        records,
        client: Some(conn),
        started,
        connecting,
        handler,
        ended: Instant::now(),
        parking,
        discard,
        result,
    }
}
