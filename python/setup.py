"""Copies the SQL the package runs into it at build time: the migration
``sql/walrelay_consumer.sql`` and the statements ``sql/consumer/*.sql`` of
the repository, which the Rust crate compiles in too. The package's
configuration is in pyproject.toml; this file only adds that step."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

REPOSITORY_SQL = Path(__file__).resolve().parent.parent / "sql"


class BuildPyWithSql(build_py):
    """``build_py``, then the repository's SQL into ``walrelay_consumer/sql``."""

    def run(self) -> None:
        super().run()
        if not (REPOSITORY_SQL / "walrelay_consumer.sql").is_file():
            raise SystemExit(
                f"{REPOSITORY_SQL} has no walrelay_consumer.sql: build the package from the "
                "walrelay repository (pip install ./python), where sql/ is its sibling"
            )
        target = Path(self.build_lib) / "walrelay_consumer" / "sql"
        (target / "consumer").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPOSITORY_SQL / "walrelay_consumer.sql", target / "walrelay_consumer.sql")
        for statement in sorted((REPOSITORY_SQL / "consumer").glob("*.sql")):
            shutil.copyfile(statement, target / "consumer" / statement.name)


setup(cmdclass={"build_py": BuildPyWithSql})
