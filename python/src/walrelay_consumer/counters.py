"""Plain counters of what the consumer did (the Rust crate's ``Counters``).

Read them from :attr:`ConsumerLoop.counters`; with ``prometheus_client``
installed the loop also exports them as metrics (:mod:`walrelay_consumer.metrics`).
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
    #: Gaps detected from previous key (``walrelay-prev`` or ``walrelay-prev-key``).
    gaps: int = 0
    #: Records parked in ``walrelay_consumer_parked``.
    parked: int = 0
    #: Batches that failed (handler or database) and were rolled back.
    errors: int = 0

    def add(self, other: Counters) -> None:
        """Adds ``other``'s totals (a worker's counts for one batch)."""
        self.processed += other.processed
        self.duplicates += other.duplicates
        self.gaps += other.gaps
        self.parked += other.parked
        self.errors += other.errors
