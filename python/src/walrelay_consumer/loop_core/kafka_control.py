"""What the loop's decisions do to its Kafka consumer (store an offset,
commit, pause, resume) and what the failure of each means: none of them
ends the loop, librdkafka retries on its own and the marks make anything
delivered again harmless.

The decisions reach Kafka only through :class:`Kafka`, implemented on
confluent-kafka's ``Consumer`` by :class:`ConsumerKafka`, so that they run
without a broker in the tests.
"""

from __future__ import annotations

import logging
from typing import Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from .job import TP

__all__ = ["ConsumerKafka", "Kafka", "KafkaControl", "close_dead", "tps_of"]

log = logging.getLogger("walrelay_consumer")


class Kafka(Protocol):
    """The calls the loop's decisions make on its consumer; each may raise
    ``KafkaException``."""

    def pause(self, tps: list[TP]) -> None: ...

    def resume(self, tps: list[TP]) -> None: ...

    def store_offset(self, tp: TP, next_offset: int) -> None:
        """Stores ``next_offset`` as the partition's next offset to commit."""

    def commit(self, asynchronous: bool) -> None:
        """Commits the stored offsets."""


class ConsumerKafka:
    """:class:`Kafka` on a confluent-kafka ``Consumer``."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer

    def pause(self, tps: list[TP]) -> None:
        self.consumer.pause([TopicPartition(t, p) for t, p in tps])

    def resume(self, tps: list[TP]) -> None:
        self.consumer.resume([TopicPartition(t, p) for t, p in tps])

    def store_offset(self, tp: TP, next_offset: int) -> None:
        self.consumer.store_offsets(offsets=[TopicPartition(tp[0], tp[1], next_offset)])

    def commit(self, asynchronous: bool) -> None:
        # Two calls: the stubs type each value of ``asynchronous`` apart.
        if asynchronous:
            self.consumer.commit(asynchronous=True)
        else:
            self.consumer.commit(asynchronous=False)


def close_dead(consumer: Consumer) -> None:
    """Closes a consumer librdkafka declared dead (a fatal error): nothing to
    commit, no group to leave; an error closing it is only logged."""
    try:
        consumer.close()
    except (KafkaException, RuntimeError) as e:
        log.debug("closing the dead Kafka consumer: %s", e)


def tps_of(partitions: list[TopicPartition]) -> list[TP]:
    """A rebalance callback's partitions as ``(topic, partition)`` pairs."""
    return [(tp.topic, tp.partition) for tp in partitions]


class KafkaControl:
    """The loop's consumer as its decisions use it, between :meth:`attach`
    (the driver created it) and :meth:`detach` (closed); also when to
    commit: asynchronously every :attr:`Settings.commit_interval` while
    something was stored, synchronously on revocation and at shutdown."""

    def __init__(self, commit_interval: float) -> None:
        self._kafka: Kafka | None = None
        self._interval = commit_interval
        self._next_commit = 0.0
        #: An offset was stored since the last commit.
        self._stored = False

    def attach(self, kafka: Kafka, now: float) -> None:
        self._kafka = kafka
        self._next_commit = now + self._interval

    def detach(self) -> None:
        self._kafka = None

    def _attached(self) -> Kafka:
        assert self._kafka is not None, "the decisions run only while the driver has a consumer"
        return self._kafka

    def store_offset(self, tp: TP, offset: int) -> None:
        """Stores ``offset + 1`` as the next offset to commit (``offset``
        is the last record of a batch that committed, or was skipped)."""
        try:
            self._attached().store_offset(tp, offset + 1)
            self._stored = True
        except KafkaException as e:
            # Revoked meanwhile: the new owner skips it by its mark.
            log.debug("storing the offset failed: %s", e)

    def commit(self, asynchronous: bool) -> None:
        """Commits the stored offsets: asynchronously while records flow
        (when something was stored since), synchronously on revocation and
        at shutdown (always: an asynchronous commit may still be on its
        way)."""
        if self._kafka is None or (asynchronous and not self._stored):
            return
        self._stored = False
        try:
            self._kafka.commit(asynchronous)
        except KafkaException as e:
            if e.args and e.args[0].code() == KafkaError._NO_OFFSET:
                return
            # The records will be redelivered and skipped by their marks.
            log.warning("committing offsets failed: %s", e)

    def commit_if_due(self, now: float) -> None:
        """The asynchronous commit of every :attr:`Settings.commit_interval`."""
        if now >= self._next_commit:
            self.commit(asynchronous=True)
            self._next_commit = now + self._interval

    def pause_stopped(self, tp: TP) -> None:
        """Pauses a partition stopped by a poison record."""
        try:
            self._attached().pause([tp])
        except KafkaException as e:
            log.warning("pausing the stopped partition failed: %s", e)

    def pause_and_resume(self, pause: list[TP], resume: list[TP]) -> None:
        """Flow control: pauses full partitions, resumes drained ones."""
        kafka = self._attached()
        try:
            if pause:
                kafka.pause(pause)
            if resume:
                kafka.resume(resume)
        except KafkaException as e:
            log.warning("pausing or resuming partitions failed: %s", e)

    def resume_assigned(self, tps: list[TP]) -> None:
        """Resumes newly assigned partitions. librdkafka keeps a partition's
        pause across a revocation and a new assignment of the same
        partition, while the loop starts it over unpaused: a partition
        paused when it was revoked would never fetch again."""
        try:
            self._attached().resume(tps)
        except KafkaException as e:
            log.warning("resuming the assigned partitions failed: %s", e)
