"""The migration shared with the Rust crate: the repository's
``sql/walrelay_consumer.sql``, which the package's build copies in
(``python/setup.py``)."""

from __future__ import annotations

from importlib import resources
from typing import Any

import psycopg
from psycopg import errors

__all__ = ["migration_sql", "migrate"]


def migration_sql() -> str:
    """The text of ``sql/walrelay_consumer.sql`` (idempotent)."""
    return resources.files(__package__).joinpath("sql", "walrelay_consumer.sql").read_text(encoding="utf-8")


def migrate(conn: psycopg.Connection[Any]) -> None:
    """Creates ``walrelay_consumer_hwm`` and ``walrelay_consumer_parked`` if
    they do not exist, exactly as the Rust crate's ``migrate`` does. Safe on
    every start and from several consumers at once (a concurrent ``CREATE
    TABLE IF NOT EXISTS`` that loses the race is retried once).

    Runs in its own transaction; ``conn`` must not be inside one.
    """
    sql = migration_sql()
    try:
        _run(conn, sql)
    except errors.UniqueViolation:
        # Two sessions creating the table at once: one fails on the
        # catalog's unique index; by now the table exists.
        _run(conn, sql)


def _run(conn: psycopg.Connection[Any], sql: str) -> None:
    with conn.transaction():
        # Without parameters psycopg sends the script as one simple query,
        # several statements at once, as the Rust crate's batch_execute.
        conn.execute(sql)
