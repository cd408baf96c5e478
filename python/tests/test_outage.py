"""Issue 25, item 7: real errors of a real server, told apart
(``walrelay_consumer.outage``, the Rust crate's rule). An outage (the
connection terminated by the server, nothing listening) is retried without
counting; a deferred constraint failing at COMMIT or a statement run after
a swallowed failure is the batch's own error."""

from __future__ import annotations

import socket

import psycopg
import pytest

from walrelay_consumer.apply import DatabaseFailed
from walrelay_consumer.outage import is_outage


def test_outages_and_errors_of_the_batch_are_told_apart(conn, dsn):
    conn.execute("CREATE TABLE d (id int, CONSTRAINT d_unique UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)")

    with pytest.raises(psycopg.Error) as at_commit:
        with conn.transaction():
            conn.execute("INSERT INTO d VALUES (1), (1)")
    assert not is_outage(at_commit.value, conn_gone=False)
    assert not is_outage(DatabaseFailed(at_commit.value), conn_gone=False)

    with pytest.raises(psycopg.Error) as swallowed:
        with conn.transaction():
            try:
                conn.execute("SELECT 1 / 0")
            except psycopg.Error:
                pass
            conn.execute("SELECT 1")
    assert not is_outage(swallowed.value, conn_gone=False)

    victim = psycopg.connect(dsn, autocommit=True)
    row = victim.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
    with pytest.raises(psycopg.Error) as terminated:
        victim.execute("SELECT 1")
    assert is_outage(terminated.value, conn_gone=False)
    victim.close()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(psycopg.Error) as refused:
        psycopg.connect(f"host=127.0.0.1 port={port} user=postgres connect_timeout=5")
    assert is_outage(refused.value, conn_gone=False)

    # A handler failure on a connection that is gone is an outage too.
    assert is_outage(ValueError("whatever"), conn_gone=True)
    assert not is_outage(ValueError("whatever"), conn_gone=False)
