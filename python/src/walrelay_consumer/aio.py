"""The batch transaction for asyncio services (FastAPI, aiohttp): the same
statements, locks and outcomes as :mod:`walrelay_consumer.apply`, on
psycopg's ``AsyncConnection``, so it runs inside an existing event loop.

The consumer loop on top of it is
:class:`~walrelay_consumer.AsyncConsumerLoop` (which also parks records
without walrelay headers here, :func:`insert_unkeyed_async`);
:func:`redrive_async` re-drives parked records on an ``AsyncConnection``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from psycopg import pq

from . import batch, parked
from .handler_timeout import call_async
from .parked import (
    INSERT_UNKEYED_SQL,
    SAME_UNKEYED_SQL,
    TAKE_SQL,
    RedriveReport,
    parked_delivery,
    row_params,
    settle,
    unkeyed_parked_before,
)
from .apply import (
    ADVANCE_SQL,
    ENSURE_SQL,
    LOCK_SQL,
    BatchOutcome,
    DatabaseFailed,
    Park,
    RowVanished,
    _advance_params,
    _check_ended,
    _check_parked,
    _check_same_transaction,
    _count,
    _Failed,
    _marks_of,
    _outcome,
    _params,
    _require_idle,
    _Split,
    _xact_of,
)
from .counters import Counters
from .records import Delivery, Position, Record

__all__ = [
    "AsyncApply",
    "AsyncBatchHandler",
    "AsyncRecordHandler",
    "apply_batch_async",
    "insert_unkeyed_async",
    "per_batch_async",
    "per_record_async",
    "process_batch_async",
    "process_records_async",
    "redrive_async",
]

#: Awaited once per batch with its new records, inside the transaction.
AsyncBatchHandler = Callable[["psycopg.AsyncConnection[Any]", Sequence[Delivery]], Awaitable[object]]
#: Awaited once per new record, in order, inside the transaction.
AsyncRecordHandler = Callable[["psycopg.AsyncConnection[Any]", Delivery], Awaitable[object]]

#: A handler adapted to the batch transaction (:func:`per_batch_async`,
#: :func:`per_record_async`).
AsyncApply = Callable[["psycopg.AsyncConnection[Any]", list[Delivery]], Awaitable[None]]


def per_batch_async(handler: AsyncBatchHandler, timeout: float | None = None) -> AsyncApply:
    """Adapts an async batch handler, each call bounded by ``timeout``
    seconds (:func:`~walrelay_consumer.handler_timeout.call_async`); a batch
    of one knows its failing record."""

    async def apply(conn: psycopg.AsyncConnection[Any], new: list[Delivery]) -> None:
        try:
            await call_async(handler(conn, new), timeout)
        except Exception as e:
            raise _Failed(e, 0 if len(new) == 1 else None) from e

    return apply


def per_record_async(handler: AsyncRecordHandler, timeout: float | None = None) -> AsyncApply:
    """Adapts an async per-record handler: each record in order, each call
    bounded by ``timeout`` seconds, the failing one named."""

    async def apply(conn: psycopg.AsyncConnection[Any], new: list[Delivery]) -> None:
        for index, delivery in enumerate(new):
            try:
                await call_async(handler(conn, delivery), timeout)
            except Exception as e:
                raise _Failed(e, index) from e

    return apply


async def process_batch_async(
    conn: psycopg.AsyncConnection[Any],
    position: Position,
    records: Sequence[Delivery],
    handler: AsyncBatchHandler,
    counters: Counters | None = None,
) -> BatchOutcome:
    """:func:`walrelay_consumer.process_batch` on an ``AsyncConnection``:
    one batch of one partition exactly once, in one transaction."""
    return await apply_batch_async(conn, position, records, per_batch_async(handler), counters=counters)


async def process_records_async(
    conn: psycopg.AsyncConnection[Any],
    position: Position,
    records: Sequence[Delivery],
    handler: AsyncRecordHandler,
    counters: Counters | None = None,
) -> BatchOutcome:
    """:func:`process_batch_async` with a per-record handler."""
    return await apply_batch_async(conn, position, records, per_record_async(handler), counters=counters)


async def apply_batch_async(
    conn: psycopg.AsyncConnection[Any],
    position: Position,
    records: Sequence[Delivery],
    apply: AsyncApply,
    *,
    park: Park | None = None,
    known: bool = False,
    counters: Counters | None = None,
) -> BatchOutcome:
    """:func:`walrelay_consumer.apply.apply_batch` on an ``AsyncConnection``."""
    try:
        outcome = await _apply(conn, position, records, apply, park, known)
    except BaseException:
        if counters is not None:
            counters.errors += 1
        raise
    _count(counters, outcome)
    return outcome


async def _apply(
    conn: psycopg.AsyncConnection[Any],
    position: Position,
    records: Sequence[Delivery],
    apply: AsyncApply,
    park: Park | None,
    known: bool,
) -> BatchOutcome:
    _require_idle(conn.info.transaction_status)
    sources = batch.sources(d.meta for d in records)
    metas = [d.meta for d in records]
    try:
        async with conn.transaction():
            cur = psycopg.AsyncRawCursor(conn)
            marks, xact = await _lock_marks(cur, position, sources, known)
            plan = batch.plan(marks, metas)
            split = _Split.of(plan, len(records), park)
            if split.take:
                new = [records[i] for i in split.take]
                try:
                    await apply(conn, new)
                except _Failed as failed:
                    _check_ended(conn.info.transaction_status, position, new, failed)
                    raise split.handler_failed(failed) from failed.error
                _check_ended(conn.info.transaction_status, position, new, None)
                if conn.info.transaction_status == pq.TransactionStatus.INERROR:
                    raise split.swallowed()
            if park is not None and split.parked_is_new:
                d = records[-1]
                await cur.execute(
                    parked.INSERT_SQL,
                    parked.row_params(position, d.record, d.meta.key, d.meta.source, park.error, park.attempts),
                )
                _check_parked(position, d, cur.rowcount)
            if plan.raised:
                p, rows = _advance_params(position, plan.raised)
                await cur.execute(ADVANCE_SQL, p)
                if cur.rowcount != rows:
                    raise RowVanished(",".join(plan.raised))
                if split.take:
                    after = _xact_of(await cur.fetchall())
                    _check_same_transaction(xact, after, position, [records[i] for i in split.take])
    except psycopg.Error as e:
        raise DatabaseFailed(e) from e
    return _outcome(position, plan, marks, split)


async def _lock_marks(
    cur: psycopg.AsyncRawCursor[Any], position: Position, sources: list[str], known: bool
) -> tuple[dict[str, str], str | None]:
    p = _params(position, sources)
    if not known:
        await cur.execute(ENSURE_SQL, p)
    rows = await (await cur.execute(LOCK_SQL, p)).fetchall()
    if len(rows) < len(sources) and known:
        await cur.execute(ENSURE_SQL, p)
        rows = await (await cur.execute(LOCK_SQL, p)).fetchall()
    return _marks_of(rows, sources), _xact_of(rows)


async def insert_unkeyed_async(
    conn: psycopg.AsyncConnection[Any], position: Position, record: Record, error: str
) -> bool:
    """:func:`walrelay_consumer.parked.insert_unkeyed` on an
    ``AsyncConnection``: parks a record without usable walrelay headers in
    its own transaction; whether a row was written."""
    params = row_params(position, record, None, None, error, 1)
    async with conn.transaction():
        cur = psycopg.AsyncRawCursor(conn)
        await cur.execute(INSERT_UNKEYED_SQL, params)
        if cur.rowcount == 1:
            return True
        await cur.execute(SAME_UNKEYED_SQL, params[:4] + params[6:10])
        row = await cur.fetchone()
    return unkeyed_parked_before(position, record, row)


async def redrive_async(
    conn: psycopg.AsyncConnection[Any],
    group: str,
    handler: AsyncRecordHandler,
) -> RedriveReport:
    """:func:`walrelay_consumer.redrive` on an ``AsyncConnection``: the
    parked records of ``group``, oldest first, each awaited through
    ``handler`` in its own transaction that also deletes its row; a record
    that fails again stays parked (``attempts`` and ``error`` updated)."""
    report = RedriveReport()
    after = 0
    while True:
        async with conn.transaction():
            cur = psycopg.AsyncRawCursor(conn)
            await cur.execute(TAKE_SQL, [group, after])
            row = await cur.fetchone()
            if row is None:
                return report
            after, delivery = parked_delivery(group, row)
            if delivery is None:
                report.unusable += 1
                continue
            failure: Exception | None = None
            try:
                async with conn.transaction():
                    await handler(conn, delivery)
            except Exception as e:  # the handler's failure, rolled back to the savepoint
                failure = e
            await cur.execute(*settle(report, after, delivery, failure))
