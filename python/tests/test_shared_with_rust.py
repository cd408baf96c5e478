"""What the Python package shares with the Rust crate must not drift: the
migration it ships and the statements it runs."""

import re
from importlib import resources
from pathlib import Path

import pytest

import walrelay_consumer
from walrelay_consumer import apply, consumer, migration_sql, parked

REPO = Path(__file__).resolve().parents[2]
RUST = REPO / "crates" / "walrelay-consumer" / "src"


def test_the_shipped_migration_is_the_repository_file_byte_for_byte():
    repo = (REPO / "sql" / "walrelay_consumer.sql").read_bytes()
    # The copy inside the installed package (what `pip install ./python`
    # put there), and the one in the source tree it was built from.
    installed = resources.files(walrelay_consumer).joinpath("sql", "walrelay_consumer.sql").read_bytes()
    source = (REPO / "python" / "src" / "walrelay_consumer" / "sql" / "walrelay_consumer.sql").read_bytes()
    assert source == repo, (
        "python/src/walrelay_consumer/sql/walrelay_consumer.sql differs from sql/walrelay_consumer.sql: "
        "copy the repository file over it (cp sql/walrelay_consumer.sql python/src/walrelay_consumer/sql/)"
    )
    assert installed == repo, (
        "the installed package ships a different walrelay_consumer.sql: reinstall it (pip install ./python)"
    )
    assert migration_sql().encode() == repo


def rust_str(path: Path, name: str) -> str:
    text = path.read_text()
    m = re.search(r'const ' + name + r': &str =\s*"((?:[^"\\]|\\.)*)";', text, re.S)
    assert m, f"no const {name} in {path}"
    body = re.sub(r"\\\n\s*", "", m.group(1))
    assert "\\" not in body, f"unexpected escape in {name}: {body!r}"
    return body


@pytest.mark.parametrize(
    "rust_file, name, python",
    [
        ("apply.rs", "ENSURE_SQL", apply.ENSURE_SQL),
        ("apply.rs", "LOCK_SQL", apply.LOCK_SQL),
        ("apply.rs", "ADVANCE_SQL", apply.ADVANCE_SQL),
        ("parked.rs", "INSERT_SQL", parked.INSERT_SQL),
        ("parked.rs", "INSERT_UNKEYED_SQL", parked.INSERT_UNKEYED_SQL),
        ("parked.rs", "SAME_UNKEYED_SQL", parked.SAME_UNKEYED_SQL),
        ("parked.rs", "TAKE_SQL", parked.TAKE_SQL),
        ("parked.rs", "DELETE_SQL", parked.DELETE_SQL),
        ("store.rs", "LOAD_SQL", consumer.LOAD_SQL),
    ],
)
def test_statements_are_the_rust_crates(rust_file, name, python):
    assert python == rust_str(RUST / rust_file, name)
