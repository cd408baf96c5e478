"""A bound on each handler call (:attr:`Settings.handler_timeout`): a call
running longer is a failed attempt of its batch, counted like a handler
error; the statement it was running is cancelled and the connection is
discarded (not returned to the pool), since a handler that blocked may
have left anything behind on it.

The blocking loop cannot interrupt Python code: a :class:`Watchdog` thread
cancels the statement the call is running when its time is up (psycopg's
``cancel_safe``), which ends a handler waiting on the database (a lock, a
slow query) with ``QueryCanceled``; a handler blocked outside the database
is only declared timed out once it returns. The asyncio loop cancels the
call itself (:func:`call_async`): psycopg cancels the running statement on
the server as the task is cancelled.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg

from .apply import HandlerFailed

__all__ = ["HandlerTimedOut", "Watchdog", "call_async"]

log = logging.getLogger("walrelay_consumer")

T = TypeVar("T")


class HandlerTimedOut(Exception):
    """A handler call ran longer than :attr:`Settings.handler_timeout`."""

    def __init__(self, timeout: float) -> None:
        super().__init__(
            f"the handler call ran longer than Settings.handler_timeout ({timeout:g}s): its "
            "statement was cancelled, the batch rolled back and the connection discarded; the "
            "batch is retried (a failed attempt). Make the handler faster, or raise the timeout"
        )
        self.timeout = timeout


class _Armed:
    """One handler call being watched."""

    __slots__ = ("conn", "fired")

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.fired = False


class Watchdog:
    """Cancels the statement of a handler call that outlives ``timeout``
    seconds; one thread for every call of the loop, started with the first
    call that is watched. Without a timeout it watches nothing."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self._lock = threading.Condition()
        #: (deadline, sequence, call): the earliest deadline first.
        self._deadlines: list[tuple[float, int, _Armed]] = []
        self._armed: set[_Armed] = set()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextmanager
    def watch(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """Runs the block as one watched handler call on ``conn``; raises
        :class:`HandlerTimedOut` at its end if its time ran out (whatever
        the block raised, which is then its context)."""
        if self.timeout is None:
            yield
            return
        armed = _Armed(conn)
        with self._lock:
            self._start()
            self._armed.add(armed)
            heapq.heappush(self._deadlines, (time.monotonic() + self.timeout, next(self._seq), armed))
            self._lock.notify()
        try:
            yield
        finally:
            with self._lock:
                self._armed.discard(armed)
            if armed.fired:
                raise HandlerTimedOut(self.timeout)

    def close(self) -> None:
        """Stops the thread (the loop ended)."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _start(self) -> None:
        if self._thread is None:
            self._closed = False
            self._thread = threading.Thread(target=self._run, name="walrelay-handler-watchdog", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                due = self._next_due()
                if due is None:
                    return
            try:
                due.conn.cancel_safe(timeout=5.0)
            except Exception as e:  # the call still ends as timed out
                log.warning("cancelling the statement of a handler call that timed out failed: %s", e)

    def _next_due(self) -> _Armed | None:
        """Waits (holding the lock) for the next call whose time ran out;
        ``None`` once closed."""
        while not self._closed:
            while self._deadlines and self._deadlines[0][2] not in self._armed:
                heapq.heappop(self._deadlines)  # ended in time
            if not self._deadlines:
                self._lock.wait()
                continue
            deadline, _, armed = self._deadlines[0]
            left = deadline - time.monotonic()
            if left > 0:
                self._lock.wait(left)
                continue
            heapq.heappop(self._deadlines)
            # Under the lock, so that the call's end sees it: a call that
            # ended meanwhile is a timeout too, and its connection is
            # discarded before the cancellation can reach another statement.
            armed.fired = True
            return armed
        return None


async def call_async(call: Awaitable[T], timeout: float | None) -> T:
    """Awaits one async handler call, cancelled after ``timeout`` seconds
    (psycopg then cancels its running statement on the server):
    :class:`HandlerTimedOut`."""
    if timeout is None:
        return await call
    try:
        return await asyncio.wait_for(call, timeout)
    except (asyncio.TimeoutError, TimeoutError) as e:
        raise HandlerTimedOut(timeout) from e


def discards_connection(result: object) -> bool:
    """Whether a batch's outcome is a handler call that timed out: its
    connection is not used again."""
    return isinstance(result, HandlerFailed) and isinstance(result.error, HandlerTimedOut)
