"""What follows from a job's outcome, on the loop's thread: store the
offset of a committed batch, or retry, or stop the partition.

Failures:

* a handler error rolls the batch back and retries it after a backoff
  (:attr:`Settings.retry`). After the last attempt :attr:`Settings.on_poison`
  decides for the failing record: stop the partition, or park it in the
  dead-letter table in the same transaction that moves the mark past it.
  The per-record handler says which record failed; for a batch handler the
  loop finds it by applying the batch one record per transaction;
* a database outage (:mod:`walrelay_consumer.outage`: a lost connection, a
  server shutting down, cannot connect), or a handler error on a connection
  that is gone, is not a poison record: the connection is replaced and the
  batch retried with backoff for as long as it takes, while the loop keeps
  polling (the partition pauses once its queue is full). Contention or a
  batch too large (a deadlock, a serialization failure, a statement
  timeout, out of shared memory) retries the failed batch's records in
  batches of half its size without counting, and counts at one record. Any
  other database error of the batch (a constraint checked at COMMIT)
  counts as an attempt, like a handler error, and so does a handler call
  running past :attr:`Settings.handler_timeout`; attempts are counted per
  record;
* a handler that ended the batch's transaction itself (ran ``COMMIT`` or
  ``ROLLBACK``) stops its partition whatever the poison policy: atomicity
  was broken, no retry can repair it;
* a record without walrelay headers goes to the same policy, alone.
"""

from __future__ import annotations

import logging
import time

from .. import parked
from ..apply import BatchOutcome, CorruptHwm, HandlerEndedTransaction, HandlerFailed
from ..outage import ErrorClass, class_of
from ..partition import Apply, ParkUnkeyed
from .context import LoopContext
from .job import Job

__all__ = ["finish"]

log = logging.getLogger("walrelay_consumer")


def finish(ctx: LoopContext, job: Job) -> None:
    """Acts on a job's outcome, on the loop's thread."""
    ctx.counters.add(job.counters)
    assert job.result is not None
    if isinstance(job.step, ParkUnkeyed):
        assert isinstance(job.result, (bool, Exception))
        _unkeyed_done(ctx, job, job.result)
        return
    assert not isinstance(job.result, bool)
    _batch_done(ctx, job, job.result)


def _unkeyed_done(ctx: LoopContext, job: Job, written: bool | Exception) -> None:
    """Acts on parking a record without walrelay headers."""
    tp, p = job.tp, job.p
    if isinstance(written, parked.OffsetReused):
        # Refused rather than guessed: the partition stops.
        p.put_back(job.records)
        ctx.stop_partition(tp, p, str(written))
        return
    if isinstance(written, Exception):
        p.put_back(job.records)
        if class_of(written, job.conn_gone) is not ErrorClass.BATCH:
            # An outage, or contention on a one-row insert: not the record's.
            _outage(ctx, job, written)
        else:
            ctx.stop_partition(
                tp,
                p,
                f"parking record {tp[0]}/{tp[1]} at offset {job.first_offset} (no walrelay "
                f"headers) failed, not for an outage: {written}",
            )
        return
    if written:
        ctx.counters.parked += 1
        ctx.metrics.parked_unkeyed()
    log.warning(
        "record without walrelay headers %s walrelay_consumer_parked (topic %s partition %d offset %d)",
        "parked in" if written else "delivered again, already parked (the same record) in",
        tp[0],
        tp[1],
        job.first_offset,
    )
    p.committed(1)
    ctx.kafka.store_offset(tp, job.first_offset)


def _batch_done(ctx: LoopContext, job: Job, result: BatchOutcome | Exception) -> None:
    """Acts on a batch's outcome: store the offset, or retry, or stop."""
    tp, p, records = job.tp, job.p, job.records
    if isinstance(result, (CorruptHwm, HandlerEndedTransaction)):
        p.put_back(records)
        ctx.stop_partition(tp, p, str(result))
        return
    if isinstance(result, Exception):
        ctx.metrics.failed()
        p.put_back(records)
        kind = class_of(result, job.conn_gone)
        if kind is ErrorClass.SHRINK:
            _contended(ctx, job, result)
        elif isinstance(result, HandlerFailed) and kind is ErrorClass.BATCH:
            _handler_failed(ctx, job, result)
        elif kind is ErrorClass.OUTAGE:
            # The database is unreachable or going away (or a handler failed
            # on a connection that is gone): not the batch's fault.
            _outage(ctx, job, result)
        else:
            _batch_failed(ctx, job, result)
        return
    ctx.metrics.committed(tp[0], tp[1], len(records), time.monotonic() - job.started, result)
    if result.parked:
        log.warning(
            "record parked in walrelay_consumer_parked after its last attempt "
            "(topic %s partition %d offset %d)",
            tp[0],
            tp[1],
            job.last_offset,
        )
    p.learn(result.marks)
    p.committed(len(records))
    ctx.kafka.store_offset(tp, job.last_offset)


def _handler_failed(ctx: LoopContext, job: Job, result: HandlerFailed) -> None:
    """The handler raised: an attempt, of the failing record when known."""
    tp, records = job.tp, job.records
    n = job.p.handler_failed(str(result.error), result.index, len(records), ctx.settings, job.started)
    offset = records[result.index].record.offset if result.index is not None else None
    log.warning(
        "handler failed (attempt %d of %d, topic %s partition %d offset %s), batch of %d "
        "rolled back and retried: %r",
        n,
        ctx.settings.retry.attempts,
        tp[0],
        tp[1],
        offset,
        len(records),
        result.error,
    )


def _batch_failed(ctx: LoopContext, job: Job, error: Exception) -> None:
    """The batch's transaction failed for a reason of its own (a
    constraint checked at COMMIT, a serialization failure, a statement
    the handler let fail): an attempt, like a handler failure."""
    tp, p = job.tp, job.p
    if isinstance(job.step, Apply) and job.step.park is not None:
        # Parking wrote nothing, for a reason that would come again.
        ctx.stop_partition(
            tp, p, f"parking record {tp[0]}/{tp[1]} at offset {job.last_offset} failed, not for an outage: {error}"
        )
        return
    n = p.handler_failed(str(error), None, len(job.records), ctx.settings, job.started)
    log.warning(
        "the transaction of a batch failed, not for a database outage (attempt %d of %d, topic "
        "%s partition %d offsets %d..%d; a batch of several is then applied one record per "
        "transaction to find the record): %s",
        n,
        ctx.settings.retry.attempts,
        tp[0],
        tp[1],
        job.first_offset,
        job.last_offset,
        error,
    )


def _contended(ctx: LoopContext, job: Job, error: Exception) -> None:
    """The batch failed for contention or for its size, not for a record:
    its records are retried in smaller batches, counted at one."""
    cause = error.error if isinstance(error, HandlerFailed) else error
    n = job.p.contended(str(cause), len(job.records), ctx.settings, job.started)
    log.warning(
        "a batch failed for contention or for its size (topic %s partition %d offsets %d..%d), "
        "rolled back and retried %s: %s",
        job.tp[0],
        job.tp[1],
        job.first_offset,
        job.last_offset,
        f"in batches of {len(job.records) // 2}, not counted" if n is None
        else f"(attempt {n} of {ctx.settings.retry.attempts} of the record)",
        cause,
    )


def _outage(ctx: LoopContext, job: Job, error: Exception) -> None:
    """A database failure: replace the connection, retry with backoff
    for as long as it takes."""
    ctx.close_db()
    now = job.started
    n = job.p.db_failed(ctx.settings, now)
    if n & (n - 1) == 0:
        log.warning(
            "database unavailable, the batch will be retried on a new connection in %.2fs "
            "(topic %s partition %d; logged at 1, 2, 4, 8... failures, now %d): %s",
            (job.p.retry_at or now) - now,
            job.tp[0],
            job.tp[1],
            n,
            error,
        )
