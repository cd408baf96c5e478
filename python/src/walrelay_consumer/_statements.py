"""The statements the consumer runs against the application's database: the
files of the repository's ``sql/consumer/``, one per statement, which the
Rust crate compiles in too. The package's build copies them in
(``python/setup.py``); nothing else in git holds a copy."""

from __future__ import annotations

from importlib import resources

__all__ = ["statement"]


def statement(name: str) -> str:
    """The text of ``sql/consumer/<name>.sql``, without its final newline."""
    return (
        resources.files(__package__)
        .joinpath("sql", "consumer", f"{name}.sql")
        .read_text(encoding="utf-8")
        .rstrip()
    )
