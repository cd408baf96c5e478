"""What the loop's decisions read and change besides the partition they are
about: the settings, the counts and metrics, the consumer
(:class:`~walrelay_consumer.loop_core.kafka_control.KafkaControl`), the
partitions stopped so far, and the driver's one database hook."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ..counters import Counters
from ..metrics import Metrics
from ..partition import Partition
from ..settings import Settings
from .job import TP
from .kafka_control import KafkaControl
from .stopped import StoppedPartition

__all__ = ["LoopContext"]

log = logging.getLogger("walrelay_consumer")


@dataclass(slots=True)
class LoopContext:
    """The state every decision of a loop shares (on the loop's thread, or
    in a rebalance callback while the loop waits for the poll)."""

    settings: Settings
    metrics: Metrics
    counters: Counters
    kafka: KafkaControl
    #: The driver closes its idle database connections (after an outage
    #: they are suspect; the next job opens a new one).
    close_db: Callable[[], None]
    stopped: list[StoppedPartition] = field(default_factory=list)

    def stop_partition(self, tp: TP, p: Partition, error: str) -> None:
        """Stops a partition: nothing of it is applied or committed past
        what is, its queue is dropped and its fetching paused, until a
        restart; the loop reports it at its end."""
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
        self.kafka.pause_stopped(tp)
        self.stopped.append(StoppedPartition(tp[0], tp[1], error))
