"""A blocking consumer-group loop on confluent-kafka and psycopg: batches
per partition in one transaction each, offsets committed only after the
database commit, rebalances, poison records, database outages and SIGTERM
handled (the design of ``crates/walrelay-consumer/src/consumer_loop``).

The loop polls a burst of records into per-partition queues, then applies
at most one batch per partition in a round: the round's batches run at the
same time on up to :attr:`Settings.pool_size` worker threads, each with a
database connection of its own (one partition never has two batches in
flight, so its order holds). When the round is done, the loop stores each
committed batch's last offset + 1 and polls again. The loop's thread
sleeps while the workers run, so they do not contend for the GIL with it.

A batch still running :data:`STRAGGLER_WAIT` after its round started is a
*straggler*: the round ends without it and the loop goes on polling and
applying the other partitions while it finishes; nothing else of its
partition is decided until the loop has acted on its outcome. So a slow
partition holds up only itself.

Rebalance callbacks run inside the poll: a revocation first waits for the
revoked partitions' stragglers (at most :attr:`Settings.revoke_wait`, then
they are abandoned and logged) and acts on them, then commits the stored
offsets (only those of committed batches) and drops the revoked
partitions' queued records, which the next owner reads again; whatever
this member committed is covered by the marks. With ``pool_size=1``
everything runs on the loop's own thread.

Failures:

* a handler error rolls the batch back and retries it after a backoff
  (:attr:`Settings.retry`). After the last attempt :attr:`Settings.on_poison`
  decides for the failing record: stop the partition, or park it in the
  dead-letter table in the same transaction that moves the mark past it.
  The per-record handler says which record failed; for a batch handler the
  loop finds it by applying the batch one record per transaction;
* a database outage (:mod:`walrelay_consumer.outage`: a lost connection, a
  server shutting down, cannot connect), or a handler error on a connection
  that is gone, is not a poison record: the connection is replaced and the
  batch retried with backoff for as long as it takes, while the loop keeps
  polling (the partition pauses once its queue is full). Contention or a
  batch too large (a deadlock, a serialization failure, a statement
  timeout, out of shared memory) retries the failed batch's records in
  batches of half its size without counting, and counts at one record. Any
  other database error of the batch (a constraint checked at COMMIT)
  counts as an attempt, like a handler error, and so does a handler call
  running past :attr:`Settings.handler_timeout`; attempts are counted per
  record;
* a handler that ended the batch's transaction itself (ran ``COMMIT`` or
  ``ROLLBACK``) stops its partition whatever the poison policy: atomicity
  was broken, no retry can repair it;
* a record without walrelay headers goes to the same policy, alone.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from . import parked
from .apply import (
    BatchError,
    BatchOutcome,
    BatchHandler,
    CorruptHwm,
    HandlerEndedTransaction,
    HandlerFailed,
    RecordHandler,
    per_batch,
    per_record,
    apply_batch,
)
from .apply import Apply as ApplyFn
from ._statements import statement
from .counters import Counters
from .denied import explain as explain_denied
from .metrics import Metrics
from .connections import Connect, Connections
from .handler_timeout import Watchdog, discards_connection
from .kafka_config import ConfigError, consumer_config
from .outage import ErrorClass, class_of
from .partition import Apply, Idle, Partition, ParkUnkeyed, Queued, Skip, Stop, WaitUntil
from .records import Delivery, Position, Record
from .settings import Settings

__all__ = ["ConsumerLoop", "ConfigError", "PartitionsStopped", "StoppedPartition", "load_marks"]

log = logging.getLogger("walrelay_consumer")

#: Records taken from librdkafka per poll.
POLL_BURST = 1024
#: The longest single poll, so a stop request is seen quickly.
POLL_MAX = 0.2
#: How long a round waits for its batches: one still running then is left
#: in flight (a straggler) and the loop goes on with the other partitions.
#: Well above a healthy batch (tens of milliseconds), so normal rounds end
#: together and the loop's thread does not contend with the workers.
STRAGGLER_WAIT = 0.25
#: The longest poll while a straggler is in flight, so its partition goes
#: on soon after it finishes.
POLL_STRAGGLER = 0.01

LOAD_SQL = statement("hwm_load")


#: Bounds the statements of the transaction it runs in.
STATEMENT_TIMEOUT_SQL = statement("statement_timeout")


def _millis(seconds: float) -> str:
    return f"{max(int(seconds * 1000), 1)}ms"


@dataclass(frozen=True, slots=True)
class StoppedPartition:
    """A partition stopped by a poison record."""

    topic: str
    partition: int
    #: What failed, naming the record (offset, attempts, error).
    error: str


class PartitionsStopped(Exception):
    """Partitions were stopped by poison records (:attr:`OnPoison.STOP`);
    the loop served the others until the shutdown. Nothing of a stopped
    partition was committed past the poison record: a restart retries it."""

    def __init__(self, stopped: list[StoppedPartition]) -> None:
        detail = "; ".join(f"{p.topic}/{p.partition}: {p.error}" for p in stopped)
        super().__init__(
            f"{len(stopped)} partition(s) stopped by a record that kept failing: {detail}; fix "
            "the handler or the record and restart (it is retried), or run with the park policy"
        )
        self.stopped = stopped


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
    out: dict[tuple[str, int], dict[str, str]] = {}
    with conn.transaction():
        cur = psycopg.RawCursor(conn)
        if timeout is not None:
            cur.execute(STATEMENT_TIMEOUT_SQL, [_millis(timeout)])
        rows = cur.execute(
            LOAD_SQL, [group, [t for t, _ in partitions], [p for _, p in partitions]]
        ).fetchall()
    for topic, partition, source, hwm in rows:
        out.setdefault((topic, partition), {})[source] = hwm
    return out


@dataclass(slots=True)
class _Job:
    """One transaction of one partition, taken out of its queue for a round,
    and what came of it. Workers fill in the outcome; the loop's thread acts
    on it after the round (offsets, retries, counters, metrics)."""

    tp: tuple[str, int]
    p: Partition
    step: Apply | ParkUnkeyed
    records: list[Queued]
    known: bool
    started: float
    #: The batch's outcome, whether an unkeyed record was written, or what failed.
    result: BatchOutcome | bool | Exception | None = None
    #: The job's connection was gone at its end (a handler failure is then an outage).
    conn_gone: bool = False
    #: This job's counts, added to the loop's on its thread.
    counters: Counters = field(default_factory=Counters)

    def deliveries(self) -> list[Delivery]:
        return _deliveries(self.p, self.records)

    def batch_options(self) -> dict[str, Any]:
        """The keyword arguments of ``apply_batch`` (and its async twin)."""
        assert isinstance(self.step, Apply)
        return {"park": self.step.park, "known": self.known, "counters": self.counters}

    @classmethod
    def take(cls, tp: tuple[str, int], p: Partition, step: Apply | ParkUnkeyed) -> _Job:
        if isinstance(step, ParkUnkeyed):
            return cls(tp, p, step, p.take(1), False, time.monotonic())
        known = p.knows_sources(step.take)
        return cls(tp, p, step, p.take(step.take), known, time.monotonic())


class _Running(Protocol):
    """A job's batch running: a worker's ``Future`` or an asyncio ``Task``."""

    def done(self) -> bool: ...

    def result(self) -> None: ...


@dataclass(slots=True)
class _Round:
    """What one round over the partitions left: whether some partition has
    more ready at once, and the earliest moment a waiting one becomes
    ready."""

    ready: bool = False
    wake: float | None = None


class ConsumerLoop:
    """A consumer-group loop that applies every walrelay record exactly once
    into PostgreSQL. See the module docs.

    ``kafka`` is a confluent-kafka configuration with at least
    ``bootstrap.servers`` and ``group.id``. The loop sets
    ``enable.auto.commit=false``, ``enable.auto.offset.store=false`` and
    ``isolation.level=read_committed`` (refusing other values for them) and
    ``auto.offset.reset=earliest`` unless given. ``database`` is a libpq
    connection string or a function returning a new psycopg connection; the
    tables must exist (:func:`walrelay_consumer.migrate`).

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
        config, group = consumer_config(kafka, topics, group_instance_id)
        self.metrics = Metrics.for_registry(registry)
        if self.metrics.enabled:
            # Statistics feed the consumer-lag gauge.
            config.setdefault("statistics.interval.ms", 5000)
            config.setdefault("stats_cb", self.metrics.statistics)
        self.group: str = str(group)
        self.topics = list(topics)
        self.settings = (settings or Settings()).normalized()
        self.counters = Counters()
        self._config = config
        if isinstance(database, str):
            conninfo = database
            self._connect: Connect = lambda: psycopg.connect(conninfo, autocommit=True)
        else:
            self._connect = database
        self._stop = threading.Event()
        self._conns = Connections(self._connect)
        self._watchdog = Watchdog(self.settings.handler_timeout)
        #: A fatal Kafka error (a static member fenced by another one with
        #: its group.instance.id): the loop ends with it.
        self._fatal: KafkaError | None = None
        self._workers: ThreadPoolExecutor | None = None
        #: Stragglers: batches left running after their round.
        self._in_flight: dict[tuple[str, int], tuple[_Job, _Running]] = {}
        #: Stragglers a revocation stopped waiting for: still running, their
        #: partitions gone; their counts are added when they end.
        self._abandoned: list[tuple[_Job, _Running]] = []
        self._consumer: Consumer | None = None
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._stopped: list[StoppedPartition] = []
        self._stored = False
        self._cursor = 0

    def stop(self) -> None:
        """Asks the loop to stop (thread- and signal-safe): it finishes the
        batch it is applying, commits the stored offsets and leaves the
        group."""
        self._stop.set()

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

    def _report(self, error: KafkaError) -> None:
        """A consumer error: librdkafka goes on retrying, so it is only
        reported, an authorization error as the ACL that is missing."""
        message = explain_denied(error, self.topics, self.group)
        if error.fatal() or error.code() == KafkaError._FATAL:
            # Nothing works after it: end the loop with it.
            log.error("fatal Kafka consumer error, the loop stops: %s", error)
            self._fatal = error
            self.stop()
        elif message is not None:
            log.error("Kafka consumer error: %s", message)
        else:
            log.warning("Kafka consumer error: %s", error)

    def _run(self, apply: ApplyFn, handle_signals: bool) -> None:
        previous: dict[signal.Signals, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda _s, _f: self.stop())
        consumer = Consumer(self._config)
        self._consumer = consumer
        if self.settings.pool_size > 1:
            self._workers = ThreadPoolExecutor(self.settings.pool_size, thread_name_prefix="walrelay-apply")
        try:
            consumer.subscribe(
                self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
            )
            next_commit = time.monotonic() + self.settings.commit_interval
            while not self._stop.is_set():
                ready, wake = self._work(apply)
                self._flow_control()
                now = time.monotonic()
                if now >= next_commit:
                    self._commit(asynchronous=True)
                    next_commit = now + self.settings.commit_interval
                timeout = self._poll_timeout(ready, wake, now)
                for message in consumer.consume(POLL_BURST, timeout):
                    error = message.error()
                    if error is not None:
                        # librdkafka retries on its own; errors here are reports.
                        self._report(error)
                        continue
                    self._enqueue(Record.from_message(message))
        finally:
            try:
                try:
                    self._settle(list(self._in_flight))
                finally:
                    # What the settled batches stored is committed even if
                    # one of them ended in a bug.
                    self._commit(asynchronous=False)
                    consumer.close()
            finally:
                self._consumer = None
                if self._workers is not None:
                    self._workers.shutdown(wait=True)
                    self._workers = None
                # The workers are done: so is every abandoned batch.
                self._collect_abandoned()
                self._close_db()
                self._watchdog.close()
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        self._raise_fatal()
        if self._stopped:
            raise PartitionsStopped(list(self._stopped))

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise KafkaException(self._fatal)

    def _enqueue(self, record: Record) -> None:
        tp = (record.topic, record.partition)
        p = self._partitions.get(tp)
        if p is None:
            p = self._partitions[tp] = Partition(Position(self.group, *tp))
        if p.stopped is not None:
            # Fetched before the pause took effect; it comes again after a restart.
            return
        p.push(Queued.of(record))

    def _poll_timeout(self, ready: bool, wake: float | None, now: float) -> float:
        """How long the next poll may wait: not at all when a partition has
        more ready, briefly while a straggler is in flight, else until the
        earliest retry (at most :data:`POLL_MAX`)."""
        if ready:
            return 0.0
        timeout = min(POLL_MAX, max(0.0, (wake or now + POLL_MAX) - now))
        return min(timeout, POLL_STRAGGLER) if self._in_flight else timeout

    def _finished_stragglers(self) -> list[tuple[str, int]]:
        return [tp for tp, (_, running) in self._in_flight.items() if running.done()]

    def _end_round(self, jobs: list[_Job], running: Sequence[_Running]) -> None:
        """Acts on the round's batches that are done; the others stay in
        flight as stragglers."""
        for job, r in zip(jobs, running):
            if r.done():
                r.result()  # the job holds its failures; this raises only a bug's
                self._finish(job)
            else:
                job.p.in_flight = True
                self._in_flight[job.tp] = (job, r)

    def _work(self, apply: ApplyFn) -> tuple[bool, float | None]:
        """Acts on the stragglers that finished, then applies at most one
        batch per other partition, the partitions' batches at the same time
        on the workers (skipping what the cached marks cover without a
        transaction), and acts on the outcomes of those done within
        :data:`STRAGGLER_WAIT`; the others stay in flight. Returns whether
        some partition may have more ready at once, and the earliest moment
        a waiting one becomes ready."""
        self._collect_abandoned()
        self._settle(self._finished_stragglers())
        round_ = _Round()
        jobs = list(self._jobs(round_))
        if self._workers is None:
            for job in jobs:
                self._execute(job, apply)
                self._finish(job)
            return round_.ready, round_.wake
        futures = [self._workers.submit(self._execute, job, apply) for job in jobs]
        wait_futures(futures, STRAGGLER_WAIT)
        self._end_round(jobs, futures)
        return round_.ready, round_.wake

    def _settle(self, tps: list[tuple[str, int]], bound: float | None = None) -> None:
        """Waits for these partitions' stragglers (at most ``bound``
        seconds, then the ones still running are abandoned) and acts on
        their outcomes (on the loop's thread, or in a rebalance callback)."""
        taken = self._take_stragglers(tps)
        if bound is not None and taken:
            wait_futures([r for _, r in taken if isinstance(r, Future)], bound)
        for job, running in taken:
            if bound is not None and not running.done():
                self._abandon(job, running, bound)
                continue
            running.result()  # the job holds its failures; this raises only a bug's
            self._finish(job)

    def _abandon(self, job: _Job, running: _Running, waited: float) -> None:
        """A revoked partition's straggler still running after ``waited``
        seconds: the revocation goes on without it."""
        log.warning(
            "a batch of the revoked partition %s/%d (offsets %d..%d) was still running after "
            "%.1fs (Settings.revoke_wait), abandoned so that the rebalance goes on: its "
            "transaction commits or rolls back on its own, its offsets are not stored, and the "
            "next owner's marks drop whatever it committed (is the database answering?)",
            job.tp[0],
            job.tp[1],
            job.records[0].record.offset,
            job.records[-1].record.offset,
            waited,
        )
        self._abandoned.append((job, running))

    def _collect_abandoned(self) -> None:
        """Counts the abandoned batches that ended since (on the loop's
        thread), so the counters stay exact."""
        if not self._abandoned:
            return
        left: list[tuple[_Job, _Running]] = []
        for job, running in self._abandoned:
            if not running.done():
                left.append((job, running))
                continue
            self.counters.add(job.counters)
            outcome = "committed" if isinstance(job.result, (BatchOutcome, bool)) else f"failed: {job.result}"
            log.info(
                "an abandoned batch of %s/%d (offsets %d..%d) ended: %s",
                job.tp[0],
                job.tp[1],
                job.records[0].record.offset,
                job.records[-1].record.offset,
                outcome,
            )
        self._abandoned = left

    def _take_stragglers(self, tps: list[tuple[str, int]]) -> list[tuple[_Job, _Running]]:
        """Takes these partitions' stragglers out of flight, to be waited for
        and acted on."""
        taken = [entry for tp in tps if (entry := self._in_flight.pop(tp, None)) is not None]
        for job, _ in taken:
            job.p.in_flight = False
        return taken

    def _jobs(self, round_: _Round) -> Iterator[_Job]:
        """One round over the partitions: takes out of its queue the one
        transaction each partition may run now and yields it, does the
        skips that need none, and notes in ``round_`` what is left. A
        partition with a job yielded is not looked at again in this round
        (its outcome is not known yet), so it is noted as maybe ready; one
        with a straggler in flight is idle. Shared by the blocking and the
        asyncio loop, which differ only in how they run the jobs."""
        order = sorted(self._partitions)
        if order:
            # Rotated, so that no partition always goes last.
            self._cursor = (self._cursor + 1) % len(order)
            order = order[self._cursor :] + order[: self._cursor]
        for tp in order:
            while not self._stop.is_set():
                p = self._partitions.get(tp)
                if p is None:
                    break
                step = p.next_step(self.settings, time.monotonic())
                if isinstance(step, Idle):
                    break
                if isinstance(step, WaitUntil):
                    round_.wake = step.at if round_.wake is None else min(round_.wake, step.at)
                    break
                if isinstance(step, Stop):
                    self._stop_partition(tp, p, step.error)
                    break
                if isinstance(step, Skip):
                    records = p.take(step.take)
                    p.committed(step.take)
                    self.counters.duplicates += step.take
                    self.metrics.skipped(step.take)
                    self._store_offset(tp, records[-1].record.offset)
                    continue
                assert isinstance(step, (Apply, ParkUnkeyed))
                yield _Job.take(tp, p, step)
                # One transaction per partition per round: poll between.
                round_.ready = True
                break

    def _close_db(self) -> None:
        """Closes the idle connections (after an outage they are suspect;
        the next job opens a new one)."""
        self._conns.close_all()

    def _execute(self, job: _Job, apply: ApplyFn) -> None:
        """Runs one job's transaction on a connection of the pool (on a
        worker thread, or the loop's own with ``pool_size=1``)."""
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = self._conns.acquire()
            if isinstance(job.step, ParkUnkeyed):
                job.result = parked.insert_unkeyed(conn, job.p.position, job.records[0].record, job.step.error)
            else:
                job.result = apply_batch(conn, job.p.position, job.deliveries(), apply, **job.batch_options())
        except (BatchError, psycopg.Error, parked.OffsetReused) as e:
            job.result = e
        finally:
            job.conn_gone = conn is None or conn.closed or conn.broken
            if conn is not None and discards_connection(job.result):
                conn.close()
            elif conn is not None:
                self._conns.release(conn)

    def _finish(self, job: _Job) -> None:
        """Acts on a job's outcome, on the loop's thread."""
        self.counters.add(job.counters)
        assert job.result is not None
        if isinstance(job.step, ParkUnkeyed):
            written = job.result
            assert isinstance(written, (bool, Exception))
            self._unkeyed_done(job.tp, job.p, job.records, written, job.started, job.conn_gone)
            return
        assert not isinstance(job.result, bool)
        parking = isinstance(job.step, Apply) and job.step.park is not None
        self._batch_done(job.tp, job.p, job.records, job.result, job.started, job.conn_gone, parking)

    def _unkeyed_done(
        self,
        tp: tuple[str, int],
        p: Partition,
        records: list[Queued],
        written: bool | Exception,
        now: float,
        conn_gone: bool,
    ) -> None:
        """Acts on parking a record without walrelay headers."""
        if isinstance(written, parked.OffsetReused):
            # Refused rather than guessed: the partition stops.
            p.put_back(records)
            self._stop_partition(tp, p, str(written))
            return
        if isinstance(written, Exception):
            p.put_back(records)
            if class_of(written, conn_gone) is not ErrorClass.BATCH:
                # An outage, or contention on a one-row insert: not the record's.
                self._outage(tp, p, written, now)
            else:
                self._stop_partition(
                    tp,
                    p,
                    f"parking record {tp[0]}/{tp[1]} at offset {records[0].record.offset} (no walrelay "
                    f"headers) failed, not for an outage: {written}",
                )
            return
        if written:
            self.counters.parked += 1
            self.metrics.parked_unkeyed()
        log.warning(
            "record without walrelay headers %s walrelay_consumer_parked (topic %s partition %d offset %d)",
            "parked in" if written else "delivered again, already parked (the same record) in",
            tp[0],
            tp[1],
            records[0].record.offset,
        )
        p.committed(1)
        self._store_offset(tp, records[0].record.offset)

    def _batch_done(
        self,
        tp: tuple[str, int],
        p: Partition,
        records: list[Queued],
        result: BatchOutcome | Exception,
        now: float,
        conn_gone: bool,
        parking: bool = False,
    ) -> None:
        """Acts on a batch's outcome: store the offset, or retry, or stop."""
        if isinstance(result, (CorruptHwm, HandlerEndedTransaction)):
            p.put_back(records)
            self._stop_partition(tp, p, str(result))
            return
        kind = class_of(result, conn_gone) if isinstance(result, Exception) else None
        if kind is ErrorClass.SHRINK:
            assert isinstance(result, Exception)
            self.metrics.failed()
            p.put_back(records)
            self._contended(tp, p, records, result, now)
            return
        if isinstance(result, HandlerFailed) and kind is ErrorClass.BATCH:
            self.metrics.failed()
            p.put_back(records)
            n = p.handler_failed(str(result.error), result.index, len(records), self.settings, now)
            offset = records[result.index].record.offset if result.index is not None else None
            log.warning(
                "handler failed (attempt %d of %d, topic %s partition %d offset %s), batch of %d "
                "rolled back and retried: %r",
                n,
                self.settings.retry.attempts,
                tp[0],
                tp[1],
                offset,
                len(records),
                result.error,
            )
            return
        if isinstance(result, Exception) and kind is ErrorClass.OUTAGE:
            # The database is unreachable or going away (or a handler failed
            # on a connection that is gone): not the batch's fault.
            self.metrics.failed()
            p.put_back(records)
            self._outage(tp, p, result, now)
            return
        if isinstance(result, Exception):
            self.metrics.failed()
            p.put_back(records)
            self._batch_failed(tp, p, records, result, now, parking)
            return
        outcome = result
        self.metrics.committed(tp[0], tp[1], len(records), time.monotonic() - now, outcome)
        if outcome.parked:
            log.warning(
                "record parked in walrelay_consumer_parked after its last attempt "
                "(topic %s partition %d offset %d)",
                tp[0],
                tp[1],
                records[-1].record.offset,
            )
        p.learn(outcome.marks)
        p.committed(len(records))
        self._store_offset(tp, records[-1].record.offset)

    def _batch_failed(
        self, tp: tuple[str, int], p: Partition, records: list[Queued], error: Exception, now: float, parking: bool
    ) -> None:
        """The batch's transaction failed for a reason of its own (a
        constraint checked at COMMIT, a serialization failure, a statement
        the handler let fail): an attempt, like a handler failure."""
        first, last = records[0].record.offset, records[-1].record.offset
        if parking:
            # Parking wrote nothing, for a reason that would come again.
            self._stop_partition(
                tp, p, f"parking record {tp[0]}/{tp[1]} at offset {last} failed, not for an outage: {error}"
            )
            return
        n = p.handler_failed(str(error), None, len(records), self.settings, now)
        log.warning(
            "the transaction of a batch failed, not for a database outage (attempt %d of %d, topic "
            "%s partition %d offsets %d..%d; a batch of several is then applied one record per "
            "transaction to find the record): %s",
            n,
            self.settings.retry.attempts,
            tp[0],
            tp[1],
            first,
            last,
            error,
        )

    def _contended(self, tp: tuple[str, int], p: Partition, records: list[Queued], error: Exception, now: float) -> None:
        """The batch failed for contention or for its size, not for a record:
        its records are retried in smaller batches, counted at one."""
        cause = error.error if isinstance(error, HandlerFailed) else error
        n = p.contended(str(cause), len(records), self.settings, now)
        log.warning(
            "a batch failed for contention or for its size (topic %s partition %d offsets %d..%d), "
            "rolled back and retried %s: %s",
            tp[0],
            tp[1],
            records[0].record.offset,
            records[-1].record.offset,
            f"in batches of {len(records) // 2}, not counted" if n is None
            else f"(attempt {n} of {self.settings.retry.attempts} of the record)",
            cause,
        )

    def _outage(self, tp: tuple[str, int], p: Partition, error: Exception, now: float) -> None:
        """A database failure: replace the connection, retry with backoff
        for as long as it takes."""
        self._close_db()
        n = p.db_failed(self.settings, now)
        if n & (n - 1) == 0:
            log.warning(
                "database unavailable, the batch will be retried on a new connection in %.2fs "
                "(topic %s partition %d; logged at 1, 2, 4, 8... failures, now %d): %s",
                (p.retry_at or now) - now,
                tp[0],
                tp[1],
                n,
                error,
            )

    def _stop_partition(self, tp: tuple[str, int], p: Partition, error: str) -> None:
        log.error(
            "partition %s/%d stopped (nothing of it is applied or committed until a restart; "
            "the other partitions go on): %s",
            tp[0],
            tp[1],
            error,
        )
        p.stopped = error
        self.metrics.stopped(tp[0], tp[1])
        p.take(len(p.queue))
        p.paused = True
        assert self._consumer is not None
        try:
            self._consumer.pause([TopicPartition(tp[0], tp[1])])
        except KafkaException as e:
            log.warning("pausing the stopped partition failed: %s", e)
        self._stopped.append(StoppedPartition(tp[0], tp[1], error))

    def _flow_control(self) -> None:
        """Pauses partitions with two batches waiting, resumes drained ones."""
        assert self._consumer is not None
        pause: list[TopicPartition] = []
        resume: list[TopicPartition] = []
        for (topic, partition), p in self._partitions.items():
            if p.should_pause(self.settings):
                p.paused = True
                pause.append(TopicPartition(topic, partition))
            elif p.should_resume(self.settings):
                p.paused = False
                resume.append(TopicPartition(topic, partition))
        try:
            if pause:
                self._consumer.pause(pause)
            if resume:
                self._consumer.resume(resume)
        except KafkaException as e:
            log.warning("pausing or resuming partitions failed: %s", e)

    def _store_offset(self, tp: tuple[str, int], offset: int) -> None:
        """Stores ``offset + 1`` as the next offset to commit."""
        assert self._consumer is not None
        try:
            self._consumer.store_offsets(offsets=[TopicPartition(tp[0], tp[1], offset + 1)])
            self._stored = True
        except KafkaException as e:
            # Revoked meanwhile: the new owner skips it by its mark.
            log.debug("storing the offset failed: %s", e)

    def _commit(self, asynchronous: bool) -> None:
        """Commits the stored offsets: asynchronously while records flow
        (when something was stored since), synchronously on revocation and
        at shutdown (always: an asynchronous commit may still be on its
        way)."""
        if self._consumer is None or (asynchronous and not self._stored):
            return
        self._stored = False
        try:
            if asynchronous:
                self._consumer.commit(asynchronous=True)
            else:
                self._consumer.commit(asynchronous=False)
        except KafkaException as e:
            if e.args and e.args[0].code() == KafkaError._NO_OFFSET:
                return
            # The records will be redelivered and skipped by their marks.
            log.warning("committing offsets failed: %s", e)

    # -- rebalance callbacks (run inside consume) -------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        log.info("partitions assigned: %s", tps)
        for tp in tps:
            self._partitions.setdefault(tp, Partition(Position(self.group, *tp)))
        _resume_assigned(consumer, partitions)
        marks = self._load_marks_bounded(tps)
        if marks is None:
            return
        for tp, by_source in marks.items():
            p = self._partitions.get(tp)
            if p is not None:
                p.learn(by_source)

    def _load_marks_bounded(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], dict[str, str]] | None:
        """Loads the assigned partitions' marks (a cache) on a thread of its
        own, waiting at most :attr:`Settings.rebalance_db_timeout`; ``None``
        when it failed or was abandoned (logged)."""
        timeout = self.settings.rebalance_db_timeout
        result: Future[dict[tuple[str, int], dict[str, str]]] = Future()
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
            log.warning(
                "loading the high-water marks of the assigned partitions %s took longer than %.1fs "
                "(Settings.rebalance_db_timeout), abandoned so that the rebalance goes on: they are "
                "only a cache, the batches read the real marks (is the database answering?)",
                tps,
                timeout,
            )
        except psycopg.Error as e:
            # Only a cache: the batch transactions read the real marks.
            log.warning("loading the high-water marks of the assigned partitions failed: %s", e)
        self._close_db()
        return None

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Finish the revoked partitions' stragglers (no other batch is in
        # flight: callbacks run inside the poll), commit what the committed
        # batches stored, drop the rest.
        tps = [(tp.topic, tp.partition) for tp in partitions]
        self._settle(tps, self.settings.revoke_wait)
        self._commit(asynchronous=False)
        log.info("partitions revoked: %s", tps)
        for tp in tps:
            self._partitions.pop(tp, None)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Lost, not revoked: committing is pointless (another member owns
        # them); the marks make the new owner's work exactly-once. Their
        # stragglers are waited for, so none outlives its partition.
        tps = [(tp.topic, tp.partition) for tp in partitions]
        self._settle(tps, self.settings.revoke_wait)
        log.warning("partitions lost: %s", tps)
        for tp in tps:
            self._partitions.pop(tp, None)


def _resume_assigned(consumer: Consumer, partitions: list[TopicPartition]) -> None:
    """Resumes newly assigned partitions. librdkafka keeps a partition's
    pause across a revocation and a new assignment of the same partition,
    while the loop starts it over unpaused: a partition paused when it was
    revoked would never fetch again."""
    try:
        consumer.resume(partitions)
    except KafkaException as e:
        log.warning("resuming the assigned partitions failed: %s", e)


def _deliveries(p: Partition, records: list[Queued]) -> list[Delivery]:
    position = p.position
    return [Delivery(q.record, q.meta, position) for q in records]  # type: ignore[arg-type]
