"""The loop's decisions in the order a driver meets them: a round (its jobs,
acting on their outcomes, stragglers), between rounds (flow control,
commits, how long to poll), what a poll returned, the rebalances, and the
end.

Rebalance callbacks run inside the poll, so they never race a batch of a
round: a revocation first waits for the revoked partitions' stragglers (at
most :attr:`Settings.revoke_wait`, then they are abandoned and logged) and
acts on them, then commits the stored offsets (only those of committed
batches) and drops the revoked partitions' queued records, which the next
owner reads again; whatever this member committed is covered by the marks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from ..counters import Counters
from ..denied import explain as explain_denied
from ..metrics import Metrics
from ..records import Record
from ..settings import Settings
from .context import LoopContext
from .job import TP, Job, Round, Running
from .kafka_control import Kafka, KafkaControl, tps_of
from .outcome import finish
from .pacing import poll_timeout
from .rejoin import Refusals, instance_id_in_use
from .rounds import Assignment, jobs
from .stopped import PartitionsStopped, StoppedPartition
from .stragglers import Stragglers

__all__ = ["LoopCore", "Settle", "Load"]

log = logging.getLogger("walrelay_consumer")

#: The driver waits for these partitions' stragglers (at most the bound,
#: in seconds, when given) and hands them to :meth:`LoopCore.settle`.
Settle = Callable[[list[TP], float | None], None]
#: The driver loads the marks of newly assigned partitions (a cache) and
#: hands them to :meth:`LoopCore.learn`.
Load = Callable[[list[TP]], None]


class LoopCore:
    """The decisions of one consumer loop, whichever driver does its I/O.
    Everything here runs on the loop's thread, or in a rebalance callback
    while the loop waits for the poll: never two at a time."""

    def __init__(
        self,
        settings: Settings,
        group: str,
        topics: list[str],
        metrics: Metrics,
        close_db: Callable[[], None],
        instance_id: str | None = None,
        sasl_mechanism: str | None = None,
    ) -> None:
        self.settings = settings
        self.group = group
        self.instance_id = instance_id
        #: The consumer's SASL mechanism, if any: the words of a login error.
        self.sasl_mechanism = sasl_mechanism
        self.topics = topics
        self.counters = Counters()
        self.kafka = KafkaControl(settings.commit_interval)
        self.ctx = LoopContext(settings, metrics, self.counters, self.kafka, close_db)
        self.assignment = Assignment(group)
        self.stragglers = Stragglers()
        self._stop = threading.Event()
        #: A fatal Kafka error (a static member fenced by another one with
        #: its group.instance.id): the loop ends with it.
        self.fatal: KafkaError | None = None
        #: The broker refused the instance id (:mod:`.rejoin`): the driver
        #: closes the consumer and makes a new one.
        self.refused: KafkaError | None = None
        self.refusals = Refusals()

    @property
    def stopped(self) -> list[StoppedPartition]:
        """The partitions stopped so far (appended to by the loop's thread)."""
        return self.ctx.stopped

    def stop(self) -> None:
        """Asks the loop to stop (thread- and signal-safe)."""
        self._stop.set()

    def stopping(self) -> bool:
        return self._stop.is_set()

    def consumer_done(self) -> bool:
        """The driver's consumer is done with: the loop stops, or the broker
        refused its instance id."""
        return self._stop.is_set() or self.refused is not None

    def rejoin(self) -> float | None:
        """After the driver closed a consumer: the seconds to wait before a
        new one if the broker refused its instance id (logged, rate-limited),
        else ``None`` (the loop ends)."""
        error, self.refused = self.refused, None
        if error is None or self.stopping():
            return None
        # Nothing of the dead consumer's assignment is this member's now.
        self.assignment.drop(list(self.assignment.partitions))
        retry = self.refusals.refused(time.monotonic(), self.instance_id or "", error.str())
        if retry.log is not None:
            log.warning("%s", retry.log)
        return retry.wait

    def wait_to_rejoin(self, seconds: float) -> None:
        """Waits ``seconds`` before a new consumer, or until :meth:`stop`."""
        self._stop.wait(seconds)

    def attach(self, kafka: Kafka) -> None:
        """The driver created its consumer."""
        self.kafka.attach(kafka, time.monotonic())

    def detach(self) -> None:
        """The driver closed its consumer."""
        self.kafka.detach()

    # -- a round ----------------------------------------------------------

    def start_round(self) -> list[TP]:
        """Counts the abandoned batches that ended; returns the partitions
        whose straggler finished, for the driver to settle first."""
        self.stragglers.collect_abandoned(self.counters)
        return self.stragglers.finished()

    def next_round(self) -> tuple[Round, list[Job]]:
        """The round's jobs, at most one per partition (the skips that need
        no transaction done), and what is left."""
        round_ = Round()
        return round_, list(jobs(self.ctx, self.assignment, round_, self.stopping))

    def finish(self, job: Job) -> None:
        """Acts on a job's outcome (:mod:`~walrelay_consumer.loop_core.outcome`)."""
        finish(self.ctx, job)

    def end_round(self, round_jobs: Sequence[Job], running: Sequence[Running]) -> None:
        """Acts on the round's batches that are done; the others stay in
        flight as stragglers."""
        for job, r in zip(round_jobs, running):
            if r.done():
                r.result()  # the job holds its failures; this raises only a bug's
                self.finish(job)
            else:
                self.stragglers.keep(job, r)

    def settle(self, taken: list[tuple[Job, Running]], bound: float | None = None) -> None:
        """Acts on stragglers taken out of flight (``Stragglers.take``) once
        the driver waited for them: with a ``bound``, those still running
        are abandoned; without one, each is done (a ``Task`` the driver
        awaited) or waited for by its ``result()`` (a ``Future``)."""
        for job, running in taken:
            if bound is not None and not running.done():
                self.stragglers.abandon(job, running, bound)
                continue
            running.result()  # the job holds its failures; this raises only a bug's
            self.finish(job)

    # -- between rounds ---------------------------------------------------

    def between_rounds(self, round_: Round) -> float:
        """Pauses full partitions and resumes drained ones, commits when
        due, and returns how long the next poll may wait."""
        self.kafka.pause_and_resume(*self.assignment.flow(self.settings))
        now = time.monotonic()
        self.kafka.commit_if_due(now)
        return poll_timeout(round_, now, bool(self.stragglers.in_flight))

    def received(self, messages: Iterable[Message]) -> None:
        """Queues what a poll returned; its errors are reports."""
        for message in messages:
            error = message.error()
            if error is not None:
                # librdkafka retries on its own; errors here are reports.
                self.report(error)
                continue
            self.assignment.enqueue(Record.from_message(message))

    def report(self, error: KafkaError) -> None:
        """A consumer error: librdkafka goes on retrying, so it is only
        reported, an authorization error as the ACL that is missing."""
        message = explain_denied(error, self.topics, self.group, self.sasl_mechanism)
        if (error.fatal() or error.code() == KafkaError._FATAL) and instance_id_in_use(error):
            # A new consumer is tried (.rejoin); logged there.
            log.debug("the broker refused the instance id: %s", error)
            self.refused = error
        elif error.fatal() or error.code() == KafkaError._FATAL:
            # Nothing works after it: end the loop with it.
            log.error("fatal Kafka consumer error, the loop stops: %s", error)
            self.fatal = error
            self.stop()
        elif message is not None:
            log.error("Kafka consumer error: %s", message)
        else:
            log.warning("Kafka consumer error: %s", error)

    # -- rebalances (callbacks run inside the poll) -----------------------

    def subscribe(self, consumer: Consumer, settle: Settle, load: Load) -> None:
        """Subscribes ``consumer`` with the loop's rebalance callbacks."""

        def on_assign(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
            load(self.assigned(tps_of(partitions)))

        def on_revoke(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
            # Finish the revoked partitions' stragglers (no other batch is in
            # flight: callbacks run inside the poll), commit what the committed
            # batches stored, drop the rest.
            tps = tps_of(partitions)
            settle(tps, self.settings.revoke_wait)
            self.revoked(tps)

        def on_lost(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
            # Lost, not revoked: committing is pointless (another member owns
            # them); the marks make the new owner's work exactly-once. Their
            # stragglers are waited for, so none outlives its partition.
            tps = tps_of(partitions)
            settle(tps, self.settings.revoke_wait)
            self.lost(tps)

        consumer.subscribe(self.topics, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)

    def assigned(self, tps: list[TP]) -> list[TP]:
        """Partitions assigned: held, and resumed in Kafka."""
        log.info("partitions assigned: %s", tps)
        joined = self.refusals.joined(time.monotonic())
        if joined is not None:
            log.info(
                "joined the group %.1fs after the broker first refused the instance id (%d refusals)", *joined
            )
        self.assignment.add(tps)
        self.kafka.resume_assigned(tps)
        return tps

    def revoked(self, tps: list[TP]) -> None:
        """After the revoked partitions' stragglers were settled."""
        self.kafka.commit(asynchronous=False)
        log.info("partitions revoked: %s", tps)
        self.assignment.drop(tps)

    def lost(self, tps: list[TP]) -> None:
        """After the lost partitions' stragglers were settled."""
        log.warning("partitions lost: %s", tps)
        self.assignment.drop(tps)

    def learn(self, marks: Mapping[TP, Mapping[str, str]]) -> None:
        """The assigned partitions' marks, loaded."""
        self.assignment.learn(marks)

    def marks_abandoned(self, tps: list[TP], timeout: float, in_rebalance: bool) -> None:
        """Loading the assigned partitions' marks took longer than
        :attr:`Settings.rebalance_db_timeout` and was abandoned (by the
        rebalance callback that waited for it when ``in_rebalance``)."""
        log.warning(
            "loading the high-water marks of the assigned partitions %s took longer than %.1fs "
            "(Settings.rebalance_db_timeout), abandoned%s: they are only a cache, the batches "
            "read the real marks (is the database answering?)",
            tps,
            timeout,
            " so that the rebalance goes on" if in_rebalance else "",
        )
        self.ctx.close_db()

    def marks_failed(self, error: Exception) -> None:
        """Loading the assigned partitions' marks failed."""
        # Only a cache: the batch transactions read the real marks.
        log.warning("loading the high-water marks of the assigned partitions failed: %s", error)
        self.ctx.close_db()

    # -- the end ----------------------------------------------------------

    def end(self) -> None:
        """After the driver closed everything: raises what ended the loop,
        a fatal Kafka error or the partitions stopped."""
        if self.fatal is not None:
            raise KafkaException(self.fatal)
        if self.ctx.stopped:
            raise PartitionsStopped(list(self.ctx.stopped))
