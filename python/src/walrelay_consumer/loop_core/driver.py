"""What the two loops, :class:`~walrelay_consumer.ConsumerLoop` (threads)
and :class:`~walrelay_consumer.AsyncConsumerLoop` (asyncio), share with
their users: the consumer configuration, the settings, the counters and
metrics, :meth:`Driver.stop`, and the :class:`LoopCore` that decides for
them. Each subclass adds only its I/O: how it polls, runs the jobs on
database connections and waits for them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..kafka_config import consumer_config
from ..metrics import Metrics
from ..settings import Settings
from .core import LoopCore

__all__ = ["Driver"]


class Driver:
    """A consumer loop's configuration and core (see the module)."""

    def __init__(
        self,
        kafka: Mapping[str, Any],
        topics: list[str],
        settings: Settings | None,
        registry: Any,
        group_instance_id: str | None,
    ) -> None:
        config, group = consumer_config(kafka, topics, group_instance_id)
        self.metrics = Metrics.for_registry(registry)
        if self.metrics.enabled:
            # Statistics feed the consumer-lag gauge.
            config.setdefault("statistics.interval.ms", 5000)
            config.setdefault("stats_cb", self.metrics.statistics)
        self.group: str = str(group)
        self.topics = list(topics)
        self.settings = (settings or Settings()).normalized()
        self._config = config
        self._core = LoopCore(
            self.settings,
            self.group,
            self.topics,
            self.metrics,
            self._close_db,
            instance_id=config.get("group.instance.id"),
            # librdkafka takes both names.
            sasl_mechanism=config.get("sasl.mechanism", config.get("sasl.mechanisms")),
        )
        self.counters = self._core.counters

    def stop(self) -> None:
        """Asks the loop to stop (thread- and signal-safe): it finishes the
        batch it is applying, commits the stored offsets and leaves the
        group."""
        self._core.stop()

    def _close_db(self) -> None:
        """Closes the idle database connections (after an outage they are
        suspect; the next job opens a new one)."""
        raise NotImplementedError
