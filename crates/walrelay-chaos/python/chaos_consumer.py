"""The chaos harness's second consumer: the Python package's batch loop
(``walrelay_consumer.ConsumerLoop.run_batches``) applying every record to
``chaos_applied_py``, exactly once by its high-water mark, as the Rust
consumer applies to ``chaos_applied`` (see ``src/consumer.rs``: the same
columns, no unique constraint, so a record applied twice shows up as two
rows, in application order).

Started, killed (``kill -9``) and restarted by the harness:

    python chaos_consumer.py --bootstrap B --dsn D --group G --topic T [--topic T ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

import psycopg

from walrelay_consumer import ConsumerLoop, Settings

SCHEMA = """
CREATE TABLE IF NOT EXISTS chaos_applied_py (
    seq bigserial PRIMARY KEY,
    event text NOT NULL,
    topic text NOT NULL,
    kafka_partition int NOT NULL,
    kafka_offset bigint NOT NULL,
    idempotency_key text NOT NULL
)"""

INSERT = """
INSERT INTO chaos_applied_py (event, topic, kafka_partition, kafka_offset, idempotency_key)
SELECT e, t, p, o, k
FROM unnest(%s::text[], %s::text[], %s::int4[], %s::int8[], %s::text[])
     WITH ORDINALITY AS u(e, t, p, o, k, n)
ORDER BY n"""


def event_id(payload: bytes | None) -> str:
    """The event id a payload carries: ``{"e": id}`` or the id itself."""
    raw = payload or b""
    try:
        if raw[:1] == b"{":
            return str(json.loads(raw)["e"])
        return raw.decode()
    except (ValueError, KeyError, TypeError):
        return "?" + raw.decode(errors="replace")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", action="append", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    loop = ConsumerLoop(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "reconnect.backoff.max.ms": 500,
        },
        args.topic,
        args.dsn + " application_name=walrelay-chaos-py",
        # Offsets committed every two seconds, as the Rust consumer does: a
        # wide window between the database commit and the offset commit.
        Settings(commit_interval=2.0),
    )

    def handler(conn: psycopg.Connection[Any], batch: list[Any]) -> None:
        columns: tuple[list[Any], ...] = ([], [], [], [], [])
        for d in batch:
            for column, value in zip(
                columns,
                (event_id(d.payload), d.position.topic, d.position.partition, d.offset, d.meta.key),
            ):
                column.append(value)
        with conn.cursor() as cur:
            cur.execute(INSERT, columns)

    loop.run_batches(handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
