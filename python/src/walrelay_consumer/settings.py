"""The consumer loop's settings: batch bounds, retries and what to do with
a record that keeps failing (``crates/walrelay-consumer/src/settings.rs``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

__all__ = ["OnPoison", "RetryPolicy", "Settings"]


class OnPoison(enum.Enum):
    """What the loop does with a record whose handler still fails after the
    last attempt (a *poison* record), or a record without walrelay
    headers."""

    #: Stop that partition: it is paused, nothing of it or after it is
    #: applied or committed, the other partitions go on, and the loop
    #: raises :class:`~walrelay_consumer.PartitionsStopped` at shutdown. A
    #: restart (or a rebalance) tries the record again.
    STOP = "stop"
    #: Park the record in ``walrelay_consumer_parked`` in the same
    #: transaction that raises the mark past it, then go on. It is never
    #: lost and never applied twice; :func:`~walrelay_consumer.redrive`
    #: applies it later.
    PARK = "park"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff between attempts."""

    #: Attempts of a failing handler before :class:`OnPoison` decides (at
    #: least 1), per record. Database outages (a lost connection, a server
    #: shutting down) do not count: they are retried until the database is
    #: back. Other database errors of a batch do.
    attempts: int = 5
    #: The wait (seconds) after the first failure; it doubles each time.
    base: float = 0.1
    #: The longest wait (seconds).
    cap: float = 10.0

    def backoff(self, failures: int) -> float:
        """The wait after ``failures`` consecutive failures (1 = the first)."""
        shift = min(max(failures - 1, 0), 31)
        return min(self.base * (1 << shift), self.cap)


@dataclass(frozen=True, slots=True)
class Settings:
    """Settings of :class:`~walrelay_consumer.ConsumerLoop`."""

    #: At most this many records in one batch transaction.
    max_batch_records: int = 1000
    #: At most this many bytes of payload, key and headers in one batch (a
    #: single larger record still makes a batch of its own).
    max_batch_bytes: int = 4 << 20
    #: Retries of failing batches.
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: What to do with a poison record.
    on_poison: OnPoison = OnPoison.STOP
    #: Seconds between asynchronous offset commits while records flow.
    commit_interval: float = 1.0
    #: Database connections, so partitions applying at the same time (one
    #: batch per partition at a time, so each partition keeps its order).
    #: 1 runs every batch on the loop's own thread.
    pool_size: int = 4
    #: Seconds a rebalance callback waits for the database when it loads the
    #: assigned partitions' marks (only a cache: the batches read the real
    #: marks); then it abandons the load, logs it and returns, so a database
    #: that stops answering does not stall the rebalance.
    rebalance_db_timeout: float = 5.0
    #: Seconds a revocation waits for the revoked partitions' batches still
    #: running (stragglers); then it abandons them, logs which, and returns.
    #: An abandoned batch commits or rolls back on its own; its offsets are
    #: not stored, so the next owner gets its records again and the marks
    #: drop what it committed. Both bounds stay well below
    #: ``max.poll.interval.ms`` (default 300 s), the rebalance's own limit.
    revoke_wait: float = 10.0
    #: Seconds a handler call may run (``None``: no bound). A call running
    #: longer is a failed attempt of its batch (counted, like a handler
    #: error): the statement it is running is cancelled, the batch rolled
    #: back and the connection discarded. The blocking loop cannot
    #: interrupt Python code: a handler blocked outside the database is
    #: declared timed out only when it returns. See
    #: :mod:`walrelay_consumer.handler_timeout`.
    handler_timeout: float | None = None

    def normalized(self) -> Settings:
        """The settings with every bound at least 1 (a zero would stall)."""
        return replace(
            self,
            max_batch_records=max(self.max_batch_records, 1),
            max_batch_bytes=max(self.max_batch_bytes, 1),
            retry=replace(self.retry, attempts=max(self.retry.attempts, 1)),
            commit_interval=max(self.commit_interval, 0.001),
            pool_size=max(self.pool_size, 1),
            rebalance_db_timeout=max(self.rebalance_db_timeout, 0.001),
            revoke_wait=max(self.revoke_wait, 0.0),
            handler_timeout=None if self.handler_timeout is None else max(self.handler_timeout, 0.001),
        )

    @property
    def queue_records(self) -> int:
        """Records queued per partition before it is paused: two batches."""
        return self.max_batch_records * 2

    @property
    def queue_bytes(self) -> int:
        """Bytes queued per partition before it is paused."""
        return self.max_batch_bytes * 2
