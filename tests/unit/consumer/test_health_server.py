"""The health endpoint on loopback: status codes, the JSON body naming failed checks,
and OpenTelemetry instruments exposed in Prometheus text format."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider

from consumer import HealthServer, SettingsError


@pytest.fixture
def server() -> Iterator[HealthServer]:
    health = HealthServer("127.0.0.1:0").start()
    try:
        yield health
    finally:
        health.close()


def _get(health: HealthServer, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{health.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_readyz_fails_until_a_role_registers(server: HealthServer) -> None:
    status, body = _get(server, "/readyz")
    assert status == 503
    assert json.loads(body)["failed"] == ["started"]
    assert _get(server, "/healthz")[0] == 200


def test_a_failing_check_is_named_with_its_reason(server: HealthServer) -> None:
    state: dict[str, str | None] = {"ledger": "the ledger database does not answer"}
    server.add("controller", live=lambda: {"loop": None}, ready=lambda: dict(state))
    status, body = _get(server, "/readyz")
    document = json.loads(body)
    assert status == 503
    assert document["failed"] == ["controller.ledger"]
    assert document["checks"]["controller.ledger"]["detail"] == state["ledger"]
    state["ledger"] = None
    status, body = _get(server, "/readyz")
    assert (status, json.loads(body)["status"]) == (200, "ok")


def test_a_probe_that_raises_is_a_failing_check(server: HealthServer) -> None:
    def broken() -> dict[str, str | None]:
        raise RuntimeError("boom")

    server.add("relay", live=broken, ready=broken)
    status, body = _get(server, "/healthz")
    assert status == 503
    assert json.loads(body)["failed"] == ["relay.probe"]


def test_metrics_expose_the_roles_instruments_in_prometheus_format(
    server: HealthServer,
) -> None:
    providers = [MeterProvider(metric_readers=[server.metric_reader()]) for _ in range(2)]
    try:
        providers[0].get_meter("a").create_counter("recovery.controller.events.processed").add(
            3, {"consumer.group": "g1"}
        )
        providers[1].get_meter("b").create_counter("recovery.relay.published").add(
            2, {"topic": "recovery.commands"}
        )
        status, text = _get(server, "/metrics")
    finally:
        for provider in providers:
            provider.shutdown()
    assert status == 200
    lines = text.splitlines()
    assert any(
        line.startswith("recovery_controller_events_processed_total{")
        and 'consumer_group="g1"' in line
        and line.endswith(" 3.0")
        for line in lines
    ), text
    assert any(line.startswith("recovery_relay_published_total{") for line in lines), text
    assert sum(line.startswith("# TYPE target_info") for line in lines) == 1


def test_an_address_that_is_not_host_port_is_refused() -> None:
    with pytest.raises(SettingsError, match="RECOVERY_METRICS_ADDRESS"):
        HealthServer("localhost")
