"""A consumed record as the handlers see it: the Kafka record, its walrelay
metadata and where it was consumed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .meta import RecordMeta

__all__ = ["Position", "Record", "Delivery"]


@dataclass(frozen=True, slots=True)
class Position:
    """Where a record was consumed: the consumer group and the topic
    partition. Together with the record's source it names one high-water
    mark."""

    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Record:
    """A Kafka record, copied out of the client so that it can be queued,
    re-driven from the dead-letter table, or built by a test."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    @classmethod
    def from_message(cls, message: Any) -> Record:
        """Copies a ``confluent_kafka.Message``."""
        # Positional: a frozen dataclass's keyword call costs a third more,
        # once per record.
        return cls(
            message.topic(),
            message.partition(),
            message.offset(),
            message.key(),
            message.value(),
            tuple(message.headers() or ()),
        )

    @property
    def size(self) -> int:
        """Bytes of key, value and headers (for the batch byte bound)."""
        n = len(self.key or b"") + len(self.value or b"")
        for name, value in self.headers:
            n += len(name) + (len(value) if value is not None else 0)
        return n


@dataclass(frozen=True, slots=True)
class Delivery:
    """A record handed to a handler."""

    #: The Kafka record.
    record: Record
    #: Its walrelay metadata.
    meta: RecordMeta
    #: Group, topic and partition.
    position: Position

    @property
    def payload(self) -> bytes | None:
        """The record's value (``None`` for a tombstone)."""
        return self.record.value

    @property
    def key(self) -> bytes | None:
        """The record's Kafka key (``None`` for a keyless record)."""
        return self.record.key

    @property
    def offset(self) -> int:
        """The record's offset."""
        return self.record.offset
