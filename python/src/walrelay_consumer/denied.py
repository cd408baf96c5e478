"""What the consumer loop says when Kafka refuses its principal something:
the ACL that is missing and how to grant it
(``crates/walrelay-consumer/src/denied.rs``, the same words).

A consumer needs Read on each topic it subscribes to (which implies the
Describe its metadata requests need) and Read on its group (joining,
committing and fetching offsets), nothing else; ``docs/security.md#acls``
lists them.

The principal and the login hint depend on the SASL mechanism: a user name
(``sasl.username``) for PLAIN and SCRAM, the token's subject for
OAUTHBEARER, whose login failures point at the OIDC settings instead of a
password.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

__all__ = ["ACL_DOC", "explain"]

#: Where the ACLs are documented.
ACL_DOC = "docs/security.md#acls"


def _is_oauth(mechanism: str | None) -> bool:
    return (mechanism or "").strip().upper() == "OAUTHBEARER"


def _grant(name: str, refused: str, resource_arg: str, mechanism: str | None) -> str:
    principal = "the token's subject, its sub claim" if _is_oauth(mechanism) else "sasl.username"
    return (
        f"Kafka denied {refused} to this consumer's principal ({name}): fix: grant the "
        f"principal ({principal}) that ACL, e.g. `kafka-acls --bootstrap-server BROKER "
        "--command-config ADMIN.properties --add --allow-principal User:NAME --operation "
        f"Read {resource_arg}` ({ACL_DOC})"
    )


def explain(error: KafkaError, topics: list[str], group: str, mechanism: str | None = None) -> str | None:
    """The message for ``error`` if it is an authorization or authentication
    error of a consumer of ``topics`` in ``group`` logging in with the SASL
    ``mechanism`` (``sasl.mechanism``, if any); ``None`` otherwise."""
    code = error.code()
    if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        refused = " or ".join(f'Read on topic "{t}"' for t in topics)
        topic_args = " ".join(f"--topic {t}" for t in topics)
        return _grant("TOPIC_AUTHORIZATION_FAILED", refused, topic_args, mechanism)
    if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return _grant("GROUP_AUTHORIZATION_FAILED", f'Read on group "{group}"', f"--group {group}", mechanism)
    if code in (KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION) and _is_oauth(mechanism):
        return (
            "Kafka refused the consumer's login (SASL_AUTHENTICATION_FAILED): check "
            "sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret against the client "
            "registered at the identity provider, sasl.oauthbearer.token.endpoint.url and "
            "sasl.oauthbearer.scope (or the token oauth_cb returns), and that the brokers accept "
            f"that provider's tokens ({ACL_DOC}): {error}"
        )
    if code in (KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION):
        return (
            "Kafka refused the consumer's login (SASL_AUTHENTICATION_FAILED): check "
            "sasl.mechanism, sasl.username and sasl.password against the user on the "
            f"brokers ({ACL_DOC}): {error}"
        )
    return None
