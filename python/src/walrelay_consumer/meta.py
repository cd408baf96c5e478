"""What walrelay's headers say about a record: its idempotency key, its
source, its LSNs and the key sent before it.

Mirrors ``crates/walrelay-consumer/src/meta.rs``: the same required and
optional headers, and the same refusal of a reserved header that occurs
twice (:class:`DuplicateHeader`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .keys import KeyFormatError, parse_compact_key, parse_key

__all__ = [
    "IDEMPOTENCY_KEY",
    "SOURCE",
    "LSN",
    "COMMIT_LSN",
    "PREV_KEY",
    "PREV",
    "RecordMeta",
    "MetaError",
    "MissingHeader",
    "NotUtf8",
    "EmptySource",
    "BadKey",
    "DuplicateHeader",
    "TwoPreviousKeys",
    "BadLsn",
    "is_reserved",
    "parse_lsn",
]

IDEMPOTENCY_KEY = "idempotency-key"
SOURCE = "walrelay-source"
LSN = "walrelay-lsn"
COMMIT_LSN = "walrelay-commit-lsn"
PREV_KEY = "walrelay-prev-key"
#: The previous key in the compact form ``HIGH/LOW`` (the lean header set,
#: walrelay's default); a record carries this or ``walrelay-prev-key``.
PREV = "walrelay-prev"
_RESERVED_PREFIX = "walrelay-"

Header = tuple[str, "bytes | None"]


class MetaError(ValueError):
    """Why a record's headers are not usable walrelay metadata."""


class MissingHeader(MetaError):
    """A required header is absent (or has a null value)."""

    def __init__(self, header: str) -> None:
        super().__init__(
            f"the record has no {header!r} header: it was not produced by walrelay, "
            "or its headers were stripped by a proxy or bridge on the way"
        )
        self.header = header


class NotUtf8(MetaError):
    """A header's value is not UTF-8."""

    def __init__(self, header: str) -> None:
        super().__init__(f"the {header!r} header is not UTF-8 (walrelay writes ASCII)")
        self.header = header


class EmptySource(MetaError):
    """The ``walrelay-source`` header is empty."""

    def __init__(self) -> None:
        super().__init__(
            f"the {SOURCE!r} header is empty: walrelay always names the source "
            "(cluster/database/slot, or relay.source_id)"
        )
        self.header = SOURCE


class BadKey(MetaError):
    """A key header that is not 32 hex digits."""

    def __init__(self, header: str, value: str, reason: str) -> None:
        super().__init__(f"the {header!r} header {value!r} is not an idempotency key: {reason}")
        self.header = header
        self.value = value


class DuplicateHeader(MetaError):
    """A header name reserved for walrelay (``idempotency-key``,
    ``walrelay-*``) occurs more than once: an application forged it, or
    something on the way rewrote the record. Which copy is the relay's
    cannot be told, so the record is refused rather than trusted."""

    def __init__(self, header: str) -> None:
        super().__init__(
            f"the record carries the walrelay header {header!r} more than once: walrelay writes "
            "each of its headers exactly once, so one copy was added by someone else (an "
            "application header named like walrelay's, or a proxy); the record is not trusted"
        )
        self.header = header


class TwoPreviousKeys(MetaError):
    """The previous key in both forms (``walrelay-prev-key`` and
    ``walrelay-prev``): walrelay writes one of them, so one was added by
    someone else and neither can be trusted."""

    def __init__(self) -> None:
        super().__init__(
            f"the record carries both {PREV_KEY!r} and {PREV!r}: walrelay writes one of them (the "
            "full or the lean header set), so one was added by someone else; the record is not "
            "trusted"
        )
        self.header = PREV


class BadLsn(MetaError):
    """An LSN header that is not ``HIGH/LOW`` hex."""

    def __init__(self, header: str, value: str, reason: str) -> None:
        super().__init__(f"the {header!r} header {value!r} is not an LSN: {reason}")
        self.header = header
        self.value = value


def is_reserved(name: str) -> bool:
    """Whether a header name belongs to walrelay (``idempotency-key`` and
    every ``walrelay-*``, ASCII case-insensitive): the relay's own rule."""
    lowered = name.lower()
    return lowered == IDEMPOTENCY_KEY or lowered.startswith(_RESERVED_PREFIX)


_LSN = re.compile(r"([0-9a-fA-F]{1,8})/([0-9a-fA-F]{1,8})")


def parse_lsn(text: str) -> int:
    """Parses ``HIGH/LOW`` with 1-8 hex digits (either case) per half, the
    format PostgreSQL's ``pg_lsn`` accepts. Raises :class:`ValueError`."""
    match = _LSN.fullmatch(text)
    if match is not None:
        return (int(match[1], 16) << 32) | int(match[2], 16)
    # Not an LSN: find what is wrong with it.
    high, sep, low = text.partition("/")
    if not sep:
        raise ValueError("an LSN is HIGH/LOW in hex, the '/' is missing")
    return (_lsn_half(high, "high") << 32) | _lsn_half(low, "low")


def _lsn_half(text: str, which: str) -> int:
    if not 1 <= len(text) <= 8 or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise ValueError(f"the {which} half {text!r} of an LSN is not 1 to 8 hex digits")
    return int(text, 16)


@dataclass(frozen=True, slots=True)
class RecordMeta:
    """The walrelay metadata of one record, parsed from its headers."""

    #: The idempotency key (``idempotency-key``), 32 lowercase hex digits.
    key: str
    #: Where the key sequence comes from (``walrelay-source``). Keys of
    #: different sources are not comparable.
    source: str
    #: The LSN the server reported for the event (``walrelay-lsn``).
    lsn: int | None = None
    #: Start of the transaction's commit record (``walrelay-commit-lsn``).
    commit_lsn: int | None = None
    #: The key the relay sent before this one to the same topic and
    #: partition in the same session (``walrelay-prev-key``, or
    #: ``walrelay-prev`` in the lean header set's compact form), as 32
    #: lowercase hex digits; ``None`` for the first record of a session,
    #: and for relays that do not send it.
    prev_key: str | None = None

    @classmethod
    def from_headers(cls, headers: Iterable[tuple[str, bytes | str | None]] | None) -> RecordMeta:
        """Parses the walrelay headers out of ``(name, value)`` pairs in
        record order (``confluent_kafka.Message.headers()``; ``None`` is no
        headers). Other headers are ignored; a reserved name that occurs
        twice raises :class:`DuplicateHeader`.

        ``idempotency-key`` and ``walrelay-source`` are required;
        ``walrelay-lsn``, ``walrelay-commit-lsn`` (both only in the full
        header set) and the previous key (``walrelay-prev-key``, or
        ``walrelay-prev`` in the lean set, never both) are optional, and an
        empty or null previous key means "first record of a session".
        """
        # Runs for every record, so the names go into a dict at C speed;
        # only a record with a name twice is looked at name by name.
        pairs = headers if isinstance(headers, (list, tuple)) else list(headers or ())
        found: dict[str, bytes | str | None] = dict(pairs)
        if len(found) != len(pairs):
            _refuse_duplicates(pairs)
        key_text = _required(IDEMPOTENCY_KEY, found)
        key = _key(IDEMPOTENCY_KEY, key_text)
        source = _required(SOURCE, found)
        if not source:
            raise EmptySource()
        if PREV in found:
            if PREV_KEY in found:
                raise TwoPreviousKeys()
            compact = _optional(PREV, found)
            prev_key = _compact_key(compact) if compact else None
        else:
            prev_text = _optional(PREV_KEY, found)
            prev_key = _key(PREV_KEY, prev_text) if prev_text else None
        # Positional, in field order: key, source, lsn, commit_lsn, prev_key.
        return cls(
            key,
            source,
            _lsn(LSN, _optional(LSN, found)),
            _lsn(COMMIT_LSN, _optional(COMMIT_LSN, found)),
            prev_key,
        )

    def __str__(self) -> str:
        return f"key {self.key} from {self.source}"


def _refuse_duplicates(pairs: Iterable[tuple[str, bytes | str | None]]) -> None:
    """Raises :class:`DuplicateHeader` for the first reserved name that
    occurs twice (other names may repeat)."""
    reserved: set[str] = set()
    for name, _ in pairs:
        if is_reserved(name):
            if name in reserved:
                raise DuplicateHeader(name)
            reserved.add(name)


def _text(name: str, value: bytes | str) -> str:
    if isinstance(value, str):
        return value
    try:
        return (value if isinstance(value, bytes) else bytes(value)).decode("utf-8")
    except UnicodeDecodeError:
        raise NotUtf8(name) from None


def _required(name: str, found: dict[str, bytes | str | None]) -> str:
    value = found.get(name)
    if value is None:
        raise MissingHeader(name)
    return _text(name, value)


def _optional(name: str, found: dict[str, bytes | str | None]) -> str | None:
    value = found.get(name)
    return None if value is None else _text(name, value)


def _key(name: str, text: str) -> str:
    try:
        return parse_key(text)
    except KeyFormatError as e:
        raise BadKey(name, text, e.reason) from None


def _compact_key(text: str) -> str:
    try:
        return parse_compact_key(text)
    except KeyFormatError as e:
        raise BadKey(PREV, text, e.reason) from None


def _lsn(name: str, text: str | None) -> int | None:
    if not text:
        return None
    try:
        return parse_lsn(text)
    except ValueError as e:
        raise BadLsn(name, text, str(e)) from None
