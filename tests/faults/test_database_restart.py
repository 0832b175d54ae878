"""Database restart under load: the PostgreSQL server the controller and relay write to is
stopped mid-stream and started again; both ride it out, and nothing is lost or decided
twice. The server is one of the test's own (`ops.postgres`), so the session's shared
server is never disturbed."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger import create_database, migrate_database
from ops.postgres import PostgresServer, start_postgres
from tests.faults.stream import FaultRun, Feeder, drain, workload
from tests.faults.verify import progress, verify_run
from tests.support.db import ensure_login_roles
from tests.support.kafka import TopicFactory
from tests.support.services import service_root

pytestmark = [pytest.mark.slow, pytest.mark.integration]

EVENTS = 6_000
RATE = 300.0
DOWN_SECONDS = 4.0


def _say(message: str) -> None:
    print(f"[db-restart {time.strftime('%X')}] {message}", flush=True)


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, removed afterwards."""
    root = service_root("faults-postgres")
    server = start_postgres(root / "postgres")
    try:
        yield server
    finally:
        server.stop()  # whichever start is running now: the folder names it
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(240)
def test_a_database_restart_under_load_is_ridden_out_without_loss_or_duplicate(
    kafka_bootstrap: str, topic_factory: TopicFactory, own_server: PostgresServer, tmp_path: Path
) -> None:
    create_database(own_server.url, "recovery")
    url = own_server.url_for("recovery")
    migrate_database(url)
    ensure_login_roles(own_server, url)  # the runtime connects as its roles
    records, _ = workload(EVENTS, seed=21)
    run = FaultRun(kafka_bootstrap, url, topic_factory, tmp_path, partitions=4)
    try:
        controller, relay = run.start("controller"), run.start("relay")
        controller.wait_assigned(60)
        feeder = Feeder(run, records, RATE, _say).start()
        time.sleep(6)
        before = progress(url, run.group, run.topics.events)
        _say(f"stopping PostgreSQL (pid {own_server.pid}); {before}")
        own_server.stop()
        time.sleep(DOWN_SECONDS)
        run.check_alive(controller, relay)
        restarted = start_postgres(own_server.root, port=own_server.port)
        _say(f"PostgreSQL back after {DOWN_SECONDS:.0f}s (pid {restarted.pid})")
        produced = feeder.join(60)
        drain(run, produced, [controller, relay], 120, _say)
        after = progress(url, run.group, run.topics.events)
        assert after.consumed > before.consumed
        for process in (controller, relay):
            status = process.terminate()
            assert status == 0, f"{process} exited {status} after the restart"
    finally:
        run.close()
    _say(str(verify_run(kafka_bootstrap, url, run.topics)))
