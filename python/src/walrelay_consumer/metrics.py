"""Metrics through ``prometheus_client`` when it is installed, with the Rust
crate's names (``walrelay_consumer_*``, docs/metrics.md); nothing when it
is not (every hook is then a no-op).

All loops of a process that use the same registry share one
:class:`Metrics` (:meth:`Metrics.for_registry`), as the Rust crate's
counters are shared: registering the same names twice would fail.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from .apply import BatchOutcome

__all__ = ["Metrics"]

log = logging.getLogger("walrelay_consumer")

_BATCH_BUCKETS = (1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0)
_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0)

# Keyed by the registry's id, holding the registry itself: a registry freed
# and a new one given the same id must not get the dead one's metrics.
_shared: dict[int, tuple[Any, Metrics]] = {}
_shared_lock = threading.Lock()


class Metrics:
    """The consumer's metrics in ``registry`` (``prometheus_client``'s
    default registry when ``None``), or no-ops without ``prometheus_client``."""

    enabled: bool

    def __init__(self, registry: Any = None) -> None:
        try:
            import prometheus_client as pc
        except ImportError:
            self.enabled = False
            return
        self.enabled = True
        r = registry if registry is not None else pc.REGISTRY
        p = "walrelay_consumer_"
        self.records_applied = pc.Counter(p + "records_applied", "Records whose side effects were committed", registry=r)
        self.duplicates = pc.Counter(
            p + "duplicates_skipped",
            "Deliveries skipped because the high-water mark already covered them",
            registry=r,
        )
        self.gaps = pc.Counter(p + "gaps", "Records whose previous key (walrelay-prev or walrelay-prev-key) was above the high-water mark", registry=r)
        self.failed_attempts = pc.Counter(
            p + "failed_attempts", "Batch or record attempts that failed and were rolled back", registry=r
        )
        self.parked = pc.Counter(p + "parked", "Records parked in walrelay_consumer_parked", registry=r)
        self.retries = pc.Counter(p + "retries", "Attempts retried after a handler or database failure", registry=r)
        self.batch_records = pc.Histogram(
            p + "batch_records", "Records per committed batch transaction", buckets=_BATCH_BUCKETS, registry=r
        )
        self.apply_seconds = pc.Histogram(
            p + "apply_seconds",
            "Time from the start of a batch transaction to its commit",
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.hwm_commit_lsn = pc.Gauge(
            p + "hwm_commit_lsn",
            "Commit LSN (high 64 bits of the key) of each high-water mark",
            ["topic", "partition", "source"],
            registry=r,
        )
        self.lag_records = pc.Gauge(
            p + "lag_records", "Records in the partition after the last one applied", ["topic", "partition"], registry=r
        )
        self.partition_stopped = pc.Gauge(
            p + "partition_stopped", "1 while a partition is stopped by a poison record", ["topic", "partition"], registry=r
        )
        self.parked_records = pc.Gauge(
            p + "parked_records",
            "Records of the group waiting in walrelay_consumer_parked (read from the table)",
            registry=r,
        )

    @classmethod
    def for_registry(cls, registry: Any = None) -> Metrics:
        """The process's one :class:`Metrics` for ``registry``."""
        with _shared_lock:
            entry = _shared.get(id(registry))
            if entry is not None and entry[0] is registry:
                return entry[1]
            metrics = cls(registry)
            _shared[id(registry)] = (registry, metrics)
            return metrics

    def committed(self, topic: str, partition: int, records: int, seconds: float, outcome: BatchOutcome) -> None:
        """After a committed batch of ``records`` records."""
        if not self.enabled:
            return
        self.records_applied.inc(outcome.applied)
        self.duplicates.inc(outcome.duplicates)
        self.gaps.inc(outcome.gaps)
        if outcome.parked:
            self.parked.inc()
        self.batch_records.observe(records)
        self.apply_seconds.observe(seconds)
        for source, key in outcome.marks.items():
            self.hwm_commit_lsn.labels(topic, str(partition), source).set(int(key[:16], 16))

    def skipped(self, records: int) -> None:
        """Records dropped by the cached marks, without a transaction."""
        if self.enabled:
            self.duplicates.inc(records)

    def parked_unkeyed(self) -> None:
        if self.enabled:
            self.parked.inc()

    def failed(self) -> None:
        """A batch attempt failed and will be retried."""
        if self.enabled:
            self.failed_attempts.inc()
            self.retries.inc()

    def stopped(self, topic: str, partition: int) -> None:
        if self.enabled:
            self.partition_stopped.labels(topic, str(partition)).set(1)

    def parked_records_set(self, records: int) -> None:
        """The group's rows in ``walrelay_consumer_parked``, as last read."""
        if self.enabled:
            self.parked_records.set(records)

    def statistics(self, stats_json: str) -> None:
        """librdkafka's statistics (``stats_cb``): the consumer lag."""
        if not self.enabled:
            return
        try:
            stats = json.loads(stats_json)
            for topic, t in stats.get("topics", {}).items():
                for partition, p in t.get("partitions", {}).items():
                    lag = p.get("consumer_lag", -1)
                    # -1: unknown (not fetching it, or no offset yet).
                    if int(partition) >= 0 and lag >= 0:
                        self.lag_records.labels(topic, partition).set(lag)
        except (ValueError, AttributeError, TypeError) as e:
            log.debug("unreadable librdkafka statistics: %s", e)
