"""The Kafka configuration of a consumer loop: what the loop requires, its
defaults, and static group membership (``group.instance.id``, KIP-345)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ConfigError", "REQUIRED", "DEFAULTS", "consumer_config"]

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
    return config, str(group)


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
