"""The blocking batch transaction against a real PostgreSQL."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import pytest

from walrelay_consumer import (
    Counters,
    DatabaseFailed,
    Delivery,
    HandlerFailed,
    HandlerSwallowedError,
    Position,
    Record,
    RecordMeta,
    migrate,
    process_batch,
    process_records,
    redrive,
)
from walrelay_consumer.apply import Park, apply_batch, per_batch

POS = Position("billing", "orders", 0)


def k(n: int) -> str:
    return f"{n:032x}"


def d(n: int, source: str = "a", prev: int | None = None, offset: int | None = None) -> Delivery:
    headers: list[tuple[str, bytes | None]] = [
        ("idempotency-key", k(n).encode()),
        ("walrelay-source", source.encode()),
        ("walrelay-prev-key", b"" if prev is None else k(prev).encode()),
        ("trace", None),
    ]
    record = Record("orders", 0, n if offset is None else offset, f"key{n}".encode(), f"v{n}".encode(), tuple(headers))
    return Delivery(record=record, meta=RecordMeta.from_headers(headers), position=POS)


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    migrate(conn)
    migrate(conn)  # idempotent
    conn.execute("CREATE TABLE effects (event_key text PRIMARY KEY, payload bytea)")
    return conn


def insert_all(conn: psycopg.Connection[Any], batch: list[Delivery]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO effects (event_key, payload) VALUES (%s, %s)", [(x.meta.key, x.payload) for x in batch]
        )


def marks(conn: psycopg.Connection[Any]) -> dict[str, str]:
    return dict(
        conn.execute(
            "SELECT source, hwm FROM walrelay_consumer_hwm WHERE consumer_group = %s AND topic = %s AND partition = %s",
            (POS.group, POS.topic, POS.partition),
        ).fetchall()
    )


def effects(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("SELECT event_key FROM effects ORDER BY event_key").fetchall()]


def test_a_batch_applies_new_records_once_and_raises_the_marks(db):
    seen: list[list[str]] = []

    def handler(conn, batch):
        seen.append([x.meta.key for x in batch])
        insert_all(conn, batch)

    counters = Counters()
    # A replay inside the batch (3 after 4), and two sources.
    batch = [d(3, prev=2), d(4, prev=3), d(3), d(105, "b"), d(5, prev=4)]
    out = process_batch(db, POS, batch, handler, counters)
    assert (out.applied, out.duplicates, out.gaps, out.parked) == (4, 1, 0, False)
    assert out.marks == {"a": k(5), "b": k(105)}
    assert seen == [[k(3), k(4), k(105), k(5)]]
    assert marks(db) == {"a": k(5), "b": k(105)}
    assert (counters.processed, counters.duplicates) == (4, 1)

    # Redelivered (a consumer crash before the offset commit): nothing runs.
    out = process_batch(db, POS, batch, handler, counters)
    assert (out.applied, out.duplicates) == (0, 5)
    assert len(seen) == 1
    assert effects(db) == [k(3), k(4), k(5), k(105)]


def test_the_handler_failing_rolls_back_effects_and_marks(db):
    process_batch(db, POS, [d(1)], insert_all)

    def fails_after_writing(conn, batch):
        insert_all(conn, batch)
        raise ValueError("downstream said no")

    with pytest.raises(HandlerFailed) as e:
        process_batch(db, POS, [d(2, prev=1), d(3, prev=2)], fails_after_writing)
    assert e.value.index is None  # a batch handler cannot say which
    assert isinstance(e.value.error, ValueError)
    assert "rolled back" in str(e.value)
    assert effects(db) == [k(1)]
    assert marks(db) == {"a": k(1)}
    # A batch of one knows its failing record.
    with pytest.raises(HandlerFailed) as e:
        process_batch(db, POS, [d(2, prev=1)], fails_after_writing)
    assert e.value.index == 0


def test_the_per_record_handler_names_the_failing_record_in_the_batch(db):
    def handler(conn, x):
        if x.meta.key == k(4):
            raise ValueError("poison")
        insert_all(conn, [x])

    # Index 1 (key 2) is a duplicate of the stored mark: the failing record
    # is index 3 of the batch, not of what the handler saw.
    process_batch(db, POS, [d(2)], insert_all)
    with pytest.raises(HandlerFailed) as e:
        process_records(db, POS, [d(1), d(2), d(3), d(4), d(5)], handler)
    assert e.value.index == 3
    assert effects(db) == [k(2)]
    out = process_records(db, POS, [d(3)], handler)
    assert out.applied == 1


def test_a_handler_that_swallows_a_failed_statement_does_not_commit(db):
    def swallow(conn, batch):
        insert_all(conn, batch)
        try:
            conn.execute("SELECT 1/0")
        except psycopg.errors.DivisionByZero:
            pass

    with pytest.raises(HandlerFailed, match="aborted by an error it did not return") as e:
        process_batch(db, POS, [d(1)], swallow)
    assert e.value.index == 0
    assert isinstance(e.value.error, HandlerSwallowedError)
    # The mark row's creation is part of the same transaction: nothing at
    # all committed, and the connection is idle again.
    assert marks(db) == {} and effects(db) == []
    assert db.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # A batch handler on several records cannot say which one.
    with pytest.raises(HandlerFailed) as e:
        process_batch(db, POS, [d(1), d(2, prev=1)], swallow)
    assert e.value.index is None and effects(db) == []


def test_gaps_are_counted_logged_and_still_applied(db, caplog):
    process_batch(db, POS, [d(10)], insert_all)
    counters = Counters()
    with caplog.at_level(logging.WARNING, logger="walrelay_consumer"):
        out = process_batch(db, POS, [d(13, prev=12), d(14, prev=13)], insert_all, counters)
    assert (out.applied, out.gaps, counters.gaps) == (2, 1, 1)
    assert any("gap" in r.getMessage() and k(12) in r.getMessage() for r in caplog.records)
    # A new group's first record is never a gap.
    other = Position("fresh", "orders", 0)
    assert process_batch(db, other, [d(50, prev=49)], lambda c, b: None).gaps == 0


def test_a_parked_record_raises_its_mark_and_is_redriven_once(db):
    batch = [d(1), d(2, prev=1), d(3, prev=2)]
    out = apply_batch(db, POS, batch, per_batch(insert_all), park=Park(error="boom", attempts=5))
    assert (out.applied, out.parked) == (2, True)
    assert marks(db) == {"a": k(3)}
    assert effects(db) == [k(1), k(2)]
    row = db.execute(
        "SELECT consumer_group, topic, partition, kafka_offset, idempotency_key, source, kafka_key, payload, "
        "header_names, header_values, error, attempts FROM walrelay_consumer_parked"
    ).fetchall()
    assert row == [
        (
            "billing",
            "orders",
            0,
            3,
            k(3),
            "a",
            b"key3",
            b"v3",
            ["idempotency-key", "walrelay-source", "walrelay-prev-key", "trace"],
            [k(3).encode(), b"a", k(2).encode(), None],
            "boom",
            5,
        )
    ]
    # Parking the same record again (a redelivery) changes nothing.
    again = apply_batch(db, POS, batch, per_batch(insert_all), park=Park(error="boom", attempts=5))
    assert (again.applied, again.duplicates, again.parked) == (0, 3, False)
    assert db.execute("SELECT count(*) FROM walrelay_consumer_parked").fetchone() == (1,)

    # Re-drive: a failing handler leaves it parked with the attempt counted.
    def still_failing(conn, x):
        insert_all(conn, [x])
        raise RuntimeError("still broken")

    report = redrive(db, "billing", still_failing)
    assert (report.applied, report.failed, report.unusable) == (0, 1, 0)
    assert db.execute("SELECT attempts, error FROM walrelay_consumer_parked").fetchone() == (6, "still broken")
    assert effects(db) == [k(1), k(2)]
    report = redrive(db, "billing", lambda conn, x: insert_all(conn, [x]))
    assert (report.applied, report.failed) == (1, 0)
    assert effects(db) == [k(1), k(2), k(3)]
    assert db.execute("SELECT count(*) FROM walrelay_consumer_parked").fetchone() == (0,)


def test_concurrent_deliveries_serialize_on_the_mark_and_apply_once(db, dsn):
    """A rebalance race: two members get the same batch at once. The second
    waits on the row lock and then sees duplicates."""
    entered = threading.Event()
    release = threading.Event()

    def slow(conn, batch):
        insert_all(conn, batch)
        entered.set()
        assert release.wait(30)

    batch = [d(2, prev=1), d(3, prev=2)]
    process_batch(db, POS, [d(1)], insert_all)  # the row exists: the race is on the lock
    results: dict[str, Any] = {}

    def first():
        with psycopg.connect(dsn, autocommit=True) as c:
            results["first"] = process_batch(c, POS, batch, slow)

    t1 = threading.Thread(target=first)
    t1.start()
    assert entered.wait(30)

    def second():
        with psycopg.connect(dsn, autocommit=True) as c:
            results["second"] = process_batch(c, POS, batch, insert_all)

    t2 = threading.Thread(target=second)
    t2.start()
    # The second is blocked on the lock (not finished) while the first holds it.
    t2.join(0.5)
    assert t2.is_alive()
    release.set()
    t1.join(30)
    t2.join(30)
    assert results["first"].applied == 2
    assert (results["second"].applied, results["second"].duplicates) == (0, 2)
    assert effects(db) == [k(1), k(2), k(3)]


def test_a_lost_connection_is_a_database_failure_and_nothing_commits(db, dsn):
    victim = psycopg.connect(dsn, autocommit=True)
    pid = victim.info.backend_pid

    def killed(conn, batch):
        insert_all(conn, batch)
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))

    with pytest.raises((DatabaseFailed, HandlerFailed)):
        process_batch(victim, POS, [d(1)], killed)
    assert victim.closed or victim.broken
    assert effects(db) == []
    assert marks(db) == {}


def test_the_connection_must_be_idle(db):
    with db.transaction():
        with pytest.raises(ValueError, match="must be idle"):
            process_batch(db, POS, [d(1)], insert_all)
