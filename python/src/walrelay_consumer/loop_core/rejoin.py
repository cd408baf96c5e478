"""A consumer that librdkafka declared dead because its instance id is still
taken, and when the loop makes a new one.

Under Kafka 4's consumer group protocol (``group.protocol=consumer``) a
static member (``group.instance.id``) restarted after a crash is refused with
``UNRELEASED_INSTANCE_ID`` while the broker still counts its predecessor as
alive: until the predecessor's session times out (the group's
``consumer.session.timeout.ms``, the brokers' ``group.consumer.*``, 45 s by
default). librdkafka makes that refusal fatal: the consumer never works
again. The loop then closes it and tries a new one after a short backoff,
for as long as it takes, logging why (at once, then at most every
:data:`LOG_EVERY` seconds). Any other fatal error ends the loop: under the
classic protocol that is a static member fenced by a newer one with its
instance id, which must not fence it back.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError

__all__ = ["FIRST_RETRY", "RETRY_CAP", "LOG_EVERY", "Refusals", "Retry", "instance_id_in_use"]

#: The first wait before a new consumer, in seconds.
FIRST_RETRY = 0.25
#: The longest: a retry costs the broker a handful of small requests, and
#: the member joins at most this long after its predecessor's session ended.
RETRY_CAP = 0.5
#: How often a refusal that goes on is logged again, in seconds.
LOG_EVERY = 30.0

#: librdkafka's text for UNRELEASED_INSTANCE_ID: the consumer's fatal error
#: event carries only ``_FATAL`` and this text (confluent-kafka does not
#: expose ``rd_kafka_fatal_error``).
_UNRELEASED_TEXT = "instance id is still used"


def instance_id_in_use(error: KafkaError) -> bool:
    """Whether a (fatal) consumer error is the broker refusing the instance
    id because another member still holds it."""
    if error.code() == KafkaError.UNRELEASED_INSTANCE_ID:
        return True
    return _UNRELEASED_TEXT in error.str().lower()


@dataclass(frozen=True)
class Retry:
    """What to do after a refusal."""

    #: Seconds to wait before the next consumer.
    wait: float
    #: A warning to log now, if any.
    log: str | None


class Refusals:
    """The refusals of one instance id since it last joined."""

    def __init__(self) -> None:
        self._first: float | None = None
        self._count = 0
        self._last_logged: float | None = None

    def refused(self, now: float, instance_id: str, reason: str) -> Retry:
        """A consumer was refused at ``now`` (monotonic seconds)."""
        if self._first is None:
            self._first = now
        self._count += 1
        n = self._count
        wait = min(FIRST_RETRY * 2 ** min(n - 1, 8), RETRY_CAP)
        log = None
        if self._last_logged is None or now - self._last_logged >= LOG_EVERY:
            self._last_logged = now
            if n == 1:
                log = (
                    f"the broker refused group.instance.id={instance_id!r} ({reason}): under "
                    "group.protocol=consumer an instance id stays taken until its previous member "
                    "leaves or its session times out (a member killed without leaving holds it for the "
                    "group's consumer.session.timeout.ms, 45 s by default). Trying a new consumer every "
                    f"{RETRY_CAP * 1000:.0f}ms until then; to rejoin sooner, shorten the group's session "
                    "timeout (docs/operations.md), or check that no other running instance uses this id"
                )
            else:
                log = (
                    f"group.instance.id={instance_id!r} still refused after {n} attempts over "
                    f"{now - self._first:.0f}s ({reason}): is another running instance using this id?"
                )
        return Retry(wait, log)

    def joined(self, now: float) -> tuple[float, int] | None:
        """The member got partitions at ``now``: how long it was refused and
        how often, if it was (and the count starts over)."""
        first, n = self._first, self._count
        self._first, self._count, self._last_logged = None, 0, None
        return None if first is None else (now - first, n)
