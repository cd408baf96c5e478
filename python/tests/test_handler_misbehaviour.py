"""Issue 35, item 2: what the batch transaction makes of a handler that
misbehaves, against a real PostgreSQL, blocking and asyncio. The loop's
side (retry, park, stop, the connection discarded) is played by the
conformance scenarios ``handler_*`` (conformance/scenarios.json)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

from test_apply import POS, d, effects, insert_all, k, marks
from walrelay_consumer import (
    HandlerEndedTransaction,
    HandlerFailed,
    HandlerTimedOut,
    migrate,
    process_batch,
    process_batch_async,
    process_records,
)
from walrelay_consumer.aio import apply_batch_async
from walrelay_consumer.apply import apply_batch, per_batch, per_record
from walrelay_consumer.handler_timeout import Watchdog, call_async, discards_connection
from walrelay_consumer.outage import ErrorClass, class_of

IDLE = psycopg.pq.TransactionStatus.IDLE


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    migrate(conn)
    conn.execute("CREATE TABLE effects (event_key text PRIMARY KEY, payload bytea)")
    return conn


@pytest.mark.parametrize("ending", ["COMMIT", "ROLLBACK"])
def test_a_handler_that_ends_the_transaction_itself_is_detected_before_the_marks_move(db, ending):
    # psycopg's transaction block does not see a COMMIT sent as a statement:
    # it would send its own COMMIT outside any transaction (a warning),
    # and the marks' update after the handler would commit on its own.
    def ends_it(conn, batch):
        insert_all(conn, batch)
        conn.execute(ending)

    process_batch(db, POS, [d(1)], insert_all)
    with pytest.raises(HandlerEndedTransaction) as e:
        process_batch(db, POS, [d(1), d(2, prev=1), d(3, prev=2)], ends_it)
    message = str(e.value)
    assert "atomicity was broken" in message
    # The records the handler saw (the duplicate excluded), by offsets and keys.
    assert "orders/0 offsets 2..3" in message and k(2) in message and k(3) in message
    assert (e.value.first, e.value.last, e.value.keys) == (2, 3, [k(2), k(3)])
    # The marks did not move; what the handler committed stays committed
    # (which is why the loop stops the partition instead of retrying).
    assert marks(db) == {"a": k(1)}
    assert effects(db) == ([k(1), k(2), k(3)] if ending == "COMMIT" else [k(1)])
    assert db.info.transaction_status == IDLE
    # Not an error the loop could retry.
    assert not isinstance(e.value, HandlerFailed)


def test_a_handler_that_commits_and_then_raises_ended_the_transaction_too(db):
    def commits_then_raises(conn, x):
        insert_all(conn, [x])
        conn.execute("COMMIT")
        raise ValueError("and then it failed")

    with pytest.raises(HandlerEndedTransaction) as e:
        process_records(db, POS, [d(1)], commits_then_raises)
    assert isinstance(e.value.__cause__, ValueError)
    assert effects(db) == [k(1)] and marks(db) == {"a": k(0)}  # the mark row, created at zero, committed with it


@pytest.mark.parametrize("ending", ["COMMIT", "ROLLBACK"])
def test_a_handler_that_ends_the_transaction_and_begins_another_is_detected(db, ending):
    # The transaction status looks normal again after BEGIN: the marks'
    # update returns another transaction id than the lock did.
    def ends_and_begins(conn, batch):
        insert_all(conn, batch)
        conn.execute(ending)
        conn.execute("BEGIN")

    process_batch(db, POS, [d(1)], insert_all)
    with pytest.raises(HandlerEndedTransaction) as e:
        process_batch(db, POS, [d(2, prev=1)], ends_and_begins)
    assert "atomicity was broken" in str(e.value)
    assert marks(db) == {"a": k(1)}
    assert effects(db) == ([k(1), k(2)] if ending == "COMMIT" else [k(1)])
    assert db.info.transaction_status == IDLE


async def _async_ends_and_begins(dsn: str) -> None:
    async def ends_and_begins(conn, batch):
        async with conn.cursor() as cur:
            for x in batch:
                await cur.execute("INSERT INTO effects (event_key) VALUES (%s)", (x.meta.key,))
        await conn.execute("COMMIT")
        await conn.execute("BEGIN")

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        with pytest.raises(HandlerEndedTransaction):
            await process_batch_async(conn, POS, [d(3, prev=2)], ends_and_begins)


def test_an_async_handler_that_ends_the_transaction_and_begins_another_is_detected(db, dsn):
    process_batch(db, POS, [d(1)], insert_all)
    asyncio.run(_async_ends_and_begins(dsn))
    assert marks(db) == {"a": k(1)}


def test_a_handler_using_a_savepoint_correctly_is_applied(db):
    def careful(conn, batch):
        try:
            with conn.transaction():  # a savepoint inside the batch's transaction
                conn.execute("SELECT 1/0")
        except psycopg.errors.DivisionByZero:
            pass
        insert_all(conn, batch)

    out = process_batch(db, POS, [d(1), d(2, prev=1)], careful)
    assert out.applied == 2 and effects(db) == [k(1), k(2)] and marks(db) == {"a": k(2)}


def test_a_handler_that_does_nothing_is_its_choice_the_records_are_applied(db):
    out = process_batch(db, POS, [d(1), d(2, prev=1)], lambda conn, batch: None)
    assert out.applied == 2 and effects(db) == [] and marks(db) == {"a": k(2)}


def test_a_handler_call_waiting_on_the_database_past_the_timeout_is_cancelled(db):
    watchdog = Watchdog(0.3)
    try:

        def sleeps(conn, batch):
            insert_all(conn, batch)
            conn.execute("SELECT pg_sleep(30)")

        began = time.monotonic()
        with pytest.raises(HandlerFailed) as e:
            apply_batch(db, POS, [d(1), d(2, prev=1)], per_batch(sleeps, watchdog.watch))
        assert time.monotonic() - began < 10
        assert isinstance(e.value.error, HandlerTimedOut) and "handler_timeout (0.3s)" in str(e.value.error)
        # The cancelled statement's QueryCanceled is only its context: a
        # counted attempt, not contention; and the connection goes.
        assert isinstance(e.value.error.__context__, psycopg.errors.QueryCanceled)
        assert class_of(e.value, conn_gone=False) is ErrorClass.BATCH
        assert discards_connection(e.value)
        assert effects(db) == [] and marks(db) == {}

        # Each call of a per-record handler has its own bound.
        def quick(conn, x):
            conn.execute("SELECT pg_sleep(0.1)")
            insert_all(conn, [x])

        out = apply_batch(db, POS, [d(1), d(2, prev=1), d(3, prev=2), d(4, prev=3)], per_record(quick, watchdog.watch))
        assert out.applied == 4
    finally:
        watchdog.close()


def test_a_handler_call_blocked_outside_the_database_times_out_when_it_returns(db):
    watchdog = Watchdog(0.1)
    try:
        with pytest.raises(HandlerFailed) as e:
            apply_batch(db, POS, [d(1)], per_batch(lambda conn, batch: time.sleep(0.4), watchdog.watch))
        assert isinstance(e.value.error, HandlerTimedOut) and e.value.index == 0
        # Without a timeout nothing is watched.
        unwatched = Watchdog(None)
        out = apply_batch(db, POS, [d(1)], per_batch(lambda conn, batch: time.sleep(0.2), unwatched.watch))
        assert out.applied == 1 and unwatched._thread is None
    finally:
        watchdog.close()


def test_async_handlers_that_end_the_transaction_or_time_out(db, dsn):
    async def commits(conn, batch):
        async with conn.cursor() as cur:
            await cur.executemany("INSERT INTO effects (event_key) VALUES (%s)", [(x.meta.key,) for x in batch])
        await conn.execute("COMMIT")

    async def sleeps(conn, batch):
        await conn.execute("SELECT pg_sleep(30)")

    async def main():
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            with pytest.raises(HandlerEndedTransaction, match="atomicity was broken"):
                await process_batch_async(c, POS, [d(1)], commits)

            async def apply(conn, new):
                from walrelay_consumer.apply import _Failed

                try:
                    await call_async(sleeps(conn, new), 0.3)
                except Exception as e:
                    raise _Failed(e, None) from e

            began = time.monotonic()
            with pytest.raises(HandlerFailed) as e:
                await apply_batch_async(c, POS, [d(2, prev=1), d(3, prev=2)], apply)
            assert time.monotonic() - began < 10
            assert isinstance(e.value.error, HandlerTimedOut) and discards_connection(e.value)
            # psycopg cancelled the statement on the server as the task was
            # cancelled: the session is not left running pg_sleep.
            assert c.info.transaction_status == IDLE

    asyncio.run(asyncio.wait_for(main(), 60))
    assert effects(db) == [k(1)] and marks(db) == {"a": k(0)}  # the mark row, created at zero, committed with it
