"""The partitions the loop holds records of (:class:`Assignment`) and one
round over them (:func:`jobs`): at most one transaction per partition in a
round, so a partition never has two batches in flight and its order holds;
the drivers run a round's jobs at the same time and poll again.

Flow control: a partition with two batches queued is paused in Kafka, and
resumed once its queue is down to one batch, so a partition whose batches
wait (a backoff, an outage, a straggler) stops fetching instead of
filling the memory while the loop keeps polling for the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from ..partition import Apply, Idle, ParkUnkeyed, Partition, Queued, Skip, Stop, WaitUntil
from ..records import Position, Record
from ..settings import Settings
from .context import LoopContext
from .job import TP, Job, Round

__all__ = ["Assignment", "jobs"]


class Assignment:
    """The assigned partitions' state, by ``(topic, partition)``."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.partitions: dict[TP, Partition] = {}
        self._cursor = 0

    def add(self, tps: list[TP]) -> None:
        """Partitions assigned (one already held keeps its state)."""
        for tp in tps:
            self.partitions.setdefault(tp, Partition(Position(self.group, *tp)))

    def drop(self, tps: list[TP]) -> None:
        """Partitions revoked or lost: their queued records go (the next
        owner reads them again)."""
        for tp in tps:
            self.partitions.pop(tp, None)

    def enqueue(self, record: Record) -> None:
        tp = (record.topic, record.partition)
        p = self.partitions.get(tp)
        if p is None:
            p = self.partitions[tp] = Partition(Position(self.group, *tp))
        if p.stopped is not None:
            # Fetched before the pause took effect; it comes again after a restart.
            return
        p.push(Queued.of(record))

    def learn(self, marks: Mapping[TP, Mapping[str, str]]) -> None:
        """Loaded marks (a cache) of partitions still held."""
        for tp, by_source in marks.items():
            p = self.partitions.get(tp)
            if p is not None:
                p.learn(dict(by_source))

    def rotated(self) -> list[TP]:
        """The partitions in order, rotated one further each round, so
        that no partition always goes last."""
        order = sorted(self.partitions)
        if order:
            self._cursor = (self._cursor + 1) % len(order)
            order = order[self._cursor :] + order[: self._cursor]
        return order

    def flow(self, s: Settings) -> tuple[list[TP], list[TP]]:
        """The partitions to pause (two batches waiting) and to resume
        (drained), marked so."""
        pause: list[TP] = []
        resume: list[TP] = []
        for tp, p in self.partitions.items():
            if p.should_pause(s):
                p.paused = True
                pause.append(tp)
            elif p.should_resume(s):
                p.paused = False
                resume.append(tp)
        return pause, resume


def jobs(ctx: LoopContext, assignment: Assignment, round_: Round, stopping: Callable[[], bool]) -> Iterator[Job]:
    """One round over the partitions: takes out of its queue the one
    transaction each partition may run now and yields it, does the skips
    that need none, and notes in ``round_`` what is left. A partition with
    a job yielded is not looked at again in this round (its outcome is not
    known yet), so it is noted as maybe ready; one with a straggler in
    flight is idle."""
    for tp in assignment.rotated():
        while not stopping():
            p = assignment.partitions.get(tp)
            if p is None:
                break
            step = p.next_step(ctx.settings, time.monotonic())
            if isinstance(step, Idle):
                break
            if isinstance(step, WaitUntil):
                round_.wait_until(step.at)
                break
            if isinstance(step, Stop):
                ctx.stop_partition(tp, p, step.error)
                break
            if isinstance(step, Skip):
                _skip(ctx, tp, p, step)
                continue
            assert isinstance(step, (Apply, ParkUnkeyed))
            yield Job.take(tp, p, step)
            # One transaction per partition per round: poll between.
            round_.ready = True
            break


def _skip(ctx: LoopContext, tp: TP, p: Partition, step: Skip) -> None:
    """Records the cached marks cover: their offset is stored without a
    transaction."""
    records = p.take(step.take)
    p.committed(step.take)
    ctx.counters.duplicates += step.take
    ctx.metrics.skipped(step.take)
    ctx.kafka.store_offset(tp, records[-1].record.offset)
