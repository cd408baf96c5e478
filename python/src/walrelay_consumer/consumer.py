"""A blocking consumer-group loop on confluent-kafka and psycopg: batches
per partition in one transaction each, offsets committed only after the
database commit, rebalances, poison records, database outages and SIGTERM
handled (the design of ``crates/walrelay-consumer/src/consumer_loop``).

The loop's decisions (what to apply, what follows from a batch's outcome,
failures and outages, flow control, offsets, rebalances) are
:mod:`walrelay_consumer.loop_core`'s, shared with the asyncio loop; this
module is its I/O on threads.

The loop polls a burst of records into per-partition queues, then applies
at most one batch per partition in a round: the round's batches run at the
same time on up to :attr:`Settings.pool_size` worker threads, each with a
database connection of its own (one partition never has two batches in
flight, so its order holds). When the round is done, the loop stores each
committed batch's last offset + 1 and polls again. The loop's thread
sleeps while the workers run, so they do not contend for the GIL with it.
A batch still running after
:data:`~walrelay_consumer.loop_core.pacing.STRAGGLER_WAIT` is left to its
worker (a straggler, :mod:`walrelay_consumer.loop_core.stragglers`). With
``pool_size=1`` everything runs on the loop's own thread.

Rebalance callbacks run inside the poll, on the loop's thread: a
revocation waits there for the revoked partitions' stragglers, and an
assignment loads the partitions' marks (a cache) on a thread of its own,
waiting at most :attr:`Settings.rebalance_db_timeout`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from typing import Any

import psycopg
from confluent_kafka import Consumer

from . import parked
from .apply import Apply as ApplyFn
from .apply import BatchHandler, RecordHandler, apply_batch, per_batch, per_record
from .connections import Connect, Connections
from .handler_timeout import Watchdog
from .kafka_config import ConfigError
from .loop_core import (
    JOB_FAILURES,
    STRAGGLER_WAIT,
    TP,
    After,
    ConsumerKafka,
    Driver,
    Job,
    PartitionsStopped,
    Round,
    StoppedPartition,
    close_dead,
    poll_burst,
)
from .marks import load_marks
from .parked_gauge import ParkedGauge
from .partition import ParkUnkeyed
from .settings import Settings

__all__ = ["ConsumerLoop", "ConfigError", "PartitionsStopped", "StoppedPartition", "load_marks"]


class ConsumerLoop(Driver):
    """A consumer-group loop that applies every walrelay record exactly once
    into PostgreSQL. See the module docs.

    ``kafka`` is a confluent-kafka configuration with at least
    ``bootstrap.servers`` and ``group.id``. The loop sets
    ``enable.auto.commit=false``, ``enable.auto.offset.store=false`` and
    ``isolation.level=read_committed`` (refusing other values for them) and
    ``auto.offset.reset=earliest`` unless given. Every other setting (TLS,
    SASL, an OAuth login with ``sasl.oauthbearer.method=oidc`` or an
    ``oauth_cb``) goes to librdkafka as given; the loop never logs the
    configuration, and secret references (``env:NAME``, ``file:/path``) are
    resolved by :func:`~walrelay_consumer.resolve_secrets`, not by the loop.
    ``database`` is a libpq connection string or a function returning a new
    psycopg connection; the tables must exist
    (:func:`walrelay_consumer.migrate`).

    With ``prometheus_client`` installed, the loop's metrics go to
    ``registry`` (its default registry when ``None``) under the Rust crate's
    names; without it there are none. :attr:`counters` has the totals
    either way.
    """

    def __init__(
        self,
        kafka: Mapping[str, Any],
        topics: list[str],
        database: str | Connect,
        settings: Settings | None = None,
        registry: Any = None,
        *,
        group_instance_id: str | None = None,
    ) -> None:
        super().__init__(kafka, topics, settings, registry, group_instance_id)
        if isinstance(database, str):
            conninfo = database
            self._connect: Connect = lambda: psycopg.connect(conninfo, autocommit=True)
        else:
            self._connect = database
        self._conns = Connections(self._connect)
        self._watchdog = Watchdog(self.settings.handler_timeout)
        self._workers: ThreadPoolExecutor | None = None

    def run(self, handler: RecordHandler, *, handle_signals: bool = True) -> None:
        """Subscribes and applies records with a **per-record** handler until
        :meth:`stop` (or SIGTERM/SIGINT, when ``handle_signals`` and this is
        the main thread).

        ``handler(conn, delivery)`` runs inside the batch transaction once
        per new record, in order, never for a duplicate; the side effects of
        the whole batch and its marks commit together. It must do all its
        database work through ``conn`` and not commit or roll back. With
        :attr:`Settings.pool_size` above 1 it runs on worker threads,
        batches of different partitions at the same time (each on its own
        connection), so what it shares besides ``conn`` must be thread-safe.
        Raises :class:`PartitionsStopped` at the end if a poison record
        stopped a partition.
        """
        self._run(per_record(handler, self._watchdog.watch), handle_signals)

    def run_batches(self, handler: BatchHandler, *, handle_signals: bool = True) -> None:
        """Like :meth:`run` with a **batch** handler: ``handler(conn,
        deliveries)`` is called once per batch with its new records (in
        order, duplicates dropped), so it can apply them in one statement."""
        self._run(per_batch(handler, self._watchdog.watch), handle_signals)

    # -- the loop ---------------------------------------------------------

    def _run(self, apply: ApplyFn, handle_signals: bool) -> None:
        core = self._core
        previous: dict[signal.Signals, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda _s, _f: self.stop())
        if self.settings.pool_size > 1:
            self._workers = ThreadPoolExecutor(self.settings.pool_size, thread_name_prefix="walrelay-apply")
        parked_gauge = ParkedGauge(self._connect, self.group, self.metrics)
        parked_gauge.start()
        try:
            # A new consumer each time the broker refuses the instance id
            # (loop_core.rejoin), until the stop or another fatal error.
            while True:
                self._consume(apply)
                wait = core.rejoin()
                if wait is None:
                    break
                core.wait_to_rejoin(wait)
        finally:
            parked_gauge.stop()
            if self._workers is not None:
                self._workers.shutdown(wait=True)
                self._workers = None
            # The workers are done: so is every abandoned batch.
            core.stragglers.collect_abandoned(core.counters)
            self._close_db()
            self._watchdog.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        core.end()

    def _consume(self, apply: ApplyFn) -> None:
        """Runs the loop on one consumer, from its creation to its close: until
        the stop, or until it is dead."""
        core = self._core
        consumer = Consumer(self._config)
        core.attach(ConsumerKafka(consumer))
        try:
            core.subscribe(consumer, self._settle, self._load_marks)
            while not core.consumer_done():
                round_ = self._work(apply)
                timeout = core.between_rounds(round_)
                core.received(poll_burst(consumer, timeout))
        finally:
            try:
                try:
                    self._settle(list(core.stragglers.in_flight))
                finally:
                    # What the settled batches stored is committed even if
                    # one of them ended in a bug (not by a dead consumer).
                    if core.refused is None:
                        try:
                            core.kafka.commit(asynchronous=False)
                        finally:
                            consumer.close()
                    else:
                        close_dead(consumer)
            finally:
                core.detach()

    def _work(self, apply: ApplyFn) -> Round:
        """Acts on the stragglers that finished, then applies the round's
        batches at the same time on the workers and acts on the outcomes of
        those done within :data:`STRAGGLER_WAIT`; the others stay in
        flight."""
        core = self._core
        self._settle(core.start_round())
        round_, jobs = core.next_round()
        if self._workers is None:
            for job in jobs:
                self._execute(job, apply)
                core.finish(job)
            return round_
        futures = [self._workers.submit(self._execute, job, apply) for job in jobs]
        wait_futures(futures, STRAGGLER_WAIT)
        core.end_round(jobs, futures)
        return round_

    def _settle(self, tps: list[TP], bound: float | None = None) -> None:
        """Waits for these partitions' stragglers (at most ``bound``
        seconds, then the ones still running are abandoned) and acts on
        their outcomes (on the loop's thread, or in a rebalance callback)."""
        taken = self._core.stragglers.take(tps)
        if bound is not None and taken:
            wait_futures([r for _, r in taken if isinstance(r, Future)], bound)
        self._core.settle(taken, bound)

    def _execute(self, job: Job, apply: ApplyFn) -> None:
        """Runs one job's transaction on a connection of the pool (on a
        worker thread, or the loop's own with ``pool_size=1``)."""
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = self._conns.acquire()
            if isinstance(job.step, ParkUnkeyed):
                job.result = parked.insert_unkeyed(conn, job.p.position, job.records[0].record, job.step.error)
            else:
                job.result = apply_batch(conn, job.p.position, job.deliveries(), apply, **job.batch_options())
        except JOB_FAILURES as e:
            job.result = e
        finally:
            after = job.end(conn)
            if conn is not None and after is After.CLOSE:
                conn.close()
            elif conn is not None and after is After.KEEP:
                self._conns.release(conn)

    def _close_db(self) -> None:
        self._conns.close_all()

    # -- the assigned partitions' marks (in the rebalance callback) -------

    def _load_marks(self, tps: list[TP]) -> None:
        marks = self._load_marks_bounded(tps)
        if marks is not None:
            self._core.learn(marks)

    def _load_marks_bounded(self, tps: list[TP]) -> dict[TP, dict[str, str]] | None:
        """Loads the assigned partitions' marks (a cache) on a thread of its
        own, waiting at most :attr:`Settings.rebalance_db_timeout`; ``None``
        when it failed or was abandoned (logged)."""
        timeout = self.settings.rebalance_db_timeout
        result: Future[dict[TP, dict[str, str]]] = Future()
        abandoned = threading.Event()

        def load() -> None:
            try:
                conn = self._conns.acquire()
            except BaseException as e:  # reported on the callback's thread
                result.set_exception(e)
                return
            try:
                result.set_result(load_marks(conn, self.group, tps, timeout))
            except BaseException as e:  # reported on the callback's thread
                result.set_exception(e)
            finally:
                if abandoned.is_set():
                    conn.close()
                else:
                    self._conns.release(conn)

        threading.Thread(target=load, name="walrelay-load-marks", daemon=True).start()
        try:
            # A little over the server's statement timeout, for the round trip.
            return result.result(timeout + 1.0)
        except FutureTimeout:
            abandoned.set()
            self._core.marks_abandoned(tps, timeout, in_rebalance=True)
        except psycopg.Error as e:
            self._core.marks_failed(e)
        return None
