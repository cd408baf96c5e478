"""Throwaway PostgreSQL clusters and brokers for the tests, started the way
the Rust test kit (crates/walrelay-testkit) starts them: ``initdb`` into a
fresh temporary directory as the server user (``postgres`` when running as
root), ``pg_ctl start`` on a free port of 127.0.0.1, and a broker
(brokers.py: Tansu with in-memory storage, or Apache Kafka with
``WALRELAY_BROKER=kafka``); both removed at the end of the session.

Each test gets a fresh database and fresh topics, so tests share one
server and one broker without seeing each other's rows or records.

Binaries: ``$WALRELAY_PG_BIN`` or /usr/lib/postgresql/15/bin (else the
newest /usr/lib/postgresql/*/bin); the brokers' in brokers.py.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from brokers import Broker, start_broker

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
TIMEOUT = 60.0
SOURCE = "7312/app/walrelay"


def await_condition(what: str, check: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    """Polls ``check`` until it returns a truthy value; fails naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# -- PostgreSQL ---------------------------------------------------------


def pg_bin() -> Path:
    env = os.environ.get("WALRELAY_PG_BIN")
    if env:
        return Path(env)
    debian15 = Path("/usr/lib/postgresql/15/bin")
    if (debian15 / "initdb").is_file():
        return debian15
    found = sorted(
        (int(p.name), p / "bin")
        for p in Path("/usr/lib/postgresql").glob("*")
        if p.name.isdigit() and (p / "bin" / "initdb").is_file()
    )
    if not found:
        raise RuntimeError(
            "no PostgreSQL server binaries: set WALRELAY_PG_BIN or run scripts/install-postgres.sh"
        )
    return found[-1][1]


class PgCluster:
    """A running throwaway cluster (trust authentication, fsync off)."""

    def __init__(self) -> None:
        self.bin = pg_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="walrelay-py-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "log"
        self.port = 0
        self._user: dict[str, Any] = {}
        if os.geteuid() == 0:
            # initdb and postgres refuse to run as root.
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        os.chmod(self.dir, 0o700)
        self._tool(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"
        )
        for _ in range(8):
            self.port = free_port()
            conf = {
                "listen_addresses": HOST,
                "port": str(self.port),
                "unix_socket_directories": str(self.dir),
                "max_connections": "40",
                "shared_buffers": "32MB",
                "fsync": "off",
                "logging_collector": "off",
            }
            with open(self.data / "postgresql.conf", "a") as f:
                f.write("\n# Added by the walrelay-consumer Python tests.\n")
                f.writelines(f"{k} = '{v}'\n" for k, v in conf.items())
            try:
                self._tool("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60")
                return
            except RuntimeError:
                if "could not bind" not in self.log_tail() and "already in use" not in self.log_tail():
                    self.remove()
                    raise
        self.remove()
        raise RuntimeError("PostgreSQL found no free port after 8 attempts")

    def _tool(self, tool: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        if self._user:
            env["HOME"] = "/"
        out = subprocess.run(
            [str(self.bin / tool), *args],
            cwd=self.dir,
            env=env,
            capture_output=True,
            text=True,
            **self._user,
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"{tool} failed ({out.returncode}): {out.stdout}{out.stderr}\n--- server log ---\n{self.log_tail()}"
            )

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text().splitlines()[-n:])
        except OSError:
            return ""

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={HOST} port={self.port} user=postgres dbname={dbname}"

    def remove(self) -> None:
        if self.data.exists():
            try:
                self._tool("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")
            except RuntimeError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pg() -> Iterator[PgCluster]:
    cluster = PgCluster()
    try:
        yield cluster
    finally:
        cluster.remove()


_db_numbers = itertools.count()


@pytest.fixture
def dsn(pg: PgCluster) -> str:
    """A fresh database; its libpq connection string."""
    name = f"test_{os.getpid()}_{next(_db_numbers)}"
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return pg.dsn(name)


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


# -- The broker ---------------------------------------------------------


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    """Tansu, or Apache Kafka with ``WALRELAY_BROKER=kafka`` (brokers.py)."""
    started = start_broker()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def topic(broker: Broker) -> str:
    """A fresh topic with two partitions."""
    name = f"orders-{uuid.uuid4().hex[:8]}"
    broker.create_topic(name, 2)
    return name


def key(partition: int, seq: int) -> str:
    """Key ``seq`` of ``partition``: increasing in ``seq``."""
    return f"{0x100 + seq:016x}{partition:016x}"


class Relay:
    """Produces walrelay-style records; remembers per partition what a relay
    would: the last key of this session (for ``walrelay-prev-key``)."""

    def __init__(self, bootstrap: str, topic: str, source: str = SOURCE) -> None:
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2}
        )
        self.topic = topic
        self.source = source
        self.prev: dict[int, str] = {}
        self.produced: dict[int, list[str]] = {}

    def restart(self) -> None:
        """A new relay session: the next record of each partition has an
        empty prev-key."""
        self.prev.clear()

    def send(self, records: list[tuple[int, int]], source: str | None = None) -> None:
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for partition, seq in records:
            k = key(partition, seq)
            prev = self.prev.get(partition, "")
            self.prev[partition] = k
            self.producer.produce(
                self.topic,
                value=f"event {k}".encode(),
                key=k.encode(),
                partition=partition,
                headers=[
                    ("idempotency-key", k.encode()),
                    ("walrelay-source", (source or self.source).encode()),
                    ("walrelay-prev-key", prev.encode()),
                ],
                on_delivery=delivered,
            )
            self.produced.setdefault(partition, []).append(k)
        assert self.producer.flush(30) == 0, "records still undelivered after 30 s"
        assert not errors, errors

    def send_raw(self, partition: int, payload: bytes) -> None:
        """A record without any walrelay header."""
        self.producer.produce(self.topic, value=payload, partition=partition)
        assert self.producer.flush(30) == 0

    def distinct(self) -> int:
        return sum(len(set(keys)) for keys in self.produced.values())


def count(dsn: str, sql: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(sql).fetchone()
        assert row is not None
        return int(row[0])
