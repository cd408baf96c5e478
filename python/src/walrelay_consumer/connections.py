"""The blocking loop's database connections."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg

__all__ = ["Connect", "Connections"]

Connect = Callable[[], "psycopg.Connection[Any]"]


class Connections:
    """The loop's database connections: one per worker at a time (and one
    for loading marks on assignment), kept open between batches, created
    when one is needed. After an outage the idle ones are closed; one in
    use is dropped when it comes back broken."""

    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()

    def acquire(self) -> psycopg.Connection[Any]:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
        conn = self._connect()
        conn.autocommit = True
        return conn

    def release(self, conn: psycopg.Connection[Any]) -> None:
        if not conn.closed and not conn.broken:
            with self._lock:
                self._idle.append(conn)

    def close_all(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            try:
                conn.close()
            except psycopg.Error:
                pass
