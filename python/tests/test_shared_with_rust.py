"""What the Python package shares with the Rust crate must not drift: the
migration it ships and the statements it runs."""

from importlib import resources
from pathlib import Path

import walrelay_consumer

REPO = Path(__file__).resolve().parents[2]


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
