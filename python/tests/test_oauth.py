"""Logging in with OAuth (SASL OAUTHBEARER): the loops hand librdkafka's OIDC
settings and an ``oauth_cb`` through unchanged, and the client secret stays
out of what the package logs or raises.

librdkafka fetches an OIDC token when the consumer starts, before it talks
to any broker, so a token endpoint on 127.0.0.1 (below) and a bootstrap
address where nothing listens are enough to see what the loop's consumer
sends the identity provider. The login to a real OAuth cluster is an
end-to-end test of the relay's suites."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError
from conftest import HOST, await_condition, free_port
from prometheus_client import CollectorRegistry

from walrelay_consumer import AsyncConsumerLoop, ConsumerLoop, Settings
from walrelay_consumer.denied import explain

SECRET = "s3cret-never-logged"


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def unsigned_jwt(subject: str, lifetime: int = 3600) -> str:
    """A token librdkafka accepts (it reads the claims, the brokers check
    the signature)."""
    now = int(time.time())
    claims = {"sub": subject, "iat": now, "exp": now + lifetime, "scope": "kafka"}
    return f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}.signature"


class TokenEndpoint:
    """An OAuth 2 token endpoint (client credentials grant) that records its
    requests and answers each with a token."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], str]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
                endpoint.requests.append((dict(self.headers), body))
                reply = json.dumps(
                    {"access_token": unsigned_jwt("orders-service"), "token_type": "bearer", "expires_in": 3600}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = HTTPServer((HOST, 0), Handler)
        self.url = f"http://{HOST}:{self.server.server_port}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def token_endpoint() -> Iterator[TokenEndpoint]:
    endpoint = TokenEndpoint()
    try:
        yield endpoint
    finally:
        endpoint.close()


def oauth_kafka(token_url: str) -> dict[str, Any]:
    """A consumer configuration logging in with OIDC client credentials to
    a broker address where nothing listens."""
    return {
        "bootstrap.servers": f"{HOST}:{free_port()}",
        "group.id": "orders-service",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "orders-service",
        "sasl.oauthbearer.client.secret": SECRET,
        "sasl.oauthbearer.token.endpoint.url": token_url,
        "sasl.oauthbearer.scope": "kafka",
        "sasl.oauthbearer.extensions": "logicalCluster=lkc-1,identityPoolId=pool-2",
    }


def run_until(loop: ConsumerLoop, done: Any) -> None:
    """Runs ``loop`` (batch handler, never called here) on a thread until
    ``done()`` holds, then stops it."""
    thread = threading.Thread(target=loop.run_batches, args=(lambda conn, batch: None,), kwargs={"handle_signals": False})
    thread.start()
    try:
        await_condition("the consumer's login", done, timeout=30)
    finally:
        loop.stop()
        thread.join(30)
    assert not thread.is_alive(), "the loop did not stop"


def test_the_loop_passes_the_oidc_settings_to_librdkafka_unchanged(token_endpoint, dsn):
    config = oauth_kafka(token_endpoint.url)
    loop = ConsumerLoop(config, ["orders"], dsn, Settings(pool_size=1), CollectorRegistry())
    for key, value in config.items():
        assert loop._config[key] == value, key
    run_until(loop, lambda: token_endpoint.requests)
    headers, body = token_endpoint.requests[0]
    expected = base64.b64encode(f"orders-service:{SECRET}".encode()).decode()
    assert headers["Authorization"] == f"Basic {expected}"
    assert "grant_type=client_credentials" in body
    assert "scope=kafka" in body


def test_an_oauth_cb_is_called_by_the_loop(dsn):
    calls: list[str] = []

    def oauth_cb(oauthbearer_config: str) -> tuple[str, float]:
        calls.append(oauthbearer_config)
        return unsigned_jwt("orders-service"), time.time() + 3600

    config = {
        "bootstrap.servers": f"{HOST}:{free_port()}",
        "group.id": "orders-service",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.config": "audience=kafka",
        "oauth_cb": oauth_cb,
    }
    loop = ConsumerLoop(config, ["orders"], dsn, Settings(pool_size=1), CollectorRegistry())
    assert loop._config["oauth_cb"] is oauth_cb
    run_until(loop, lambda: calls)
    assert calls[0] == "audience=kafka"


def test_the_asyncio_loop_logs_in_with_oidc_and_serves_an_oauth_cb(token_endpoint, dsn):
    calls: list[str | None] = []

    def oauth_cb(oauthbearer_config: str | None) -> tuple[str, float]:
        calls.append(oauthbearer_config)
        return unsigned_jwt("orders-service"), time.time() + 3600

    cb_config = {
        "bootstrap.servers": f"{HOST}:{free_port()}",
        "group.id": "orders-service",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "oauth_cb": oauth_cb,
    }

    async def until(loop: AsyncConsumerLoop, done: Any) -> None:
        async def handler(conn: Any, batch: Any) -> None:
            pass

        run = asyncio.create_task(loop.run_batches(handler))
        deadline = time.monotonic() + 30
        while not done() and not run.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        loop.stop()
        await asyncio.wait_for(run, 30)

    oidc = AsyncConsumerLoop(oauth_kafka(token_endpoint.url), ["orders"], dsn, Settings(pool_size=1), CollectorRegistry())
    asyncio.run(until(oidc, lambda: token_endpoint.requests))
    assert token_endpoint.requests
    callback = AsyncConsumerLoop(cb_config, ["orders"], dsn, Settings(pool_size=1), CollectorRegistry())
    asyncio.run(until(callback, lambda: calls))
    assert calls[0] is None, "without sasl.oauthbearer.config the callback gets None"


def test_the_client_secret_is_not_in_the_logs_or_the_loop_repr(token_endpoint, dsn, caplog):
    caplog.set_level(logging.DEBUG)
    loop = ConsumerLoop(oauth_kafka(token_endpoint.url), ["orders"], dsn, Settings(pool_size=1), CollectorRegistry())
    run_until(loop, lambda: token_endpoint.requests)
    assert SECRET not in caplog.text
    assert SECRET not in repr(loop) and SECRET not in str(loop)


def test_a_refused_oauth_login_points_at_the_oidc_settings():
    refused = KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED)
    m = explain(refused, ["orders"], "billing", "OAUTHBEARER")
    assert m is not None
    for setting in ("sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret", "token.endpoint.url", "oauth_cb"):
        assert setting in m
    assert "sasl.password" not in m
    denied = explain(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), ["orders"], "billing", "oauthbearer")
    assert denied is not None and "sub claim" in denied and "sasl.username" not in denied
    # PLAIN and SCRAM logins keep the user name and password hint.
    plain = explain(refused, ["orders"], "billing", "SCRAM-SHA-512")
    assert plain is not None and "sasl.password" in plain


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "consumer.py"


def example_command(dsn: str, token_url: str) -> list[str]:
    """The example service logging in with OIDC, its client secret in the
    environment variable KAFKA_CLIENT_SECRET."""
    command = [sys.executable, str(EXAMPLE), "--bootstrap", f"{HOST}:{free_port()}", "--topic", "orders"]
    command += ["--dsn", dsn, "--group", "orders-service"]
    for key, value in oauth_kafka(token_url).items():
        if key == "sasl.oauthbearer.client.secret":
            value = "env:KAFKA_CLIENT_SECRET"
        if key not in ("bootstrap.servers", "group.id"):
            command += ["--kafka", f"{key}={value}"]
    return command


def test_the_example_logs_in_with_a_client_secret_from_the_environment(token_endpoint, dsn):
    env = {**os.environ, "KAFKA_CLIENT_SECRET": SECRET}
    proc = subprocess.Popen(
        example_command(dsn, token_endpoint.url), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        await_condition("the example's token request", lambda: token_endpoint.requests or proc.poll() is not None)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert token_endpoint.requests, out
    expected = base64.b64encode(f"orders-service:{SECRET}".encode()).decode()
    assert token_endpoint.requests[0][0]["Authorization"] == f"Basic {expected}"
    assert proc.returncode == 0, out
    assert SECRET not in out


def test_the_example_names_a_missing_secret_variable(dsn):
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_CLIENT_SECRET"}
    done = subprocess.run(
        example_command(dsn, "http://127.0.0.1:9/token"), env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "sasl.oauthbearer.client.secret: environment variable KAFKA_CLIENT_SECRET is not set" in done.stderr
