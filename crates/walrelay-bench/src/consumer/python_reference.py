"""The consumer bench's Python reference peers, written as a Python team
writes them on confluent-kafka and psycopg 3, with no walrelay code: a plain
poll loop that takes up to 500 records at a time and applies them in one
transaction.

    python -c SCRIPT BOOTSTRAP TOPIC DSN GROUP careful|limit

``careful``: the inbox table, ids in one multi-row ``INSERT ... ON CONFLICT
DO NOTHING RETURNING``, the effects of the new ids in one multi-row insert.
``limit``: the same effects insert with no deduplication at all (the apply
limit). Offsets are stored after the commit and committed every second.

It tells the bench on stdout what ``python_consumer.py`` tells it:
``first``, ``processed N`` and ``stopped N``.
"""

import signal
import sys

import psycopg
from confluent_kafka import Consumer

INBOX = (
    "INSERT INTO inbox (event_id) SELECT * FROM unnest(%s::text[]) "
    "ON CONFLICT DO NOTHING RETURNING event_id"
)
EFFECTS = "INSERT INTO applied_events (event_id, payload) SELECT * FROM unnest(%s::text[], %s::text[])"
BATCH = 500


def idempotency_key(msg):
    for name, value in msg.headers() or []:
        if name == "idempotency-key":
            return value.decode()
    raise ValueError(f"a record without idempotency-key at offset {msg.offset()}")


def main() -> int:
    bootstrap, topic, dsn, group, mode = sys.argv[1:6]
    if mode not in ("careful", "limit"):
        print(f"unknown mode {mode!r}: careful or limit", file=sys.stderr)
        return 2
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.offset.store": False,
            "auto.commit.interval.ms": 1000,
            # The bench's other consumers use the same settings.
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "fetch.wait.max.ms": 5,
        }
    )
    consumer.subscribe([topic])
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    processed = 0
    with psycopg.connect(dsn) as conn:
        while not stopping:
            msgs = [m for m in consumer.consume(BATCH, 0.1) if m.error() is None]
            if not msgs:
                continue
            if processed == 0:
                print("first", flush=True)
            ids = [idempotency_key(m) for m in msgs]
            with conn.transaction():
                if mode == "careful":
                    new = {row[0] for row in conn.execute(INBOX, (ids,))}
                else:
                    new = None
                keep = [(i, m) for i, m in zip(ids, msgs) if new is None or i in new]
                conn.execute(
                    EFFECTS,
                    (
                        [i for i, _ in keep],
                        [(m.value() or b"").decode("utf-8", "replace") for _, m in keep],
                    ),
                )
            for m in msgs:
                consumer.store_offsets(m)
            processed += len(msgs)
            print(f"processed {processed}", flush=True)
    consumer.close()
    print(f"stopped {processed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
