"""The health endpoint of real controller and relay processes: /metrics carries the
documented series after events flowed, and /readyz fails naming the ledger while the
real PostgreSQL server is stopped, then recovers when it is back; started while it is
down (a multi-host URL), they wait, say so on /readyz, and start when it answers. The
server is the test's own (`ops.postgres`), so the session's shared server is never
disturbed."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger import create_database, migrate_database
from ops.ports import free_ports
from ops.postgres import PostgresServer, start_postgres
from tests.faults.processes import wait_until
from tests.faults.stream import FaultRun, Feeder, drain, workload
from tests.support.db import ensure_login_roles
from tests.support.kafka import TopicFactory
from tests.support.services import service_root

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, removed afterwards."""
    root = service_root("health-postgres")
    server = start_postgres(root / "postgres")
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # not listening yet
        return 0, str(exc)


def _sample(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of series `name` whose labels include `labels`."""
    total, found = 0.0, False
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{.*\}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total, found = total + float(match.group(2)), True
    assert found, f"series {name} {labels} not on /metrics:\n{text}"
    return total


@pytest.mark.timeout(180)
def test_metrics_are_scraped_and_readyz_follows_the_database(
    kafka_bootstrap: str, topic_factory: TopicFactory, own_server: PostgresServer, tmp_path: Path
) -> None:
    create_database(own_server.url, "recovery")
    url = own_server.url_for("recovery")
    migrate_database(url)
    ensure_login_roles(own_server, url)  # the runtime connects as its roles
    records, _ = workload(300, seed=19)
    run = FaultRun(kafka_bootstrap, url, topic_factory, tmp_path, partitions=2)
    c_port, r_port = free_ports(2)
    try:
        run.extra_env["RECOVERY_METRICS_ADDRESS"] = f"127.0.0.1:{c_port}"
        controller = run.start("controller")
        run.extra_env["RECOVERY_METRICS_ADDRESS"] = f"127.0.0.1:{r_port}"
        relay = run.start("relay")
        controller.wait_assigned(60)
        produced = Feeder(run, records, 500.0).start().join(60)
        drain(run, produced, [controller, relay], 90)
        for port in (c_port, r_port):
            wait_until(lambda p=port: _get(p, "/readyz")[0] == 200, 30, f"/readyz on {port}")
            assert _get(port, "/healthz")[0] == 200

        text = _get(c_port, "/metrics")[1]
        group = {"consumer_group": run.group}
        decided = _sample(text, "recovery_controller_events_processed_total", **group)
        assert 0 < decided <= produced
        assert _sample(text, "recovery_controller_batches_total", result="committed") >= 1
        assert _sample(text, "recovery_controller_batch_latency_seconds_count", **group) >= 1
        lag = _sample(
            text, "recovery_controller_consumer_lag", messaging_destination=run.topics.events
        )
        assert 0 <= lag < produced
        _sample(text, "recovery_controller_events_dead_lettered_total", **group)

        def relay_published() -> float:
            return _sample(_get(r_port, "/metrics")[1], "recovery_relay_published_total")

        assert relay_published() > 0
        wait_until(
            lambda: "recovery_outbox_backlog" in _get(r_port, "/metrics")[1], 30, "backlog gauge"
        )

        own_server.stop()
        for port, role in ((c_port, "controller"), (r_port, "relay")):
            wait_until(lambda p=port: _get(p, "/readyz")[0] == 503, 30, f"{role} not ready")
            body = json.loads(_get(port, "/readyz")[1])
            assert f"{role}.ledger" in body["failed"], body
            assert "does not answer" in body["checks"][f"{role}.ledger"]["detail"]
            assert _get(port, "/healthz")[0] == 200  # alive: it rides the outage out
        start_postgres(own_server.root, port=own_server.port)
        for port in (c_port, r_port):
            wait_until(lambda p=port: _get(p, "/readyz")[0] == 200, 60, f"/readyz on {port}")
        for process in (controller, relay):
            assert process.terminate() == 0
    finally:
        run.close()


def _multi_host(url: str, dead_port: int) -> str:
    """`url` as a libpq multi-host URL: a node that does not answer first, then the
    server, `target_session_attrs=read-write` (the form of a failover pair's URL)."""
    head, sep, rest = url.partition("@")
    hostport, slash, tail = rest.partition("/")
    joiner = "&" if "?" in tail else "?"
    return (
        f"{head}{sep}127.0.0.1:{dead_port},{hostport}{slash}{tail}"
        f"{joiner}target_session_attrs=read-write"
    )


@pytest.mark.timeout(180)
def test_roles_started_without_a_database_wait_say_so_and_start_when_it_answers(
    kafka_bootstrap: str, topic_factory: TopicFactory, own_server: PostgresServer, tmp_path: Path
) -> None:
    create_database(own_server.url, "recovery")
    plain = own_server.url_for("recovery")
    migrate_database(plain)
    ensure_login_roles(own_server, plain)
    c_port, r_port, dead = free_ports(3)
    url = _multi_host(plain, dead)
    run = FaultRun(kafka_bootstrap, url, topic_factory, tmp_path, partitions=2)
    own_server.stop()
    try:
        run.extra_env["RECOVERY_METRICS_ADDRESS"] = f"127.0.0.1:{c_port}"
        controller = run.start("controller")
        run.extra_env["RECOVERY_METRICS_ADDRESS"] = f"127.0.0.1:{r_port}"
        relay = run.start("relay")
        waiting = "waits for a read-write ledger database"
        for port in (c_port, r_port):
            wait_until(lambda p=port: waiting in _get(p, "/readyz")[1], 60, f"waiting on {port}")
            status, text = _get(port, "/readyz")
            details = [check["detail"] for check in json.loads(text)["checks"].values()]
            assert status == 503, text
            assert any("RECOVERY_DATABASE_WAIT_S" in d for d in details if waiting in d), text
        time.sleep(5)  # several backoff rounds: still waiting, not exited
        run.check_alive(controller, relay)
        start_postgres(own_server.root, port=own_server.port)
        for port in (c_port, r_port):
            wait_until(lambda p=port: _get(p, "/readyz")[0] == 200, 90, f"/readyz on {port}")
        records, _ = workload(200, seed=23)
        produced = Feeder(run, records, 500.0).start().join(60)
        drain(run, produced, [controller, relay], 90)
        for process in (controller, relay):
            assert process.terminate() == 0
    finally:
        run.close()
