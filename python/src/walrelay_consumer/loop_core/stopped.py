"""Partitions stopped by a poison record (:attr:`OnPoison.STOP`), by a
handler that ended its batch's transaction, or by a record the loop
refuses to guess about: what the loop reports at its end."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PartitionsStopped", "StoppedPartition"]


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
