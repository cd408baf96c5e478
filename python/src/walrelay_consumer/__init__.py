"""Exactly-once processing of walrelay records into PostgreSQL.

The Python flavour of the Rust crate ``walrelay-consumer``, on
``confluent-kafka`` and ``psycopg`` 3, with the same tables: one
high-water mark per (consumer group, topic, partition, source), raised in
the same transaction as the record's side effects, and the same dead-letter
table. A Rust and a Python service can share one database and one
migration.

Keys are 32 lowercase hex digits and are compared as strings, which is
their numeric order.
"""

from __future__ import annotations

from ._migrate import migrate, migration_sql
from .aio import AsyncBatchHandler, AsyncRecordHandler, process_batch_async, process_records_async, redrive_async
from .aio_loop import AsyncConsumerLoop
from .apply import (
    BatchError,
    BatchHandler,
    BatchOutcome,
    CorruptHwm,
    DatabaseFailed,
    HandlerEndedTransaction,
    HandlerFailed,
    HandlerSwallowedError,
    NotParked,
    RecordHandler,
    RowVanished,
    process_batch,
    process_records,
)
from .batch import Gap, Plan, plan
from .consumer import ConfigError, ConsumerLoop, PartitionsStopped, StoppedPartition, load_marks
from .counters import Counters
from .handler_timeout import HandlerTimedOut
from .kafka_secrets import SecretError, redacted, resolve_secrets
from .keys import INITIAL_HWM, KeyFormatError, parse_key
from .meta import (
    BadKey,
    BadLsn,
    DuplicateHeader,
    TwoPreviousKeys,
    EmptySource,
    MetaError,
    MissingHeader,
    NotUtf8,
    RecordMeta,
    is_reserved,
)
from .metrics import Metrics
from .parked import OffsetReused, RedriveReport, redrive
from .records import Delivery, Position, Record
from .settings import OnPoison, RetryPolicy, Settings

__all__ = [
    "AsyncBatchHandler",
    "AsyncConsumerLoop",
    "AsyncRecordHandler",
    "BadKey",
    "BadLsn",
    "BatchError",
    "BatchHandler",
    "BatchOutcome",
    "ConfigError",
    "ConsumerLoop",
    "CorruptHwm",
    "Counters",
    "DatabaseFailed",
    "Delivery",
    "DuplicateHeader",
    "TwoPreviousKeys",
    "EmptySource",
    "Gap",
    "HandlerEndedTransaction",
    "HandlerFailed",
    "HandlerSwallowedError",
    "HandlerTimedOut",
    "INITIAL_HWM",
    "KeyFormatError",
    "MetaError",
    "Metrics",
    "MissingHeader",
    "NotParked",
    "NotUtf8",
    "OffsetReused",
    "OnPoison",
    "PartitionsStopped",
    "Plan",
    "Position",
    "Record",
    "RecordHandler",
    "RecordMeta",
    "RedriveReport",
    "RetryPolicy",
    "RowVanished",
    "SecretError",
    "Settings",
    "StoppedPartition",
    "is_reserved",
    "load_marks",
    "migrate",
    "migration_sql",
    "parse_key",
    "plan",
    "process_batch",
    "process_batch_async",
    "process_records",
    "process_records_async",
    "redacted",
    "redrive",
    "redrive_async",
    "resolve_secrets",
]
