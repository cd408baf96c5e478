"""Batches left running after their round (stragglers) and batches a
revocation stopped waiting for (abandoned).

A batch still running :data:`~walrelay_consumer.loop_core.pacing.STRAGGLER_WAIT`
after its round started is a *straggler*: the round ends without it and
the loop goes on polling and applying the other partitions while it
finishes; nothing else of its partition is decided until the loop has
acted on its outcome. So a slow partition holds up only itself.

A revocation first waits for the revoked partitions' stragglers (at most
:attr:`Settings.revoke_wait`); those still running then are abandoned and
logged, so that a database that stops answering does not stall the
group's rebalance. An abandoned batch commits or rolls back on its own;
its offsets are never stored, and its counts are added when it ends.
"""

from __future__ import annotations

import logging

from ..apply import BatchOutcome
from ..counters import Counters
from .job import TP, Job, Running

__all__ = ["Stragglers"]

log = logging.getLogger("walrelay_consumer")


class Stragglers:
    """The loop's batches in flight after their round, and the abandoned
    ones still running."""

    def __init__(self) -> None:
        #: One per partition at most (the partition is idle meanwhile).
        self.in_flight: dict[TP, tuple[Job, Running]] = {}
        #: Their partitions are gone; their counts are added when they end.
        self.abandoned: list[tuple[Job, Running]] = []

    def keep(self, job: Job, running: Running) -> None:
        """A job still running at the end of its round."""
        job.p.in_flight = True
        self.in_flight[job.tp] = (job, running)

    def finished(self) -> list[TP]:
        """The partitions whose straggler is done."""
        return [tp for tp, (_, running) in self.in_flight.items() if running.done()]

    def take(self, tps: list[TP]) -> list[tuple[Job, Running]]:
        """Takes these partitions' stragglers out of flight, to be waited for
        and acted on."""
        taken = [entry for tp in tps if (entry := self.in_flight.pop(tp, None)) is not None]
        for job, _ in taken:
            job.p.in_flight = False
        return taken

    def abandon(self, job: Job, running: Running, waited: float) -> None:
        """A revoked partition's straggler still running after ``waited``
        seconds: the revocation goes on without it."""
        log.warning(
            "a batch of the revoked partition %s/%d (offsets %d..%d) was still running after "
            "%.1fs (Settings.revoke_wait), abandoned so that the rebalance goes on: its "
            "transaction commits or rolls back on its own, its offsets are not stored, and the "
            "next owner's marks drop whatever it committed (is the database answering?)",
            job.tp[0],
            job.tp[1],
            job.first_offset,
            job.last_offset,
            waited,
        )
        self.abandoned.append((job, running))

    def collect_abandoned(self, counters: Counters) -> None:
        """Counts the abandoned batches that ended since (on the loop's
        thread), so the counters stay exact."""
        if not self.abandoned:
            return
        left: list[tuple[Job, Running]] = []
        for job, running in self.abandoned:
            if not running.done():
                left.append((job, running))
                continue
            counters.add(job.counters)
            outcome = "committed" if isinstance(job.result, (BatchOutcome, bool)) else f"failed: {job.result}"
            log.info(
                "an abandoned batch of %s/%d (offsets %d..%d) ended: %s",
                job.tp[0],
                job.tp[1],
                job.first_offset,
                job.last_offset,
                outcome,
            )
        self.abandoned = left
