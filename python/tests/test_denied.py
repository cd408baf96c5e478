"""The consumer's words for a refused ACL (``walrelay_consumer.denied``),
the same as the Rust crate's; the secured-broker run is in
``crates/walrelay/tests/kafka_security.rs``, which drives
``examples/consumer.py``."""

from __future__ import annotations

from confluent_kafka import KafkaError

from walrelay_consumer.denied import ACL_DOC, explain


def test_a_denied_topic_names_the_acl_and_the_fix() -> None:
    m = explain(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), ["orders"], "billing")
    assert m is not None
    assert 'Kafka denied Read on topic "orders"' in m
    assert "(TOPIC_AUTHORIZATION_FAILED)" in m
    assert "--operation Read --topic orders`" in m
    assert ACL_DOC in m


def test_a_denied_group_names_the_group() -> None:
    m = explain(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED), ["orders"], "billing")
    assert m is not None
    assert 'Kafka denied Read on group "billing"' in m
    assert "(GROUP_AUTHORIZATION_FAILED)" in m
    assert "--operation Read --group billing`" in m


def test_other_errors_are_not_explained() -> None:
    assert explain(KafkaError(KafkaError._TRANSPORT), ["orders"], "billing") is None
    login = explain(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED), ["orders"], "billing")
    assert login is not None and "sasl.password" in login
