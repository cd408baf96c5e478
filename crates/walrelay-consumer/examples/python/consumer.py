"""Exactly-once processing of walrelay records in Python.

The same pattern as the Rust crate walrelay-consumer, in about fifty lines:
one high-water mark (HWM) per (group, topic, partition, source), kept in
the table of sql/walrelay_consumer.sql and advanced in the SAME database
transaction as the side effects.

walrelay's idempotency keys are 32 lowercase hex digits, so Python
compares them as plain strings: "00000000015353d8..." < "0000000001553510..."
is exactly numeric order. No big-integer parsing is needed.

    pip install confluent-kafka psycopg[binary]
    python consumer.py --bootstrap 127.0.0.1:9092 --topic orders \
        --dsn "host=127.0.0.1 dbname=app user=app" --group orders-service
"""

import argparse

import psycopg
from confluent_kafka import Consumer

ZERO = "0" * 32


def header(msg, name):
    for key, value in msg.headers() or []:
        if key == name:
            return value.decode() if value is not None else None
    return None


def apply(cur, msg):
    """The service's side effect; runs inside the HWM transaction."""
    cur.execute(
        "INSERT INTO applied_events (event_key, topic, payload) VALUES (%s, %s, %s)",
        (header(msg, "idempotency-key"), msg.topic(), msg.value()),
    )


def process(conn, group, msg):
    key = header(msg, "idempotency-key")
    source = header(msg, "walrelay-source")
    if key is None or source is None:
        raise ValueError(f"record at {msg.topic()}/{msg.partition()}@{msg.offset()} has no walrelay headers")
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(
            "INSERT INTO walrelay_consumer_hwm (consumer_group, topic, partition, source, hwm)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (group, msg.topic(), msg.partition(), source, ZERO),
        )
        cur.execute(
            "SELECT hwm FROM walrelay_consumer_hwm"
            " WHERE consumer_group = %s AND topic = %s AND partition = %s AND source = %s FOR UPDATE",
            (group, msg.topic(), msg.partition(), source),
        )
        (hwm,) = cur.fetchone()
        if key <= hwm:  # string comparison == key order
            return "duplicate"
        prev = header(msg, "walrelay-prev-key")
        if prev and hwm != ZERO and prev > hwm:
            print(f"gap: {msg.topic()}/{msg.partition()} hwm {hwm} but the relay sent {prev} before {key}")
        apply(cur, msg)
        cur.execute(
            "UPDATE walrelay_consumer_hwm SET hwm = %s, updated_at = now()"
            " WHERE consumer_group = %s AND topic = %s AND partition = %s AND source = %s",
            (key, group, msg.topic(), msg.partition(), source),
        )
        return "processed"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", action="append", required=True)
    p.add_argument("--dsn", required=True)
    p.add_argument("--group", required=True)
    args = p.parse_args()
    conn = psycopg.connect(args.dsn, autocommit=True)
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    consumer.subscribe(args.topic)
    try:
        while True:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            outcome = process(conn, args.group, msg)
            # Commit the offset only after the database commit. A crash
            # between the two redelivers the record, and the HWM skips it.
            consumer.commit(message=msg, asynchronous=False)
            print(outcome, msg.topic(), msg.partition(), msg.offset(), header(msg, "idempotency-key"))
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
