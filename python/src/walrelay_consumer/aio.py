"""The batch transaction for asyncio services (FastAPI, aiohttp): the same
statements, locks and outcomes as :mod:`walrelay_consumer.apply`, on
psycopg's ``AsyncConnection``, so it runs inside an existing event loop.

Only the transaction exists in this flavour so far; an asyncio consumer
loop is not part of the package yet (feed it records from any client, or
run the blocking :class:`~walrelay_consumer.ConsumerLoop` in a thread).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from psycopg import pq

from . import batch, parked
from .apply import (
    ADVANCE_SQL,
    ENSURE_SQL,
    LOCK_SQL,
    BatchOutcome,
    CorruptHwm,
    DatabaseFailed,
    HandlerFailed,
    Park,
    RowVanished,
    _log_gaps,
)
from .counters import Counters
from .keys import KeyFormatError, parse_key
from .records import Delivery, Position

__all__ = ["AsyncBatchHandler", "AsyncRecordHandler", "process_batch_async", "process_records_async"]

#: Awaited once per batch with its new records, inside the transaction.
AsyncBatchHandler = Callable[["psycopg.AsyncConnection[Any]", Sequence[Delivery]], Awaitable[object]]
#: Awaited once per new record, in order, inside the transaction.
AsyncRecordHandler = Callable[["psycopg.AsyncConnection[Any]", Delivery], Awaitable[object]]

_AsyncApply = Callable[["psycopg.AsyncConnection[Any]", list[Delivery]], Awaitable[None]]


class _Failed(Exception):
    def __init__(self, error: BaseException, index: int | None) -> None:
        super().__init__(error)
        self.error = error
        self.index = index


async def process_batch_async(
    conn: psycopg.AsyncConnection[Any],
    position: Position,
    records: Sequence[Delivery],
    handler: AsyncBatchHandler,
    counters: Counters | None = None,
) -> BatchOutcome:
    """:func:`walrelay_consumer.process_batch` on an ``AsyncConnection``:
    one batch of one partition exactly once, in one transaction."""

    async def apply(c: psycopg.AsyncConnection[Any], new: list[Delivery]) -> None:
        try:
            await handler(c, new)
        except Exception as e:
            raise _Failed(e, 0 if len(new) == 1 else None) from e

    return await apply_batch_async(conn, position, records, apply, counters=counters)


async def process_records_async(
    conn: psycopg.AsyncConnection[Any],
    position: Position,
    records: Sequence[Delivery],
    handler: AsyncRecordHandler,
    counters: Counters | None = None,
) -> BatchOutcome:
    """:func:`process_batch_async` with a per-record handler."""

    async def apply(c: psycopg.AsyncConnection[Any], new: list[Delivery]) -> None:
        for index, delivery in enumerate(new):
            try:
                await handler(c, delivery)
            except Exception as e:
                raise _Failed(e, index) from e

    return await apply_batch_async(conn, position, records, apply, counters=counters)


async def apply_batch_async(
    conn: psycopg.AsyncConnection[Any],
    position: Position,
    records: Sequence[Delivery],
    apply: _AsyncApply,
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
    if counters is not None:
        counters.processed += outcome.applied
        counters.duplicates += outcome.duplicates
        counters.gaps += outcome.gaps
        counters.parked += int(outcome.parked)
    return outcome


async def _apply(
    conn: psycopg.AsyncConnection[Any],
    position: Position,
    records: Sequence[Delivery],
    apply: _AsyncApply,
    park: Park | None,
    known: bool,
) -> BatchOutcome:
    status = conn.info.transaction_status
    if status != pq.TransactionStatus.IDLE:
        raise ValueError(
            f"the connection must be idle to apply a batch, but its transaction status is "
            f"{status.name}: commit or roll back what it started (or use autocommit=True)"
        )
    sources = batch.sources(d.meta for d in records)
    metas = [d.meta for d in records]
    try:
        async with conn.transaction():
            cur = psycopg.AsyncRawCursor(conn)
            marks = await _lock_marks(cur, position, sources, known)
            plan = batch.plan(marks, metas)
            parked_index = len(records) - 1 if park is not None else None
            parked_is_new = parked_index is not None and bool(plan.apply) and plan.apply[-1] == parked_index
            take = [i for i in plan.apply if i != parked_index]
            if take:
                try:
                    await apply(conn, [records[i] for i in take])
                except _Failed as failed:
                    index = failed.index
                    raise HandlerFailed(
                        failed.error, take[index] if index is not None and index < len(take) else None
                    ) from failed.error
                if conn.info.transaction_status == pq.TransactionStatus.INERROR:
                    raise HandlerFailed(
                        RuntimeError(
                            "a statement of the handler failed and the handler went on as if it "
                            "had not: the transaction is aborted (let the error propagate)"
                        ),
                        take[0] if len(take) == 1 else None,
                    )
            if park is not None and parked_is_new and parked_index is not None:
                d = records[parked_index]
                await cur.execute(
                    parked.INSERT_SQL,
                    [
                        position.group,
                        position.topic,
                        position.partition,
                        d.record.offset,
                        d.meta.key,
                        d.meta.source,
                        d.record.key,
                        d.record.value,
                        [n for n, _ in d.record.headers],
                        [v for _, v in d.record.headers],
                        park.error,
                        min(park.attempts, 2**31 - 1),
                    ],
                )
            if plan.raised:
                srcs = list(plan.raised)
                await cur.execute(
                    ADVANCE_SQL,
                    [position.group, position.topic, position.partition, srcs, [plan.raised[s] for s in srcs]],
                )
                if cur.rowcount != len(srcs):
                    raise RowVanished(",".join(srcs))
    except psycopg.Error as e:
        raise DatabaseFailed(e) from e

    _log_gaps(position, plan)
    committed = dict(marks)
    committed.update(plan.raised)
    return BatchOutcome(
        applied=len(take),
        duplicates=plan.duplicates,
        gaps=len(plan.gaps),
        parked=parked_is_new,
        marks=committed,
    )


async def _lock_marks(
    cur: psycopg.AsyncRawCursor[Any], position: Position, sources: list[str], known: bool
) -> dict[str, str]:
    p: list[object] = [position.group, position.topic, position.partition, sources]
    if not known:
        await cur.execute(ENSURE_SQL, p)
    rows = await (await cur.execute(LOCK_SQL, p)).fetchall()
    if len(rows) < len(sources):
        if known:
            await cur.execute(ENSURE_SQL, p)
            rows = await (await cur.execute(LOCK_SQL, p)).fetchall()
        found = {row[0] for row in rows}
        for source in sources:
            if source not in found:
                raise RowVanished(source)
    marks: dict[str, str] = {}
    for source, text in rows:
        try:
            marks[source] = parse_key(text)
        except KeyFormatError as e:
            raise CorruptHwm(source, text, e.reason) from None
    return marks
