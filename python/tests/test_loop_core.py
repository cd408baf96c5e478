"""The consumer loop's decisions (walrelay_consumer.loop_core), shared by the
blocking and the asyncio loop, without Kafka or PostgreSQL: a fake consumer
records what the decisions do to it, and the tests fill in the jobs'
outcomes the way a driver does."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry

from walrelay_consumer import (
    BatchOutcome,
    DatabaseFailed,
    HandlerEndedTransaction,
    HandlerFailed,
    HandlerTimedOut,
    Metrics,
    OffsetReused,
    OnPoison,
    Record,
    RetryPolicy,
    Settings,
)
from walrelay_consumer.loop_core import After, Job, LoopCore, PartitionsStopped, Round, rejoin
from walrelay_consumer.loop_core.pacing import POLL_BURST, POLL_MAX, POLL_STRAGGLER, poll_burst, poll_timeout
from walrelay_consumer.partition import Apply, ParkUnkeyed

TP0 = ("t", 0)
TP1 = ("t", 1)


def k(n: int) -> str:
    return f"{n:032x}"


def rec(offset: int, key: int | None = None, partition: int = 0, source: str = "s") -> Record:
    headers = () if key is None else (("idempotency-key", k(key).encode()), ("walrelay-source", source.encode()))
    return Record("t", partition, offset, None, b"v", headers)


class FakeKafka:
    """The consumer as the decisions see it."""

    def __init__(self) -> None:
        self.paused: list[tuple[str, int]] = []
        self.resumed: list[tuple[str, int]] = []
        self.stored: dict[tuple[str, int], int] = {}
        self.commits: list[bool] = []
        self.refuse_store = False
        self.commit_error: KafkaError | None = None

    def pause(self, tps: list[tuple[str, int]]) -> None:
        self.paused += tps

    def resume(self, tps: list[tuple[str, int]]) -> None:
        self.resumed += tps

    def store_offset(self, tp: tuple[str, int], next_offset: int) -> None:
        if self.refuse_store:
            raise KafkaException(KafkaError(KafkaError._STATE))
        self.stored[tp] = next_offset

    def commit(self, asynchronous: bool) -> None:
        if self.commit_error is not None:
            raise KafkaException(self.commit_error)
        self.commits.append(asynchronous)


class FakeConsumer:
    """Only what ``LoopCore.subscribe`` calls: it keeps the callbacks."""

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.topics = topics
        self.callbacks = callbacks


class Running:
    """A job's batch running (a ``Future`` or a ``Task`` in the drivers)."""

    def __init__(self, done: bool = True) -> None:
        self.is_done = done

    def done(self) -> bool:
        return self.is_done

    def result(self) -> None:
        assert self.is_done, "a driver asks for the result only of a batch that is done"


S = Settings(max_batch_records=3, retry=RetryPolicy(attempts=2, base=1.0, cap=4.0))


class Loop:
    """A core attached to a fake consumer, and the database closes it asked for."""

    def __init__(self, settings: Settings = S) -> None:
        self.db_closed = 0
        self.core = LoopCore(settings.normalized(), "g", ["t"], Metrics(CollectorRegistry()), self.close_db)
        self.kafka = FakeKafka()
        self.core.attach(self.kafka)

    def close_db(self) -> None:
        self.db_closed += 1

    def push(self, *records: Record) -> None:
        for r in records:
            self.core.assignment.enqueue(r)

    def round(self) -> tuple[Round, list[Job]]:
        return self.core.next_round()

    def one_job(self) -> Job:
        _, jobs = self.round()
        assert len(jobs) == 1, jobs
        return jobs[0]

    def part(self, tp: tuple[str, int] = TP0) -> Any:
        return self.core.assignment.partitions[tp]


def committed(job: Job, **marks: str) -> BatchOutcome:
    return BatchOutcome(applied=len(job.records), marks=dict(marks))


# -- rounds ------------------------------------------------------------------


def test_a_round_takes_one_batch_per_partition_and_notes_more_may_be_ready():
    loop = Loop()
    loop.push(*[rec(i, i + 1) for i in range(5)], rec(0, 1, partition=1))
    round_, jobs = loop.round()
    assert sorted(j.tp for j in jobs) == [TP0, TP1]
    assert [len(j.records) for j in sorted(jobs, key=lambda j: j.tp)] == [3, 1]
    assert round_.ready
    # The rest of partition 0 waits for the next round.
    assert [q.record.offset for q in loop.part().queue] == [3, 4]


def test_the_partitions_take_turns_going_first():
    loop = Loop()
    loop.push(rec(0, 1), rec(0, 1, partition=1))
    firsts = []
    for _ in range(2):
        _, jobs = loop.round()
        firsts.append(jobs[0].tp)
        for job in jobs:
            job.p.put_back(job.records)
    assert sorted(firsts) == [TP0, TP1]


def test_a_committed_batch_stores_its_last_offset_and_the_next_one_follows():
    loop = Loop()
    loop.push(*[rec(i, i + 1) for i in range(4)])
    job = loop.one_job()
    job.result = committed(job, s=k(3))
    loop.core.finish(job)
    assert loop.kafka.stored == {TP0: 3}
    assert loop.part().marks == {"s": k(3)}
    job = loop.one_job()
    assert [q.record.offset for q in job.records] == [3]
    assert job.known, "the mark rows of a source seen committed exist"


def test_records_the_cached_marks_cover_are_skipped_without_a_transaction():
    loop = Loop()
    loop.core.assigned([TP0])
    loop.core.learn({TP0: {"s": k(5)}, ("t", 9): {"s": k(9)}})
    loop.push(rec(0, 4), rec(1, 5))
    round_, jobs = loop.round()
    assert jobs == [] and not round_.ready
    assert loop.kafka.stored == {TP0: 2}
    assert loop.core.counters.duplicates == 2
    # A batch with something new is a transaction (which drops the duplicates).
    loop.push(rec(2, 5), rec(3, 6))
    assert [q.record.offset for q in loop.one_job().records] == [2, 3]
    assert ("t", 9) not in loop.core.assignment.partitions, "marks of a partition not held are not kept"


# -- failures ----------------------------------------------------------------


def test_a_handler_failure_puts_the_batch_back_and_waits_out_the_backoff():
    loop = Loop()
    loop.push(rec(0, 1), rec(1, 2))
    job = loop.one_job()
    job.result = HandlerFailed(ValueError("boom"), 1)
    loop.core.finish(job)
    p = loop.part()
    assert len(p.queue) == 2 and loop.kafka.stored == {}
    assert p.record_failures == {1: 1}
    round_, jobs = loop.round()
    assert jobs == [] and round_.wake == p.retry_at and not round_.ready


def test_a_record_failing_its_last_attempt_stops_its_partition_only():
    loop = Loop(Settings(max_batch_records=3, retry=RetryPolicy(attempts=1)))
    loop.push(rec(0, 1), rec(0, 1, partition=1))
    for job in loop.round()[1]:
        job.result = HandlerFailed(ValueError("boom"), 0) if job.tp == TP0 else committed(job)
        loop.core.finish(job)
    loop.part().retry_at = None  # the backoff is over
    _, jobs = loop.round()
    assert jobs == []
    assert loop.part().stopped is not None and "failed 1 times: boom" in loop.part().stopped
    assert loop.kafka.paused == [TP0]
    assert loop.kafka.stored == {TP1: 1}
    # What was fetched before the pause took effect is dropped.
    loop.push(rec(1, 2))
    assert not loop.part().queue
    with pytest.raises(PartitionsStopped) as stopped:
        loop.core.end()
    assert [(s.topic, s.partition) for s in stopped.value.stopped] == [TP0]


def test_a_handler_that_ended_the_transaction_stops_the_partition_whatever_the_policy():
    loop = Loop(Settings(on_poison=OnPoison.PARK))
    loop.push(rec(0, 1))
    job = loop.one_job()
    job.result = HandlerEndedTransaction(job.p.position, job.deliveries())
    loop.core.finish(job)
    assert loop.part().stopped is not None and "atomicity was broken" in loop.part().stopped
    assert loop.core.stopped[0].partition == 0


def test_an_outage_replaces_the_connections_and_counts_no_attempt():
    loop = Loop()
    loop.push(rec(0, 1))
    job = loop.one_job()
    job.result = DatabaseFailed(psycopg.OperationalError("server closed the connection"))
    loop.core.finish(job)
    p = loop.part()
    assert loop.db_closed == 1
    assert p.db_failures == 1 and p.failing is None and p.record_failures == {}
    # A handler's failure on a connection that is gone is an outage too.
    p.retry_at = None
    job = loop.one_job()
    job.result = HandlerFailed(ValueError("boom"), 0)
    job.conn_gone = True
    loop.core.finish(job)
    assert loop.db_closed == 2 and p.db_failures == 2 and p.record_failures == {}


def test_contention_retries_the_batch_at_half_its_size_without_counting():
    loop = Loop()
    loop.push(*[rec(i, i + 1) for i in range(3)])
    job = loop.one_job()
    job.result = HandlerFailed(psycopg.errors.DeadlockDetected("40P01"), None)
    loop.core.finish(job)
    p = loop.part()
    assert p.failing is None and p.record_failures == {}
    p.retry_at = None
    assert len(loop.one_job().records) == 1


def test_a_batch_failing_at_commit_counts_an_attempt():
    loop = Loop()
    loop.push(rec(0, 1), rec(1, 2))
    job = loop.one_job()
    job.result = DatabaseFailed(psycopg.errors.UniqueViolation("23505"))
    loop.core.finish(job)
    p = loop.part()
    assert loop.db_closed == 0
    assert p.failing is not None and p.failing.failures == 1 and p.failing.index is None


def test_parking_that_fails_for_the_record_stops_the_partition():
    loop = Loop(Settings(max_batch_records=3, retry=RetryPolicy(attempts=1), on_poison=OnPoison.PARK))
    loop.push(rec(0, 1))
    job = loop.one_job()
    job.result = HandlerFailed(ValueError("boom"), 0)
    loop.core.finish(job)
    loop.part().retry_at = None  # the backoff is over
    job = loop.one_job()
    assert isinstance(job.step, Apply) and job.step.park is not None
    job.result = DatabaseFailed(psycopg.errors.CheckViolation("23514"))
    loop.core.finish(job)
    assert loop.part().stopped is not None and loop.part().stopped.startswith("parking record t/0 at offset 0 failed")


def test_a_record_without_headers_is_parked_alone_or_refused_on_a_reused_offset():
    loop = Loop(Settings(on_poison=OnPoison.PARK))
    loop.push(rec(0), rec(1, 1))
    job = loop.one_job()
    assert isinstance(job.step, ParkUnkeyed) and len(job.records) == 1
    job.result = True
    loop.core.finish(job)
    assert loop.core.counters.parked == 1 and loop.kafka.stored == {TP0: 1}

    loop = Loop(Settings(on_poison=OnPoison.PARK))
    loop.push(rec(0))
    job = loop.one_job()
    job.result = OffsetReused(job.p.position, 0)
    loop.core.finish(job)
    assert loop.part().stopped is not None and "offsets were reused" in loop.part().stopped
    assert loop.kafka.stored == {}


# -- flow control, offsets, polls --------------------------------------------


def test_a_partition_with_two_batches_queued_is_paused_and_resumed_once_drained():
    loop = Loop()
    loop.push(*[rec(i, i + 1) for i in range(6)])
    loop.core.between_rounds(Round())
    assert loop.kafka.paused == [TP0] and loop.part().paused
    job = loop.one_job()
    job.result = committed(job, s=k(3))
    loop.core.finish(job)
    loop.core.between_rounds(Round())
    assert loop.kafka.resumed == [TP0] and not loop.part().paused


def test_offsets_are_committed_when_due_and_something_was_stored():
    loop = Loop(Settings(commit_interval=1.0))
    now = time.monotonic()
    loop.core.kafka.commit_if_due(now + 2.0)
    assert loop.kafka.commits == [], "nothing stored: no asynchronous commit"
    loop.push(rec(0, 1))
    job = loop.one_job()
    job.result = committed(job)
    loop.core.finish(job)
    loop.core.kafka.commit_if_due(now + 2.5)
    assert loop.kafka.commits == [], "not due yet"
    loop.core.kafka.commit_if_due(now + 3.0)
    assert loop.kafka.commits == [True]
    # On revocation and at shutdown, always, synchronously.
    loop.core.kafka.commit(asynchronous=False)
    assert loop.kafka.commits == [True, False]
    # Nothing to commit is not a failure; a refused store is logged.
    loop.kafka.commit_error = KafkaError(KafkaError._NO_OFFSET)
    loop.core.kafka.commit(asynchronous=False)
    loop.kafka.refuse_store = True
    loop.core.kafka.store_offset(TP0, 5)


def test_the_poll_waits_for_nothing_when_ready_briefly_for_a_straggler_else_until_a_retry():
    assert poll_timeout(Round(ready=True), 10.0, stragglers=True) == 0.0
    assert poll_timeout(Round(wake=10.05), 10.0, stragglers=False) == pytest.approx(0.05)
    assert poll_timeout(Round(wake=99.0), 10.0, stragglers=False) == POLL_MAX
    assert poll_timeout(Round(), 10.0, stragglers=False) == pytest.approx(POLL_MAX)
    assert poll_timeout(Round(), 10.0, stragglers=True) == POLL_STRAGGLER


class FakeConsume:
    """``Consumer.consume`` as librdkafka serves it: up to ``n`` of what is
    queued; with nothing queued and a timeout, what arrives within it
    (``arriving``), at most ``n``."""

    def __init__(self, queued: int, arriving: int = 0) -> None:
        self.queued = queued
        self.arriving = arriving
        self.calls: list[tuple[int, float]] = []

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        self.calls.append((num_messages, timeout))
        if self.queued == 0 and timeout > 0:
            self.queued, self.arriving = self.arriving, 0
        n = min(num_messages, self.queued)
        self.queued -= n
        return [object()] * n


def test_a_poll_takes_what_is_fetched_and_waits_only_for_the_first_record():
    # A backlog: one burst, no wait.
    backlog = FakeConsume(queued=5000)
    assert len(poll_burst(backlog, POLL_MAX)) == POLL_BURST
    assert backlog.calls == [(POLL_BURST, 0)]
    # A live stream: nothing queued, so wait for one record (returned as it
    # arrives, not after the timeout) and take what came with it.
    live = FakeConsume(queued=0, arriving=3)
    assert len(poll_burst(live, POLL_MAX)) == 3
    assert live.calls == [(POLL_BURST, 0), (1, POLL_MAX), (POLL_BURST - 1, 0)]
    # Nothing arrives: the timeout's one wait, and nothing more.
    idle = FakeConsume(queued=0)
    assert poll_burst(idle, POLL_MAX) == []
    assert idle.calls == [(POLL_BURST, 0), (1, POLL_MAX)]
    # No time to wait: a single call.
    ready = FakeConsume(queued=0, arriving=3)
    assert poll_burst(ready, 0.0) == []
    assert ready.calls == [(POLL_BURST, 0)]


# -- stragglers and rebalances -----------------------------------------------


def test_a_straggler_holds_up_only_its_partition_until_the_loop_acts_on_it():
    loop = Loop()
    loop.push(rec(0, 1), rec(1, 2), rec(0, 1, partition=1), rec(1, 2, partition=1))
    round_, jobs = loop.round()
    slow = Running(done=False)
    running = [slow if j.tp == TP0 else Running() for j in jobs]
    for job in jobs:
        job.result = committed(job)
    loop.core.end_round(jobs, running)
    assert list(loop.core.stragglers.in_flight) == [TP0]
    assert loop.kafka.stored == {TP1: 2}
    assert loop.core.between_rounds(Round()) == POLL_STRAGGLER
    loop.push(rec(2, 3), rec(2, 3, partition=1))
    assert [j.tp for j in loop.round()[1]] == [TP1]
    assert loop.core.start_round() == []
    slow.is_done = True
    assert loop.core.start_round() == [TP0]
    loop.core.settle(loop.core.stragglers.take([TP0]))
    assert loop.kafka.stored[TP0] == 2 and not loop.part().in_flight


def test_a_revocation_settles_the_stragglers_commits_and_drops_the_partitions():
    loop = Loop()
    consumer = FakeConsumer()
    settled: list[tuple[list[tuple[str, int]], float | None]] = []
    loaded: list[list[tuple[str, int]]] = []
    loop.core.subscribe(consumer, lambda tps, bound: settled.append((tps, bound)), loaded.append)
    assert consumer.topics == ["t"]
    cb = consumer.callbacks
    cb["on_assign"](consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])
    assert loaded == [[TP0, TP1]] and loop.kafka.resumed == [TP0, TP1]
    assert sorted(loop.core.assignment.partitions) == [TP0, TP1]
    loop.push(rec(0, 1))
    cb["on_revoke"](consumer, [TopicPartition("t", 0)])
    assert settled == [([TP0], S.revoke_wait)]
    assert loop.kafka.commits == [False]
    assert sorted(loop.core.assignment.partitions) == [TP1]
    cb["on_lost"](consumer, [TopicPartition("t", 1)])
    assert loop.kafka.commits == [False], "lost partitions are another member's: no commit"
    assert loop.core.assignment.partitions == {}


def test_a_straggler_still_running_after_the_bound_is_abandoned_and_counted_when_it_ends(caplog):
    loop = Loop()
    loop.push(rec(0, 1))
    job = loop.one_job()
    slow = Running(done=False)
    loop.core.end_round([job], [slow])
    with caplog.at_level(logging.WARNING, logger="walrelay_consumer"):
        loop.core.settle(loop.core.stragglers.take([TP0]), bound=0.5)
    assert "abandoned so that the rebalance goes on" in caplog.text
    assert loop.kafka.stored == {}
    job.counters.processed = 1
    job.result = committed(job)
    loop.core.start_round()
    assert loop.core.counters.processed == 0, "still running"
    slow.is_done = True
    loop.core.start_round()
    assert loop.core.counters.processed == 1 and loop.core.stragglers.abandoned == []
    assert loop.kafka.stored == {}, "an abandoned batch's offset is never stored"


def test_marks_not_loaded_replace_the_connections():
    loop = Loop()
    loop.core.marks_abandoned([TP0], 5.0, in_rebalance=True)
    loop.core.marks_failed(psycopg.OperationalError("no"))
    assert loop.db_closed == 2


# -- Kafka errors, the end -----------------------------------------------------


def test_a_fatal_kafka_error_stops_the_loop_and_ends_it_with_the_error():
    loop = Loop()
    loop.core.report(KafkaError(KafkaError._TRANSPORT))
    assert not loop.core.stopping()
    loop.core.report(KafkaError(KafkaError._FATAL))
    assert loop.core.stopping()
    with pytest.raises(KafkaException):
        loop.core.end()


#: The consumer error event librdkafka queues when the broker refuses the
#: instance id (group.protocol=consumer), as confluent-kafka 2.16.1 (librdkafka
#: 2.16.0) hands it over: code _FATAL, but fatal() False, and only this text.
UNRELEASED = KafkaError(
    KafkaError._FATAL,
    "Fatal error: Broker: The instance ID is still used by another member in the consumer group: "
    "ConsumerGroupHeartbeat fatal error: Broker: The instance ID is still used by another member "
    "in the consumer group",
)


def test_a_refused_instance_id_ends_the_consumer_not_the_loop_and_a_new_one_is_tried(caplog):
    loop = Loop()
    loop.core.instance_id = "billing-0"
    loop.core.assigned([TP0])
    loop.core.report(UNRELEASED)
    assert loop.core.consumer_done()
    assert not loop.core.stopping()
    with caplog.at_level(logging.WARNING, logger="walrelay_consumer"):
        wait = loop.core.rejoin()
    assert wait == rejoin.FIRST_RETRY
    assert loop.core.assignment.partitions == {}, "the dead consumer's partitions are dropped"
    assert not loop.core.consumer_done()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "billing-0" in warned[0] and "consumer.session.timeout.ms" in warned[0], warned
    # Refused again at once: a longer wait, and no second warning yet.
    caplog.clear()
    loop.core.report(UNRELEASED)
    with caplog.at_level(logging.WARNING, logger="walrelay_consumer"):
        assert loop.core.rejoin() == rejoin.RETRY_CAP
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    loop.core.end()  # nothing to raise: the loop was not ended by it


def test_without_a_refusal_or_once_stopping_there_is_no_new_consumer():
    loop = Loop()
    assert loop.core.rejoin() is None
    loop.core.report(UNRELEASED)
    loop.core.stop()
    assert loop.core.rejoin() is None


def test_refusals_are_logged_again_after_a_while_and_start_over_once_joined():
    r = rejoin.Refusals()
    assert r.refused(100.0, "m", "x").log is not None
    assert r.refused(101.0, "m", "x").log is None
    later = r.refused(100.0 + rejoin.LOG_EVERY, "m", "x")
    assert later.log is not None and "3 attempts over 30s" in later.log, later.log
    assert r.joined(131.0) == (31.0, 3)
    assert r.joined(132.0) is None
    again = r.refused(140.0, "m", "x")
    assert again.wait == rejoin.FIRST_RETRY and again.log is not None


def test_other_fatal_errors_still_end_the_loop():
    loop = Loop()
    fenced = KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced by other consumer", fatal=True)
    assert not rejoin.instance_id_in_use(fenced)
    assert rejoin.instance_id_in_use(KafkaError(KafkaError.UNRELEASED_INSTANCE_ID))
    loop.core.report(fenced)
    assert loop.core.stopping()
    assert loop.core.rejoin() is None
    with pytest.raises(KafkaException):
        loop.core.end()


# -- a job's connection ----------------------------------------------------------


class Conn:
    def __init__(self, closed: bool = False, broken: bool = False) -> None:
        self.closed = closed
        self.broken = broken


def test_a_jobs_connection_is_kept_closed_after_a_timeout_or_dropped_when_gone():
    loop = Loop()
    loop.push(rec(0, 1))
    job = loop.one_job()
    job.result = committed(job)
    assert job.end(Conn()) is After.KEEP and not job.conn_gone
    assert job.end(Conn(broken=True)) is After.DROP and job.conn_gone
    assert job.end(None) is After.DROP and job.conn_gone
    job.result = HandlerFailed(HandlerTimedOut(1.0), 0)
    assert job.end(Conn()) is After.CLOSE and not job.conn_gone
