"""Which records of a batch are new: the pure dedupe decision behind every
batch transaction (``crates/walrelay-consumer/src/batch.rs``).

A batch holds consecutive records of one partition, possibly of several
sources. Each source has its own high-water mark. Walking the batch in
order with a *running* mark per source (the stored mark, then raised by
every record taken) decides each record:

* key at or below the running mark: a duplicate (a relay replay puts lower
  keys after higher ones inside one batch too), dropped;
* above it: new, applied, and the running mark becomes its key.

A new record whose previous key (``walrelay-prev`` or ``walrelay-prev-key``) is above the running mark is also
a **gap**: the record the relay sent before it was never processed. It is
still applied; a running mark at its initial value is never compared,
since new groups start mid-stream.

Keys are compared as strings: 32 lowercase hex digits sort like numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .keys import INITIAL_HWM
from .meta import RecordMeta

__all__ = ["Gap", "Plan", "plan", "sources"]


@dataclass(frozen=True, slots=True)
class Gap:
    """A gap found in a batch."""

    #: Index of the record (in the batch) that revealed it.
    index: int
    #: Its source.
    source: str
    #: The running mark it was compared with.
    hwm: str
    #: Its previous key (``walrelay-prev`` or ``walrelay-prev-key``), above the mark.
    prev: str


@dataclass(slots=True)
class Plan:
    """What to do with a batch, given the marks."""

    #: Indexes of the new records, in batch order.
    apply: list[int] = field(default_factory=list)
    #: How many records were duplicates.
    duplicates: int = 0
    #: Gaps revealed by new records.
    gaps: list[Gap] = field(default_factory=list)
    #: The marks after the batch, for every source whose mark rises.
    raised: dict[str, str] = field(default_factory=dict)

    @property
    def is_all_duplicates(self) -> bool:
        """Whether nothing in the batch is new."""
        return not self.apply


def plan(marks: Mapping[str, str], records: Iterable[RecordMeta]) -> Plan:
    """Decides every record of a batch against ``marks`` (per source; a
    missing source is at :data:`INITIAL_HWM`). See the module docs."""
    result = Plan()
    raised = result.raised
    for index, meta in enumerate(records):
        source = meta.source
        running = raised.get(source)
        if running is None:
            running = marks.get(source, INITIAL_HWM)
        if meta.key <= running:
            result.duplicates += 1
            continue
        prev = meta.prev_key
        if prev is not None and running != INITIAL_HWM and prev > running:
            result.gaps.append(Gap(index=index, source=source, hwm=running, prev=prev))
        result.apply.append(index)
        raised[source] = meta.key
    return result


def sources(records: Iterable[RecordMeta]) -> list[str]:
    """The distinct sources of a batch, sorted: the order in which the batch
    transaction locks their mark rows, so that two members applying batches
    of one partition never deadlock.

    Sorted by code point, which is the order PostgreSQL's ``ORDER BY`` in
    the lock statement uses for these rows only under the C collation; the
    lock order that matters is the server's (the statement sorts), this
    list only names the rows.
    """
    return sorted({meta.source for meta in records})
