"""A plain Python relay: the bench's reference for walrelay's cost per event.

What a Python team writes to publish logical messages and outbox rows from
a pgoutput slot to Kafka, done with care but without tricks:

- psycopg2's logical replication (psycopg 3 has no replication API),
  pgoutput protocol 1 with messages, decoded here in Python;
- confluent-kafka's idempotent producer, with the producer properties
  walrelay runs with (passed as --property), so that the two relays stand
  on the same producer;
- one header per record, `idempotency-key` (commit LSN, event position:
  32 hex digits, as walrelay's), the outbox row's `aggregateid` as the key
  and `payload` as the value, a message's content as the value (keyless);
- batches of up to 10,000 records: produced, then `flush()`ed, then the
  slot confirmed up to the end of the last transaction the batch
  completed, so nothing is confirmed before Kafka acknowledged it (a
  delivery error, seen by the producer's `on_delivery` callback, stops
  the relay); with nothing in flight the server's WAL end is confirmed,
  so an idle slot advances. This is the common Python pattern; a
  per-transaction accounting of delivery callbacks costs more per record.

It runs until the slot's confirmed position reaches --end-lsn, then
flushes and exits 0. Errors end it with a non-zero status. Invoked by
`walrelay-bench` as `python -c <this file> ...`.
"""

import argparse
import select
import struct
import sys

import psycopg2
import psycopg2.extras
from confluent_kafka import Producer

_UNPACK_BEGIN = struct.Struct(">QqI").unpack_from
_UNPACK_COMMIT = struct.Struct(">BQQq").unpack_from
_UNPACK_I = struct.Struct(">I").unpack_from
_UNPACK_H = struct.Struct(">H").unpack_from
_UNPACK_MESSAGE = struct.Struct(">BQ").unpack_from

# Records per produce-and-flush batch.
BATCH = 10_000


class DeliveryFailed(RuntimeError):
    pass


def on_delivery(err, _msg):
    if err is not None:
        raise DeliveryFailed(f"a record was not delivered: {err}")


def cstring(buf, at):
    end = buf.index(b"\0", at)
    return bytes(buf[at:end]).decode(), end + 1


class Relay:
    def __init__(self, args):
        config = {
            "bootstrap.servers": args.bootstrap,
            "enable.idempotence": True,
            "on_delivery": on_delivery,
        }
        for prop in args.property:
            name, _, value = prop.partition("=")
            config[name] = value
        self.producer = Producer(config)
        self.topic = args.topic
        self.prefix = args.prefix
        self.outbox = tuple(args.outbox.split("."))
        self.relations = {}
        self.in_tx = False
        self.commit_lsn = 0
        self.position = 0
        # The end of the last transaction all of whose records were
        # produced, and how many records were produced since the last
        # flush.
        self.completed = 0
        self.unflushed = 0

    def handle(self, data):
        kind = data[0]
        if kind == 0x42:  # B
            self.commit_lsn, _, _ = _UNPACK_BEGIN(data, 1)
            self.position = 0
            self.in_tx = True
        elif kind == 0x43:  # C
            _, _, self.completed, _ = _UNPACK_COMMIT(data, 1)
            self.in_tx = False
        elif kind == 0x49:  # I
            self.insert(data)
        elif kind == 0x4D:  # M
            self.message(data)
        elif kind == 0x52:  # R
            self.relation(data)
        # Y (type), O (origin), U, D, T: nothing to publish.

    def relation(self, data):
        (relid,) = _UNPACK_I(data, 1)
        namespace, at = cstring(data, 5)
        name, at = cstring(data, at)
        at += 1  # replica identity
        (ncols,) = _UNPACK_H(data, at)
        at += 2
        columns = []
        for _ in range(ncols):
            at += 1  # flags
            column, at = cstring(data, at)
            at += 8  # type oid, type modifier
            columns.append(column)
        wanted = (namespace or "pg_catalog", name) == self.outbox
        index = {c: i for i, c in enumerate(columns)}
        self.relations[relid] = (index["aggregateid"], index["payload"]) if wanted else None

    def insert(self, data):
        (relid,) = _UNPACK_I(data, 1)
        route = self.relations.get(relid)
        if route is None:
            raise RuntimeError(f"an INSERT into relation {relid}, which is no outbox table")
        values = tuple_values(data, 6)
        self.produce(values[route[1]], values[route[0]])

    def message(self, data):
        flags, _ = _UNPACK_MESSAGE(data, 1)
        prefix, at = cstring(data, 10)
        (length,) = _UNPACK_I(data, at)
        content = bytes(data[at + 4 : at + 4 + length])
        if prefix != self.prefix:
            return
        if not flags & 1:
            raise RuntimeError("a non-transactional message: the bench writes none")
        self.produce(content, None)

    def produce(self, value, key):
        headers = [("idempotency-key", f"{self.commit_lsn:016x}{self.position:016x}")]
        self.position += 1
        self.unflushed += 1
        while True:
            try:
                self.producer.produce(self.topic, value, key, headers=headers)
                return
            except BufferError:
                self.producer.poll(0.05)

    def flush(self, wal_end):
        """Waits for every record produced so far; the position the slot
        may be confirmed at."""
        if self.producer.flush(60) != 0:
            raise RuntimeError("Kafka did not acknowledge every record within 60 s")
        self.unflushed = 0
        return self.completed if self.in_tx else max(self.completed, wal_end)


def tuple_values(data, at):
    """The columns of a TupleData: bytes for text values, None for NULL."""
    (ncols,) = _UNPACK_H(data, at)
    at += 2
    values = []
    for _ in range(ncols):
        kind = data[at]
        at += 1
        if kind == 0x74 or kind == 0x62:  # t, b
            (length,) = _UNPACK_I(data, at)
            at += 4
            values.append(bytes(data[at : at + length]))
            at += length
        else:  # n, u
            values.append(None)
    return values


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--slot", required=True)
    parser.add_argument("--publication", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--outbox", required=True, help="schema.table")
    parser.add_argument("--end-lsn", type=int, required=True)
    parser.add_argument("--property", action="append", default=[])
    args = parser.parse_args()

    relay = Relay(args)
    conn = psycopg2.connect(args.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    cur = conn.cursor()
    cur.start_replication(
        slot_name=args.slot,
        decode=False,
        options={"proto_version": "1", "publication_names": args.publication, "messages": "true"},
    )
    reported = 0
    while True:
        msg = cur.read_message()
        if msg is not None:
            relay.handle(msg.payload)
            if relay.unflushed >= BATCH:
                confirmed = relay.flush(0)
                cur.send_feedback(flush_lsn=confirmed)
                reported = confirmed
            continue
        # The stream is idle for now: flush what was produced, confirm.
        confirmed = relay.flush(cur.wal_end)
        if confirmed != reported:
            cur.send_feedback(flush_lsn=confirmed, reply=True)
            reported = confirmed
        if confirmed >= args.end_lsn:
            break
        select.select([cur], [], [], 1.0)
    relay.producer.flush(30)
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
