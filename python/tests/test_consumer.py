"""The blocking consumer loop end to end: a real broker, a real
PostgreSQL, records produced with walrelay headers."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaException
from prometheus_client import CollectorRegistry

from brokers import broker_kind
from conftest import SOURCE, Relay, await_condition, count, key
from walrelay_consumer import (
    AsyncConsumerLoop,
    ConfigError,
    ConsumerLoop,
    OnPoison,
    PartitionsStopped,
    RetryPolicy,
    Settings,
    migrate,
    redrive,
)

HERE = Path(__file__).resolve().parent
EFFECTS = "SELECT count(*) FROM effects"


@pytest.fixture
def env(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        migrate(c)
        c.execute("CREATE TABLE effects (event_key text NOT NULL, partition int NOT NULL, consumer text NOT NULL)")
    return dsn


def kafka(bootstrap: str, group: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
        "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 500,
    }


def insert(name: str):
    def handler(conn, batch):
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO effects (event_key, partition, consumer) VALUES (%s, %s, %s)",
                [(d.meta.key, d.position.partition, name) for d in batch],
            )

    return handler


class Running:
    """A loop in a thread."""

    def __init__(self, loop: ConsumerLoop, handler: Any, batches: bool = True) -> None:
        self.loop = loop
        self.error: BaseException | None = None
        run = loop.run_batches if batches else loop.run

        def target() -> None:
            try:
                run(handler, handle_signals=False)
            except BaseException as e:  # reported by stop()
                self.error = e

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def stop(self) -> BaseException | None:
        self.loop.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the loop did not stop within 60 s"
        return self.error


def start(broker, topic, dsn, group, name, batches=True, settings=None, handler=None, registry=None) -> Running:
    loop = ConsumerLoop(
        kafka(broker.bootstrap, group),
        [topic],
        dsn + f" application_name=walrelay-test-{name}",
        settings,
        registry if registry is not None else CollectorRegistry(),
    )
    if handler is None:
        handler = insert(name)
        if not batches:
            batch_handler = handler
            handler = lambda conn, d: batch_handler(conn, [d])  # noqa: E731
    return Running(loop, handler, batches)


def exactly_once(dsn: str) -> None:
    assert count(dsn, "SELECT count(*) - count(DISTINCT event_key) FROM effects") == 0, "an event applied twice"


def marks(dsn: str, group: str, topic: str) -> dict[tuple[int, str], str]:
    with psycopg.connect(dsn) as c:
        rows = c.execute(
            "SELECT partition, source, hwm FROM walrelay_consumer_hwm WHERE consumer_group = %s AND topic = %s",
            (group, topic),
        ).fetchall()
    return {(p, s): h for p, s, h in rows}


@pytest.mark.parametrize("batches", [True, False], ids=["batch", "per-record"])
def test_every_event_is_applied_once_across_replays_and_two_sources(broker, topic, env, batches):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(p, s) for s in range(1, 31) for p in (0, 1)])
    # The relay restarts and replays 21..=30, then goes on to 40.
    relay.restart()
    relay.send([(p, s) for s in range(21, 41) for p in (0, 1)])
    # A second source on partition 0 whose keys are far lower: not comparable.
    other = Relay(broker.bootstrap, topic, source="9999/other/walrelay")
    other.send([(0, s) for s in range(-200, -195)])
    total = sum(len(v) for v in relay.produced.values()) + 5
    distinct = relay.distinct() + 5

    registry = CollectorRegistry()
    r = start(broker, topic, env, "billing", "a", batches, registry=registry)
    c = r.loop.counters
    await_condition("all records seen", lambda: c.processed + c.duplicates >= total)
    assert r.stop() is None
    assert (c.processed, c.duplicates, c.gaps, c.errors) == (85, 20, 0, 0)
    # The same totals in the Rust crate's metric names.
    sample = registry.get_sample_value
    assert sample("walrelay_consumer_records_applied_total") == 85
    assert sample("walrelay_consumer_duplicates_skipped_total") == 20
    assert sample("walrelay_consumer_gaps_total") == 0
    assert sample("walrelay_consumer_batch_records_count") >= 1
    assert sample("walrelay_consumer_apply_seconds_count") == sample("walrelay_consumer_batch_records_count")
    assert sample(
        "walrelay_consumer_hwm_commit_lsn", {"topic": topic, "partition": "1", "source": SOURCE}
    ) == 0x100 + 40
    assert count(env, EFFECTS) == distinct
    exactly_once(env)
    assert marks(env, "billing", topic) == {
        (0, SOURCE): key(0, 40),
        (1, SOURCE): key(1, 40),
        (0, "9999/other/walrelay"): key(0, -196),
    }

    # A second run of the same group resumes after the committed offsets.
    relay.send([(0, 41), (1, 41)])
    r = start(broker, topic, env, "billing", "a2", batches)
    c = r.loop.counters
    await_condition("the two new records", lambda: count(env, EFFECTS) == distinct + 2)
    assert r.stop() is None
    assert (c.processed, c.duplicates, c.errors) == (2, 0, 0)


def test_a_gap_is_counted_and_the_record_still_applied(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(0, 1), (0, 2)])
    r = start(broker, topic, env, "g", "a")
    await_condition("two applied", lambda: count(env, EFFECTS) == 2)
    # Record 3 never reaches the consumer (say, retention deleted it):
    # the relay sent 3 then 4, the consumer sees 4 with prev-key 3.
    relay.prev[0] = key(0, 3)
    relay.send([(0, 4)])
    await_condition("the record after the gap", lambda: count(env, EFFECTS) == 3)
    # The counters follow the database commit: read them once the loop stopped.
    assert r.stop() is None
    assert (r.loop.counters.processed, r.loop.counters.gaps) == (3, 1)


def run_process(broker, topic, dsn, group, name, commit_interval) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "consumer_process.py"), broker.bootstrap, topic, dsn, group, name, str(commit_interval)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_killed_between_the_database_commit_and_the_offset_commit(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(p, s) for s in range(1, 21) for p in (0, 1)])
    # Offsets are committed only every hour: everything is applied, no
    # offset is committed, then the process is killed.
    proc = run_process(broker, topic, env, "crashy", "a", 3600)
    try:
        await_condition("all applied by the process", lambda: count(env, EFFECTS) == 40)
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, out
    # Its successor reads everything again; the marks drop all of it.
    r = start(broker, topic, env, "crashy", "b")
    c = r.loop.counters
    await_condition("all redelivered", lambda: c.duplicates >= 40)
    assert r.stop() is None
    assert (c.processed, c.duplicates, c.errors) == (0, 40, 0)
    assert count(env, EFFECTS) == 40
    exactly_once(env)


def test_sigterm_stops_cleanly_and_commits_the_offsets(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(p, s) for s in range(1, 11) for p in (0, 1)])
    proc = run_process(broker, topic, env, "polite", "a", 3600)
    try:
        await_condition("all applied by the process", lambda: count(env, EFFECTS) == 20)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "stopped cleanly" in out
    # The offsets were committed at the stop: the successor sees only what
    # is new.
    relay.send([(0, 11)])
    r = start(broker, topic, env, "polite", "b")
    await_condition("the new record", lambda: count(env, EFFECTS) == 21)
    assert r.stop() is None
    assert (r.loop.counters.processed, r.loop.counters.duplicates) == (1, 0)


def poison_handler(poison: str, name: str):
    def handler(conn, d):
        if d.meta.key == poison:
            raise ValueError(f"cannot apply {d.meta.key}")
        insert(name)(conn, [d])

    return handler


FAST_RETRY = RetryPolicy(attempts=3, base=0.01, cap=0.05)


def test_a_poison_record_is_parked_then_redriven(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(p, s) for s in range(1, 11) for p in (0, 1)])
    poison = key(0, 5)
    settings = Settings(retry=FAST_RETRY, on_poison=OnPoison.PARK)
    r = start(broker, topic, env, "parky", "a", batches=False, settings=settings, handler=poison_handler(poison, "a"))
    await_condition("all but the poison record applied", lambda: count(env, EFFECTS) == 19)
    await_condition("the poison record parked", lambda: r.loop.counters.parked == 1)
    assert r.stop() is None
    with psycopg.connect(env, autocommit=True) as c:
        rows = c.execute(
            "SELECT partition, kafka_offset, idempotency_key, attempts, error FROM walrelay_consumer_parked"
        ).fetchall()
        assert rows == [(0, 4, poison, 3, f"cannot apply {poison}")]
        # The mark moved past it: nothing of partition 0 is stuck.
        assert marks(env, "parky", topic)[(0, SOURCE)] == key(0, 10)
        report = redrive(c, "parky", lambda conn, d: insert("redrive")(conn, [d]))
        assert (report.applied, report.failed) == (1, 0)
    assert count(env, EFFECTS) == 20
    exactly_once(env)


def test_a_poison_record_stops_its_partition_only(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(p, s) for s in range(1, 11) for p in (0, 1)])
    poison = key(0, 5)
    settings = Settings(retry=FAST_RETRY, on_poison=OnPoison.STOP)
    registry = CollectorRegistry()
    r = start(
        broker,
        topic,
        env,
        "stoppy",
        "a",
        batches=False,
        settings=settings,
        handler=poison_handler(poison, "a"),
        registry=registry,
    )
    await_condition("partition 1 and the records before the poison", lambda: count(env, EFFECTS) == 14)
    # The stop is decided once the records before the poison record are
    # committed and acted on.
    await_condition(
        "partition 0 stopped",
        lambda: registry.get_sample_value("walrelay_consumer_partition_stopped", {"topic": topic, "partition": "0"})
        == 1,
    )
    error = r.stop()
    assert isinstance(error, PartitionsStopped), error
    assert registry.get_sample_value("walrelay_consumer_partition_stopped", {"topic": topic, "partition": "0"}) == 1
    assert [(p.topic, p.partition) for p in error.stopped] == [(topic, 0)]
    assert "offset 4 failed 3 times" in str(error)
    assert count(env, "SELECT count(*) FROM effects WHERE partition = 0") == 4
    # Nothing past the poison record was committed: a fixed service applies
    # it and the rest.
    r = start(broker, topic, env, "stoppy", "b")
    await_condition("the rest of partition 0", lambda: count(env, EFFECTS) == 20)
    assert r.stop() is None
    assert r.loop.counters.processed == 6
    exactly_once(env)


def test_a_batch_handler_failure_finds_the_poison_record(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    poison = key(1, 3)

    def handler(conn, batch):
        if any(d.meta.key == poison for d in batch):
            raise ValueError("a bad record somewhere in the batch")
        insert("a")(conn, batch)

    r = start(
        broker, topic, env, "finder", "a", settings=Settings(retry=FAST_RETRY, on_poison=OnPoison.PARK), handler=handler
    )
    relay.send([(1, s) for s in range(1, 8)])
    await_condition("all but the poison record", lambda: count(env, EFFECTS) == 6)
    await_condition("the poison record parked", lambda: r.loop.counters.parked == 1)
    assert r.stop() is None
    with psycopg.connect(env) as c:
        assert c.execute("SELECT idempotency_key FROM walrelay_consumer_parked").fetchall() == [(poison,)]


def test_a_record_without_headers_is_parked_alone(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(0, 1)])
    relay.send_raw(0, b"not from walrelay")
    relay.send([(0, 2)])
    r = start(broker, topic, env, "raw", "a", settings=Settings(on_poison=OnPoison.PARK))
    await_condition("both walrelay records", lambda: count(env, EFFECTS) == 2)
    await_condition("the raw record parked", lambda: r.loop.counters.parked == 1)
    assert r.stop() is None
    with psycopg.connect(env) as c:
        rows = c.execute("SELECT kafka_offset, idempotency_key, payload, error FROM walrelay_consumer_parked").fetchall()
    assert len(rows) == 1 and rows[0][:3] == (1, None, b"not from walrelay"), rows
    assert "idempotency-key" in rows[0][3]


def test_a_lost_database_connection_is_reconnected(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(0, 1)])
    r = start(broker, topic, env, "reconnect", "victim")
    await_condition("the first record", lambda: count(env, EFFECTS) == 1)
    killed = count(
        env,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'walrelay-test-victim'",
    )
    assert killed >= 1
    relay.send([(0, 2), (1, 1)])
    await_condition("records after the loss", lambda: count(env, EFFECTS) == 3)
    assert r.stop() is None
    exactly_once(env)


def meet_the_other_partition(name: str, pids: dict[int, set[int]]):
    """A batch handler that applies its batch only once a batch of the other
    partition is inside its handler at the same moment (a barrier): it can
    only pass when the loop runs two partitions' transactions at once.
    Notes each partition's connection."""
    barrier = threading.Barrier(2, timeout=5)

    def handler(conn, batch):
        partition = batch[0].position.partition
        pids.setdefault(partition, set()).add(conn.info.backend_pid)
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            # Alone (the other partition's records were not polled yet):
            # the batch fails and is retried, with the barrier fresh.
            barrier.reset()
            raise
        insert(name)(conn, batch)

    return handler


def test_partitions_apply_at_the_same_time_each_on_its_own_connection(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(p, s) for s in range(1, 6) for p in (0, 1)])
    pids: dict[int, set[int]] = {}
    settings = Settings(retry=RetryPolicy(attempts=20, base=0.01, cap=0.05), pool_size=4)
    r = start(broker, topic, env, "parallel", "a", settings=settings, handler=meet_the_other_partition("a", pids))
    await_condition("both partitions applied", lambda: count(env, EFFECTS) == 10)
    assert r.stop() is None
    exactly_once(env)
    # Two transactions at once need two connections.
    assert pids[0] and pids[1] and not pids[0] & pids[1], pids
    assert r.loop.counters.processed == 10


def test_a_slow_partition_holds_up_only_itself(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(0, 1), (1, 1)])
    blocked = threading.Event()
    release = threading.Event()

    def handler(conn, batch):
        if batch[0].position.partition == 0:
            blocked.set()
            assert release.wait(60), "never released"
        insert("a")(conn, batch)

    r = start(broker, topic, env, "slow", "a", handler=handler)
    try:
        await_condition("partition 0's batch in its handler", blocked.is_set)
        # Partition 1 goes on, batch after batch, while 0's batch is stuck
        # (the loop keeps polling).
        for s in range(2, 6):
            relay.send([(1, s)])
            await_condition(f"partition 1's record {s}", lambda s=s: count(env, "SELECT count(*) FROM effects WHERE partition = 1") == s)
        assert count(env, "SELECT count(*) FROM effects WHERE partition = 0") == 0
    finally:
        release.set()
    await_condition("partition 0 applied", lambda: count(env, EFFECTS) == 6)
    assert r.stop() is None
    exactly_once(env)


def test_a_pool_of_one_applies_the_partitions_one_after_the_other(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(p, s) for s in range(1, 4) for p in (0, 1)])
    threads: set[str] = set()

    def handler(conn, batch):
        threads.add(threading.current_thread().name)
        insert("a")(conn, batch)

    r = start(broker, topic, env, "serial", "a", settings=Settings(pool_size=1), handler=handler)
    await_condition("both partitions applied", lambda: count(env, EFFECTS) == 6)
    assert r.stop() is None
    # Every batch ran on the loop's own thread.
    assert threads == {r.thread.name}, threads


def test_two_members_racing_over_rebalances_apply_each_event_once(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    seq = 0

    def step() -> None:
        nonlocal seq
        relay.send([(p, s) for s in range(seq + 1, seq + 11) for p in (0, 1)])
        seq += 10
        # A relay restart replays the last 3 of each partition.
        relay.restart()
        relay.send([(p, s) for s in range(seq - 2, seq + 1) for p in (0, 1)])

    a = start(broker, topic, env, "ledger", "a")
    step()
    await_condition("A applies the first step", lambda: count(env, EFFECTS) == 20)
    b = start(broker, topic, env, "ledger", "b")
    # B joins: a rebalance while records keep coming.
    for _ in range(200):
        step()
        if count(env, "SELECT count(*) FROM effects WHERE consumer = 'b'") > 0:
            break
        await_condition("the consumers catch up", lambda: count(env, EFFECTS) == relay.distinct())
    else:
        pytest.fail("consumer b never got a partition")
    step()
    await_condition("every event applied", lambda: count(env, EFFECTS) == relay.distinct())
    assert a.stop() is None
    assert b.stop() is None
    exactly_once(env)
    assert marks(env, "ledger", topic) == {(0, SOURCE): key(0, seq), (1, SOURCE): key(1, seq)}


def test_configuration_that_would_skip_events_is_refused():
    with pytest.raises(ConfigError, match="group.id"):
        ConsumerLoop({"bootstrap.servers": "x"}, ["t"], "dbname=x")
    with pytest.raises(ConfigError, match="no topics"):
        ConsumerLoop({"bootstrap.servers": "x", "group.id": "g"}, [], "dbname=x")
    with pytest.raises(ConfigError, match="enable.auto.commit=true conflicts"):
        ConsumerLoop({"bootstrap.servers": "x", "group.id": "g", "enable.auto.commit": "true"}, ["t"], "dbname=x")
    # Booleans are accepted for the values the loop needs.
    ConsumerLoop({"bootstrap.servers": "x", "group.id": "g", "enable.auto.commit": False}, ["t"], "dbname=x")


def test_the_consumer_group_protocol_refuses_client_side_group_settings_naming_the_fix():
    base = {"bootstrap.servers": "x", "group.id": "g", "group.protocol": "consumer"}
    ConsumerLoop(base, ["t"], "dbname=x", group_instance_id="m-0")
    for key, fix in [
        ("session.timeout.ms", "consumer.session.timeout.ms"),
        ("heartbeat.interval.ms", "consumer.heartbeat.interval.ms"),
        ("partition.assignment.strategy", "group.remote.assignor"),
        ("group.protocol.type", "remove it"),
    ]:
        with pytest.raises(ConfigError, match=f"{key} is not allowed with group.protocol=consumer.*{fix}"):
            ConsumerLoop({**base, key: "1"}, ["t"], "dbname=x")
    # The classic protocol (the default) takes them.
    ConsumerLoop({**base, "group.protocol": "classic", "session.timeout.ms": 6000}, ["t"], "dbname=x")


def test_static_group_membership_is_a_keyword_or_the_kafka_setting():
    # Issue 35, item 5: group_instance_id is group.instance.id (KIP-345).
    base = {"bootstrap.servers": "x", "group.id": "g"}
    loop = ConsumerLoop(base, ["t"], "dbname=x", group_instance_id="billing-0")
    assert loop._config["group.instance.id"] == "billing-0"
    aloop = AsyncConsumerLoop(base, ["t"], "dbname=x", group_instance_id="billing-1")
    assert aloop._config["group.instance.id"] == "billing-1"
    # The same id both ways is fine; two different ones, or an empty one, are refused.
    ConsumerLoop({**base, "group.instance.id": "billing-0"}, ["t"], "dbname=x", group_instance_id="billing-0")
    with pytest.raises(ConfigError, match="unique per running instance"):
        ConsumerLoop({**base, "group.instance.id": "a"}, ["t"], "dbname=x", group_instance_id="b")
    with pytest.raises(ConfigError, match="non-empty"):
        ConsumerLoop(base, ["t"], "dbname=x", group_instance_id="")
    # Without it the member is dynamic, as before.
    assert "group.instance.id" not in ConsumerLoop(base, ["t"], "dbname=x")._config


def test_the_example_service_applies_records_and_stops_on_sigterm(broker, topic, dsn):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(p, s) for s in range(1, 6) for p in (0, 1)])
    relay.restart()
    relay.send([(0, 5)])  # a replay
    example = HERE.parent / "examples" / "consumer.py"
    proc = subprocess.Popen(
        [
            *(sys.executable, str(example), "--bootstrap", broker.bootstrap, "--topic", topic, "--dsn", dsn),
            *("--group", "ex", "--kafka", "session.timeout.ms=6000", "--kafka", "heartbeat.interval.ms=1000"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def applied() -> int:
            try:
                return count(dsn, "SELECT count(*) FROM applied_events")
            except psycopg.errors.UndefinedTable:
                return 0

        await_condition("the example applies the ten events", lambda: applied() == 10)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "stopped: 10 applied" in out, out


def test_a_revocation_abandons_a_batch_the_database_does_not_finish(broker, topic, env, caplog):
    # Issue 25, item 9: the revocation callback waited for the revoked
    # partitions' batches without a bound, so a database that stops
    # answering one batch stalled the whole rebalance (until the member was
    # evicted). Partition 0's batch waits on a lock the test holds.
    relay = Relay(broker.bootstrap, topic)
    relay.send([(0, 1), (1, 1)])
    p1 = "SELECT count(*) FROM effects WHERE partition = 1"
    holder = psycopg.connect(env, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(25009)")

    def stuck_on_partition_0(conn, batch):
        if batch[0].position.partition == 0:
            conn.execute("SELECT pg_advisory_xact_lock(25009)")
        insert("a")(conn, batch)

    settings = Settings(revoke_wait=0.5)
    a = start(broker, topic, env, "stuck", "a", settings=settings, handler=stuck_on_partition_0)
    b = None
    try:
        await_condition("partition 1 applied", lambda: count(env, p1) == 1)
        await_condition(
            "partition 0's batch waiting on the lock",
            lambda: count(
                env,
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND query LIKE '%advisory_xact_lock%'",
            )
            == 1,
        )
        b = start(broker, topic, env, "stuck", "b", settings=settings)
        # B's joining revokes A's partitions: A stops waiting for the stuck
        # batch and the rebalance goes on, so partition 1's records are
        # applied again while partition 0's batch still waits.
        await_condition(
            "the revocation abandoning the stuck batch",
            lambda: "abandoned so that the rebalance goes on" in caplog.text,
            timeout=30,
        )
        relay.send([(1, 2)])
        await_condition("partition 1's new record, during the stall", lambda: count(env, p1) == 2, timeout=30)
        assert count(env, "SELECT count(*) FROM effects WHERE partition = 0") == 0
    finally:
        holder.execute("SELECT pg_advisory_unlock(25009)")
        holder.close()
    await_condition("everything applied", lambda: count(env, EFFECTS) == 3)
    # The abandoned batch is counted when it ends: the counters stay exact.
    assert b is not None
    await_condition(
        "the abandoned batch counted", lambda: a.loop.counters.processed + b.loop.counters.processed == 3
    )
    assert a.stop() is None
    assert b.stop() is None
    exactly_once(env)


def test_an_assignment_does_not_wait_for_a_database_that_does_not_answer(broker, topic, env, caplog):
    # Issue 25, item 9: the assignment callback loaded the marks (a cache)
    # with no timeout; a table the test keeps locked stands for a database
    # that does not answer. The callback gives up after
    # Settings.rebalance_db_timeout and says so; the records are applied
    # once the database answers again.
    relay = Relay(broker.bootstrap, topic)
    relay.send([(0, 1)])
    holder = psycopg.connect(env)
    holder.execute("LOCK TABLE walrelay_consumer_hwm IN ACCESS EXCLUSIVE MODE")
    try:
        a = start(broker, topic, env, "unanswered", "a", settings=Settings(rebalance_db_timeout=0.5))
        await_condition(
            "the assignment gave up loading the marks",
            lambda: "loading the high-water marks of the assigned partitions" in caplog.text,
            timeout=20,
        )
    finally:
        holder.rollback()
        holder.close()
    await_condition("the record applied", lambda: count(env, EFFECTS) == 1)
    assert a.stop() is None


@pytest.mark.skipif(broker_kind() != "kafka", reason="static group membership is tested on Apache Kafka")
def test_a_second_member_with_the_same_instance_id_ends_the_first_with_an_error(broker, topic, env):
    # Issue 35, item 5: the instance id must be unique per running
    # instance. A second one fences the first out of the group, which
    # librdkafka reports as a fatal error: the loop ends with it instead of
    # polling for ever without partitions.
    relay = Relay(broker.bootstrap, topic)
    relay.send([(0, 1), (1, 1)])
    group = f"fenced-{uuid.uuid4().hex[:8]}"
    config = {**kafka(broker.bootstrap, group), "group.instance.id": "only-one"}
    a = Running(ConsumerLoop(config, [topic], env, registry=CollectorRegistry()), insert("a"))
    await_condition("a applies", lambda: count(env, EFFECTS) == 2)
    b = Running(ConsumerLoop(config, [topic], env, registry=CollectorRegistry()), insert("b"))
    a.thread.join(60)
    assert not a.thread.is_alive(), "the fenced loop did not end"
    assert isinstance(a.error, KafkaException), a.error
    assert "fenced" in str(a.error).lower() and "group.instance.id" in str(a.error)
    assert b.stop() is None
