"""Metrics with prometheus_client, and none without it."""

import json
import subprocess
import sys

from prometheus_client import CollectorRegistry

from walrelay_consumer import Metrics
from walrelay_consumer.apply import BatchOutcome


def test_hooks_count_under_the_rust_crates_names():
    registry = CollectorRegistry()
    m = Metrics.for_registry(registry)
    assert m is Metrics.for_registry(registry), "one Metrics per registry (names register once)"
    m.committed("t", 2, 5, 0.002, BatchOutcome(applied=3, duplicates=2, gaps=1, parked=True, marks={"s": "0" * 15 + "a" + "0" * 16}))
    m.skipped(4)
    m.failed()
    m.stopped("t", 2)
    m.parked_records_set(3)
    m.statistics(json.dumps({"topics": {"t": {"partitions": {"2": {"consumer_lag": 7}, "-1": {"consumer_lag": 9}}}}}))
    m.statistics("not json")
    v = registry.get_sample_value
    assert v("walrelay_consumer_records_applied_total") == 3
    assert v("walrelay_consumer_duplicates_skipped_total") == 6
    assert v("walrelay_consumer_gaps_total") == 1
    assert v("walrelay_consumer_parked_total") == 1
    assert v("walrelay_consumer_failed_attempts_total") == 1
    assert v("walrelay_consumer_retries_total") == 1
    assert v("walrelay_consumer_batch_records_sum") == 5
    assert v("walrelay_consumer_apply_seconds_count") == 1
    assert v("walrelay_consumer_hwm_commit_lsn", {"topic": "t", "partition": "2", "source": "s"}) == 10
    assert v("walrelay_consumer_lag_records", {"topic": "t", "partition": "2"}) == 7
    assert v("walrelay_consumer_lag_records", {"topic": "t", "partition": "-1"}) is None
    assert v("walrelay_consumer_partition_stopped", {"topic": "t", "partition": "2"}) == 1
    assert v("walrelay_consumer_parked_records") == 3


def test_without_prometheus_client_there_are_no_metrics_and_nothing_fails():
    code = """
import sys
sys.modules["prometheus_client"] = None  # as if it were not installed
from walrelay_consumer import ConsumerLoop, Metrics
from walrelay_consumer.apply import BatchOutcome
m = Metrics()
assert not m.enabled
m.committed("t", 0, 1, 0.1, BatchOutcome(applied=1, marks={"s": "0" * 32}))
m.skipped(1); m.failed(); m.stopped("t", 0); m.statistics("{}"); m.parked_records_set(1)
loop = ConsumerLoop({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}, ["t"], "dbname=x")
assert not loop.metrics.enabled
assert "stats_cb" not in loop._config
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_new_registry_never_gets_a_freed_ones_metrics():
    # CPython reuses a freed object's id: keyed by id alone, a test's new
    # registry once got metrics registered in a dead one.
    import gc

    from prometheus_client import CollectorRegistry

    for _ in range(50):
        registry = CollectorRegistry()
        Metrics.for_registry(registry).parked_records_set(3)
        assert registry.get_sample_value("walrelay_consumer_parked_records") == 3
        del registry
        gc.collect()
