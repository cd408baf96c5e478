"""One transaction of one partition (:class:`Job`), what a round over the
partitions left (:class:`Round`), and a job's batch while it runs
(:class:`Running`), whichever driver runs it: a worker thread of
:class:`~walrelay_consumer.ConsumerLoop` or a task of
:class:`~walrelay_consumer.AsyncConsumerLoop`.

A driver runs a job's transaction and records its outcome in the job (a
failure included: it is the job's result, not an exception of the
driver's); the core acts on that outcome afterwards, on the loop's thread
(:func:`~walrelay_consumer.loop_core.outcome.finish`).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg

from ..apply import BatchError, BatchOutcome
from ..counters import Counters
from ..handler_timeout import discards_connection
from ..parked import OffsetReused
from ..partition import Apply, ParkUnkeyed, Partition, Queued
from ..records import Delivery

__all__ = ["JOB_FAILURES", "TP", "After", "Job", "Round", "Running"]

#: A partition: (topic, partition).
TP = tuple[str, int]

#: What a job's transaction may fail with: the failure is the job's result,
#: for the core to act on. Anything else is a bug and propagates.
JOB_FAILURES = (BatchError, psycopg.Error, OffsetReused)


class After(enum.Enum):
    """What becomes of a job's connection after its transaction."""

    #: Back to the pool, for the next job.
    KEEP = "keep"
    #: Closed: a handler call timed out on it and may have left anything
    #: behind (:mod:`walrelay_consumer.handler_timeout`).
    CLOSE = "close"
    #: Dropped: never opened, or gone (closed or broken) during the job.
    DROP = "drop"


@dataclass(slots=True)
class Job:
    """One transaction of one partition, taken out of its queue for a round,
    and what came of it. The driver fills in the outcome; the core acts on
    it after the round (offsets, retries, counters, metrics)."""

    tp: TP
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

    @classmethod
    def take(cls, tp: TP, p: Partition, step: Apply | ParkUnkeyed) -> Job:
        """Takes the step's records out of the partition's queue."""
        if isinstance(step, ParkUnkeyed):
            return cls(tp, p, step, p.take(1), False, time.monotonic())
        known = p.knows_sources(step.take)
        return cls(tp, p, step, p.take(step.take), known, time.monotonic())

    @property
    def first_offset(self) -> int:
        return self.records[0].record.offset

    @property
    def last_offset(self) -> int:
        return self.records[-1].record.offset

    def deliveries(self) -> list[Delivery]:
        position = self.p.position
        return [Delivery(q.record, q.meta, position) for q in self.records]  # type: ignore[arg-type]

    def batch_options(self) -> dict[str, Any]:
        """The keyword arguments of ``apply_batch`` (and its async twin)."""
        assert isinstance(self.step, Apply)
        return {"park": self.step.park, "known": self.known, "counters": self.counters}

    def end(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None) -> After:
        """After the job's transaction on ``conn`` (``None``: none could be
        opened): notes whether the connection is gone, which makes a
        handler's failure an outage, and says what becomes of it."""
        self.conn_gone = conn is None or conn.closed or conn.broken
        if conn is None:
            return After.DROP
        if discards_connection(self.result):
            return After.CLOSE
        return After.DROP if self.conn_gone else After.KEEP


class Running(Protocol):
    """A job's batch running: a worker's ``Future`` or an asyncio ``Task``."""

    def done(self) -> bool: ...

    def result(self) -> None: ...


@dataclass(slots=True)
class Round:
    """What one round over the partitions left: whether some partition has
    more ready at once, and the earliest moment a waiting one becomes
    ready."""

    ready: bool = False
    wake: float | None = None

    def wait_until(self, at: float) -> None:
        """A partition waits until ``at`` (a backoff)."""
        self.wake = at if self.wake is None else min(self.wake, at)
