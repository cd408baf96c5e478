"""What a failed batch's error means for its retry
(``crates/walrelay-consumer/src/outage.rs``, the same rule).

* **Outage** (:attr:`ErrorClass.OUTAGE`): the database is unreachable or
  going away, and any batch would fail the same. Retried for as long as it
  lasts, without counting attempts, on a new connection: a connection gone
  during the batch, an OperationalError without SQLSTATE (the client lost
  or could not open the connection), class 08 (connection exception), 53
  (insufficient resources: disk full, out of memory, too many connections)
  except 53200, 58 (system error, e.g. an I/O error), and
  57P01/57P02/57P03 (the server is shutting down, crashed, or not
  accepting connections yet).
* **Shrink** (:attr:`ErrorClass.SHRINK`): the error depends on the batch's
  size or on other sessions, not on a record: 53200 (out of shared memory,
  e.g. ``max_locks_per_transaction`` on a batch touching many partitions),
  40P01 (deadlock), 40001 (serialization failure), 55P03 (lock not
  available), 57014 (statement timeout, query cancelled). The failed
  batch's records are retried in batches of half its size without counting
  an attempt; a batch of one record counts it, so a record whose own
  handler always trips a statement timeout is still parked or stops its
  partition.
* **The batch's own** (:attr:`ErrorClass.BATCH`): everything else (a
  constraint checked at COMMIT, a statement the handler let fail, a value
  psycopg cannot adapt, a handler's own exception, a handler call that
  ran past :attr:`Settings.handler_timeout`): an attempt of the retry
  policy, after which the record is parked or its partition stopped.

The SQLSTATE is looked up on the library's own statements and on what the
handler raised: the exception itself, or the first ``psycopg.Error`` in
its ``__cause__`` / ``__context__`` chain (a handler that wraps a deadlock
in an exception of its own still gets the deadlock's treatment).
"""

from __future__ import annotations

import enum

import psycopg

from .apply import DatabaseFailed, HandlerFailed
from .handler_timeout import HandlerTimedOut

__all__ = ["ErrorClass", "class_of", "class_of_state", "is_outage"]

#: SQLSTATE classes of an outage (but see :data:`SHRINK_STATES`).
OUTAGE_CLASSES = frozenset({"08", "53", "58"})
#: Single SQLSTATEs of an outage: admin_shutdown, crash_shutdown, cannot_connect_now.
OUTAGE_STATES = frozenset({"57P01", "57P02", "57P03"})
#: SQLSTATEs of contention or of a batch too large: retried smaller.
SHRINK_STATES = frozenset({"53200", "40P01", "40001", "55P03", "57014"})


class ErrorClass(enum.Enum):
    """What a failed batch's error means for its retry (see the module)."""

    OUTAGE = "outage"
    SHRINK = "shrink"
    BATCH = "batch"


def class_of_state(state: str) -> ErrorClass:
    """The class of an error with SQLSTATE ``state``."""
    if state in SHRINK_STATES:
        return ErrorClass.SHRINK
    if state in OUTAGE_STATES or state[:2] in OUTAGE_CLASSES:
        return ErrorClass.OUTAGE
    return ErrorClass.BATCH


def class_of(error: BaseException, conn_gone: bool) -> ErrorClass:
    """The class of ``error``, which failed a batch whose connection is gone
    when ``conn_gone``."""
    if conn_gone:
        return ErrorClass.OUTAGE
    if isinstance(error, HandlerFailed):
        if isinstance(error.error, HandlerTimedOut):
            # Whatever the cancelled statement said: the handler's time ran out.
            return ErrorClass.BATCH
        error = error.error
    elif isinstance(error, DatabaseFailed):
        error = error.error
    db = _database_error(error)
    if db is None:
        return ErrorClass.BATCH
    state = db.sqlstate
    if state is None:
        return ErrorClass.OUTAGE if isinstance(db, psycopg.OperationalError) else ErrorClass.BATCH
    return class_of_state(state)


def is_outage(error: BaseException, conn_gone: bool) -> bool:
    """Whether ``error``, which failed a batch whose connection is gone when
    ``conn_gone``, is an outage rather than an error of the batch."""
    return class_of(error, conn_gone) is ErrorClass.OUTAGE


def _database_error(error: BaseException) -> psycopg.Error | None:
    """``error`` if it is a psycopg error, else the first one of its
    ``__cause__`` / ``__context__`` chain."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, psycopg.Error):
            return current
        seen.add(id(current))
        current = current.__cause__ if current.__cause__ is not None else current.__context__
    return None
