"""The Kafka configuration of a consumer loop: what the loop requires, its
defaults, static group membership (``group.instance.id``, KIP-345), and the
client settings Kafka 4's consumer group protocol (``group.protocol=consumer``,
KIP-848) does not take.

The loop leaves ``group.protocol`` to the caller: librdkafka's default,
``classic``, works with every broker and lets a restarted static member take
its partitions back at once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ConfigError", "REQUIRED", "DEFAULTS", "NOT_WITH_CONSUMER_PROTOCOL", "consumer_config"]

#: Settings the loop depends on, and the value it requires.
REQUIRED: Mapping[str, str] = {
    # Offsets are committed by the loop, after processing.
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
    # Never see records of aborted Kafka transactions.
    "isolation.level": "read_committed",
}
#: Defaults the caller may override.
DEFAULTS: Mapping[str, str] = {
    # A new group starts at the beginning: every retained event is
    # processed once.
    "auto.offset.reset": "earliest",
}

#: Client settings refused with ``group.protocol=consumer`` (librdkafka
#: refuses to create such a consumer), and what to do instead.
NOT_WITH_CONSUMER_PROTOCOL: Mapping[str, str] = {
    "session.timeout.ms": (
        "the session timeout is the group's under this protocol: set the group's "
        "consumer.session.timeout.ms (kafka-configs --entity-type groups), or the brokers' "
        "group.consumer.session.timeout.ms, and remove session.timeout.ms"
    ),
    "heartbeat.interval.ms": (
        "the heartbeat interval is the group's under this protocol: set the group's "
        "consumer.heartbeat.interval.ms, or the brokers' group.consumer.heartbeat.interval.ms, "
        "and remove heartbeat.interval.ms"
    ),
    "partition.assignment.strategy": (
        "the broker assigns the partitions under this protocol: remove it, and set "
        "group.remote.assignor (uniform or range) if you need another assignor than the broker's default"
    ),
    "group.protocol.type": "it belongs to the classic protocol: remove it",
}


class ConfigError(ValueError):
    """The loop cannot be built with this configuration."""


def consumer_config(
    kafka: Mapping[str, Any], topics: list[str], group_instance_id: str | None
) -> tuple[dict[str, Any], str]:
    """The configuration the loop's consumer gets, and its group: ``kafka``
    with :data:`REQUIRED` (refusing other values for them), :data:`DEFAULTS`
    unless given, and ``group.instance.id`` when ``group_instance_id`` is
    given (the same as giving it in ``kafka``)."""
    config = _static_membership(dict(kafka), group_instance_id)
    group = config.get("group.id")
    if not group:
        raise ConfigError("the Kafka configuration has no group.id (high-water marks are kept per consumer group)")
    if not topics:
        raise ConfigError("no topics to consume")
    for key, required in REQUIRED.items():
        value = config.get(key)
        if value is not None and str(value).lower() != required:
            raise ConfigError(
                f"the Kafka setting {key}={value} conflicts with the consumer loop, which "
                f"needs {key}={required} (offsets are stored and committed only after processing)"
            )
        config[key] = required
    for key, default in DEFAULTS.items():
        config.setdefault(key, default)
    _check_group_protocol(config)
    return config, str(group)


def _check_group_protocol(config: Mapping[str, Any]) -> None:
    """Refuses the client-side group settings that ``group.protocol=consumer``
    does not take, naming what to set instead."""
    if str(config.get("group.protocol", "classic")).lower() != "consumer":
        return
    for key, fix in NOT_WITH_CONSUMER_PROTOCOL.items():
        if key in config:
            raise ConfigError(f"the Kafka setting {key} is not allowed with group.protocol=consumer: {fix}")


def _static_membership(config: dict[str, Any], instance_id: str | None) -> dict[str, Any]:
    """``config`` with ``group.instance.id`` set to ``instance_id``: a static
    member of its group, which must be unique per running instance (a
    second one with the same id fences the first out of the group)."""
    if instance_id is None:
        return config
    given = config.get("group.instance.id")
    if not instance_id or (given is not None and str(given) != instance_id):
        raise ConfigError(
            f"group_instance_id={instance_id!r} conflicts with group.instance.id={given!r} in the "
            "Kafka configuration, or is empty: give one non-empty id, unique per running instance"
        )
    config["group.instance.id"] = instance_id
    return config
