"""Idempotency keys as text: 32 hex digits, compared as strings.

A walrelay key is a 128-bit number (commit LSN high, event position low).
Written as exactly 32 lowercase hex digits, string order is numeric order,
so Python never needs to parse it into an integer: the high-water marks in
``walrelay_consumer_hwm`` are stored and compared the same way.
"""

from __future__ import annotations

import re

__all__ = ["INITIAL_HWM", "KeyFormatError", "parse_key", "parse_compact_key"]

#: The high-water mark of a row that has seen nothing yet: 32 zeros, below
#: every key walrelay issues.
INITIAL_HWM = "0" * 32

_HEX = frozenset("0123456789abcdefABCDEF")
#: 32 ASCII hex digits (a ``str`` pattern's ranges are code points, so no
#: other script's digits match).
_KEY = re.compile(r"[0-9a-fA-F]{32}")


class KeyFormatError(ValueError):
    """Text that is not a 32-hex-digit idempotency key."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__(reason)
        self.text = text
        self.reason = reason


def parse_key(text: str) -> str:
    """Validates a key and returns it in the canonical lowercase form.

    Accepts either case (as the Rust crate does) so that a key compares
    correctly as a string; raises :class:`KeyFormatError` otherwise.
    """
    # Every record's key goes through here: one C-level match on the way
    # that succeeds, the reasons only on the way that fails.
    if _KEY.fullmatch(text) is not None:
        return text.lower()
    if len(text) != 32:
        raise KeyFormatError(text, f"an event key is exactly 32 hex digits, got {len(text.encode())} bytes")
    for index, char in enumerate(text):
        if char not in _HEX:
            raise KeyFormatError(text, f"an event key is exactly 32 hex digits, found {char!r} at byte {index}")
    return text.lower()


#: ``HIGH/LOW``, each half 1 to 16 ASCII hex digits.
_COMPACT = re.compile(r"([0-9a-fA-F]{1,16})/([0-9a-fA-F]{1,16})")


def parse_compact_key(text: str) -> str:
    """Parses a key in the compact form of the lean header set's
    ``walrelay-prev`` (``HIGH/LOW``, each half 1 to 16 hex digits, like
    ``16b374d848/16b374d800``) and returns it as the canonical 32 lowercase
    hex digits; raises :class:`KeyFormatError` otherwise."""
    match = _COMPACT.fullmatch(text)
    if match is None:
        raise KeyFormatError(text, "a compact event key is HIGH/LOW, each half 1 to 16 hex digits")
    return f"{match[1].lower():0>16}{match[2].lower():0>16}"
