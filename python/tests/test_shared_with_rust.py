"""What the Python package shares with the Rust crate must not drift: the
migration and the statements live once in git, under the repository's
``sql/``, and the installed package ships exactly those files (its build
copies them, ``python/setup.py``). The Rust crate compiles the same files
in (``crates/walrelay-consumer/src/statements.rs``)."""

from importlib import resources
from pathlib import Path

import walrelay_consumer
from walrelay_consumer import apply, marks, migration_sql, parked, parked_gauge

REPO = Path(__file__).resolve().parents[2]
SQL = REPO / "sql"


def shipped(*parts: str) -> bytes:
    return resources.files(walrelay_consumer).joinpath("sql", *parts).read_bytes()


def test_the_shipped_migration_is_the_repository_file_byte_for_byte():
    repo = (SQL / "walrelay_consumer.sql").read_bytes()
    assert shipped("walrelay_consumer.sql") == repo, (
        "the installed package ships another walrelay_consumer.sql: reinstall it "
        "(scripts/install-python-venv.sh, or pip install ./python)"
    )
    assert migration_sql().encode() == repo


def test_the_shipped_statements_are_the_repository_files_byte_for_byte():
    files = sorted(p.name for p in (SQL / "consumer").glob("*.sql"))
    assert files, "sql/consumer/ holds the statements"
    for name in files:
        assert shipped("consumer", name) == (SQL / "consumer" / name).read_bytes(), (
            f"the installed package ships another {name}: reinstall it (scripts/install-python-venv.sh)"
        )


def test_the_modules_run_the_repository_statements():
    def repo(name: str) -> str:
        return (SQL / "consumer" / f"{name}.sql").read_text().rstrip()

    assert apply.ENSURE_SQL == repo("hwm_ensure")
    assert apply.LOCK_SQL == repo("hwm_lock")
    assert apply.ADVANCE_SQL == repo("hwm_advance")
    assert marks.LOAD_SQL == repo("hwm_load")
    assert marks.STATEMENT_TIMEOUT_SQL == repo("statement_timeout")
    assert parked.INSERT_SQL == repo("parked_insert")
    assert parked.INSERT_UNKEYED_SQL == repo("parked_insert_unkeyed")
    assert parked.SAME_UNKEYED_SQL == repo("parked_same_unkeyed")
    assert parked.TAKE_SQL == repo("parked_take")
    assert parked.DELETE_SQL == repo("parked_delete")
    assert parked.FAILED_AGAIN_SQL == repo("parked_failed_again")
    assert parked_gauge.COUNT_SQL == repo("parked_count")
