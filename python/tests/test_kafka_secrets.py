"""Secret Kafka settings (``walrelay_consumer.kafka_secrets``): the relay's
rule for which settings hold one, ``env:``/``file:``/``literal:``
references, errors that never show a value (the example service's
``--kafka`` flag, which resolves them: ``test_example_cli.py``)."""

from __future__ import annotations

import pytest

from walrelay_consumer import SecretError, redacted, resolve_secrets
from walrelay_consumer.kafka_secrets import REDACTED, is_secret_property, resolve_secret

SECRET = "s3cret-never-shown"


def test_the_secret_settings_are_the_relays():
    for name in (
        "sasl.password",
        "sasl.oauthbearer.client.secret",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
        "ssl_key",
        "sasl.oauthbearer.config",
        "SASL.PASSWORD",
        "sasl.oauthbearer.assertion.private.key.passphrase",
    ):
        assert is_secret_property(name), name
    for name in (
        "sasl.username",
        "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.token.endpoint.url",
        "sasl.oauthbearer.scope",
        "sasl.oauthbearer.extensions",
        "ssl.ca.location",
        "bootstrap.servers",
    ):
        assert not is_secret_property(name), name


def test_references_resolve_from_the_environment_and_files(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    env = {"KAFKA_CLIENT_SECRET": SECRET}
    config = {
        "sasl.oauthbearer.client.secret": "env:KAFKA_CLIENT_SECRET",
        "sasl.password": f"file:{secret_file}",
        "ssl.key.password": "literal:env:not-a-reference",
        "ssl.keystore.password": "plain",
        # Only secret settings are resolved.
        "client.id": "env:KAFKA_CLIENT_SECRET",
        "oauth_cb": print,
    }
    resolved = resolve_secrets(config, env)
    assert resolved == {
        "sasl.oauthbearer.client.secret": SECRET,
        "sasl.password": SECRET,
        "ssl.key.password": "env:not-a-reference",
        "ssl.keystore.password": "plain",
        "client.id": "env:KAFKA_CLIENT_SECRET",
        "oauth_cb": print,
    }
    assert config["sasl.password"] == f"file:{secret_file}", "the input is not changed"
    secret_file.write_text(SECRET + "\r\n")
    assert resolve_secret("sasl.password", f"file:{secret_file}") == SECRET


@pytest.mark.parametrize(
    ("value", "env", "words"),
    [
        ("env:MISSING", {}, "environment variable MISSING is not set"),
        ("env:", {}, "does not name an environment variable"),
        ("env:EMPTY", {"EMPTY": ""}, "environment variable EMPTY is empty"),
        ("file:", {}, "names no file"),
        ("file:/nonexistent/secret", {}, "file /nonexistent/secret"),
    ],
)
def test_an_unresolvable_reference_names_the_setting_and_where_it_looked(value, env, words):
    with pytest.raises(SecretError) as raised:
        resolve_secrets({"sasl.oauthbearer.client.secret": value}, env)
    assert "sasl.oauthbearer.client.secret" in str(raised.value)
    assert words in str(raised.value)


def test_redacted_hides_every_secret_value():
    config = {"sasl.oauthbearer.client.secret": SECRET, "sasl.password": "env:X", "sasl.username": "u"}
    assert redacted(config) == {"sasl.oauthbearer.client.secret": REDACTED, "sasl.password": REDACTED, "sasl.username": "u"}
