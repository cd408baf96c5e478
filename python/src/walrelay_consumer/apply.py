"""One batch of one partition in one transaction: lock the marks, drop what
they already cover, run the handler on the rest, raise the marks, commit.

The statements are the Rust crate's (``crates/walrelay-consumer/src/apply.rs``),
character for character (a test compares them), run through psycopg's
``RawCursor`` so that they keep PostgreSQL's ``$n`` placeholders. So a Rust
and a Python service can share one database: they take the same locks in
the same order and write the same rows.

Round trips per batch: ``BEGIN``, one insert of missing mark rows (skipped
when the caller knows they exist), one ``SELECT ... FOR UPDATE`` of every
source's row, the handler's own statements, one ``UPDATE`` of the marks and
``COMMIT``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq

from . import batch, parked
from ._statements import statement
from .counters import Counters
from .keys import KeyFormatError, parse_key
from .records import Delivery, Position

__all__ = [
    "BatchHandler",
    "RecordHandler",
    "BatchOutcome",
    "BatchError",
    "HandlerFailed",
    "HandlerSwallowedError",
    "HandlerEndedTransaction",
    "DatabaseFailed",
    "CorruptHwm",
    "RowVanished",
    "NotParked",
    "Park",
    "process_batch",
    "process_records",
    "apply_batch",
]

log = logging.getLogger("walrelay_consumer")

#: Called once per batch with its new records (in order, duplicates
#: dropped), inside the batch's transaction on the given connection.
BatchHandler = Callable[["psycopg.Connection[Any]", Sequence[Delivery]], object]
#: Called once per new record, in order, inside the batch's transaction.
RecordHandler = Callable[["psycopg.Connection[Any]", Delivery], object]

ENSURE_SQL = statement("hwm_ensure")
LOCK_SQL = statement("hwm_lock")
ADVANCE_SQL = statement("hwm_advance")


@dataclass(slots=True)
class BatchOutcome:
    """What a committed batch did."""

    #: Records whose side effects were committed.
    applied: int = 0
    #: Records dropped because the marks already covered them.
    duplicates: int = 0
    #: Gaps found (see :mod:`walrelay_consumer.batch`).
    gaps: int = 0
    #: Whether the batch's last record was parked instead of applied.
    parked: bool = False
    #: The committed marks of the batch's sources.
    marks: dict[str, str] = field(default_factory=dict)


class BatchError(Exception):
    """Why a batch was not committed. In every case the transaction was
    rolled back (or never committed): no side effect and no mark moved."""


class HandlerFailed(BatchError):
    """The handler raised. ``index`` is the failing record's index in the
    batch when known (the per-record handler, or a batch of one); the
    handler's exception is ``error`` (and ``__cause__``)."""

    def __init__(self, error: BaseException, index: int | None) -> None:
        super().__init__(
            f"the handler failed (rolled back; the high-water marks are unchanged): {error!r}"
        )
        self.error = error
        self.index = index


class HandlerSwallowedError(Exception):
    """The handler returned, but one of its statements had failed and
    aborted the transaction (an error it caught and did not raise, without
    a savepoint): ``COMMIT`` would have rolled its side effects back while
    the offset moved on. The ``error`` of a :class:`HandlerFailed`: a
    failed attempt, retried, then parked or stopping the partition."""

    def __init__(self) -> None:
        super().__init__(
            "the handler's transaction was aborted by an error it did not return (a failed "
            "statement whose error the handler swallowed): rolled back, the high-water marks are "
            "unchanged; use a savepoint around a statement that may fail "
            "(with conn.transaction(): ...), or let the error propagate"
        )


class HandlerEndedTransaction(BatchError):
    """The handler ended the batch's transaction itself (it ran ``COMMIT``
    or ``ROLLBACK``): part of its side effects may be committed while the
    high-water marks did not move, so the batch's atomicity was broken and
    no retry can repair it. The loop stops the partition whatever its
    poison policy (nothing retried, parked, or committed to Kafka)."""

    def __init__(self, position: Position, records: Sequence[Delivery]) -> None:
        first, last = records[0].record.offset, records[-1].record.offset
        keys = [d.meta.key for d in records[:5]]
        more = f" and {len(records) - 5} more" if len(records) > 5 else ""
        super().__init__(
            f"the handler ended the transaction of records {position.topic}/{position.partition} "
            f"offsets {first}..{last} (keys {', '.join(keys)}{more}) itself: it ran COMMIT or "
            "ROLLBACK, so atomicity was broken (part of the side effects may be committed without "
            "the high-water marks, and would be applied again). The partition is stopped: fix the "
            "handler (it must not commit or roll back; the loop commits), check these records' "
            "side effects by hand, then restart"
        )
        self.first = first
        self.last = last
        self.keys = [d.meta.key for d in records]


class DatabaseFailed(BatchError):
    """A database error (connection lost, failed commit, ...)."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(f"database error while applying a batch (rolled back): {error}")
        self.error = error


class CorruptHwm(BatchError):
    """A stored mark is not a key (the table's CHECK prevents this unless it
    was changed)."""

    def __init__(self, source_id: str, value: str, reason: str) -> None:
        super().__init__(
            f"the stored high-water mark {value!r} of source {source_id!r} is not a "
            f"32-hex-digit key: {reason}"
        )
        self.source_id = source_id
        self.value = value


class RowVanished(BatchError):
    """A mark row disappeared between creating and locking it."""

    def __init__(self, source_id: str) -> None:
        super().__init__(
            f"the high-water mark row of source {source_id!r} vanished between creating and "
            "locking it (deleted concurrently, or not READ COMMITTED)"
        )
        self.source_id = source_id


class NotParked(BatchError):
    """Parking a record wrote no row (or more than one), so the batch is
    not committed: its mark would move past a record that is neither
    applied nor parked."""

    def __init__(self, position: Position, offset: int, key: str, rows: int) -> None:
        super().__init__(
            f"parking record {position.topic}/{position.partition} at offset {offset} (key {key}) "
            f"wrote {rows} rows of walrelay_consumer_parked instead of 1, so the batch was rolled "
            "back (its mark would have moved past a record neither applied nor parked): check the "
            "table's unique indexes (run the migration again)"
        )
        self.offset = offset
        self.key = key


@dataclass(frozen=True, slots=True)
class Park:
    """The last record of a batch is parked instead of applied."""

    error: str
    attempts: int


class _Failed(Exception):
    """A handler's failure inside a batch, with the failing index if known."""

    def __init__(self, error: BaseException, index: int | None) -> None:
        super().__init__(error)
        self.error = error
        self.index = index


Apply = Callable[["psycopg.Connection[Any]", list[Delivery]], None]
#: Wraps each handler call (the loop's :class:`~walrelay_consumer.handler_timeout.Watchdog`).
Watch = Callable[["psycopg.Connection[Any]"], AbstractContextManager[None]]


def _unwatched(_conn: psycopg.Connection[Any]) -> AbstractContextManager[None]:
    return nullcontext()


def per_batch(handler: BatchHandler, watch: Watch = _unwatched) -> Apply:
    """Adapts a batch handler; a batch of one knows its failing record."""

    def apply(conn: psycopg.Connection[Any], new: list[Delivery]) -> None:
        try:
            with watch(conn):
                handler(conn, new)
        except Exception as e:
            raise _Failed(e, 0 if len(new) == 1 else None) from e

    return apply


def per_record(handler: RecordHandler, watch: Watch = _unwatched) -> Apply:
    """Adapts a per-record handler: each record in order, the failing one
    named."""

    def apply(conn: psycopg.Connection[Any], new: list[Delivery]) -> None:
        for index, delivery in enumerate(new):
            try:
                with watch(conn):
                    handler(conn, delivery)
            except Exception as e:
                raise _Failed(e, index) from e

    return apply


def process_batch(
    conn: psycopg.Connection[Any],
    position: Position,
    records: Sequence[Delivery],
    handler: BatchHandler,
    counters: Counters | None = None,
) -> BatchOutcome:
    """Applies a batch of records of **one partition** exactly once, in one
    transaction, with a batch handler.

    1. Locks the mark rows of every source in the batch (``SELECT ... FOR
       UPDATE`` ordered by source, so two members never deadlock), creating
       missing ones at 32 zeros.
    2. Walks the batch with a running mark per source
       (:func:`walrelay_consumer.batch.plan`): records at or below it are
       duplicates.
    3. Runs ``handler(conn, new_records)`` once, unless nothing is new.
    4. Raises each mark to the highest key applied and commits.

    ``conn`` must be idle (no transaction open); the handler must do all
    its database work through it and must not commit or roll back. Every
    record must come from ``position``'s partition, in offset order. Any
    error rolls everything back and raises a :class:`BatchError`.
    """
    return apply_batch(conn, position, records, per_batch(handler), counters=counters)


def process_records(
    conn: psycopg.Connection[Any],
    position: Position,
    records: Sequence[Delivery],
    handler: RecordHandler,
    counters: Counters | None = None,
) -> BatchOutcome:
    """:func:`process_batch` with a per-record handler: called once per new
    record, in order, all in the batch's one transaction."""
    return apply_batch(conn, position, records, per_record(handler), counters=counters)


def apply_batch(
    conn: psycopg.Connection[Any],
    position: Position,
    records: Sequence[Delivery],
    apply: Apply,
    *,
    park: Park | None = None,
    known: bool = False,
    counters: Counters | None = None,
) -> BatchOutcome:
    """:func:`process_batch` with the loop's extras: the last record may be
    parked instead of applied, and ``known`` skips the row creation when
    the marks are known to exist."""
    try:
        outcome = _apply(conn, position, records, apply, park, known)
    except BaseException:
        if counters is not None:
            counters.errors += 1
        raise
    _count(counters, outcome)
    return outcome


def _apply(
    conn: psycopg.Connection[Any],
    position: Position,
    records: Sequence[Delivery],
    apply: Apply,
    park: Park | None,
    known: bool,
) -> BatchOutcome:
    _require_idle(conn.info.transaction_status)
    sources = batch.sources(d.meta for d in records)
    metas = [d.meta for d in records]
    try:
        with conn.transaction():
            cur = psycopg.RawCursor(conn)
            marks, xact = _lock_marks(cur, position, sources, known)
            plan = batch.plan(marks, metas)
            split = _Split.of(plan, len(records), park)
            if split.take:
                new = [records[i] for i in split.take]
                try:
                    apply(conn, new)
                except _Failed as failed:
                    _check_ended(conn.info.transaction_status, position, new, failed)
                    raise split.handler_failed(failed) from failed.error
                _check_ended(conn.info.transaction_status, position, new, None)
                if conn.info.transaction_status == pq.TransactionStatus.INERROR:
                    raise split.swallowed()
            if park is not None and split.parked_is_new:
                _check_parked(position, records[-1], parked.insert(cur, records[-1], park.error, park.attempts))
            if plan.raised:
                after = _advance(cur, position, plan.raised)
                if split.take:
                    _check_same_transaction(xact, after, position, [records[i] for i in split.take])
    except psycopg.Error as e:
        raise DatabaseFailed(e) from e
    return _outcome(position, plan, marks, split)


# The pure steps of a batch, shared with the asyncio flavour
# (:mod:`walrelay_consumer.aio`), which only awaits the statements.


def _check_ended(
    status: pq.TransactionStatus, position: Position, new: list[Delivery], failed: _Failed | None
) -> None:
    """After the handler: the batch's transaction must still be open. Outside
    one (IDLE), the handler ran ``COMMIT`` or ``ROLLBACK`` itself, whether
    it then returned or raised."""
    if status == pq.TransactionStatus.IDLE:
        error = HandlerEndedTransaction(position, new)
        if failed is not None:
            raise error from failed.error
        raise error


def _require_idle(status: pq.TransactionStatus) -> None:
    """A batch opens its own transaction: the connection must have none."""
    if status != pq.TransactionStatus.IDLE:
        raise ValueError(
            f"the connection must be idle to apply a batch, but its transaction status is "
            f"{status.name}: commit or roll back what it started (or use autocommit=True)"
        )


@dataclass(frozen=True, slots=True)
class _Split:
    """Which records of a planned batch the handler sees. A parked last
    record is taken out of what the handler sees but still raises its mark
    (it is "done" for this group)."""

    #: Indexes (in the batch) of the records the handler applies.
    take: list[int]
    #: Whether the parked last record is new (not covered by the marks).
    parked_is_new: bool

    @staticmethod
    def of(plan: batch.Plan, count: int, park: Park | None) -> _Split:
        parked_index = count - 1 if park is not None else None
        parked_is_new = parked_index is not None and bool(plan.apply) and plan.apply[-1] == parked_index
        return _Split([i for i in plan.apply if i != parked_index], parked_is_new)

    def handler_failed(self, failed: _Failed) -> HandlerFailed:
        """The handler raised: the failing record's index in the batch."""
        index = failed.index
        return HandlerFailed(failed.error, self.take[index] if index is not None and index < len(self.take) else None)

    def swallowed(self) -> HandlerFailed:
        """The handler swallowed a failed statement: its failure (an
        attempt), not a database outage."""
        return HandlerFailed(HandlerSwallowedError(), self.take[0] if len(self.take) == 1 else None)


def _check_parked(position: Position, d: Delivery, rows: int) -> None:
    """A parked record must have written exactly one row."""
    if rows != 1:
        raise NotParked(position, d.record.offset, d.meta.key, rows)


def _outcome(position: Position, plan: batch.Plan, marks: dict[str, str], split: _Split) -> BatchOutcome:
    """A committed batch: its gaps logged, its marks as committed."""
    _log_gaps(position, plan)
    committed = dict(marks)
    committed.update(plan.raised)
    return BatchOutcome(
        applied=len(split.take),
        duplicates=plan.duplicates,
        gaps=len(plan.gaps),
        parked=split.parked_is_new,
        marks=committed,
    )


def _count(counters: Counters | None, outcome: BatchOutcome) -> None:
    if counters is not None:
        counters.processed += outcome.applied
        counters.duplicates += outcome.duplicates
        counters.gaps += outcome.gaps
        counters.parked += int(outcome.parked)


def _marks_of(rows: Sequence[tuple[Any, ...]], sources: list[str]) -> dict[str, str]:
    """The locked marks: every source's row must be there, every mark a key."""
    found = {row[0] for row in rows}
    for source in sources:
        if source not in found:
            raise RowVanished(source)
    marks: dict[str, str] = {}
    for source, text, *_ in rows:
        try:
            marks[source] = parse_key(text)
        except KeyFormatError as e:
            raise CorruptHwm(source, text, e.reason) from None
    return marks


def _xact_of(rows: Sequence[tuple[Any, ...]]) -> str | None:
    """The transaction id that :data:`LOCK_SQL` and :data:`ADVANCE_SQL`
    return in their last column."""
    return str(rows[0][-1]) if rows else None


def _check_same_transaction(
    locked: str | None, raised: str | None, position: Position, new: list[Delivery]
) -> None:
    """The marks must be raised in the transaction that locked them: another
    one means the handler ran ``COMMIT`` (or ``ROLLBACK``) and then
    ``BEGIN`` itself, which the transaction status alone does not show."""
    if locked is not None and raised != locked:
        raise HandlerEndedTransaction(position, new)


def _advance_params(position: Position, raised: dict[str, str]) -> tuple[list[object], int]:
    """:data:`ADVANCE_SQL`'s parameters and how many rows it must update."""
    sources = list(raised)
    p = _params(position, sources)
    p.append([raised[s] for s in sources])
    return p, len(sources)


def _params(position: Position, sources: list[str]) -> list[object]:
    return [position.group, position.topic, position.partition, sources]


def _lock_marks(
    cur: psycopg.RawCursor[Any], position: Position, sources: list[str], known: bool
) -> tuple[dict[str, str], str | None]:
    """Locks the mark rows of ``sources`` and returns their marks, creating
    missing rows first, and the transaction's id."""
    p = _params(position, sources)
    if not known:
        cur.execute(ENSURE_SQL, p)
    rows = cur.execute(LOCK_SQL, p).fetchall()
    if len(rows) < len(sources) and known:
        # Rows deleted by hand since they were seen: create them.
        cur.execute(ENSURE_SQL, p)
        rows = cur.execute(LOCK_SQL, p).fetchall()
    return _marks_of(rows, sources), _xact_of(rows)


def _advance(cur: psycopg.RawCursor[Any], position: Position, raised: dict[str, str]) -> str | None:
    """Raises the marks; returns the id of the transaction that did."""
    p, rows = _advance_params(position, raised)
    cur.execute(ADVANCE_SQL, p)
    if cur.rowcount != rows:
        raise RowVanished(",".join(raised))
    return _xact_of(cur.fetchall())


def _log_gaps(position: Position, plan: batch.Plan) -> None:
    for gap in plan.gaps:
        log.warning(
            "gap: the record sent before this one was never processed by group %r "
            "(high-water mark %s < previous key %s) topic=%s partition=%d source=%s",
            position.group,
            gap.hwm,
            gap.prev,
            position.topic,
            position.partition,
            gap.source,
        )
