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

``--pool-size N``, ``--max-batch-records N``, ``--max-batch-bytes N`` and
``--handler-timeout-ms N`` set the package's ``Settings`` (the Rust and Java
examples' flags); left out, each keeps its default.

``--metrics-addr HOST:PORT`` serves the loop's metrics
(``walrelay_consumer_*``, docs/metrics.md) for Prometheus at
``http://HOST:PORT/metrics``, from ``prometheus_client``'s default
registry (``pip install './python[metrics]'``).

``--kafka KEY=VALUE`` (repeatable; ``--kafka-property`` is the same flag)
adds any librdkafka setting: TLS, SASL, OAuth. The value of a secret
setting (``sasl.password``, ``sasl.oauthbearer.client.secret``,
``ssl.key.password``, ...: the relay's rule) may say where the secret is
instead of holding it, so that it never appears on the command line:
``env:NAME`` (an environment variable), ``file:/path`` (a file's contents,
without a trailing newline), ``literal:text`` (text as written). Logging in
with OAuth (OIDC client credentials)::

    KAFKA_CLIENT_SECRET=... python consumer.py --bootstrap broker:9093 --topic orders \\
        --dsn "host=127.0.0.1 dbname=app user=app" --group orders-service \\
        --kafka security.protocol=SASL_SSL --kafka ssl.ca.location=/etc/kafka/ca.pem \\
        --kafka sasl.mechanism=OAUTHBEARER --kafka sasl.oauthbearer.method=oidc \\
        --kafka sasl.oauthbearer.client.id=orders-service \\
        --kafka sasl.oauthbearer.client.secret=env:KAFKA_CLIENT_SECRET \\
        --kafka sasl.oauthbearer.token.endpoint.url=https://idp.example.com/oauth2/token \\
        --kafka sasl.oauthbearer.scope=kafka
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from walrelay_consumer import ConfigError, ConsumerLoop, Delivery, OnPoison, Settings, migrate, resolve_secrets
from walrelay_consumer.kafka_secrets import is_secret_property

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


def kafka_pair(text: str) -> tuple[str, str]:
    """One ``--kafka KEY=VALUE``; an argument without ``=`` is shown in the
    error only if it does not look like a secret."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        shown = "(not shown: it may hold a secret)" if is_secret_property(text) else repr(text)
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE (a librdkafka setting), not {shown}")
    return key.strip(), value


def kafka_settings(pairs: Sequence[tuple[str, str]], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``--kafka`` settings (a later one overrides an earlier one), with
    the ``env:``/``file:`` references of secret settings resolved."""
    return resolve_secrets(dict(pairs), environ)


def settings(args: argparse.Namespace) -> Settings:
    """The package's settings from the flags given, its defaults for the others."""
    given: dict[str, Any] = {"on_poison": OnPoison(args.on_poison)}
    for name in ("pool_size", "max_batch_records", "max_batch_bytes"):
        if getattr(args, name) is not None:
            given[name] = getattr(args, name)
    if args.handler_timeout_ms is not None:
        given["handler_timeout"] = args.handler_timeout_ms / 1000
    return Settings(**given)


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
    # The settings' flags have the Rust and Java examples' names; left out,
    # each keeps the package's default (Settings).
    p.add_argument("--pool-size", type=int, help="database connections, so partitions applying at the same time")
    p.add_argument("--max-batch-records", type=int, help="at most this many records in one batch transaction")
    p.add_argument("--max-batch-bytes", type=int, help="at most this many bytes in one batch")
    p.add_argument("--handler-timeout-ms", type=int, help="how long one handler call may run (default: no bound)")
    p.add_argument(
        "--metrics-addr",
        metavar="HOST:PORT",
        help="serve the metrics at http://HOST:PORT/metrics (needs prometheus_client)",
    )
    p.add_argument(
        "--kafka",
        "--kafka-property",
        dest="kafka",
        action="append",
        default=[],
        type=kafka_pair,
        metavar="KEY=VALUE",
        help="another librdkafka setting (repeatable); a secret setting's value may be env:NAME, "
        "file:/path or literal:text",
    )
    args = p.parse_args()
    try:
        extra = kafka_settings(args.kafka)
    except ConfigError as e:
        p.error(str(e))
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
        settings(args),
        group_instance_id=args.instance_id,
    )
    loop.run_batches(apply)  # until SIGTERM / SIGINT
    c = loop.counters
    print(f"stopped: {c.processed} applied, {c.duplicates} duplicates, {c.gaps} gaps, {c.parked} parked")


if __name__ == "__main__":
    main()
