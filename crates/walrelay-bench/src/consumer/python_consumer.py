"""The consumer bench's Python consumer: the Python package's blocking
``ConsumerLoop`` applying a relayed topic into ``applied_events``, the same
side effect as the bench's Rust consumers, run as a child process of the
bench from the pinned virtualenv (scripts/install-python-venv.sh).

    python -c SCRIPT BOOTSTRAP TOPIC DSN GROUP batch|record

It tells the bench on stdout: ``first`` when its handler is first called,
``processed N`` whenever its count of applied (committed) records changed
(checked every 2 ms by a reporter thread), and ``stopped N`` after a
SIGTERM stopped the loop cleanly.
"""

import sys
import threading
import time

from walrelay_consumer import ConsumerLoop

INSERT_BATCH = "INSERT INTO applied_events (event_id, payload) SELECT * FROM unnest(%s::text[], %s::text[])"
INSERT_ONE = "INSERT INTO applied_events (event_id, payload) VALUES (%s, %s)"


def main() -> int:
    bootstrap, topic, dsn, group, mode = sys.argv[1:6]
    loop = ConsumerLoop(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            # The bench's Rust consumers use the same settings.
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "fetch.wait.max.ms": 5,
        },
        [topic],
        dsn,
    )
    started = threading.Event()
    done = threading.Event()

    def report() -> None:
        last = -1
        while not done.is_set():
            n = loop.counters.processed
            if n != last:
                print(f"processed {n}", flush=True)
                last = n
            time.sleep(0.002)

    threading.Thread(target=report, daemon=True).start()

    def first() -> None:
        if not started.is_set():
            started.set()
            print("first", flush=True)

    def batch(conn, deliveries):
        first()
        ids = [d.meta.key for d in deliveries]
        payloads = [(d.record.value or b"").decode("utf-8", "replace") for d in deliveries]
        conn.execute(INSERT_BATCH, (ids, payloads))

    def record(conn, d):
        first()
        conn.execute(INSERT_ONE, (d.meta.key, (d.record.value or b"").decode("utf-8", "replace")))

    # SIGTERM stops the loop cleanly (offsets committed, group left).
    if mode == "batch":
        loop.run_batches(batch)
    elif mode == "record":
        loop.run(record)
    else:
        print(f"unknown mode {mode!r}: batch or record", file=sys.stderr)
        return 2
    done.set()
    print(f"stopped {loop.counters.processed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
