"""The consumer conformance suite, Python side: every scenario of
``conformance/scenarios.json`` (the file the Rust crate's
``crates/walrelay-consumer/tests/conformance`` runs too) against a real
PostgreSQL and a broker (Tansu, or Apache Kafka with WALRELAY_BROKER=kafka),
one test per scenario, each in its own database, topic and consumer group.

conformance/README.md describes the actions and the checks; both runners
implement exactly those and refuse anything else (unknown actions, unknown
fields), so the two cannot drift apart silently.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

import consumer_process
from brokers import Broker, broker_kind
from conftest import REPO, count
from walrelay_consumer import (
    AsyncConsumerLoop,
    ConsumerLoop,
    Counters,
    OnPoison,
    PartitionsStopped,
    RetryPolicy,
    Settings,
    migrate,
    redrive,
)

HERE = Path(__file__).resolve().parent
FILE = json.loads((REPO / "conformance" / "scenarios.json").read_text())
AWAIT = 60.0
#: The consumer group protocols the scenarios are played with, one after the
#: other on the same brokers: ``$WALRELAY_GROUP_PROTOCOL``, ``classic`` (the
#: default), ``consumer`` (Kafka 4's, KIP-848) or both, comma-separated.
PROTOCOLS = [p.strip() for p in os.environ.get("WALRELAY_GROUP_PROTOCOL", "classic").split(",") if p.strip()]
assert set(PROTOCOLS) <= {"classic", "consumer"}, f"WALRELAY_GROUP_PROTOCOL: {PROTOCOLS} (classic, consumer)"
KEY_FORMAT = "{0x100 + seq:016x}{partition:016x}"
#: A produced record's misbehaviour in the handlers (README: Handler semantics).
BEHAVIOURS = ("swallow", "savepoint", "raise", "noop", "slow", "self_commit", "self_rollback", "contend")

#: Every action with its required and optional fields.
ACTIONS: dict[str, tuple[set[str], set[str]]] = {
    "produce": (
        {"source", "partitions", "seqs"},
        {"prev_seq", "poison", "poison_at_commit", "fails", "headers", "behaviour", "times", "payload_bytes"},
    ),
    "restart_relay": ({"source"}, set()),
    "replay_last": ({"source", "partitions", "count"}, set()),
    "produce_more": ({"source", "partitions", "count"}, set()),
    "produce_until_applied_by": ({"consumer", "source", "partitions", "per_round"}, set()),
    "start": (
        {"consumer", "handler"},
        {"batch_delay_ms", "max_batch_records", "handler_timeout_ms", "max_batch_bytes", "on_poison"},
    ),
    "stop": ({"consumer"}, {"stopped"}),
    "start_process": ({"consumer", "commit_interval_ms"}, {"instance_id"}),
    "kill_process": ({"consumer"}, set()),
    "await": (set(), {"effects", "parked", "seen", "stopped", "within_ms"}),
    "expect_counters": ({"processed", "duplicates", "gaps", "parked"}, set()),
    "park_row": ({"source", "partition", "offset", "seq"}, set()),
    "redrive": ({"handler", "applied", "failed", "unusable"}, set()),
}


def check_fields(what: str, obj: dict[str, Any], required: set[str], optional: Iterable[str] = ()) -> None:
    missing = required - obj.keys()
    unknown = obj.keys() - required - set(optional)
    assert not missing and not unknown, f"{what}: missing fields {sorted(missing)}, unknown fields {sorted(unknown)}"


def key(partition: int, seq: int) -> str:
    return f"{0x100 + seq:016x}{partition:016x}"


@dataclass
class Planned:
    partition: int
    key: str
    prev: str
    source: str
    poison: bool
    #: The handler's statements for it succeed, its transaction's commit
    #: fails (a deferred constraint).
    at_commit: bool = False
    #: The handler fails on it this many times, then applies it.
    fails: int = 0
    #: The relay's header set: "full" (``walrelay-prev-key``, 32 hex digits)
    #: or "lean" (``walrelay-prev``, ``HIGH/LOW``).
    headers: str = "full"
    #: How the handlers misbehave on it (one of :data:`BEHAVIOURS`), on the
    #: first ``times`` calls that include it.
    behaviour: str | None = None
    times: int = 1
    #: The payload padded with ``x`` to this many bytes.
    payload_bytes: int | None = None

    def payload(self) -> bytes:
        if self.poison:
            kind = "poison"
        elif self.at_commit:
            kind = "commit-poison"
        elif self.fails:
            kind = f"flaky {self.fails}"
        elif self.behaviour is not None:
            kind = f"{self.behaviour.replace('_', '-')} {self.times}"
        else:
            kind = "event"
        text = f"{kind} {self.key}"
        if self.payload_bytes is not None:
            text += " " + "x" * max(self.payload_bytes - len(text) - 1, 0)
        return text.encode()


@dataclass
class Ledger:
    """What the scenario's relays produced, and the last key per (source,
    partition) of the current relay session (for ``walrelay-prev-key``)."""

    prev: dict[tuple[str, int], str] = field(default_factory=dict)
    seqs: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)
    #: Keys of ``noop`` records: applied without an effects row.
    noop: set[str] = field(default_factory=set)

    def plan(
        self, source: str, partitions: list[int], seqs: list[int], prev_seq: int | None = None, poison: bool = False
    ) -> list[Planned]:
        out = []
        for i, seq in enumerate(seqs):
            for partition in partitions:
                k = key(partition, seq)
                prev = self.prev.get((source, partition), "")
                self.prev[(source, partition)] = k
                if i == 0 and prev_seq is not None:
                    prev = key(partition, prev_seq)
                self.seqs.setdefault((source, partition), set()).add(seq)
                self.keys.add(k)
                out.append(Planned(partition, k, prev, source, poison))
        return out

    def restart(self, source: str) -> None:
        self.prev = {sp: k for sp, k in self.prev.items() if sp[0] != source}

    def last(self, source: str, partition: int) -> int | None:
        seqs = self.seqs.get((source, partition))
        return max(seqs) if seqs else None

    def tail(self, source: str, partition: int, n: int) -> list[int]:
        return sorted(self.seqs.get((source, partition), set()))[-n:]

    def expected_effects(self, parked: list[dict[str, Any]], not_applied: Sequence[dict[str, Any]] = ()) -> set[str]:
        left_out = {key(p["partition"], p["seq"]) for p in [*parked, *not_applied]}
        return self.keys - left_out - self.noop

    def resolve(self, n: int | str, parked: list[dict[str, Any]], not_applied: Sequence[dict[str, Any]] = ()) -> int:
        if n == "all":
            return len(self.expected_effects(parked, not_applied))
        assert isinstance(n, int), f"a count must be a number or 'all', not {n!r}"
        return n


def test_the_ledger_chains_prev_keys_per_source_partition_and_session() -> None:
    ledger = Ledger()
    assert [p.prev for p in ledger.plan("s", [0, 1], [1, 2])] == ["", "", key(0, 1), key(1, 1)]
    gap = ledger.plan("s", [0], [4, 5], prev_seq=3)
    assert (gap[0].prev, gap[1].prev) == (key(0, 3), key(0, 4))
    other = ledger.plan("t", [0], [7], poison=True)
    assert other[0].prev == "" and other[0].payload() == f"poison {key(0, 7)}".encode()
    ledger.restart("s")
    assert ledger.plan("s", [1], [2])[0].prev == ""
    assert ledger.last("s", 0) == 5 and ledger.tail("s", 0, 3) == [2, 4, 5]
    assert ledger.resolve("all", [{"partition": 0, "seq": 7}]) == 6
    assert key(1, 5) == "00000000000001050000000000000001"


class Running:
    """An in-process loop in a thread: ``run`` is the blocking loop's run
    call, or ``asyncio.run`` of the asyncio loop's."""

    def __init__(self, loop: ConsumerLoop, run: Callable[[], None]) -> None:
        self.loop = loop
        self.error: BaseException | None = None

        def target() -> None:
            try:
                run()
            except BaseException as e:  # reported by stop()
                self.error = e

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def stop(self, stopped: list[dict[str, Any]] | None = None) -> None:
        """Stops the loop: it must end without error, or (``stopped``) with
        its stopped-partitions error naming exactly these partitions, each
        error containing its text."""
        self.loop.stop()
        self.thread.join(AWAIT)
        assert not self.thread.is_alive(), f"the loop did not stop within {AWAIT} s"
        if stopped is None:
            assert self.error is None, f"the loop ended with {self.error!r}"
            return
        assert isinstance(self.error, PartitionsStopped), f"the loop ended with {self.error!r}, not PartitionsStopped"
        got = {p.partition: p.error for p in self.error.stopped}
        for want in stopped:
            check_fields("stopped", want, {"partition", "error_contains"})
        assert sorted(got) == sorted(w["partition"] for w in stopped), f"stopped partitions: {got}, expected {stopped}"
        for want in stopped:
            assert want["error_contains"] in got[want["partition"]], (
                f"the error of stopped partition {want['partition']} lacks {want['error_contains']!r}: "
                f"{got[want['partition']]}"
            )


INSERT_EFFECT = "INSERT INTO effects (event_key, partition, consumer) VALUES (%s, %s, %s)"


#: How often each flaky record (``flaky <n> <key>``) failed, per topic.
FLAKY: dict[tuple[str, str], int] = {}
FLAKY_LOCK = threading.Lock()


def refuse_poison(batch: list[Any]) -> None:
    for d in batch:
        value = d.record.value or b""
        if value.startswith(b"poison"):
            raise ValueError(f"poison: cannot apply {d.meta.key}")
        if value.startswith(b"flaky "):
            n = int(value.split(b" ")[1])
            with FLAKY_LOCK:
                failed = FLAKY.get((d.position.topic, d.meta.key), 0)
                if failed < n:
                    FLAKY[(d.position.topic, d.meta.key)] = failed + 1
                    raise ValueError(f"flaky: failure {failed + 1} of {n} of {d.meta.key}")


#: Fine until the commit checks the deferred constraint.
COMMIT_POISON = "INSERT INTO commit_check (id) VALUES (1), (1)"


def commit_poison(batch: list[Any]) -> bool:
    return any((d.record.value or b"").startswith(b"commit-poison") for d in batch)


#: How often each misbehaving record misbehaved, per topic and key.
MISBEHAVED: dict[tuple[str, str], int] = {}
CONTEND = "DO $$BEGIN RAISE EXCEPTION 'contention' USING ERRCODE = '40001'; END$$"


@dataclass
class Misbehaviour:
    """What the handler does on this call, for the records of a batch
    (README: Handler semantics): statements before the effects, the
    records without an effects row, and statements after them (each
    ``(sql, ignore_its_error)``)."""

    raise_: str | None = None
    before: list[tuple[str, bool]] = field(default_factory=list)
    noop: set[str] = field(default_factory=set)
    after: list[tuple[str, bool]] = field(default_factory=list)

    @classmethod
    def of(cls, batch: list[Any]) -> Misbehaviour:
        m = cls()
        for d in batch:
            words = (d.record.value or b"").split(b" ")
            behaviour = words[0].decode().replace("-", "_")
            if behaviour not in BEHAVIOURS:
                continue
            if behaviour == "savepoint":
                m.before += [("SAVEPOINT s", False), ("SELECT 1/0", True), ("ROLLBACK TO SAVEPOINT s", False)]
            elif behaviour == "noop":
                m.noop.add(d.meta.key)
            elif behaviour == "self_commit":
                m.after.append(("COMMIT", False))
            elif behaviour == "self_rollback":
                m.after.append(("ROLLBACK", False))
            elif misbehaves(d, int(words[1])):
                if behaviour == "raise":
                    m.raise_ = f"raise: the handler raised on {d.meta.key}"
                elif behaviour == "contend":
                    m.before.append((CONTEND, False))
                elif behaviour == "slow":
                    m.before.append(("SELECT pg_sleep(30)", False))
                else:  # swallow
                    m.after.append(("SELECT 1/0", True))
        return m

    def rows(self, batch: list[Any], consumer: str) -> list[tuple[str, int, str]]:
        return [(d.meta.key, d.position.partition, consumer) for d in batch if d.meta.key not in self.noop]


def misbehaves(d: Any, times: int) -> bool:
    """Whether this call is one of the first ``times`` that include ``d``."""
    with FLAKY_LOCK:
        done = MISBEHAVED.get((d.position.topic, d.meta.key), 0)
        if done >= times:
            return False
        MISBEHAVED[(d.position.topic, d.meta.key)] = done + 1
        return True


def run_statements(cur: psycopg.Cursor[Any], statements: list[tuple[str, bool]]) -> None:
    for sql, ignore in statements:
        try:
            cur.execute(sql)
        except psycopg.Error:
            if not ignore:
                raise


async def run_statements_async(cur: psycopg.AsyncCursor[Any], statements: list[tuple[str, bool]]) -> None:
    for sql, ignore in statements:
        try:
            await cur.execute(sql)
        except psycopg.Error:
            if not ignore:
                raise


def apply(conn: psycopg.Connection[Any], batch: list[Any], consumer: str, delay: float, poison_fails: bool) -> None:
    """The handlers' side effect: one ``effects`` row per record; a batch
    with a poison record fails while ``poison_fails``, and its records'
    misbehaviours are played then."""
    m = Misbehaviour()
    if poison_fails:
        refuse_poison(batch)
        m = Misbehaviour.of(batch)
        if m.raise_ is not None:
            raise RuntimeError(m.raise_)
    with conn.cursor() as cur:
        if poison_fails and commit_poison(batch):
            cur.execute(COMMIT_POISON)
        if delay:
            cur.execute("SELECT pg_sleep(%s)", (delay,))
        run_statements(cur, m.before)
        rows = m.rows(batch, consumer)
        if rows:
            cur.executemany(INSERT_EFFECT, rows)
        run_statements(cur, m.after)


async def apply_async(conn: psycopg.AsyncConnection[Any], batch: list[Any], consumer: str, delay: float) -> None:
    """:func:`apply` for the asyncio loop (whose handlers always refuse
    poison records)."""
    refuse_poison(batch)
    m = Misbehaviour.of(batch)
    if m.raise_ is not None:
        raise RuntimeError(m.raise_)
    async with conn.cursor() as cur:
        if commit_poison(batch):
            await cur.execute(COMMIT_POISON)
        if delay:
            await cur.execute("SELECT pg_sleep(%s)", (delay,))
        await run_statements_async(cur, m.before)
        rows = m.rows(batch, consumer)
        if rows:
            await cur.executemany(INSERT_EFFECT, rows)
        await run_statements_async(cur, m.after)


class World:
    """One scenario's database, topic, relays and consumers."""

    def __init__(
        self, scenario: dict[str, Any], broker: Broker, dsn: str, flavour: str, protocol: str = "classic"
    ) -> None:
        assert flavour in ("blocking", "asyncio"), flavour
        self.flavour = flavour
        self.protocol = protocol
        self.defaults = FILE["defaults"]
        self.broker = broker
        self.dsn = dsn
        # Topics and groups are broker-wide: unique per test run.
        suffix = uuid.uuid4().hex[:8]
        self.group = f"{scenario['name']}-{suffix}"
        self.topic = f"conformance-{scenario['name']}-{suffix}"
        self.expected_parked: list[dict[str, Any]] = scenario["expect"]["parked"]
        self.not_applied: list[dict[str, Any]] = scenario["expect"].get("not_applied", [])
        broker.create_topic(self.topic, self.defaults["partitions"])
        with psycopg.connect(dsn, autocommit=True) as c:
            migrate(c)
            c.execute("CREATE TABLE effects (event_key text NOT NULL, partition int NOT NULL, consumer text NOT NULL)")
            c.execute(
                "CREATE TABLE commit_check (id int, "
                "CONSTRAINT commit_check_unique UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)"
            )
        self.producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2}
        )
        self.ledger = Ledger()
        self.consumers: dict[str, Running] = {}
        self.processes: dict[str, subprocess.Popen[str]] = {}
        self.counters: list[Counters] = []
        self.loops: list[ConsumerLoop] = []

    # -- producing ----------------------------------------------------------

    def send(self, planned: list[Planned]) -> None:
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for r in planned:
            assert r.headers in ("full", "lean"), f"unknown header set {r.headers!r}"
            if r.headers == "full":
                prev = ("walrelay-prev-key", r.prev.encode())
            elif r.prev:
                prev = ("walrelay-prev", f"{int(r.prev[:16], 16):x}/{int(r.prev[16:], 16):x}".encode())
            else:
                prev = ("walrelay-prev", b"")
            self.producer.produce(
                self.topic,
                value=r.payload(),
                key=r.key.encode(),
                partition=r.partition,
                headers=[
                    ("idempotency-key", r.key.encode()),
                    ("walrelay-source", r.source.encode()),
                    prev,
                ],
                on_delivery=delivered,
            )
        assert self.producer.flush(30) == 0, "records still undelivered after 30 s"
        assert not errors, errors

    def produce_more(self, source: str, partitions: list[int], n: int) -> None:
        for p in partitions:
            last = self.ledger.last(source, p)
            start = 1 if last is None else last + 1
            self.send(self.ledger.plan(source, [p], list(range(start, start + n))))

    # -- consumers ----------------------------------------------------------

    def settings(self, step: dict[str, Any]) -> Settings:
        """The defaults, with what a ``start`` step overrides."""
        d = self.defaults
        retry = d["retry"]
        timeout = step.get("handler_timeout_ms")
        return Settings(
            max_batch_records=step.get("max_batch_records") or d["max_batch_records"],
            max_batch_bytes=step.get("max_batch_bytes", Settings().max_batch_bytes),
            commit_interval=d["commit_interval_ms"] / 1000,
            retry=RetryPolicy(attempts=retry["attempts"], base=retry["base_ms"] / 1000, cap=retry["cap_ms"] / 1000),
            on_poison={"park": OnPoison.PARK, "stop": OnPoison.STOP}[step.get("on_poison", d["on_poison"])],
            handler_timeout=None if timeout is None else timeout / 1000,
        )

    def start(self, step: dict[str, Any]) -> None:
        name, handler, delay_ms = step["consumer"], step["handler"], step.get("batch_delay_ms", 0)
        assert name not in self.consumers, f"consumer {name} is already running"
        loop_class = AsyncConsumerLoop if self.flavour == "asyncio" else ConsumerLoop
        kafka: dict[str, Any] = {
            "bootstrap.servers": self.broker.bootstrap,
            "group.id": self.group,
            "reconnect.backoff.ms": 20,
            "reconnect.backoff.max.ms": 500,
        }
        if self.protocol == "consumer":
            # The session timeout and heartbeat are the broker's
            # (brokers.py: group.consumer.*); the client may not set them.
            kafka["group.protocol"] = "consumer"
        else:
            kafka.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000})
        loop = loop_class(
            kafka,
            [self.topic],
            self.dsn,
            self.settings(step),
            CollectorRegistry(),
        )
        self.counters.append(loop.counters)
        self.loops.append(loop)
        delay = delay_ms / 1000
        assert handler in ("batch", "record"), f"unknown handler {handler!r} (batch or record)"
        run: Callable[[], None]
        if isinstance(loop, AsyncConsumerLoop):
            aloop = loop

            async def batch_async(conn: Any, b: list[Any]) -> None:
                await apply_async(conn, b, name, delay)

            async def record_async(conn: Any, d: Any) -> None:
                await apply_async(conn, [d], name, delay)

            if handler == "batch":
                run = lambda: asyncio.run(aloop.run_batches(batch_async))  # noqa: E731
            else:
                run = lambda: asyncio.run(aloop.run(record_async))  # noqa: E731
        elif handler == "batch":
            run = lambda: loop.run_batches(lambda conn, b: apply(conn, b, name, delay, True), handle_signals=False)  # noqa: E731
        else:
            run = lambda: loop.run(lambda conn, d: apply(conn, [d], name, delay, True), handle_signals=False)  # noqa: E731
        self.consumers[name] = Running(loop, run)

    def start_process(self, name: str, commit_interval_ms: int, instance_id: str | None) -> None:
        assert name not in self.processes, f"consumer process {name} is already running"
        # Instance ids are broker-wide, like groups: unique per test run.
        static = [] if instance_id is None else [f"{instance_id}-{self.group}"]
        self.processes[name] = subprocess.Popen(
            [
                *(sys.executable, str(HERE / "consumer_process.py"), self.broker.bootstrap, self.topic, self.dsn),
                *(self.group, name, str(commit_interval_ms / 1000), *static),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "WALRELAY_GROUP_PROTOCOL": self.protocol},
        )
        self.await_ready(name, self.processes[name])

    @staticmethod
    def await_ready(name: str, proc: subprocess.Popen[str]) -> None:
        """Waits until the consumer process says it is up: a scenario's
        deadline (`within_ms`) times the consumer from there, not the
        interpreter's start, which takes seconds on a loaded machine."""
        seen: list[str] = []

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                seen.append(line)
                if consumer_process.READY in line:
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(60)
        assert any(consumer_process.READY in line for line in seen), (
            f"consumer process {name} was not ready within 60 s: {''.join(seen)}"
        )

    def kill_process(self, name: str) -> None:
        proc = self.processes.pop(name)
        assert proc.poll() is None, f"consumer process {name} exited on its own: {proc.communicate()[0]}"
        proc.kill()
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, out

    def counters_sum(self) -> Counters:
        total = Counters()
        for c in self.counters:
            total.processed += c.processed
            total.duplicates += c.duplicates
            total.gaps += c.gaps
            total.parked += c.parked
            total.errors += c.errors
        return total

    def await_counts(
        self,
        effects: int | None,
        parked: int | None,
        seen: int | None,
        stopped: int | None = None,
        within: float = AWAIT,
    ) -> None:
        deadline = time.monotonic() + within
        while True:
            e = count(self.dsn, "SELECT count(*) FROM effects")
            p = count(self.dsn, "SELECT count(*) FROM walrelay_consumer_parked")
            c = self.counters_sum()
            s = c.processed + c.duplicates + c.parked
            # The loops' own list (read only; appended to by their threads).
            st = sum(len(loop._core.stopped) for loop in self.loops)
            if (
                (effects is None or e >= effects)
                and (parked is None or p >= parked)
                and (seen is None or s >= seen)
                and (stopped is None or st >= stopped)
            ):
                return
            assert time.monotonic() < deadline, (
                f"timed out after {within} s waiting for effects {effects}, parked {parked}, seen {seen}, "
                f"stopped {stopped}; have effects {e}, parked {p}, seen {s}, stopped {st} ({c})"
            )
            time.sleep(0.05)

    # -- steps --------------------------------------------------------------

    def step(self, step: dict[str, Any]) -> None:
        action = step.get("do")
        assert action in ACTIONS, f"unknown action {action!r}: this runner knows {sorted(ACTIONS)}"
        required, optional = ACTIONS[action]
        check_fields(f"action {action}", {k: v for k, v in step.items() if k != "do"}, required, optional)
        if action == "produce":
            first, last = step["seqs"]
            planned = self.ledger.plan(
                step["source"],
                step["partitions"],
                list(range(first, last + 1)),
                step.get("prev_seq"),
                step.get("poison", False),
            )
            behaviour = step.get("behaviour")
            assert behaviour is None or behaviour in BEHAVIOURS, f"unknown behaviour {behaviour!r}: {BEHAVIOURS}"
            assert behaviour is None or not (step.keys() & {"poison", "poison_at_commit", "fails"}), (
                "behaviour excludes poison, poison_at_commit and fails"
            )
            for p in planned:
                p.at_commit = step.get("poison_at_commit", False)
                p.fails = step.get("fails", 0)
                p.headers = step.get("headers", "full")
                p.behaviour = behaviour
                p.times = step.get("times", 1)
                p.payload_bytes = step.get("payload_bytes")
                if behaviour == "noop":
                    self.ledger.noop.add(p.key)
            self.send(planned)
        elif action == "restart_relay":
            self.ledger.restart(step["source"])
        elif action == "replay_last":
            for p in step["partitions"]:
                self.send(self.ledger.plan(step["source"], [p], self.ledger.tail(step["source"], p, step["count"])))
        elif action == "produce_more":
            self.produce_more(step["source"], step["partitions"], step["count"])
        elif action == "produce_until_applied_by":
            who = step["consumer"]
            for _ in range(200):
                self.produce_more(step["source"], step["partitions"], step["per_round"])
                with psycopg.connect(self.dsn) as c:
                    row = c.execute("SELECT count(*) FROM effects WHERE consumer = %s", (who,)).fetchone()
                if row is not None and row[0] > 0:
                    return
                self.await_counts(self.ledger.resolve("all", self.expected_parked, self.not_applied), None, None)
            raise AssertionError(f"consumer {who} applied nothing in 200 rounds")
        elif action == "start":
            self.start(step)
        elif action == "stop":
            self.consumers.pop(step["consumer"]).stop(step.get("stopped"))
        elif action == "start_process":
            self.start_process(step["consumer"], step["commit_interval_ms"], step.get("instance_id"))
        elif action == "kill_process":
            self.kill_process(step["consumer"])
        elif action == "await":
            effects = step.get("effects")
            began = time.monotonic()
            self.await_counts(
                None if effects is None else self.ledger.resolve(effects, self.expected_parked, self.not_applied),
                step.get("parked"),
                step.get("seen"),
                step.get("stopped"),
                step.get("within_ms", AWAIT * 1000) / 1000,
            )
            if "within_ms" in step:
                # The measured time (pytest -s shows it), for docs/operations.md.
                print(f"{self.group} ({self.protocol} protocol): reached after {(time.monotonic() - began) * 1000:.0f} ms")
        elif action == "expect_counters":
            c = self.counters_sum()
            want = (step["processed"], step["duplicates"], step["gaps"], step["parked"])
            got = (c.processed, c.duplicates, c.gaps, c.parked)
            assert got == want, f"counters (processed, duplicates, gaps, parked): expected {want}, got {got}"
        elif action == "park_row":
            # As an earlier incarnation of the topic left it.
            with psycopg.connect(self.dsn, autocommit=True) as c:
                c.execute(
                    "INSERT INTO walrelay_consumer_parked (consumer_group, topic, partition, kafka_offset, "
                    "idempotency_key, source, header_names, header_values, error, attempts) "
                    "VALUES (%s, %s, %s, %s, %s, %s, '{}', '{}', 'an earlier incarnation', 1)",
                    (
                        self.group,
                        self.topic,
                        step["partition"],
                        step["offset"],
                        key(step["partition"], step["seq"]),
                        step["source"],
                    ),
                )
        elif action == "redrive":
            broken = {"broken": True, "fixed": False}[step["handler"]]
            with psycopg.connect(self.dsn, autocommit=True) as c:
                report = redrive(c, self.group, lambda conn, d: apply(conn, [d], "redrive", 0, broken))
            want = (step["applied"], step["failed"], step["unusable"])
            got = (report.applied, report.failed, report.unusable)
            assert got == want, f"redrive (applied, failed, unusable): expected {want}, got {got}"

    # -- final state --------------------------------------------------------

    def check(self, expect: dict[str, Any]) -> None:
        check_fields("expect", expect, {"effects", "marks", "parked"}, {"not_applied"})
        not_applied = expect.get("not_applied", [])
        for n in not_applied:
            check_fields("not_applied", n, {"partition", "seq"})
        with psycopg.connect(self.dsn) as c:
            rows = c.execute("SELECT event_key, count(*) FROM effects GROUP BY event_key").fetchall()
            marks = c.execute(
                "SELECT partition, source, hwm FROM walrelay_consumer_hwm WHERE consumer_group = %s AND topic = %s",
                (self.group, self.topic),
            ).fetchall()
            parked = c.execute(
                "SELECT partition, idempotency_key, attempts FROM walrelay_consumer_parked "
                "ORDER BY partition, kafka_offset, id"
            ).fetchall()
        twice = [(k, n) for k, n in rows if n > 1]
        assert not twice, f"applied more than once: {twice}"
        total = sum(n for _, n in rows)
        want_total = self.ledger.resolve(expect["effects"], expect["parked"], not_applied)
        assert total == want_total, f"effects rows: expected {want_total}, got {total}"
        got_keys = {k for k, _ in rows}
        want_keys = self.ledger.expected_effects(expect["parked"], not_applied)
        assert got_keys == want_keys, (
            f"effects: missing {sorted(want_keys - got_keys)}, unexpected {sorted(got_keys - want_keys)}"
        )

        if expect["marks"] is not None:  # null: not checked
            want_marks = set()
            for m in expect["marks"]:
                check_fields("mark", m, {"partition", "source", "seq"})
                seq = self.ledger.last(m["source"], m["partition"]) if m["seq"] == "last" else m["seq"]
                assert isinstance(seq, int), f"nothing produced for mark {m}"
                want_marks.add((m["partition"], m["source"], key(m["partition"], seq)))
            assert set(marks) == want_marks, f"marks: expected {want_marks}, got {set(marks)}"

        for p in expect["parked"]:
            check_fields("parked", p, {"partition", "seq"}, {"attempts"})
        want_parked = [(p["partition"], key(p["partition"], p["seq"]), p.get("attempts")) for p in expect["parked"]]
        matches = len(parked) == len(want_parked) and all(
            g[0] == w[0] and g[1] == w[1] and (w[2] is None or w[2] == g[2]) for g, w in zip(parked, want_parked)
        )
        assert matches, f"parked (partition, key, attempts): expected {want_parked}, got {parked}"

    def close(self) -> None:
        for running in self.consumers.values():
            running.loop.stop()
        for proc in self.processes.values():
            proc.kill()
            proc.communicate(timeout=30)
        self.producer.flush(5)


def test_the_file_is_one_this_runner_understands() -> None:
    check_fields("scenarios.json", FILE, {"about", "key_format", "defaults", "scenarios"})
    assert FILE["key_format"] == KEY_FORMAT, f"key_format {FILE['key_format']!r} is not implemented here"
    check_fields(
        "defaults", FILE["defaults"], {"partitions", "max_batch_records", "commit_interval_ms", "retry", "on_poison"}
    )
    names = [s["name"] for s in FILE["scenarios"]]
    assert len(names) == len(set(names)), f"scenario names repeat: {names}"
    for s in FILE["scenarios"]:
        check_fields(f"scenario {s.get('name')}", s, {"name", "doc", "steps", "expect"}, {"brokers"})
        for b in s.get("brokers", []):
            assert b in ("kafka", "tansu"), f"scenario {s['name']}: unknown broker {b!r} (kafka or tansu)"
    with pytest.raises(AssertionError, match="unknown action 'teleport'"):
        World.step(None, {"do": "teleport"})  # type: ignore[arg-type]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("flavour", ["blocking", "asyncio"])
@pytest.mark.parametrize("scenario", FILE["scenarios"], ids=[s["name"] for s in FILE["scenarios"]])
def test_scenario(scenario: dict[str, Any], flavour: str, protocol: str, broker: Broker, dsn: str) -> None:
    """Every scenario with the blocking loop and with the asyncio loop (the
    ``start`` action's consumers; ``start_process`` always runs the
    blocking one), under each group protocol of :data:`PROTOCOLS`."""
    if broker_kind() not in scenario.get("brokers", [broker_kind()]):
        pytest.skip(f"played on {scenario['brokers']} only, not on {broker_kind()}")
    if protocol == "consumer" and broker_kind() != "kafka":
        pytest.skip("the consumer group protocol needs Apache Kafka 4 (WALRELAY_BROKER=kafka)")
    world = World(scenario, broker, dsn, flavour, protocol)
    try:
        for i, step in enumerate(scenario["steps"], 1):
            try:
                world.step(step)
            except AssertionError as e:
                raise AssertionError(f"step {i} {step}: {e}") from e
        assert not world.consumers and not world.processes, (
            f"the scenario leaves consumers running: {sorted(world.consumers)} {sorted(world.processes)} "
            "(end it with stop or kill_process)"
        )
        world.check(scenario["expect"])
    finally:
        world.close()
