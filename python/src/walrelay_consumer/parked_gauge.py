"""Keeps ``walrelay_consumer_parked_records`` at the count of the group's
rows in ``walrelay_consumer_parked`` (the Rust crate's gauge, same name):
read when the loop starts and every :data:`PARKED_REFRESH` seconds while
it runs, on a connection of its own (one more than the pool's), so that
records re-driven by another process leave the gauge too. A failed read
keeps the last value and is logged at DEBUG: the batches report
database outages."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from ._statements import statement
from .metrics import Metrics

__all__ = ["PARKED_REFRESH", "COUNT_SQL", "ParkedGauge", "refresh_async"]

log = logging.getLogger("walrelay_consumer")

PARKED_REFRESH = 10.0
COUNT_SQL = statement("parked_count")


def _count(conn: psycopg.Connection[Any], group: str) -> int:
    # A raw cursor keeps the statement's $1, as the other modules do.
    with psycopg.RawCursor(conn) as cur:
        row = cur.execute(COUNT_SQL, [group]).fetchone()
    return int(row[0]) if row else 0


class ParkedGauge:
    """The blocking loop's refresher: a daemon thread from :meth:`start`
    to :meth:`stop`; nothing without ``prometheus_client``."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], group: str, metrics: Metrics) -> None:
        self._connect = connect
        self._group = group
        self._metrics = metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._metrics.enabled:
            self._thread = threading.Thread(target=self._run, name="walrelay-parked-gauge", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            while not self._stop.is_set():
                try:
                    if conn is None or conn.closed:
                        conn = self._connect()
                        conn.autocommit = True
                    self._metrics.parked_records_set(_count(conn, self._group))
                except psycopg.Error as e:
                    log.debug("cannot read the parked records' count: %s", e)
                    if conn is not None:
                        conn.close()
                    conn = None
                self._stop.wait(PARKED_REFRESH)
        finally:
            if conn is not None:
                conn.close()


async def refresh_async(
    connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]], group: str, metrics: Metrics
) -> None:
    """The asyncio loop's refresher: a task it cancels when it ends."""
    if not metrics.enabled:
        return
    conn: psycopg.AsyncConnection[Any] | None = None
    try:
        while True:
            try:
                if conn is None or conn.closed:
                    conn = await connect()
                    await conn.set_autocommit(True)
                async with psycopg.AsyncRawCursor(conn) as cur:
                    await cur.execute(COUNT_SQL, [group])
                    row = await cur.fetchone()
                metrics.parked_records_set(int(row[0]) if row else 0)
            except psycopg.Error as e:
                log.debug("cannot read the parked records' count: %s", e)
                if conn is not None:
                    await conn.close()
                conn = None
            await asyncio.sleep(PARKED_REFRESH)
    finally:
        if conn is not None:
            await conn.close()
