"""The example service's command line (``examples/consumer.py``): the
settings' flags, with the Rust and Java examples' names, and ``--kafka``
settings with their secret references resolved."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from walrelay_consumer import OnPoison, Settings

SECRET = "s3cret-never-shown"


def example() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "examples" / "consumer.py"
    spec = importlib.util.spec_from_file_location("walrelay_example_consumer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_settings_flags_set_the_packages_settings():
    ex = example()
    args = argparse.Namespace(
        on_poison="park", pool_size=2, max_batch_records=50, max_batch_bytes=65536, handler_timeout_ms=1500
    )
    assert ex.settings(args) == Settings(
        on_poison=OnPoison.PARK, pool_size=2, max_batch_records=50, max_batch_bytes=65536, handler_timeout=1.5
    )
    none = argparse.Namespace(
        on_poison="stop", pool_size=None, max_batch_records=None, max_batch_bytes=None, handler_timeout_ms=None
    )
    assert ex.settings(none) == Settings()


def test_the_example_takes_every_oauth_setting_and_a_secret_from_the_environment():
    ex = example()
    pairs = [
        ex.kafka_pair(text)
        for text in (
            "security.protocol=SASL_SSL",
            "sasl.mechanism=OAUTHBEARER",
            "sasl.oauthbearer.method=oidc",
            "sasl.oauthbearer.client.id=orders-service",
            "sasl.oauthbearer.client.secret=env:KAFKA_CLIENT_SECRET",
            "sasl.oauthbearer.token.endpoint.url=http://127.0.0.1:8080/token",
            "sasl.oauthbearer.scope=kafka orders",
            "sasl.oauthbearer.extensions=logicalCluster=lkc-1,identityPoolId=pool-2",
        )
    ]
    settings = ex.kafka_settings(pairs, {"KAFKA_CLIENT_SECRET": SECRET})
    assert settings == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "orders-service",
        "sasl.oauthbearer.client.secret": SECRET,
        "sasl.oauthbearer.token.endpoint.url": "http://127.0.0.1:8080/token",
        "sasl.oauthbearer.scope": "kafka orders",
        "sasl.oauthbearer.extensions": "logicalCluster=lkc-1,identityPoolId=pool-2",
    }


def test_the_example_refuses_a_setting_without_a_value_without_showing_a_secret():
    ex = example()
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE") as raised:
        ex.kafka_pair(f"sasl.oauthbearer.client.secret:{SECRET}")
    assert SECRET not in str(raised.value)
    with pytest.raises(argparse.ArgumentTypeError, match="'linger.ms'"):
        ex.kafka_pair("linger.ms")
