"""Plain counters of what the consumer did (the Rust crate's ``Counters``).

Exposing them through ``prometheus_client`` is not part of this package
yet; read them from :attr:`ConsumerLoop.counters` meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Counters"]


@dataclass(slots=True)
class Counters:
    """Totals since the counters were created."""

    #: Records whose side effects were committed.
    processed: int = 0
    #: Records dropped because their mark already covered them.
    duplicates: int = 0
    #: Gaps detected from ``walrelay-prev-key``.
    gaps: int = 0
    #: Records parked in ``walrelay_consumer_parked``.
    parked: int = 0
    #: Batches that failed (handler or database) and were rolled back.
    errors: int = 0
