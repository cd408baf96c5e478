"""Loading the stored high-water marks of partitions (the same query as the
Rust crate's ``PgHwmStore::load``): the loops load the marks of the
partitions they are assigned, as a cache that lets them skip duplicates
without a transaction; the batches read and lock the real ones."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg

from ._statements import statement

__all__ = ["LOAD_SQL", "STATEMENT_TIMEOUT_SQL", "load_marks", "load_marks_async", "millis"]

LOAD_SQL = statement("hwm_load")
#: Bounds the statements of the transaction it runs in.
STATEMENT_TIMEOUT_SQL = statement("statement_timeout")

Marks = dict[tuple[str, int], dict[str, str]]


def millis(seconds: float) -> str:
    """``seconds`` as a ``statement_timeout`` value (at least 1 ms)."""
    return f"{max(int(seconds * 1000), 1)}ms"


def load_marks(
    conn: psycopg.Connection[Any],
    group: str,
    partitions: list[tuple[str, int]],
    timeout: float | None = None,
) -> dict[tuple[str, int], dict[str, str]]:
    """The stored marks of ``group`` for the given ``(topic, partition)``
    pairs, all sources (the same query as the Rust crate's
    ``PgHwmStore::load``). With ``timeout`` (seconds), the server cancels
    the query after that long (``statement_timeout``)."""
    with conn.transaction():
        cur = psycopg.RawCursor(conn)
        if timeout is not None:
            cur.execute(STATEMENT_TIMEOUT_SQL, [millis(timeout)])
        rows = cur.execute(LOAD_SQL, _params(group, partitions)).fetchall()
    return _marks_of(rows)


async def load_marks_async(
    conn: psycopg.AsyncConnection[Any],
    group: str,
    partitions: list[tuple[str, int]],
    timeout: float,
) -> dict[tuple[str, int], dict[str, str]]:
    """:func:`load_marks` on an ``AsyncConnection``, the query bounded by
    the server (``statement_timeout``)."""
    async with conn.transaction():
        cur = psycopg.AsyncRawCursor(conn)
        await cur.execute(STATEMENT_TIMEOUT_SQL, [millis(timeout)])
        await cur.execute(LOAD_SQL, _params(group, partitions))
        rows = await cur.fetchall()
    return _marks_of(rows)


def _params(group: str, partitions: list[tuple[str, int]]) -> list[object]:
    return [group, [t for t, _ in partitions], [p for _, p in partitions]]


def _marks_of(rows: Iterable[tuple[Any, ...]]) -> Marks:
    out: Marks = {}
    for topic, partition, source, hwm in rows:
        out.setdefault((topic, partition), {})[source] = hwm
    return out
