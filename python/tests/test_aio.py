"""The asyncio batch transaction against a real PostgreSQL, inside one
event loop (as in a FastAPI or aiohttp service)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from test_apply import POS, d, effects, k, marks
from walrelay_consumer import (
    Counters,
    HandlerFailed,
    migrate,
    process_batch,
    process_batch_async,
    process_records_async,
    redrive_async,
)
from walrelay_consumer.aio import apply_batch_async
from walrelay_consumer.apply import Park


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    migrate(conn)
    conn.execute("CREATE TABLE effects (event_key text PRIMARY KEY, payload bytea)")
    return conn


async def insert_all(conn: psycopg.AsyncConnection[Any], batch) -> None:
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO effects (event_key, payload) VALUES (%s, %s)", [(x.meta.key, x.payload) for x in batch]
        )


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_an_async_batch_applies_once_and_shares_marks_with_the_blocking_one(db, dsn):
    async def main():
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            counters = Counters()
            out = await process_batch_async(c, POS, [d(3, prev=2), d(4, prev=3), d(3), d(105, "b")], insert_all, counters)
            assert (out.applied, out.duplicates, out.marks) == (3, 1, {"a": k(4), "b": k(105)})
            again = await process_batch_async(c, POS, [d(3), d(4)], insert_all)
            assert (again.applied, again.duplicates) == (0, 2)

    run(main())
    assert marks(db) == {"a": k(4), "b": k(105)}
    # A blocking (or Rust) service on the same marks sees them as done.
    out = process_batch(db, POS, [d(4), d(5, prev=4)], lambda c, b: c.execute(
        "INSERT INTO effects (event_key) VALUES (%s)", (b[0].meta.key,)))
    assert (out.applied, out.duplicates) == (1, 1)
    assert effects(db) == [k(3), k(4), k(5), k(105)]


def test_an_async_handler_failure_rolls_back_and_names_the_record(db, dsn):
    async def handler(conn, x):
        if x.meta.key == k(2):
            raise ValueError("poison")
        await insert_all(conn, [x])

    async def main():
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            with pytest.raises(HandlerFailed) as e:
                await process_records_async(c, POS, [d(1), d(2), d(3)], handler)
            assert e.value.index == 1
            out = await apply_batch_async(
                c, POS, [d(1)], lambda conn, new: insert_all(conn, new), park=None
            )
            assert out.applied == 1

    run(main())
    assert effects(db) == [k(1)]
    assert marks(db) == {"a": k(1)}


def test_concurrent_async_deliveries_wait_on_the_lock_without_blocking_the_event_loop(db, dsn):
    async def main():
        entered = asyncio.Event()
        release = asyncio.Event()

        async def slow(conn, batch):
            await insert_all(conn, batch)
            entered.set()
            await release.wait()  # needs the event loop to keep running

        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as a, await psycopg.AsyncConnection.connect(
            dsn, autocommit=True
        ) as b:
            await process_batch_async(a, POS, [d(1)], insert_all)
            batch = [d(2, prev=1), d(3, prev=2)]
            first = asyncio.create_task(process_batch_async(a, POS, batch, slow))
            await entered.wait()
            second = asyncio.create_task(process_batch_async(b, POS, batch, insert_all))
            await asyncio.sleep(0.5)
            assert not second.done(), "the second delivery did not wait for the mark row's lock"
            release.set()
            one, two = await first, await second
            assert (one.applied, two.applied, two.duplicates) == (2, 0, 2)

    run(main())
    assert effects(db) == [k(1), k(2), k(3)]


def test_an_async_parked_record_raises_its_mark(db, dsn):
    async def main():
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            out = await apply_batch_async(
                c, POS, [d(1), d(2, prev=1)], lambda conn, new: insert_all(conn, new), park=Park("boom", 3)
            )
            assert (out.applied, out.parked) == (1, True)

    run(main())
    assert marks(db) == {"a": k(2)}
    rows = db.execute("SELECT idempotency_key, header_values, error, attempts FROM walrelay_consumer_parked").fetchall()
    assert rows == [(k(2), [k(2).encode(), b"a", k(1).encode(), None], "boom", 3)]


def test_parked_records_are_redriven_on_an_async_connection(db, dsn):
    async def main():
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            for n in (2, 3):
                await apply_batch_async(c, POS, [d(n)], lambda conn, new: insert_all(conn, new), park=Park("boom", 3))

            async def picky(conn, delivery):
                if delivery.meta.key == k(3):
                    raise ValueError("still bad")
                await insert_all(conn, [delivery])

            report = await redrive_async(c, POS.group, picky)
            assert (report.applied, report.failed, report.unusable) == (1, 1, 0)

    run(main())
    assert effects(db) == [k(2)]
    rows = db.execute("SELECT idempotency_key, attempts, error FROM walrelay_consumer_parked").fetchall()
    # The one that failed again stays parked, its attempt counted.
    assert rows == [(k(3), 4, "still bad")]
