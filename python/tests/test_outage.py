"""Issue 25, item 7: real errors of a real server, told apart
(``walrelay_consumer.outage``, the Rust crate's rule). An outage (the
connection terminated by the server, nothing listening) is retried without
counting; a deferred constraint failing at COMMIT or a statement run after
a swallowed failure is the batch's own error."""

from __future__ import annotations

import socket

import psycopg
import pytest

from walrelay_consumer import HandlerFailed, HandlerSwallowedError, HandlerTimedOut
from walrelay_consumer.apply import DatabaseFailed
from walrelay_consumer.outage import ErrorClass, class_of, class_of_state, is_outage


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

    # A value psycopg cannot adapt: no SQLSTATE, the connection fine, and
    # the same batch fails the same way every time.
    with pytest.raises(psycopg.Error) as unadaptable:
        conn.execute("SELECT %s", (object(),))
    assert unadaptable.value.sqlstate is None
    assert not is_outage(unadaptable.value, conn_gone=False)

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


def test_sqlstates_fall_in_their_class():
    # Issue 35, item 4 (the Rust crate's codes_fall_in_their_class).
    # Outages: every batch would fail the same.
    for state in ["08006", "53100", "53300", "53000", "58030", "57P01", "57P02", "57P03"]:
        assert class_of_state(state) is ErrorClass.OUTAGE, state
    # Contention, or a batch too large: not the record's fault.
    for state in ["53200", "40P01", "40001", "55P03", "57014"]:
        assert class_of_state(state) is ErrorClass.SHRINK, state
    # The batch's own.
    for state in ["23505", "23514", "22012", "25P02", "42P01", "40000", "57000"]:
        assert class_of_state(state) is ErrorClass.BATCH, state


def wrapped(inner: BaseException) -> ValueError:
    """A handler's own exception raised while handling ``inner``."""
    try:
        raise inner
    except BaseException:
        try:
            raise ValueError("the handler's own words")
        except ValueError as e:
            return e


def test_the_handlers_error_and_its_chain_are_classified():
    errors = psycopg.errors
    # The library's statements (DatabaseFailed) and the handler's error.
    assert class_of(DatabaseFailed(errors.OutOfMemory("53200")), False) is ErrorClass.SHRINK
    assert class_of(DatabaseFailed(errors.DiskFull("53100")), False) is ErrorClass.OUTAGE
    assert class_of(HandlerFailed(errors.SerializationFailure("40001"), None), False) is ErrorClass.SHRINK
    assert class_of(HandlerFailed(errors.DeadlockDetected("40P01"), 0), False) is ErrorClass.SHRINK
    assert class_of(HandlerFailed(errors.DiskFull("53100"), 0), False) is ErrorClass.OUTAGE
    assert class_of(HandlerFailed(errors.UniqueViolation("23505"), 0), False) is ErrorClass.BATCH
    # A psycopg error in the handler's chain (__context__, or __cause__).
    assert class_of(HandlerFailed(wrapped(errors.LockNotAvailable("55P03")), 0), False) is ErrorClass.SHRINK
    cause = RuntimeError("wrapped")
    cause.__cause__ = errors.QueryCanceled("57014")
    assert class_of(HandlerFailed(cause, 0), False) is ErrorClass.SHRINK
    # A handler's own error, a swallowed one, and a timeout (whose
    # cancelled statement's 57014 is only its context) are counted.
    assert class_of(HandlerFailed(ValueError("no"), 0), False) is ErrorClass.BATCH
    assert class_of(HandlerFailed(HandlerSwallowedError(), 0), False) is ErrorClass.BATCH
    assert class_of(HandlerFailed(wrapped(errors.QueryCanceled("57014")), 0), False) is ErrorClass.SHRINK
    timed_out = HandlerTimedOut(0.5)
    timed_out.__context__ = errors.QueryCanceled("57014")
    assert class_of(HandlerFailed(timed_out, 0), False) is ErrorClass.BATCH
    # A chain that loops ends.
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert class_of(HandlerFailed(a, 0), False) is ErrorClass.BATCH
    # Whatever the error, a connection gone is an outage.
    assert class_of(HandlerFailed(ValueError("no"), 0), True) is ErrorClass.OUTAGE
