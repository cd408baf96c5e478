"""A consumer service as a separate process, for the tests that kill or
signal it: applies records into ``effects`` with the batch handler.

    python consumer_process.py BOOTSTRAP TOPIC DSN GROUP NAME COMMIT_INTERVAL
"""

import logging
import sys

from walrelay_consumer import ConsumerLoop, Settings


def main() -> int:
    bootstrap, topic, dsn, group, name, interval = sys.argv[1:7]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    loop = ConsumerLoop(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        },
        [topic],
        dsn + f" application_name=walrelay-test-{name}",
        Settings(commit_interval=float(interval)),
    )

    def handler(conn, batch):
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO effects (event_key, partition, consumer) VALUES (%s, %s, %s)",
                [(d.meta.key, d.position.partition, name) for d in batch],
            )

    # SIGTERM and SIGINT stop the loop cleanly (handled by run_batches).
    loop.run_batches(handler)
    print("stopped cleanly", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
