"""A consumer service as a separate process, for the tests that kill or
signal it: applies records into ``effects`` with the batch handler.

    python consumer_process.py BOOTSTRAP TOPIC DSN GROUP NAME COMMIT_INTERVAL [INSTANCE_ID]

With INSTANCE_ID it is a static member of its group (``group.instance.id``)
with Kafka's default session timeout (45 s); without, a dynamic member with
a 6 s session. With WALRELAY_GROUP_PROTOCOL=consumer in the environment it
speaks Kafka 4's consumer group protocol, whose session timeout is the
broker's.
"""

import logging
import os
import sys

from walrelay_consumer import ConsumerLoop, Settings


# The line printed once the interpreter is up and the loop is built, before
# it joins the group.
READY = "consumer process ready"


def main() -> int:
    bootstrap, topic, dsn, group, name, interval = sys.argv[1:7]
    instance_id = sys.argv[7] if len(sys.argv) > 7 else None
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    kafka: dict[str, object] = {"bootstrap.servers": bootstrap, "group.id": group}
    if os.environ.get("WALRELAY_GROUP_PROTOCOL", "classic") == "consumer":
        kafka["group.protocol"] = "consumer"
    else:
        kafka["heartbeat.interval.ms"] = 1000
        if instance_id is None:
            kafka["session.timeout.ms"] = 6000
    loop = ConsumerLoop(
        kafka,
        [topic],
        dsn + f" application_name=walrelay-test-{name}",
        Settings(commit_interval=float(interval)),
        group_instance_id=instance_id,
    )

    def handler(conn, batch):
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO effects (event_key, partition, consumer) VALUES (%s, %s, %s)",
                [(d.meta.key, d.position.partition, name) for d in batch],
            )

    # Started: the conformance runner waits for this line, so that a
    # scenario's deadlines time the consumer, not the interpreter's start.
    print(READY, flush=True)
    # SIGTERM and SIGINT stop the loop cleanly (handled by run_batches).
    loop.run_batches(handler)
    print("stopped cleanly", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
