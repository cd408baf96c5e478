"""The brokers the Python tests run against, behind one interface
(``bootstrap``, ``create_topic``, ``stop``), as the Rust test kit's
``TestBroker``: Tansu with in-memory storage (fast; the default) or one
combined KRaft node of Apache Kafka, picked with ``WALRELAY_BROKER=tansu|kafka``
(the same variable the Rust suites read).

Binaries: ``$WALRELAY_TANSU_BIN`` or <repo>/target/tools/bin/tansu
(scripts/install-tansu.sh); ``$WALRELAY_KAFKA_HOME`` or
<repo>/target/tools/kafka-<version> (scripts/install-kafka.sh).
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Protocol

from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
#: The version scripts/install-kafka.sh pins (keep equal to the test kit's
#: KAFKA_VERSION).
KAFKA_VERSION = "4.1.1"
#: Kills a broker and removes its directory when the test process's end of
#: the pipe on its stdin closes, however the process ended (kill -9 too).
WATCHDOG = 'read -r _; kill -9 "$1" 2>/dev/null; rm -rf "$2"'


class Broker(Protocol):
    @property
    def bootstrap(self) -> str: ...

    @property
    def name(self) -> str: ...

    def create_topic(self, name: str, partitions: int) -> None: ...

    def stop(self) -> None: ...


def broker_kind() -> str:
    kind = os.environ.get("WALRELAY_BROKER", "tansu").strip().lower() or "tansu"
    if kind not in ("tansu", "kafka"):
        raise RuntimeError(f"WALRELAY_BROKER={kind!r}: expected tansu or kafka")
    return kind


def start_broker() -> Broker:
    """The broker ``WALRELAY_BROKER`` names, started on free ports."""
    return Kafka() if broker_kind() == "kafka" else Tansu()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _await_metadata(bootstrap: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """True once the broker answers a metadata request naming a broker;
    False when the process exited first (lost a port race) or on timeout."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if admin.list_topics(timeout=1).brokers:
                return True
        except Exception:
            pass
        time.sleep(0.05)
    return False


def _create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10).values():
        future.result(timeout=20)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        meta = admin.list_topics(timeout=5).topics.get(name)
        if meta is not None and len(meta.partitions) == partitions and all(p.leader >= 0 for p in meta.partitions.values()):
            return
        time.sleep(0.05)
    raise AssertionError(f"topic {name} did not get {partitions} partitions with leaders within 20 s")


class _Process:
    """A broker process and its watchdog."""

    def __init__(self, argv: list[str], cwd: Path, log: Path, env: dict[str, str]) -> None:
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        self.watchdog = subprocess.Popen(
            ["sh", "-c", WATCHDOG, "walrelay-py-broker-watchdog", str(self.proc.pid), str(cwd)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.watchdog.stdin is not None:
            self.watchdog.stdin.close()
        self.watchdog.wait()


class _Running:
    """What both brokers share once started: a process on ``port`` with
    its files in ``dir``."""

    port: int
    dir: Path
    process: _Process

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def create_topic(self, name: str, partitions: int) -> None:
        _create_topic(self.bootstrap, name, partitions)

    def stop(self) -> None:
        self.process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class Tansu(_Running):
    """A Tansu broker with in-memory storage on a free port."""

    name = "Tansu"

    def __init__(self) -> None:
        env_bin = os.environ.get("WALRELAY_TANSU_BIN")
        binary = Path(env_bin) if env_bin else REPO / "target" / "tools" / "bin" / "tansu"
        if not binary.is_file():
            raise RuntimeError(
                f"the Tansu broker binary is not at {binary}: run scripts/install-tansu.sh (or set WALRELAY_TANSU_BIN)"
            )
        self.dir = Path(tempfile.mkdtemp(prefix="walrelay-py-tansu-"))
        self.log = self.dir / "tansu.log"
        for _ in range(8):
            self.port = free_port()
            url = f"tcp://{HOST}:{self.port}"
            self.process = _Process(
                [
                    str(binary),
                    "broker",
                    "--cluster-id",
                    f"walrelay-py-{os.getpid()}",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                self.dir,
                self.log,
                {**os.environ, "RUST_LOG": "warn"},
            )
            if _await_metadata(self.bootstrap, self.process.proc, 10):
                return
            tail = _log_tail(self.log)
            self.process.kill()
            self.dir.mkdir(parents=True, exist_ok=True)
        raise RuntimeError(f"tansu did not start; its log ended:\n{tail}")



def kafka_home() -> Path:
    env_home = os.environ.get("WALRELAY_KAFKA_HOME")
    home = Path(env_home) if env_home else REPO / "target" / "tools" / f"kafka-{KAFKA_VERSION}"
    if not home.is_absolute():
        home = (REPO / home) if not home.exists() else home.resolve()
    if not (home / "config" / "log4j2.properties").is_file() or not list((home / "libs").glob("kafka_2.13-*.jar")):
        raise RuntimeError(
            f"Apache Kafka is not installed at {home}: run scripts/install-kafka.sh "
            "(or set WALRELAY_KAFKA_HOME to the directory it printed)"
        )
    return home


def kafka_cluster_id() -> str:
    """A random KRaft cluster id: 16 bytes, URL-safe base64 without padding,
    never starting with '-' (the storage tool would take it for an option)."""
    raw = bytearray(os.urandom(16))
    raw[0] &= 0x7F
    return base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


def kafka_server_properties(broker_port: int, controller_port: int, data_dir: Path) -> str:
    """One combined KRaft node: stock settings except what one node needs
    (as the Rust test kit's broker/kafka/config.rs writes them)."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{broker_port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{broker_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Consumer-protocol groups (group.protocol=consumer) take their
        # session timeout and heartbeat from the broker: 3 s and 1 s, as
        # docs/operations.md says to set for a restart within 5 s.
        "group.consumer.min.session.timeout.ms": "3000",
        "group.consumer.session.timeout.ms": "3000",
        "group.consumer.min.heartbeat.interval.ms": "1000",
        "group.consumer.heartbeat.interval.ms": "1000",
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


class Kafka(_Running):
    """One combined (broker and controller) KRaft node of Apache Kafka on
    free ports, its data in a temporary directory removed at the end."""

    name = f"Apache Kafka {KAFKA_VERSION}"

    def __init__(self) -> None:
        home = kafka_home()
        java = str(Path(os.environ["JAVA_HOME"]) / "bin" / "java") if os.environ.get("JAVA_HOME") else "java"
        jvm = [
            java,
            "-Xms64m",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={home / 'config' / 'log4j2.properties'}",
            "-cp",
            str(home / "libs" / "*"),
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_OPTS", "KAFKA_HEAP_OPTS")}
        self.dir = Path(tempfile.mkdtemp(prefix="walrelay-py-kafka-"))
        self.log = self.dir / "kafka.log"
        for _ in range(4):
            self.port, controller = free_port(), free_port()
            data = self.dir / "data"
            shutil.rmtree(data, ignore_errors=True)
            props = self.dir / "server.properties"
            props.write_text(kafka_server_properties(self.port, controller, data))
            formatted = subprocess.run(
                [*jvm[:1], "-Xmx256m", *jvm[1:], "kafka.tools.StorageTool", "format", "--ignore-formatted"]
                + ["-t", kafka_cluster_id(), "-c", str(props)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=env,
            )
            if formatted.returncode != 0:
                raise RuntimeError(
                    f"formatting the Kafka node failed ({formatted.returncode}): "
                    f"{formatted.stdout.decode(errors='replace')}{formatted.stderr.decode(errors='replace')}"
                )
            self.process = _Process([*jvm[:1], "-Xmx512m", *jvm[1:], "kafka.Kafka", str(props)], self.dir, self.log, env)
            if _await_metadata(self.bootstrap, self.process.proc, 90):
                return
            tail = _log_tail(self.log)
            self.process.kill()
            self.dir.mkdir(parents=True, exist_ok=True)
        raise RuntimeError(f"Apache Kafka did not start; its log ended:\n{tail}")

