//! What the loop does when a job ends: one handler per outcome (a
//! committed batch, a parked record without walrelay headers, a failed
//! batch), each deciding whether the records are done, retried or stop
//! their partition; then the partition's bookkeeping and the offset.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::super::context::LoopContext;
use super::super::failure::{
    failure_of, prepared_gone, stop_message, Failure, Retry, PREPARED_GONE,
};
use super::super::handler_call::HandlerFailure;
use super::super::job::{Done, JobResult, TopicPartition};
use super::super::partition::Queued;
use super::super::StoppedPartition;
use super::Driver;
use crate::apply::{BatchError, BatchOutcome};
use crate::metrics::{MarkLabels, PartitionLabels};
use crate::outage::is_outage;
use crate::parked::ParkUnkeyedError;

/// How a job's records settled.
enum Settled {
    /// Committed (applied, duplicates, or parked): the partition moves on.
    Done(Vec<Queued>),
    /// Rolled back: put back and retried as `retry` says.
    Retry {
        records: Vec<Queued>,
        error: String,
        index: Option<usize>,
        retry: Retry,
    },
    /// The partition stopped (its records were put back first).
    Stopped,
}

impl Driver<'_> {
    /// Acts on a finished job.
    pub(super) fn finish<E: std::fmt::Display + 'static>(&mut self, done: Done<E>) {
        let Done {
            tp,
            generation,
            records,
            client,
            started,
            connecting,
            handler,
            ended,
            parking,
            discard,
            result,
        } = done;
        let now = Instant::now();
        self.clock.job(
            connecting,
            handler,
            ended.saturating_duration_since(started),
        );
        let lost_connection = !discard && client.as_ref().is_none_or(|c| c.client.is_closed());
        self.pool.give_back(client.filter(|_| !discard));
        let Some(p) = self
            .partitions
            .get_mut(&tp)
            .filter(|p| p.generation == generation)
        else {
            // Revoked meanwhile: whatever committed is covered by the
            // marks; the new owner reads the rest.
            return;
        };
        p.busy = false;
        let settled = match result {
            JobResult::Batch(Ok(outcome)) => {
                self.batch_committed(&tp, records, &outcome, now.duration_since(started))
            }
            JobResult::Batch(Err(e)) => {
                self.batch_failed(&tp, records, &e, lost_connection, parking)
            }
            JobResult::ParkedUnkeyed(result) => {
                self.unkeyed_parked(&tp, records, result, lost_connection)
            }
        };
        match settled {
            Settled::Done(records) => {
                let Some(p) = self.partitions.get_mut(&tp) else {
                    return;
                };
                p.committed(records.len(), now);
                if let Some(last) = records.last() {
                    store_offset(self.consumer, &tp, last.message.offset(), &mut self.stored);
                }
            }
            Settled::Retry {
                records,
                error,
                index,
                retry,
            } => self.retry(&tp, records, error, index, retry, now),
            Settled::Stopped => {}
        }
    }

    /// A committed batch: the marks it learned, metrics, and a log line
    /// when its last record was parked.
    fn batch_committed(
        &mut self,
        tp: &TopicPartition,
        records: Vec<Queued>,
        outcome: &BatchOutcome,
        took: Duration,
    ) -> Settled {
        if let Some(p) = self.partitions.get_mut(tp) {
            p.learn(&outcome.marks);
        }
        self.metrics.batches.inc();
        self.metrics.batch_records.observe(records.len() as f64);
        self.metrics.apply_seconds.observe(took.as_secs_f64());
        for (source, key) in &outcome.marks {
            let lsn = i64::try_from(key.high()).unwrap_or(i64::MAX);
            self.metrics
                .hwm_commit_lsn
                .get_or_create(&MarkLabels {
                    topic: tp.0.clone(),
                    partition: tp.1,
                    source: source.clone(),
                })
                .set(lsn);
        }
        if outcome.parked {
            if let Some(last) = records.last() {
                tracing::warn!(
                    topic = %tp.0,
                    partition = tp.1,
                    offset = last.message.offset(),
                    "record parked in walrelay_consumer_parked after its last attempt"
                );
            }
        }
        Settled::Done(records)
    }

    /// A rolled-back batch: stop the partition, or retry as the error's
    /// class says ([`failure_of`]).
    fn batch_failed<E: std::fmt::Display + 'static>(
        &mut self,
        tp: &TopicPartition,
        records: Vec<Queued>,
        e: &BatchError<HandlerFailure<E>>,
        lost_connection: bool,
        parking: bool,
    ) -> Settled {
        let (index, retry) = match failure_of(e, lost_connection, parking) {
            Failure::Stop => {
                let error = stop_message(tp, &records, e, parking);
                return self.put_back_and_stop(tp, records, error);
            }
            Failure::Outage => (None, Retry::Outage),
            Failure::Shrink => (None, Retry::Shrink),
            Failure::Attempt(index) => (index, Retry::Attempt),
        };
        let mut error = e.to_string();
        if prepared_gone(e) {
            error.push_str(PREPARED_GONE);
            if self.pool.stop_preparing() {
                tracing::warn!(
                    "the loop's prepared statements were dropped from a connection's session: \
                     new connections send them unnamed from now on (a DISCARD ALL or DEALLOCATE \
                     in the handler, or a pooler that does not keep prepared statements with the \
                     session, such as PgBouncer in transaction mode; set \
                     Settings::prepared_statements to false behind such a pooler): {e}"
                );
            }
        }
        Settled::Retry {
            records,
            error,
            index,
            retry,
        }
    }

    /// A record without walrelay headers, parked (or found parked) or not.
    fn unkeyed_parked(
        &mut self,
        tp: &TopicPartition,
        records: Vec<Queued>,
        result: Result<bool, ParkUnkeyedError>,
        lost_connection: bool,
    ) -> Settled {
        match result {
            Ok(written) => {
                if written {
                    self.store.counters().parked.inc();
                }
                if let Some(last) = records.last() {
                    tracing::warn!(
                        topic = %tp.0,
                        partition = tp.1,
                        offset = last.message.offset(),
                        "record without walrelay headers {} walrelay_consumer_parked",
                        if written {
                            "parked in"
                        } else {
                            "delivered again, already parked (the same record) in"
                        }
                    );
                }
                Settled::Done(records)
            }
            // Refused rather than guessed: the partition stops.
            Err(e @ ParkUnkeyedError::OffsetReused { .. }) => {
                self.put_back_and_stop(tp, records, e.to_string())
            }
            Err(ParkUnkeyedError::Db(e)) if !lost_connection && !is_outage(&e) => {
                let offset = records.first().map_or(-1, |r| r.message.offset());
                let error = format!(
                    "parking record {}/{} at offset {offset} (no walrelay headers) failed, not \
                     for a database outage: {e}",
                    tp.0, tp.1
                );
                self.put_back_and_stop(tp, records, error)
            }
            Err(e) => Settled::Retry {
                records,
                error: e.to_string(),
                index: None,
                retry: Retry::Outage,
            },
        }
    }

    fn put_back_and_stop(
        &mut self,
        tp: &TopicPartition,
        records: Vec<Queued>,
        error: String,
    ) -> Settled {
        if let Some(p) = self.partitions.get_mut(tp) {
            p.put_back(records);
        }
        self.stop(tp, error);
        Settled::Stopped
    }

    /// Stops a partition: nothing of it is applied or committed until a
    /// restart, its queue is emptied and its fetching paused.
    pub(super) fn stop(&mut self, tp: &TopicPartition, error: String) {
        let Some(p) = self.partitions.get_mut(tp) else {
            return;
        };
        tracing::error!(
            topic = %tp.0,
            partition = tp.1,
            "partition stopped (nothing of it is applied or committed until a restart; the \
             other partitions go on): {error}"
        );
        p.stopped = Some(error.clone());
        let dropped = p.take(p.queue.len());
        drop(dropped);
        p.paused = true;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&tp.0, tp.1);
        if let Err(e) = self.consumer.pause(&tpl) {
            tracing::warn!("pausing the stopped partition failed: {e}");
        }
        self.metrics
            .stopped
            .get_or_create(&PartitionLabels {
                topic: tp.0.clone(),
                partition: tp.1,
            })
            .set(1);
        self.stopped.push(StoppedPartition {
            topic: tp.0.clone(),
            partition: tp.1,
            error,
        });
    }

    /// Puts a failed batch back and schedules its retry (see [`Retry`]).
    fn retry(
        &mut self,
        tp: &TopicPartition,
        records: Vec<Queued>,
        error: String,
        index: Option<usize>,
        retry: Retry,
        now: Instant,
    ) {
        let Some(p) = self.partitions.get_mut(tp) else {
            return;
        };
        let take = records.len();
        let first = records.first().map_or(-1, |r| r.message.offset());
        let last = records.last().map_or(-1, |r| r.message.offset());
        let offset = index
            .and_then(|i| records.get(i))
            .map(|r| r.message.offset());
        p.put_back(records);
        self.metrics.retries.inc();
        match retry {
            Retry::Shrink => match p.contended(error.clone(), take, &self.settings, now) {
                None => tracing::info!(
                    topic = %tp.0,
                    partition = tp.1,
                    offsets = %format_args!("{first}..{last}"),
                    "batch of {take} rolled back for contention or for its size, retried in \
                     batches of half its size (not counted as an attempt until a batch of one \
                     record): {error}"
                ),
                Some(n) => tracing::warn!(
                    topic = %tp.0,
                    partition = tp.1,
                    attempt = n,
                    attempts = self.settings.retry.attempts,
                    offset = first,
                    "record rolled back for contention or a statement timeout on its own \
                     (counted as an attempt): {error}"
                ),
            },
            Retry::Outage => {
                // Replace the connections, retry until it works.
                self.pool.drop_idle();
                let n = p.db_failed(&self.settings, now);
                if n.is_power_of_two() {
                    tracing::warn!(
                        topic = %tp.0,
                        partition = tp.1,
                        failures = n,
                        retry_in = ?p.backoff_left(now),
                        "database unavailable, the batch will be retried on a new connection \
                         (meanwhile the partition reads at most two batches ahead; logged at 1, \
                         2, 4, 8... failures): {error}"
                    );
                }
            }
            Retry::Attempt => {
                let n = p.handler_failed(error.clone(), index, take, &self.settings, now);
                tracing::warn!(
                    topic = %tp.0,
                    partition = tp.1,
                    attempt = n,
                    attempts = self.settings.retry.attempts,
                    offset,
                    offsets = %format_args!("{first}..{last}"),
                    "batch of {take} rolled back and retried (not a database outage: counted as \
                     an attempt; a batch of several whose failing record is unknown is then \
                     applied one record per transaction): {error}"
                );
            }
        }
    }
}

/// Stores `offset + 1` as the next offset to commit.
pub(super) fn store_offset(
    consumer: &Arc<StreamConsumer<LoopContext>>,
    tp: &TopicPartition,
    offset: i64,
    stored: &mut bool,
) {
    let mut tpl = TopicPartitionList::new();
    let stored_ok = tpl
        .add_partition_offset(&tp.0, tp.1, Offset::Offset(offset + 1))
        .and_then(|()| consumer.store_offsets(&tpl));
    match stored_ok {
        Ok(()) => *stored = true,
        // Revoked meanwhile: the new owner skips it by its mark.
        Err(e) => tracing::debug!("storing the offset failed: {e}"),
    }
}
