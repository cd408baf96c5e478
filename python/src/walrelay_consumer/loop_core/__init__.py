"""The consumer loop's decisions, shared by its two drivers (the design of
``crates/walrelay-consumer/src/consumer_loop``): the blocking
:class:`~walrelay_consumer.ConsumerLoop` runs a round's jobs on worker
threads, :class:`~walrelay_consumer.AsyncConsumerLoop` as tasks of an
event loop; what a job is, what follows from its outcome, when to pause,
what to commit and what a rebalance does are decided here, once, and
tested without Kafka or PostgreSQL (``tests/test_loop_core.py``).

* :mod:`.job`: one transaction of one partition, a round, a running batch;
* :mod:`.rounds`: the assigned partitions, one round over them, flow control;
* :mod:`.outcome`: what follows from a job's outcome (failures, outages);
* :mod:`.stragglers`: batches left running after their round, or abandoned;
* :mod:`.kafka_control`: what the decisions do to the consumer, and when to commit;
* :mod:`.context`: the state every decision shares, stopping a partition;
* :mod:`.stopped`: what the loop reports about stopped partitions;
* :mod:`.pacing`: how long polls and rounds wait;
* :mod:`.rejoin`: a consumer refused its instance id, and when to try a new one;
* :mod:`.core`: the decisions in the order a driver meets them;
* :mod:`.driver`: what both drivers share with their users.
"""

from __future__ import annotations

from .core import Load, LoopCore, Settle
from .driver import Driver
from .job import JOB_FAILURES, TP, After, Job, Round, Running
from .kafka_control import ConsumerKafka, Kafka, close_dead
from .pacing import POLL_BURST, STRAGGLER_WAIT, poll_burst
from .stopped import PartitionsStopped, StoppedPartition

__all__ = [
    "JOB_FAILURES",
    "POLL_BURST",
    "STRAGGLER_WAIT",
    "TP",
    "After",
    "ConsumerKafka",
    "Driver",
    "Job",
    "Kafka",
    "Load",
    "LoopCore",
    "PartitionsStopped",
    "Round",
    "Running",
    "Settle",
    "StoppedPartition",
    "close_dead",
    "poll_burst",
]
