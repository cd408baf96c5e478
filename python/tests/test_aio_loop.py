"""The asyncio consumer loop end to end (a broker + PostgreSQL), running as a
task of an event loop that must stay responsive."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from conftest import SOURCE, Relay, count, key
from test_consumer import EFFECTS, exactly_once, kafka, marks
from walrelay_consumer import AsyncConsumerLoop, OnPoison, RetryPolicy, Settings, migrate


@pytest.fixture
def env(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        migrate(c)
        c.execute("CREATE TABLE effects (event_key text NOT NULL, partition int NOT NULL, consumer text NOT NULL)")
    return dsn


def insert(name: str):
    async def handler(conn, batch):
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO effects (event_key, partition, consumer) VALUES (%s, %s, %s)",
                [(d.meta.key, d.position.partition, name) for d in batch],
            )

    return handler


async def await_async(what, check, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def new_loop(broker, topic, dsn, group, name, settings=None) -> AsyncConsumerLoop:
    return AsyncConsumerLoop(
        kafka(broker.bootstrap, group),
        [topic],
        dsn + f" application_name=walrelay-test-{name}",
        settings,
        CollectorRegistry(),
    )


def test_the_async_loop_applies_once_and_keeps_the_event_loop_running(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(p, s) for s in range(1, 21) for p in (0, 1)])
    relay.restart()
    relay.send([(p, s) for s in range(16, 26) for p in (0, 1)])  # a replay, then new ones

    async def main():
        ticks = 0
        done = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.create_task(ticker())
        loop = new_loop(broker, topic, env, "aio", "a")
        run = asyncio.create_task(loop.run_batches(insert("a")))
        started = time.monotonic()
        c = loop.counters
        await await_async("all records seen", lambda: c.processed + c.duplicates >= 60)
        elapsed = time.monotonic() - started
        loop.stop()
        await asyncio.wait_for(run, 60)
        done.set()
        await t
        assert (c.processed, c.duplicates, c.gaps, c.errors) == (50, 10, 0, 0)
        # The event loop ran all along: 10 ms ticks kept coming (a loop
        # blocked in librdkafka or libpq gets none; the bound leaves room
        # for a loaded machine).
        assert ticks >= max(5, elapsed / 0.01 / 10), (ticks, elapsed)

    asyncio.run(main())
    assert count(env, EFFECTS) == 50
    exactly_once(env)
    assert marks(env, "aio", topic) == {(0, SOURCE): key(0, 25), (1, SOURCE): key(1, 25)}

    # Offsets were committed at the stop: a new run sees only what is new.
    relay.send([(0, 26)])

    async def again():
        loop = new_loop(broker, topic, env, "aio", "b")
        run = asyncio.create_task(loop.run(lambda conn, d: insert("b")(conn, [d])))
        await await_async("the new record", lambda: count(env, EFFECTS) == 51)
        loop.stop()
        await asyncio.wait_for(run, 60)
        assert (loop.counters.processed, loop.counters.duplicates) == (1, 0)

    asyncio.run(again())


def test_the_async_loop_parks_a_poison_record_and_survives_a_lost_connection(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    poison = key(1, 3)

    async def handler(conn, d):
        if d.meta.key == poison:
            raise ValueError("cannot apply")
        await insert("victim")(conn, [d])

    async def main():
        settings = Settings(retry=RetryPolicy(attempts=2, base=0.01, cap=0.05), on_poison=OnPoison.PARK)
        loop = new_loop(broker, topic, env, "aio-park", "victim", settings)
        run = asyncio.create_task(loop.run(handler))
        relay.send([(1, s) for s in range(1, 6)])
        await await_async("all but the poison record", lambda: count(env, EFFECTS) == 4)
        killed = await asyncio.to_thread(
            count,
            env,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'walrelay-test-victim'",
        )
        assert killed >= 1
        relay.send([(0, 1), (1, 6)])
        await await_async("records after the lost connection", lambda: count(env, EFFECTS) == 6)
        loop.stop()
        await asyncio.wait_for(run, 60)
        assert loop.counters.parked == 1

    asyncio.run(main())
    with psycopg.connect(env) as c:
        assert c.execute("SELECT idempotency_key, attempts FROM walrelay_consumer_parked").fetchall() == [(poison, 2)]
    exactly_once(env)


def test_the_async_loop_applies_partitions_concurrently_each_on_its_own_connection(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(p, s) for s in range(1, 6) for p in (0, 1)])
    pids: dict[int, set[int]] = {}

    async def main():
        inside = {0: asyncio.Event(), 1: asyncio.Event()}

        async def handler(conn, batch):
            partition = batch[0].position.partition
            pids.setdefault(partition, set()).add(conn.info.backend_pid)
            inside[partition].set()
            try:
                # Only passes while the other partition's batch is in its
                # handler too; alone, the batch fails and is retried.
                await asyncio.wait_for(inside[1 - partition].wait(), 5)
            finally:
                inside[partition].clear()
            await insert("a")(conn, batch)

        settings = Settings(retry=RetryPolicy(attempts=20, base=0.01, cap=0.05), pool_size=4)
        loop = new_loop(broker, topic, env, "aio-parallel", "a", settings)
        run = asyncio.create_task(loop.run_batches(handler))
        await await_async("both partitions applied", lambda: count(env, EFFECTS) == 10)
        loop.stop()
        await asyncio.wait_for(run, 60)
        assert loop.counters.processed == 10

    asyncio.run(main())
    exactly_once(env)
    assert pids[0] and pids[1] and not pids[0] & pids[1], pids


def test_a_slow_partition_holds_up_only_itself_in_the_async_loop(broker, topic, env):
    relay = Relay(broker.bootstrap, topic)
    relay.send([(0, 1), (1, 1)])

    def on_partition(p):
        return lambda: count(env, f"SELECT count(*) FROM effects WHERE partition = {p}")

    async def main():
        blocked = asyncio.Event()
        release = asyncio.Event()

        async def handler(conn, batch):
            if batch[0].position.partition == 0:
                blocked.set()
                await asyncio.wait_for(release.wait(), 60)
            await insert("a")(conn, batch)

        loop = new_loop(broker, topic, env, "aio-slow", "a")
        run = asyncio.create_task(loop.run_batches(handler))
        try:
            await asyncio.wait_for(blocked.wait(), 60)
            for s in range(2, 6):
                await asyncio.to_thread(relay.send, [(1, s)])
                await await_async(f"partition 1's record {s}", lambda s=s: on_partition(1)() == s)
            assert on_partition(0)() == 0
        finally:
            release.set()
        await await_async("partition 0 applied", lambda: count(env, EFFECTS) == 6)
        loop.stop()
        await asyncio.wait_for(run, 60)

    asyncio.run(main())
    exactly_once(env)


def test_a_revocation_abandons_a_stuck_batch_in_the_async_loop(broker, topic, env, caplog):
    # Issue 25, item 9, asyncio flavour: the revocation callback waits for
    # the revoked partitions' stragglers at most Settings.revoke_wait.
    relay = Relay(broker.bootstrap, topic)
    relay.send([(0, 1), (1, 1)])
    p1 = "SELECT count(*) FROM effects WHERE partition = 1"
    holder = psycopg.connect(env, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(25010)")

    async def stuck_on_partition_0(conn, batch):
        if batch[0].position.partition == 0:
            await conn.execute("SELECT pg_advisory_xact_lock(25010)")
        await insert("a")(conn, batch)

    async def main():
        settings = Settings(revoke_wait=0.5)
        a = new_loop(broker, topic, env, "aio-stuck", "a", settings)
        b = new_loop(broker, topic, env, "aio-stuck", "b", settings)
        run_a = asyncio.create_task(a.run_batches(stuck_on_partition_0))
        run_b = None
        try:
            await await_async("partition 1 applied", lambda: count(env, p1) == 1)
            run_b = asyncio.create_task(b.run_batches(insert("b")))
            await await_async(
                "the revocation abandoning the stuck batch",
                lambda: "abandoned so that the rebalance goes on" in caplog.text,
                timeout=30,
            )
            relay.send([(1, 2)])
            await await_async("partition 1's new record, during the stall", lambda: count(env, p1) == 2, 30)
        finally:
            holder.execute("SELECT pg_advisory_unlock(25010)")
            holder.close()
        await await_async("everything applied", lambda: count(env, EFFECTS) == 3)
        await await_async(
            "the abandoned batch counted", lambda: a.counters.processed + b.counters.processed == 3
        )
        a.stop()
        b.stop()
        await asyncio.wait_for(run_a, 60)
        assert run_b is not None
        await asyncio.wait_for(run_b, 60)

    asyncio.run(main())
    exactly_once(env)
