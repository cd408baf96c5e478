"""The dead-letter table ``walrelay_consumer_parked``: where the ``park``
poison policy puts records that keep failing, and how to re-drive them
(``crates/walrelay-consumer/src/parked.rs``, same table and statements).

A record with walrelay headers is parked in the transaction that raises its
partition's mark past it (:mod:`walrelay_consumer.apply`): either both
commit or neither does, so a parked record is never lost and never applied
by the loop as well. Its row is unique on its event (group, topic,
partition, source, key), not on its offset, which repeats when a topic is
recreated or a group fails over to a mirror; the same event parked again
updates its row, and the batch fails unless exactly one row was written.

A record without usable headers has no key and moves no mark; it is parked
on its own. Nothing walrelay wrote identifies it, so its row is unique on
(group, topic, partition, offset): an identical row there is the same
record delivered again, a different one means the offset was reused, and
the consumer refuses (:class:`OffsetReused`) rather than guess.

:func:`redrive` takes parked records of a group one at a time, runs the
handler on each in a transaction that also deletes its row, and commits.
Rows are locked with ``SKIP LOCKED``, so two re-drives at once never take
the same record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from ._statements import statement
from .meta import MetaError, RecordMeta
from .records import Delivery, Position, Record

__all__ = ["OffsetReused", "RedriveReport", "insert", "insert_unkeyed", "redrive"]

log = logging.getLogger("walrelay_consumer")

INSERT_SQL = statement("parked_insert")
INSERT_UNKEYED_SQL = statement("parked_insert_unkeyed")
SAME_UNKEYED_SQL = statement("parked_same_unkeyed")
TAKE_SQL = statement("parked_take")
DELETE_SQL = statement("parked_delete")
FAILED_AGAIN_SQL = statement("parked_failed_again")

_INT4_MAX = 2**31 - 1


class OffsetReused(Exception):
    """A record without walrelay headers was not parked: the dead-letter
    table already holds a different record without headers at its offset.
    Offsets were reused (a topic deleted and recreated, a failover to a
    mirror cluster) and nothing identifies such a record but its offset, so
    the consumer refuses to guess whether it is parked."""

    def __init__(self, position: Position, offset: int) -> None:
        super().__init__(
            f"record {position.topic}/{position.partition} at offset {offset} has no walrelay "
            f"headers and the dead-letter table already holds a different record without headers "
            f"at that offset for group {position.group!r}: the offsets were reused (topic "
            f"recreated, or a mirror failover), so nothing tells whether this record is parked. "
            f"Nothing was parked and the partition stops: save and delete the old row "
            f"(walrelay_consumer_parked, idempotency_key IS NULL, kafka_offset = {offset}), then "
            f"restart"
        )
        self.position = position
        self.offset = offset


def row_params(
    position: Position,
    record: Record,
    key: str | None,
    source: str | None,
    error: str,
    attempts: int,
) -> list[object]:
    """The parameters of :data:`INSERT_SQL` for one record (pure; shared by
    the blocking and the asyncio flavours)."""
    return [
        position.group,
        position.topic,
        position.partition,
        record.offset,
        key,
        source,
        record.key,
        record.value,
        [name for name, _ in record.headers],
        [value for _, value in record.headers],
        error,
        min(attempts, _INT4_MAX),
    ]


def _insert_row(cur: psycopg.RawCursor[Any], params: list[object]) -> int:
    cur.execute(INSERT_UNKEYED_SQL, params)
    return cur.rowcount


def insert(cur: psycopg.RawCursor[Any], delivery: Delivery, error: str, attempts: int) -> int:
    """Parks a record with walrelay headers inside the batch transaction that
    raises its mark. Returns the rows written (the caller fails the batch
    unless it is 1)."""
    cur.execute(
        INSERT_SQL,
        row_params(delivery.position, delivery.record, delivery.meta.key, delivery.meta.source, error, attempts),
    )
    return cur.rowcount


def insert_unkeyed(conn: psycopg.Connection[Any], position: Position, record: Record, error: str) -> bool:
    """Parks a record without usable walrelay headers, in its own
    transaction. Returns whether a row was written (false: the same record
    was parked before); raises :class:`OffsetReused` when a different one
    is parked at its offset."""
    params = row_params(position, record, None, None, error, 1)
    with conn.transaction():
        cur = psycopg.RawCursor(conn)
        if _insert_row(cur, params) == 1:
            return True
        row = cur.execute(SAME_UNKEYED_SQL, params[:4] + params[6:10]).fetchone()
    return unkeyed_parked_before(position, record, row)


def unkeyed_parked_before(position: Position, record: Record, row: tuple[Any, ...] | None) -> bool:
    """After :data:`INSERT_UNKEYED_SQL` wrote nothing: ``row`` is what
    :data:`SAME_UNKEYED_SQL` found. The same record parked before is fine
    (``False``: nothing written); anything else is refused (shared by the
    blocking and the asyncio flavours)."""
    if row is not None and row[0] is True:
        return False
    raise OffsetReused(position, record.offset)


@dataclass(slots=True)
class RedriveReport:
    """What a :func:`redrive` did."""

    #: Records applied and removed from the table.
    applied: int = 0
    #: Records whose handler failed again (left in the table, attempt counted).
    failed: int = 0
    #: Records without usable walrelay headers (left: they need a person).
    unusable: int = 0


def redrive(
    conn: psycopg.Connection[Any],
    group: str,
    handler: Callable[[psycopg.Connection[Any], Delivery], object],
) -> RedriveReport:
    """Applies the parked records of ``group`` through ``handler``, oldest
    first, each in its own transaction that also deletes its row. A record
    whose handler fails again stays parked (its ``attempts`` and ``error``
    updated) and the re-drive goes on with the next one.

    The re-driven record's mark is not consulted: the record was parked by
    the transaction that moved the mark past it.
    """
    report = RedriveReport()
    after = 0
    while True:
        failure: Exception | None = None
        with conn.transaction():
            cur = psycopg.RawCursor(conn)
            row = cur.execute(TAKE_SQL, [group, after]).fetchone()
            if row is None:
                return report
            after, delivery = parked_delivery(group, row)
            if delivery is None:
                report.unusable += 1
                continue
            try:
                with conn.transaction():
                    handler(conn, delivery)
            except Exception as e:  # the handler's failure, rolled back to the savepoint
                failure = e
            cur.execute(*settle(report, after, delivery, failure))


def parked_delivery(group: str, row: tuple[Any, ...]) -> tuple[int, Delivery | None]:
    """A row of :data:`TAKE_SQL` as its id and the delivery to re-drive, or
    ``None`` when its headers are unusable (pure; shared by the blocking and
    the asyncio re-drive)."""
    row_id, topic, partition, offset, kafka_key, payload, names, values, _attempts = row
    record = Record(
        topic=topic,
        partition=partition,
        offset=offset,
        key=_bytes(kafka_key),
        value=_bytes(payload),
        headers=tuple((n, _bytes(v)) for n, v in zip(names, values)),
    )
    try:
        meta = RecordMeta.from_headers(record.headers)
    except MetaError:
        return row_id, None
    return row_id, Delivery(record=record, meta=meta, position=Position(group, topic, partition))


def settle(
    report: RedriveReport, row_id: int, delivery: Delivery, failure: Exception | None
) -> tuple[str, list[object]]:
    """Counts a re-driven record and returns the statement that settles its
    row: deleted when its handler succeeded, its attempt counted when not
    (shared by the blocking and the asyncio re-drive)."""
    if failure is None:
        report.applied += 1
        return DELETE_SQL, [row_id]
    report.failed += 1
    log.warning(
        "re-driving a parked record failed again (parked id %d, key %s): %s",
        row_id,
        delivery.meta.key,
        failure,
    )
    return FAILED_AGAIN_SQL, [row_id, str(failure)]


def _bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"expected bytes from a bytea column, got {type(value).__name__}")
