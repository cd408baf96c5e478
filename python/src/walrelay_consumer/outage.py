"""Which database errors are an outage and which are the batch's own
(``crates/walrelay-consumer/src/outage.rs``, the same rule).

An outage is retried for as long as it lasts, without counting attempts: the
database is unreachable or going away, and any batch would fail the same. An
error of the batch itself (a constraint checked at COMMIT, a serialization
failure or deadlock, a statement the handler let fail, a statement timeout)
may fail this batch every time: it counts as an attempt of the retry policy,
after which the record is parked or its partition stopped.

Outage: no SQLSTATE (the client lost or could not open the connection), a
connection gone during the batch, class 08 (connection exception), 53
(insufficient resources: disk full, out of memory, too many connections),
58 (system error, e.g. an I/O error), and 57P01/57P02/57P03 (the server is
shutting down, crashed, or not accepting connections yet).
"""

from __future__ import annotations

import psycopg

from .apply import DatabaseFailed

__all__ = ["is_outage"]

#: SQLSTATE classes of an outage.
OUTAGE_CLASSES = frozenset({"08", "53", "58"})
#: Single SQLSTATEs of an outage: admin_shutdown, crash_shutdown, cannot_connect_now.
OUTAGE_STATES = frozenset({"57P01", "57P02", "57P03"})


def is_outage(error: BaseException, conn_gone: bool) -> bool:
    """Whether ``error``, which failed a batch whose connection is gone when
    ``conn_gone``, is an outage rather than an error of the batch."""
    if conn_gone:
        return True
    if isinstance(error, DatabaseFailed):
        error = error.error
    if not isinstance(error, psycopg.Error):
        return False
    state = error.sqlstate
    return state is None or state[:2] in OUTAGE_CLASSES or state in OUTAGE_STATES
