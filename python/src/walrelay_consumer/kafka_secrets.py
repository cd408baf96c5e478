"""Secrets in a Kafka configuration: which settings hold one, references to
where a secret is kept (an environment variable, a file) instead of the
secret itself, and a copy of a configuration that is safe to log.

The rule is the relay's (``crates/walrelay/src/secrets.rs``): a setting
whose name contains ``password``, ``secret`` or ``passphrase``, ends with
``key.pem``, or is ``ssl_key`` or ``sasl.oauthbearer.config`` holds a secret
(``sasl.password``, ``sasl.oauthbearer.client.secret``,
``ssl.key.password``, ...). Its value may be a reference:

============================  ==================================================
value                         resolves to
============================  ==================================================
``env:NAME``                  the value of environment variable ``NAME``
``file:/path/to/file``        the file's contents, without one trailing newline
``literal:text``              ``text`` as written (a secret that starts with
                              ``env:``, ``file:`` or ``literal:``)
anything else                 itself
============================  ==================================================

The loops do not resolve references themselves: a service calls
:func:`resolve_secrets` on the configuration it builds (the example service,
``examples/consumer.py``, does it for its ``--kafka`` settings), so a secret
never has to be written on a command line, where other users of the machine
can read it. Errors name the setting and the variable or file, never a
value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .kafka_config import ConfigError

__all__ = ["REDACTED", "SecretError", "is_secret_property", "redacted", "resolve_secret", "resolve_secrets"]

#: What a secret's value is shown as.
REDACTED = "<redacted>"


class SecretError(ConfigError):
    """A secret setting's reference cannot be resolved (a variable not set,
    a file not readable, an empty secret)."""


def is_secret_property(name: str) -> bool:
    """Whether the Kafka setting ``name`` holds a secret (the relay's rule)."""
    name = name.lower()
    return (
        "password" in name
        or "secret" in name
        or "passphrase" in name
        or name.endswith("key.pem")
        or name in ("ssl_key", "sasl.oauthbearer.config")
    )


def resolve_secret(name: str, value: str, environ: Mapping[str, str] | None = None) -> str:
    """The secret that ``value``, the value of the secret setting ``name``,
    stands for (see the module). ``environ`` defaults to ``os.environ``."""
    env = os.environ if environ is None else environ
    if value.startswith("literal:"):
        return value[len("literal:") :]
    if value.startswith("env:"):
        variable = value[len("env:") :]
        if not variable or "=" in variable or "\0" in variable:
            raise SecretError(
                f"the Kafka setting {name}: `env:{variable}` does not name an environment variable (write `env:NAME`)"
            )
        if variable not in env:
            raise SecretError(f"the Kafka setting {name}: environment variable {variable} is not set")
        return _not_empty(name, env[variable], f"environment variable {variable}")
    if value.startswith("file:"):
        path = value[len("file:") :]
        if not path:
            raise SecretError(f"the Kafka setting {name}: `file:` names no file (write `file:/path/to/secret`)")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            raise SecretError(f"the Kafka setting {name}: file {path} is not valid UTF-8") from None
        except OSError as e:
            raise SecretError(f"the Kafka setting {name}: file {path}: {e.strerror or e}") from None
        # `echo secret > file` and most editors end the file with a newline
        # that is not part of the secret.
        if text.endswith("\n"):
            text = text[:-1]
            if text.endswith("\r"):
                text = text[:-1]
        return _not_empty(name, text, f"file {path}")
    return value


def _not_empty(name: str, value: str, origin: str) -> str:
    if not value:
        raise SecretError(f"the Kafka setting {name}: {origin} is empty")
    return value


def resolve_secrets(config: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A copy of ``config`` with the references of its secret settings
    resolved (see the module); other settings, and values that are not
    strings (callbacks such as ``oauth_cb``), are left as they are. The
    result holds secrets in clear text: give it to the loop, never to a
    log (:func:`redacted`)."""
    return {
        key: resolve_secret(key, value, environ) if isinstance(value, str) and is_secret_property(key) else value
        for key, value in config.items()
    }


def redacted(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` to log or show: every secret setting's value
    replaced by :data:`REDACTED` (references too, since a resolved secret
    may itself look like one)."""
    return {key: REDACTED if is_secret_property(key) else value for key, value in config.items()}
