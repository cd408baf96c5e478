"""One assigned partition's state and the pure decisions about it: what to
apply next, when to wait, what a failure means
(``crates/walrelay-consumer/src/consumer_loop/partition.rs``).

A batch only ever takes records from the front of the queue, and they leave
the queue only when their transaction committed, so the partition's order
is strict and a failed batch is retried as it was (or one record per
transaction, to find the record that fails; or in batches of half its size
after contention, :class:`Shrink`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from . import batch
from .apply import Park
from .meta import MetaError, RecordMeta
from .records import Position, Record
from .settings import OnPoison, Settings

__all__ = ["Queued", "Failing", "Shrink", "Step", "Idle", "WaitUntil", "Skip", "Apply", "ParkUnkeyed", "Stop", "Partition"]


@dataclass(slots=True)
class Queued:
    """A record waiting in its partition's queue, its headers parsed once."""

    record: Record
    meta: RecordMeta | MetaError
    bytes: int

    @classmethod
    def of(cls, record: Record) -> Queued:
        meta: RecordMeta | MetaError
        try:
            meta = RecordMeta.from_headers(record.headers)
        except MetaError as e:
            meta = e
        return cls(record, meta, record.size)


@dataclass(slots=True)
class Failing:
    """The failure of the batch at the front of the queue."""

    failures: int
    error: str
    #: The failing record's index in the batch, when known.
    index: int | None
    #: The batch's length.
    len: int


@dataclass(frozen=True, slots=True)
class Shrink:
    """A cap on the batch size after a batch failed for contention or for
    its size (:attr:`~walrelay_consumer.outage.ErrorClass.SHRINK`): the
    failed batch's records are retried in batches of at most ``max``,
    halved on each such failure, until ``left`` of them committed."""

    max: int
    left: int


class Step:
    """What the partition does next."""


@dataclass(frozen=True, slots=True)
class Idle(Step):
    """Nothing now (empty, stopped)."""


@dataclass(frozen=True, slots=True)
class WaitUntil(Step):
    """Nothing before this moment (backoff)."""

    at: float


@dataclass(frozen=True, slots=True)
class Skip(Step):
    """Every one of the first ``take`` records is at or below a cached
    mark: store the offset, no transaction."""

    take: int


@dataclass(frozen=True, slots=True)
class Apply(Step):
    """Apply the first ``take`` records in one transaction; with ``park``,
    the last of them is parked instead."""

    take: int
    park: Park | None = None


@dataclass(frozen=True, slots=True)
class ParkUnkeyed(Step):
    """The front record has no usable walrelay headers: park it alone."""

    error: str


@dataclass(frozen=True, slots=True)
class Stop(Step):
    """Stop the partition with this error."""

    error: str


@dataclass(slots=True)
class Partition:
    """An assigned partition."""

    position: Position
    queue: deque[Queued] = field(default_factory=deque)
    queued_bytes: int = 0
    #: Fetching is paused in Kafka.
    paused: bool = False
    #: Stopped by a poison record (the error).
    stopped: str | None = None
    #: Known marks per source (a lower bound of the stored ones).
    marks: dict[str, str] = field(default_factory=dict)
    #: Sources whose mark rows exist.
    known: set[str] = field(default_factory=set)
    failing: Failing | None = None
    #: Handler failures per record (by offset) of the records still queued:
    #: each record has its own attempts, whatever failed around it.
    record_failures: dict[int, int] = field(default_factory=dict)
    #: Database failures in a row (an outage: not counted as attempts).
    db_failures: int = 0
    #: No batch before this moment (``time.monotonic()``).
    retry_at: float | None = None
    #: Records left to apply one per transaction, to find the one that
    #: fails in a batch whose handler cannot say which.
    isolate: int = 0
    #: A batch of it is still being applied after its round ended (a
    #: straggler): nothing else of it may be decided (not even a skip,
    #: whose offset would go ahead of the batch's) until its outcome is
    #: known.
    in_flight: bool = False
    #: Batches capped smaller after contention (see :class:`Shrink`).
    shrink: Shrink | None = None

    def push(self, queued: Queued) -> None:
        self.queued_bytes += queued.bytes
        self.queue.append(queued)

    def take(self, n: int) -> list[Queued]:
        """Takes the first ``n`` records out of the queue (for a batch)."""
        taken = [self.queue.popleft() for _ in range(min(n, len(self.queue)))]
        self.queued_bytes -= sum(q.bytes for q in taken)
        return taken

    def put_back(self, records: list[Queued]) -> None:
        """Puts the records of a failed batch back at the front."""
        for queued in reversed(records):
            self.queued_bytes += queued.bytes
            self.queue.appendleft(queued)

    def is_full(self, s: Settings) -> bool:
        """Whether two batches are waiting: no more records should come in."""
        return len(self.queue) >= s.queue_records or self.queued_bytes >= s.queue_bytes

    def should_pause(self, s: Settings) -> bool:
        return not self.paused and self.is_full(s)

    def should_resume(self, s: Settings) -> bool:
        return (
            self.paused
            and self.stopped is None
            and len(self.queue) <= s.max_batch_records
            and self.queued_bytes <= s.max_batch_bytes
        )

    def learn(self, marks: dict[str, str]) -> None:
        """Raises the cached marks."""
        for source, key in marks.items():
            self.known.add(source)
            if key > self.marks.get(source, ""):
                self.marks[source] = key

    def knows_sources(self, take: int) -> bool:
        """Whether the mark rows of every source of the first ``take``
        records are known to exist."""
        for i, queued in enumerate(self.queue):
            if i >= take:
                break
            if isinstance(queued.meta, MetaError) or queued.meta.source not in self.known:
                return False
        return True

    def next_step(self, s: Settings, now: float) -> Step:
        """What to do next (see :class:`Step`)."""
        if self.stopped is not None or self.in_flight or not self.queue:
            return Idle()
        if self.retry_at is not None and self.retry_at > now:
            return WaitUntil(self.retry_at)
        front = self.queue[0]
        if isinstance(front.meta, MetaError):
            error = (
                f"record {self.position.topic}/{self.position.partition} at offset "
                f"{front.record.offset}: {front.meta}"
            )
            return ParkUnkeyed(error) if s.on_poison is OnPoison.PARK else Stop(error)
        take = 0
        size = 0
        for queued in self.queue:
            if (
                isinstance(queued.meta, MetaError)
                or take == s.max_batch_records
                or (take > 0 and size + queued.bytes > s.max_batch_bytes)
            ):
                break
            take += 1
            size += queued.bytes
        if self.isolate > 0:
            take = 1
        if self.shrink is not None:
            take = min(take, self.shrink.max)
        f = self.failing
        if f is not None and f.failures >= s.retry.attempts:
            poison: int | None
            if f.index is not None:
                poison = f.index
            elif f.len <= 1:
                poison = 0
            else:
                poison = None  # find the failing record: one per transaction
            if poison is not None:
                offset = self.queue[poison].record.offset if poison < len(self.queue) else -1
                error = (
                    f"record {self.position.topic}/{self.position.partition} at offset {offset} "
                    f"failed {f.failures} times: {f.error}"
                )
                if s.on_poison is OnPoison.PARK:
                    return Apply(poison + 1, Park(error=f.error, attempts=f.failures))
                if poison > 0:
                    # Apply what precedes the poison record first.
                    return Apply(poison)
                return Stop(error)
            take = 1
        metas = [q.meta for q in list(self.queue)[:take] if isinstance(q.meta, RecordMeta)]
        if batch.plan(self.marks, metas).is_all_duplicates:
            return Skip(take)
        return Apply(take)

    def committed(self, take: int) -> None:
        """After a committed batch of ``take`` records."""
        f = self.failing
        # A known poison record after the committed ones keeps its failures
        # (the records before it were applied first).
        if f is not None and f.index is not None and f.index >= take:
            self.failing = Failing(f.failures, f.error, f.index - take, max(f.len - take, 0))
        else:
            self.failing = None
        self.db_failures = 0
        self.retry_at = None
        self.isolate = max(self.isolate - take, 0)
        if self.shrink is not None:
            left = self.shrink.left - take
            self.shrink = Shrink(self.shrink.max, left) if left > 0 else None
        # The committed records' failures go with them.
        first = self.queue[0].record.offset if self.queue else None
        self.record_failures = {
            o: n for o, n in self.record_failures.items() if first is not None and o >= first
        }

    def handler_failed(self, error: str, index: int | None, n: int, s: Settings, now: float) -> int:
        """After a handler failure of a batch of ``n`` records, put back at
        the front of the queue (``index``: the failing record, when known).
        Returns the failures that count: the failing record's own when it is
        known, else the batch's in a row."""
        if index is None and n == 1:
            index = 0
        if index is not None and index < len(self.queue):
            offset = self.queue[index].record.offset
            failures = self.record_failures.get(offset, 0) + 1
            self.record_failures[offset] = failures
        else:
            f = self.failing
            failures = (f.failures if f is not None and f.index is None else 0) + 1
        if failures >= s.retry.attempts and index is None and n > 1:
            # The batch cannot say which record fails: apply its records one
            # per transaction, each with its own attempts.
            self.isolate = n
            self.failing = None
            self.retry_at = None
            return failures
        self.failing = Failing(failures, error, index, n)
        self.retry_at = now + s.retry.backoff(failures)
        return failures

    def contended(self, error: str, n: int, s: Settings, now: float) -> int | None:
        """After a batch of ``n`` records failed for contention or for its
        size (:attr:`~walrelay_consumer.outage.ErrorClass.SHRINK`). A batch
        of several is retried at half its size without counting an attempt
        (returns ``None``); a batch of one counts it, like a handler failure
        of that record (returns the record's failures)."""
        if n <= 1:
            return self.handler_failed(error, 0, 1, s, now)
        left = n if self.shrink is None else max(self.shrink.left, n)
        self.shrink = Shrink(max(n // 2, 1), left)
        self.retry_at = now + s.retry.backoff(1)
        return None

    def db_failed(self, s: Settings, now: float) -> int:
        """After a database failure (outage): retried until it works, with
        backoff, without counting as an attempt."""
        self.db_failures += 1
        self.retry_at = now + s.retry.backoff(self.db_failures)
        return self.db_failures
