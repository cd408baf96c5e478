"""The consumer loop for asyncio services (FastAPI, aiohttp): the decisions
of :mod:`walrelay_consumer.loop_core` (the same as the blocking
:class:`~walrelay_consumer.ConsumerLoop`'s), with the database work on
psycopg's ``AsyncConnection`` and librdkafka's blocking calls on one worker
thread, so the event loop keeps running while the loop waits.

Kafka calls (poll, commit, close) all go through one single-thread
executor: rebalance callbacks run inside the poll on that thread while the
loop's coroutine is suspended waiting for it, so they never race a batch,
exactly as in the blocking loop. A round's batches (one per partition) run
as tasks of the event loop on up to :attr:`Settings.pool_size` connections;
stragglers stay in flight as in the blocking loop, and a revocation (on the
Kafka thread) waits for the revoked partitions' ones on the event loop.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from confluent_kafka import Consumer

from .aio import (
    AsyncApply,
    AsyncBatchHandler,
    AsyncRecordHandler,
    apply_batch_async,
    insert_unkeyed_async,
    per_batch_async,
    per_record_async,
)
from .loop_core import (
    JOB_FAILURES,
    STRAGGLER_WAIT,
    TP,
    After,
    ConsumerKafka,
    Driver,
    Job,
    Round,
    close_dead,
    poll_burst,
)
from .marks import load_marks_async
from .parked_gauge import refresh_async
from .partition import ParkUnkeyed
from .settings import Settings

__all__ = ["AsyncConsumerLoop"]

AsyncConnect = Callable[[], Awaitable["psycopg.AsyncConnection[Any]"]]


class AsyncConsumerLoop(Driver):
    """:class:`~walrelay_consumer.ConsumerLoop` for an asyncio event loop:
    ``await loop.run_batches(handler)`` with an ``async`` handler that gets
    the ``AsyncConnection`` of the batch's transaction. Stop it with
    :meth:`stop` (from any thread or coroutine); it handles no signals
    unless ``handle_signals`` (the framework usually does)."""

    def __init__(
        self,
        kafka: Mapping[str, Any],
        topics: list[str],
        database: str | AsyncConnect,
        settings: Settings | None = None,
        registry: Any = None,
        *,
        group_instance_id: str | None = None,
    ) -> None:
        super().__init__(kafka, topics, settings, registry, group_instance_id)
        if isinstance(database, str):
            conninfo = database

            async def connect() -> psycopg.AsyncConnection[Any]:
                return await psycopg.AsyncConnection.connect(conninfo, autocommit=True)

            self._aconnect: AsyncConnect = connect
        else:
            self._aconnect = database
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._stale = False
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._pending: list[TP] = []

    async def run(self, handler: AsyncRecordHandler, *, handle_signals: bool = False) -> None:
        """Applies records with an async **per-record** handler until
        :meth:`stop`. See :meth:`ConsumerLoop.run`."""
        await self._arun(per_record_async(handler, self.settings.handler_timeout), handle_signals)

    async def run_batches(self, handler: AsyncBatchHandler, *, handle_signals: bool = False) -> None:
        """Applies records with an async **batch** handler until :meth:`stop`.
        See :meth:`ConsumerLoop.run_batches`."""
        await self._arun(per_batch_async(handler, self.settings.handler_timeout), handle_signals)

    async def _arun(self, apply: AsyncApply, handle_signals: bool) -> None:
        core = self._core
        loop = asyncio.get_running_loop()
        self._event_loop = loop
        self._slots = asyncio.Semaphore(self.settings.pool_size)
        kafka = ThreadPoolExecutor(max_workers=1, thread_name_prefix="walrelay-kafka")
        signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.stop)
        parked_gauge = asyncio.create_task(refresh_async(self._aconnect, self.group, self.metrics))
        try:
            # A new consumer each time the broker refuses the instance id
            # (loop_core.rejoin), until the stop or another fatal error.
            while True:
                await self._aconsume(apply, kafka)
                wait = core.rejoin()
                if wait is None:
                    break
                await loop.run_in_executor(None, core.wait_to_rejoin, wait)
        finally:
            kafka.shutdown(wait=False)
            parked_gauge.cancel()
            await asyncio.wait([parked_gauge])
            await self._aclose()
            for sig in signals:
                loop.remove_signal_handler(sig)
        core.end()

    async def _aconsume(self, apply: AsyncApply, kafka: ThreadPoolExecutor) -> None:
        """Runs the loop on one consumer, from its creation to its close: until
        the stop, or until it is dead."""
        core = self._core
        loop = asyncio.get_running_loop()
        consumer = Consumer(self._config)
        core.attach(ConsumerKafka(consumer))
        try:
            core.subscribe(consumer, self._settle, self._defer_load)
            while not core.consumer_done():
                round_ = await self._awork(apply)
                timeout = core.between_rounds(round_)
                messages = await loop.run_in_executor(kafka, poll_burst, consumer, timeout)
                await self._load_pending()
                core.received(messages)
        finally:
            try:
                try:
                    await self._asettle(list(core.stragglers.in_flight))
                    # Abandoned batches still running are left to the event
                    # loop; those done are counted.
                    core.stragglers.collect_abandoned(core.counters)
                finally:
                    # What the settled batches stored is committed even if
                    # one of them ended in a bug (not by a dead consumer).
                    await loop.run_in_executor(kafka, self._commit_and_close, consumer)
            finally:
                core.detach()

    def _commit_and_close(self, consumer: Consumer) -> None:
        if self._core.refused is not None:
            close_dead(consumer)
            return
        try:
            self._core.kafka.commit(asynchronous=False)
        finally:
            consumer.close()

    async def _awork(self, apply: AsyncApply) -> Round:
        """The round with the batches as tasks of the event loop, at most
        ``pool_size`` running at a time: the round waits
        :data:`~walrelay_consumer.loop_core.pacing.STRAGGLER_WAIT` for them,
        acts on those done and leaves the others in flight."""
        core = self._core
        await self._asettle(core.start_round())
        if self._stale:
            await self._aclose()
        round_, jobs = core.next_round()
        tasks = [asyncio.create_task(self._aslot(job, apply)) for job in jobs]
        if tasks:
            await asyncio.wait(tasks, timeout=STRAGGLER_WAIT)
        core.end_round(jobs, tasks)
        return round_

    async def _asettle(self, tps: list[TP], bound: float | None = None) -> None:
        """Awaits these partitions' stragglers on the event loop (at most
        ``bound`` seconds, then the ones still running are abandoned) and
        acts on their outcomes."""
        taken = self._core.stragglers.take(tps)
        tasks = [r for _, r in taken if isinstance(r, asyncio.Task)]
        assert len(tasks) == len(taken)
        if tasks:
            await asyncio.wait(tasks, timeout=bound)
        self._core.settle(taken, bound)

    def _settle(self, tps: list[TP], bound: float | None = None) -> None:
        # Called by the rebalance callbacks on the Kafka thread while the
        # event loop waits for the poll: the stragglers are awaited there.
        if any(tp in self._core.stragglers.in_flight for tp in tps):
            assert self._event_loop is not None
            asyncio.run_coroutine_threadsafe(self._asettle(tps, bound), self._event_loop).result()

    async def _aslot(self, job: Job, apply: AsyncApply) -> None:
        assert self._slots is not None
        async with self._slots:
            await self._aexecute(job, apply)

    async def _aexecute(self, job: Job, apply: AsyncApply) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            conn = await self._acquire()
            if isinstance(job.step, ParkUnkeyed):
                job.result = await insert_unkeyed_async(conn, job.p.position, job.records[0].record, job.step.error)
            else:
                job.result = await apply_batch_async(conn, job.p.position, job.deliveries(), apply, **job.batch_options())
        except JOB_FAILURES as e:
            job.result = e
        finally:
            after = job.end(conn)
            if conn is not None and after is After.CLOSE:
                await conn.close()
            elif conn is not None and after is After.KEEP:
                self._idle.append(conn)

    async def _acquire(self) -> psycopg.AsyncConnection[Any]:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        conn = await self._aconnect()
        await conn.set_autocommit(True)
        return conn

    def _close_db(self) -> None:
        # Called by the core's decisions after an outage: the idle
        # connections are replaced before the next round (closing them
        # must be awaited).
        self._stale = True

    async def _aclose(self) -> None:
        self._stale = False
        idle, self._idle = self._idle, []
        for conn in idle:
            try:
                await conn.close()
            except psycopg.Error:
                pass

    # -- the assigned partitions' marks (after the poll) ------------------

    def _defer_load(self, tps: list[TP]) -> None:
        # Called by the assignment callback on the Kafka thread: the marks
        # are loaded on the event loop once the poll returns.
        self._pending.extend(tps)

    async def _load_pending(self) -> None:
        if not self._pending:
            return
        tps, self._pending = self._pending, []
        timeout = self.settings.rebalance_db_timeout
        try:
            if self._stale:
                await self._aclose()
            # A little over the server's statement timeout, for the round trip.
            marks = await asyncio.wait_for(self._aload(tps, timeout), timeout + 1.0)
        except (asyncio.TimeoutError, TimeoutError):
            self._core.marks_abandoned(tps, timeout, in_rebalance=False)
            return
        except psycopg.Error as e:
            self._core.marks_failed(e)
            return
        self._core.learn(marks)

    async def _aload(self, tps: list[TP], timeout: float) -> dict[TP, dict[str, str]]:
        """The marks of these partitions, the query bounded by the server
        (``statement_timeout``); a connection cancelled mid-query is not
        reused."""
        conn = await self._acquire()
        marks = await load_marks_async(conn, self.group, tps, timeout)
        if not conn.closed:
            self._idle.append(conn)
        return marks
