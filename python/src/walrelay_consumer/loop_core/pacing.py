"""How long the loop's steps wait: a poll, a round for its batches.

The loop polls a burst of records into per-partition queues, then applies
at most one batch per partition in a round, the round's batches at the
same time; when the round is done (or has waited :data:`STRAGGLER_WAIT`)
it acts on their outcomes and polls again.
"""

from __future__ import annotations

from typing import Any, Protocol

from .job import Round

__all__ = ["POLL_BURST", "POLL_MAX", "POLL_STRAGGLER", "STRAGGLER_WAIT", "poll_burst", "poll_timeout"]

#: Records taken from librdkafka per poll.
POLL_BURST = 1024
#: The longest single poll, so a stop request is seen quickly.
POLL_MAX = 0.2
#: How long a round waits for its batches: one still running then is left
#: in flight (a straggler) and the loop goes on with the other partitions.
#: Well above a healthy batch (tens of milliseconds), so normal rounds end
#: together and the loop's thread does not contend with the workers.
STRAGGLER_WAIT = 0.25
#: The longest poll while a straggler is in flight, so its partition goes
#: on soon after it finishes.
POLL_STRAGGLER = 0.01


def poll_timeout(round_: Round, now: float, stragglers: bool) -> float:
    """How long the next poll may wait: not at all when a partition has
    more ready, briefly while a straggler is in flight, else until the
    earliest retry (at most :data:`POLL_MAX`)."""
    if round_.ready:
        return 0.0
    timeout = min(POLL_MAX, max(0.0, (round_.wake or now + POLL_MAX) - now))
    return min(timeout, POLL_STRAGGLER) if stragglers else timeout


class _Consumes(Protocol):
    def consume(self, num_messages: int = ..., timeout: float = ...) -> list[Any]: ...


def poll_burst(consumer: _Consumes, timeout: float) -> list[Any]:
    """Up to :data:`POLL_BURST` records of what librdkafka has fetched,
    waiting at most ``timeout`` for the first one only.

    ``Consumer.consume(n, timeout)`` returns when it has ``n`` records or
    when ``timeout`` has passed: under a live stream (fewer than ``n``
    records a poll) every poll would wait its whole timeout, up to
    :data:`POLL_MAX`, before the records it already holds are applied.
    So: take what is there; if nothing, wait for one record and then take
    what came with it. A backlog is still read in bursts of
    :data:`POLL_BURST`."""
    messages = consumer.consume(POLL_BURST, 0)
    if messages or timeout <= 0:
        return messages
    first = consumer.consume(1, timeout)
    if not first:
        return first
    return first + consumer.consume(POLL_BURST - 1, 0)
