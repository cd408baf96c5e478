"""The partition's pure decisions (crates/walrelay-consumer/src/consumer_loop/partition.rs)."""

from walrelay_consumer import OnPoison, Position, Record, RetryPolicy, Settings
from walrelay_consumer.apply import Park
from walrelay_consumer.partition import Apply, Idle, Partition, ParkUnkeyed, Queued, Skip, Stop, WaitUntil


def k(n):
    return f"{n:032x}"


def rec(offset, key=None, source="s"):
    headers = () if key is None else (("idempotency-key", k(key).encode()), ("walrelay-source", source.encode()))
    return Queued.of(Record("t", 0, offset, None, b"v", headers))


def part(*queued):
    p = Partition(Position("g", "t", 0))
    for q in queued:
        p.push(q)
    return p


S = Settings(max_batch_records=3, retry=RetryPolicy(attempts=2, base=1.0, cap=4.0))


def test_batches_are_bounded_and_stop_before_a_record_without_headers():
    p = part(rec(0, 1), rec(1, 2), rec(2, 3), rec(3, 4))
    assert p.next_step(S, 0.0) == Apply(3)
    p = part(rec(0, 1), rec(1), rec(2, 3))
    assert p.next_step(S, 0.0) == Apply(1)
    assert part().next_step(S, 0.0) == Idle()


def test_known_marks_skip_without_a_transaction():
    p = part(rec(0, 1), rec(1, 2))
    p.learn({"s": k(2)})
    assert p.next_step(S, 0.0) == Skip(2)
    assert p.knows_sources(2)


def test_a_record_without_headers_follows_the_poison_policy():
    p = part(rec(7))
    step = p.next_step(S, 0.0)
    assert isinstance(step, Stop) and "offset 7" in step.error and "idempotency-key" in step.error
    step = p.next_step(Settings(on_poison=OnPoison.PARK), 0.0)
    assert isinstance(step, ParkUnkeyed)


def test_a_failing_record_is_retried_with_backoff_then_parked_or_stops():
    p = part(rec(0, 1), rec(1, 2), rec(2, 3))
    # The per-record handler names record 1.
    assert p.handler_failed("boom", 1, 3, S, 10.0) == 1
    assert p.next_step(S, 10.5) == WaitUntil(11.0)
    assert p.next_step(S, 11.0) == Apply(3)
    assert p.handler_failed("boom", 1, 3, S, 11.0) == 2
    # Attempts exhausted: apply what precedes it first, then stop on it.
    assert p.next_step(S, 20.0) == Apply(1)
    p.take(1)
    p.committed(1)
    assert p.failing is not None and p.failing.index == 0
    step = p.next_step(S, 20.0)
    assert isinstance(step, Stop) and "offset 1 failed 2 times: boom" in step.error
    park = Settings(max_batch_records=3, retry=S.retry, on_poison=OnPoison.PARK)
    assert p.next_step(park, 20.0) == Apply(1, Park(error="boom", attempts=2))


def test_a_batch_handler_failure_isolates_records_one_per_transaction():
    p = part(rec(0, 1), rec(1, 2), rec(2, 3))
    p.handler_failed("boom", None, 3, S, 0.0)
    p.handler_failed("boom", None, 3, S, 1.0)
    assert p.isolate == 3
    assert p.next_step(S, 1.0) == Apply(1)


def test_database_failures_back_off_without_counting_attempts():
    p = part(rec(0, 1))
    assert p.db_failed(S, 0.0) == 1
    assert p.db_failed(S, 0.0) == 2
    assert p.failing is None
    assert p.next_step(S, 1.0) == WaitUntil(2.0)
    assert p.next_step(S, 2.0) == Apply(1)


def test_backoff_doubles_up_to_the_cap():
    r = RetryPolicy(attempts=5, base=0.1, cap=1.0)
    assert [r.backoff(n) for n in (0, 1, 2, 4, 5, 1000)] == [0.1, 0.1, 0.2, 0.8, 1.0, 1.0]


def test_pause_and_resume_bounds():
    p = part(*[rec(i, i + 1) for i in range(6)])
    assert p.should_pause(S)
    p.paused = True
    p.take(3)
    assert p.should_resume(S)


def test_nothing_is_decided_while_a_batch_is_in_flight():
    # What follows a batch in flight is covered by the known marks, but
    # skipping it would store an offset ahead of the batch's.
    p = part(rec(0, 1), rec(1, 2), rec(2, 1))
    taken = p.take(2)
    p.in_flight = True
    p.learn({"s": k(1)})
    assert p.next_step(S, 0.0) == Idle()
    p.in_flight = False
    p.put_back(taken)
    assert p.next_step(S, 0.0) == Apply(3)


def test_attempts_are_counted_per_record_not_per_batch():
    # Record 2 fails four times and then goes through, while record 7 fails
    # once: record 7 has had one attempt, not five (issue 25, item 6).
    s = Settings(max_batch_records=10, retry=RetryPolicy(attempts=5, base=1.0, cap=1.0), on_poison=OnPoison.PARK)
    p = part(*(rec(i, i + 1) for i in range(10)))
    for _ in range(4):
        assert p.handler_failed("record 2 failed", 2, 10, s, 0.0) <= 4
    assert p.handler_failed("record 7 failed", 7, 10, s, 0.0) == 1
    assert p.next_step(s, 5.0) == Apply(10)
    # Its own attempts still add up to the policy's.
    for attempt in range(2, 6):
        assert p.handler_failed("record 7 failed", 7, 10, s, 0.0) == attempt
    assert p.next_step(s, 5.0) == Apply(8, Park(error="record 7 failed", attempts=5))
    # Once the records before it are committed, their counts go with them.
    p.take(7)
    p.committed(7)
    assert p.record_failures == {7: 5}


def test_contention_halves_the_batch_without_counting_until_one_record():
    # Issue 35, item 4 (the Rust crate's test of the same name).
    s = Settings(max_batch_records=8, retry=RetryPolicy(attempts=2, base=1.0, cap=4.0), on_poison=OnPoison.PARK)
    p = part(*(rec(i, i + 1) for i in range(10)))
    assert p.next_step(s, 0.0) == Apply(8)
    # A deadlock on the batch of 8: half of it next, nothing counted, the
    # retry after the policy's first backoff.
    assert p.contended("deadlock", 8, s, 0.0) is None
    assert not p.record_failures and p.failing is None
    assert p.next_step(s, 0.5) == WaitUntil(1.0)
    assert p.next_step(s, 1.0) == Apply(4)
    assert p.contended("deadlock", 4, s, 1.0) is None
    assert p.next_step(s, 2.0) == Apply(2)
    assert p.contended("deadlock", 2, s, 2.0) is None
    assert p.next_step(s, 3.0) == Apply(1)
    # At one record it counts, as a failure of that record...
    assert p.contended("deadlock", 1, s, 3.0) == 1
    assert p.record_failures == {0: 1}
    # ...so after the policy's attempts it is parked, like any failing record.
    assert p.contended("deadlock", 1, s, 5.0) == 2
    assert p.next_step(s, 10.0) == Apply(1, Park(error="deadlock", attempts=2))
    p.take(1)
    p.committed(1)
    # The cap holds for the failed batch's 8 records, then full batches
    # come back.
    for _ in range(6):
        assert p.shrink is not None and p.next_step(s, 10.0) == Apply(1)
        p.take(1)
        p.committed(1)
    assert p.shrink is not None
    p.take(1)
    p.committed(1)
    assert p.shrink is None and p.next_step(s, 10.0) == Apply(2)


def test_a_lone_record_of_several_times_the_byte_bound_is_applied_at_once():
    # Issue 35, item 3: the Rust loop waited for ever to fill a batch
    # behind such a record. Here it makes a batch of its own, and the
    # paused partition resumes once it is applied.
    s = Settings(max_batch_bytes=1024)
    big = Queued.of(Record("t", 0, 0, None, b"x" * 4096, rec(0, 1).record.headers))
    p = part(big)
    assert p.is_full(s) and p.should_pause(s)
    p.paused = True
    assert p.next_step(s, 0.0) == Apply(1)
    p.take(1)
    p.committed(1)
    assert p.should_resume(s)
    # Two of them: one batch each.
    p = part(big, Queued.of(Record("t", 0, 1, None, b"x" * 4096, rec(1, 2).record.headers)))
    assert p.next_step(s, 0.0) == Apply(1)


def test_a_partition_never_waits_for_more_records_to_fill_a_batch():
    # Issue 35, item 3: the Rust loop's short batch waited while librdkafka
    # had more, and a burst ending exactly on its read limit waited for the
    # 1 s ticker. The Python loop has no such wait: whatever is queued is
    # applied in the round after the poll that fetched it (its poll waits
    # 0 s while a partition has more ready), so a healthy partition with
    # records queued is never idle.
    for n in (1, 2, 3, 16, 1024):
        p = part(*(rec(i, i + 1) for i in range(n)))
        assert p.next_step(S, 0.0) == Apply(min(n, S.max_batch_records))
