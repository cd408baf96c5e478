"""Applies walrelay records to PostgreSQL exactly once, with the
``walrelay_consumer`` package (``pip install ./python``).

Every new record of a batch becomes a row of ``applied_events`` in the
batch's transaction, together with the high-water marks; duplicates
(relay replays, redeliveries after a crash or a rebalance) are dropped
before the handler sees them. SIGTERM or Ctrl-C stops it cleanly.

    python consumer.py --bootstrap 127.0.0.1:9092 --topic orders \\
        --dsn "host=127.0.0.1 dbname=app user=app" --group orders-service \\
        --instance-id orders-service-0

``--instance-id`` makes it a static member of its group (Kafka's
``group.instance.id``): restarted after a crash under the same id, it gets
its partitions back at once instead of after the dead member's session
timeout (45 s by default). The id must be unique per running instance
(e.g. a StatefulSet pod's name): a second instance with the same id fences
the first out of the group.

``--metrics-addr HOST:PORT`` serves the loop's metrics
(``walrelay_consumer_*``, docs/metrics.md) for Prometheus at
``http://HOST:PORT/metrics``, from ``prometheus_client``'s default
registry (``pip install './python[metrics]'``).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from typing import Any

import psycopg

from walrelay_consumer import ConsumerLoop, Delivery, OnPoison, Settings, migrate

SCHEMA = """
CREATE TABLE IF NOT EXISTS applied_events (
    event_key text PRIMARY KEY,
    topic     text NOT NULL,
    payload   bytea
)
"""


def apply(conn: psycopg.Connection[Any], batch: Sequence[Delivery]) -> None:
    """The service's side effects: one statement for the whole batch (arrays
    unnested into rows: one round trip, not one per record as executemany
    would take), inside the transaction that also raises the marks. Raise
    to roll it back."""
    conn.execute(
        "INSERT INTO applied_events (event_key, topic, payload) "
        "SELECT * FROM unnest(%s::text[], %s::text[], %s::bytea[])",
        (
            [d.meta.key for d in batch],
            [d.position.topic for d in batch],
            [d.payload for d in batch],
        ),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    p.add_argument("--topic", action="append", required=True, help="topic to consume (repeatable)")
    p.add_argument("--dsn", required=True, help="libpq connection string of the service's database")
    p.add_argument("--group", required=True, help="consumer group: the marks are kept per group")
    p.add_argument(
        "--instance-id",
        default=os.environ.get("WALRELAY_INSTANCE_ID"),
        help="static group membership (group.instance.id), unique per running instance "
        "(default: $WALRELAY_INSTANCE_ID; none: a dynamic member)",
    )
    p.add_argument("--on-poison", choices=["stop", "park"], default="stop", help="what to do with a record that keeps failing")
    p.add_argument(
        "--metrics-addr",
        metavar="HOST:PORT",
        help="serve the metrics at http://HOST:PORT/metrics (needs prometheus_client)",
    )
    p.add_argument(
        "--kafka", action="append", default=[], metavar="KEY=VALUE", help="another librdkafka setting (repeatable)"
    )
    args = p.parse_args()
    extra = dict(setting.split("=", 1) for setting in args.kafka)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        migrate(conn)  # the same tables as the Rust crate; idempotent
        conn.execute(SCHEMA)

    if args.metrics_addr:
        import prometheus_client  # the metrics extra

        host, _, port = args.metrics_addr.rpartition(":")
        prometheus_client.start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0")

    loop = ConsumerLoop(
        {"bootstrap.servers": args.bootstrap, "group.id": args.group, **extra},
        args.topic,
        args.dsn,
        Settings(on_poison=OnPoison(args.on_poison)),
        group_instance_id=args.instance_id,
    )
    loop.run_batches(apply)  # until SIGTERM / SIGINT
    c = loop.counters
    print(f"stopped: {c.processed} applied, {c.duplicates} duplicates, {c.gaps} gaps, {c.parked} parked")


if __name__ == "__main__":
    main()
