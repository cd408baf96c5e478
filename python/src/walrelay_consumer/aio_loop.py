"""The consumer loop for asyncio services (FastAPI, aiohttp): the blocking
:class:`~walrelay_consumer.ConsumerLoop`'s decisions, with the database
work on psycopg's ``AsyncConnection`` and librdkafka's blocking calls on
one worker thread, so the event loop keeps running while the loop waits.

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
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

from .aio import AsyncBatchHandler, AsyncRecordHandler, _AsyncApply, apply_batch_async
from .apply import BatchError, _Failed
from .handler_timeout import call_async, discards_connection
from .consumer import (
    LOAD_SQL,
    STATEMENT_TIMEOUT_SQL,
    POLL_BURST,
    STRAGGLER_WAIT,
    ConsumerLoop,
    PartitionsStopped,
    _Job,
    _millis,
    _resume_assigned,
    _Round,
    log,
)
from .parked import INSERT_UNKEYED_SQL, OffsetReused, SAME_UNKEYED_SQL, row_params, unkeyed_parked_before
from .partition import ParkUnkeyed, Partition
from .records import Delivery, Position, Record
from .settings import Settings

__all__ = ["AsyncConsumerLoop"]

AsyncConnect = Callable[[], Awaitable["psycopg.AsyncConnection[Any]"]]


class AsyncConsumerLoop(ConsumerLoop):
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
        super().__init__(
            kafka,
            topics,
            database if isinstance(database, str) else "",
            settings,
            registry,
            group_instance_id=group_instance_id,
        )
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
        self._pending: list[tuple[str, int]] = []

    async def run(self, handler: AsyncRecordHandler, *, handle_signals: bool = False) -> None:  # type: ignore[override]
        """Applies records with an async **per-record** handler until
        :meth:`stop`. See :meth:`ConsumerLoop.run`."""

        timeout = self.settings.handler_timeout

        async def apply(conn: psycopg.AsyncConnection[Any], new: list[Delivery]) -> None:
            for index, delivery in enumerate(new):
                try:
                    await call_async(handler(conn, delivery), timeout)
                except Exception as e:
                    raise _Failed(e, index) from e

        await self._arun(apply, handle_signals)

    async def run_batches(self, handler: AsyncBatchHandler, *, handle_signals: bool = False) -> None:  # type: ignore[override]
        """Applies records with an async **batch** handler until :meth:`stop`.
        See :meth:`ConsumerLoop.run_batches`."""

        timeout = self.settings.handler_timeout

        async def apply(conn: psycopg.AsyncConnection[Any], new: list[Delivery]) -> None:
            try:
                await call_async(handler(conn, new), timeout)
            except Exception as e:
                raise _Failed(e, 0 if len(new) == 1 else None) from e

        await self._arun(apply, handle_signals)

    async def _arun(self, apply: _AsyncApply, handle_signals: bool) -> None:
        loop = asyncio.get_running_loop()
        self._event_loop = loop
        self._slots = asyncio.Semaphore(self.settings.pool_size)
        kafka = ThreadPoolExecutor(max_workers=1, thread_name_prefix="walrelay-kafka")
        signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.stop)
        consumer = Consumer(self._config)
        self._consumer = consumer
        try:
            consumer.subscribe(
                self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
            )
            next_commit = time.monotonic() + self.settings.commit_interval
            while not self._stop.is_set():
                ready, wake = await self._awork(apply)
                self._flow_control()
                now = time.monotonic()
                if now >= next_commit:
                    self._commit(asynchronous=True)
                    next_commit = now + self.settings.commit_interval
                timeout = self._poll_timeout(ready, wake, now)
                messages = await loop.run_in_executor(kafka, consumer.consume, POLL_BURST, timeout)
                await self._load_pending()
                for message in messages:
                    error = message.error()
                    if error is not None:
                        self._report(error)
                        continue
                    self._enqueue(Record.from_message(message))
        finally:
            try:
                try:
                    await self._asettle(list(self._in_flight))
                    # Abandoned batches still running are left to the event
                    # loop; those done are counted.
                    self._collect_abandoned()
                finally:
                    # What the settled batches stored is committed even if
                    # one of them ended in a bug.
                    await loop.run_in_executor(kafka, self._commit_and_close, consumer)
            finally:
                kafka.shutdown(wait=False)
                self._consumer = None
                await self._aclose()
                for sig in signals:
                    loop.remove_signal_handler(sig)
        self._raise_fatal()
        if self._stopped:
            raise PartitionsStopped(list(self._stopped))

    def _commit_and_close(self, consumer: Consumer) -> None:
        try:
            self._commit(asynchronous=False)
        finally:
            consumer.close()

    async def _awork(self, apply: _AsyncApply) -> tuple[bool, float | None]:
        """:meth:`ConsumerLoop._work` with the batches as tasks of the event
        loop, at most ``pool_size`` running at a time: the round waits
        :data:`~walrelay_consumer.consumer.STRAGGLER_WAIT` for them, acts on
        those done and leaves the others in flight."""
        self._collect_abandoned()
        await self._asettle(self._finished_stragglers())
        if self._stale:
            await self._aclose()
        round_ = _Round()
        jobs = list(self._jobs(round_))
        tasks = [asyncio.create_task(self._aslot(job, apply)) for job in jobs]
        if tasks:
            await asyncio.wait(tasks, timeout=STRAGGLER_WAIT)
        self._end_round(jobs, tasks)
        return round_.ready, round_.wake

    async def _asettle(self, tps: list[tuple[str, int]], bound: float | None = None) -> None:
        """:meth:`ConsumerLoop._settle` on the event loop: awaits these
        partitions' stragglers (at most ``bound`` seconds, then the ones
        still running are abandoned) and acts on their outcomes."""
        taken = self._take_stragglers(tps)
        if bound is not None and taken:
            tasks = [r for _, r in taken if isinstance(r, asyncio.Task)]
            await asyncio.wait(tasks, timeout=bound)
        for job, running in taken:
            assert isinstance(running, asyncio.Task)
            if bound is not None and not running.done():
                self._abandon(job, running, bound)
                continue
            await running  # the job holds its failures; this raises only a bug's
            self._finish(job)

    def _settle(self, tps: list[tuple[str, int]], bound: float | None = None) -> None:
        # Called by the rebalance callbacks on the Kafka thread while the
        # event loop waits for the poll: the stragglers are awaited there.
        if any(tp in self._in_flight for tp in tps):
            assert self._event_loop is not None
            asyncio.run_coroutine_threadsafe(self._asettle(tps, bound), self._event_loop).result()

    async def _aslot(self, job: _Job, apply: _AsyncApply) -> None:
        assert self._slots is not None
        async with self._slots:
            await self._aexecute(job, apply)

    async def _aexecute(self, job: _Job, apply: _AsyncApply) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            conn = await self._acquire()
            if isinstance(job.step, ParkUnkeyed):
                job.result = await _insert_unkeyed(conn, job.p.position, job.records[0].record, job.step.error)
            else:
                job.result = await apply_batch_async(conn, job.p.position, job.deliveries(), apply, **job.batch_options())
        except (BatchError, psycopg.Error, OffsetReused) as e:
            job.result = e
        finally:
            job.conn_gone = conn is None or conn.closed or conn.broken
            if conn is not None and not job.conn_gone and discards_connection(job.result):
                await conn.close()
            elif conn is not None and not job.conn_gone:
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
        # Called by the shared decisions after an outage: the idle
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

    # Rebalance callbacks run on the Kafka thread inside the poll.

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        log.info("partitions assigned: %s", tps)
        for tp in tps:
            self._partitions.setdefault(tp, Partition(Position(self.group, *tp)))
        _resume_assigned(consumer, partitions)
        # Loaded on the event loop once the poll returns.
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
            rows = await asyncio.wait_for(self._aload(tps, timeout), timeout + 1.0)
        except (asyncio.TimeoutError, TimeoutError):
            log.warning(
                "loading the high-water marks of the assigned partitions %s took longer than %.1fs "
                "(Settings.rebalance_db_timeout), abandoned: they are only a cache, the batches "
                "read the real marks (is the database answering?)",
                tps,
                timeout,
            )
            self._stale = True
            return
        except psycopg.Error as e:
            # Only a cache: the batch transactions read the real marks.
            log.warning("loading the high-water marks of the assigned partitions failed: %s", e)
            self._stale = True
            return
        for topic, partition, source, hwm in rows:
            p = self._partitions.get((topic, partition))
            if p is not None:
                p.learn({source: hwm})

    async def _aload(self, tps: list[tuple[str, int]], timeout: float) -> list[tuple[Any, ...]]:
        """The marks of these partitions, the query bounded by the server
        (``statement_timeout``); a connection cancelled mid-query is not
        reused."""
        conn = await self._acquire()
        done = False
        try:
            async with conn.transaction():
                cur = psycopg.AsyncRawCursor(conn)
                await cur.execute(STATEMENT_TIMEOUT_SQL, [_millis(timeout)])
                await cur.execute(LOAD_SQL, [self.group, [t for t, _ in tps], [p for _, p in tps]])
                rows = await cur.fetchall()
            done = True
            return rows
        finally:
            if done and not conn.closed:
                self._idle.append(conn)


async def _insert_unkeyed(conn: psycopg.AsyncConnection[Any], position: Position, record: Record, error: str) -> bool:
    params = row_params(position, record, None, None, error, 1)
    async with conn.transaction():
        cur = psycopg.AsyncRawCursor(conn)
        await cur.execute(INSERT_UNKEYED_SQL, params)
        if cur.rowcount == 1:
            return True
        await cur.execute(SAME_UNKEYED_SQL, params[:4] + params[6:10])
        row = await cur.fetchone()
    return unkeyed_parked_before(position, record, row)
