"""The dead-letter table's identity of a parked record, against a real
PostgreSQL: unique on the event, not on its Kafka offset (offsets repeat
after a topic is recreated or a mirror failover), and the upgrade of a table
an earlier version created."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from conftest import REPO
from walrelay_consumer import Delivery, Position, Record, RecordMeta, migrate
from walrelay_consumer.apply import Park, apply_batch, per_batch
from walrelay_consumer.parked import OffsetReused, insert_unkeyed

POS = Position("billing", "orders", 0)
#: The migration as it was before parked rows became unique on the event.
OLD_MIGRATION = REPO / "conformance" / "fixtures" / "walrelay_consumer_before_parked_event_unique.sql"


def keyed(n: int, offset: int) -> Delivery:
    headers: list[tuple[str, bytes | None]] = [
        ("idempotency-key", f"{n:032x}".encode()),
        ("walrelay-source", b"a"),
    ]
    record = Record("orders", 0, offset, None, f"v{n}".encode(), tuple(headers))
    return Delivery(record=record, meta=RecordMeta.from_headers(headers), position=POS)


def raw(offset: int, payload: bytes) -> Record:
    return Record("orders", 0, offset, None, payload, (("trace", b"t"),))


def parked(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT kafka_offset, idempotency_key, payload FROM walrelay_consumer_parked ORDER BY id"
    ).fetchall()


def park(conn: psycopg.Connection[Any], d: Delivery) -> None:
    apply_batch(conn, POS, [d], per_batch(lambda _c, _b: None), park=Park(error="boom", attempts=3))


def test_a_new_record_at_a_reused_offset_is_parked_next_to_the_old_one(conn):
    migrate(conn)
    park(conn, keyed(5, offset=4))
    # The topic is recreated: offsets start over, keys go on.
    conn.execute("DELETE FROM walrelay_consumer_hwm")
    park(conn, keyed(9, offset=4))
    assert parked(conn) == [(4, f"{5:032x}", b"v5"), (4, f"{9:032x}", b"v9")]


def test_the_same_event_parked_again_updates_its_row(conn):
    migrate(conn)
    park(conn, keyed(5, offset=4))
    conn.execute("UPDATE walrelay_consumer_hwm SET hwm = '00000000000000000000000000000000'")
    park(conn, keyed(5, offset=7))
    assert parked(conn) == [(7, f"{5:032x}", b"v5")]


def test_a_record_without_headers_at_a_reused_offset_is_refused(conn):
    migrate(conn)
    assert insert_unkeyed(conn, POS, raw(4, b"old"), "no headers") is True
    # Delivered again (a crash before the offset commit): the same record.
    assert insert_unkeyed(conn, POS, raw(4, b"old"), "no headers") is False
    with pytest.raises(OffsetReused, match="offset 4 has no walrelay headers.*offsets were reused"):
        insert_unkeyed(conn, POS, raw(4, b"new"), "no headers")
    assert parked(conn) == [(4, None, b"old")]


def test_the_migration_upgrades_a_table_of_the_earlier_version(conn):
    conn.execute(OLD_MIGRATION.read_text())
    conn.execute(
        "INSERT INTO walrelay_consumer_parked (consumer_group, topic, partition, kafka_offset, "
        "idempotency_key, source, payload, header_names, header_values, error, attempts) "
        "VALUES ('billing', 'orders', 0, 4, %s, 'a', 'v5', '{}', '{}', 'boom', 3)",
        (f"{5:032x}",),
    )
    migrate(conn)
    migrate(conn)  # idempotent after the upgrade too
    constraints = conn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = 'walrelay_consumer_parked'::regclass AND contype = 'u'"
    ).fetchall()
    assert constraints == []
    indexes = {
        r[0]
        for r in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'walrelay_consumer_parked'"
        ).fetchall()
    }
    assert {"walrelay_consumer_parked_event", "walrelay_consumer_parked_unkeyed"} <= indexes
    conn.execute("DELETE FROM walrelay_consumer_hwm")
    park(conn, keyed(9, offset=4))
    assert parked(conn) == [(4, f"{5:032x}", b"v5"), (4, f"{9:032x}", b"v9")]


def test_the_parked_gauge_counts_the_groups_rows(conn, dsn):
    from prometheus_client import CollectorRegistry

    from walrelay_consumer import Metrics
    from walrelay_consumer import parked_gauge as pg_module

    migrate(conn)
    park(conn, keyed(5, offset=4))
    park(conn, keyed(6, offset=5))
    assert pg_module._count(conn, "billing") == 2
    assert pg_module._count(conn, "another-group") == 0
    registry = CollectorRegistry()
    gauge = pg_module.ParkedGauge(lambda: psycopg.connect(dsn), "billing", Metrics.for_registry(registry))
    gauge.start()  # reads at once, then every PARKED_REFRESH seconds
    try:
        for _ in range(100):
            if registry.get_sample_value("walrelay_consumer_parked_records") == 2:
                break
            time.sleep(0.05)
        assert registry.get_sample_value("walrelay_consumer_parked_records") == 2
    finally:
        gauge.stop()
