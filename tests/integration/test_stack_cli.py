"""`recoveryctl stack up|status|down` start, report and stop a real local stack, the
way developers and the demo use it (in a separate process, as from a shell)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ops.context import Context
from ops.errors import NotConfigured, StackError
from ops.kafka import wait_for_kafka
from ops.kafka_security import java_client_file
from ops.postgres_ha import NODES, HaPostgres
from ops.process import pid_alive, pid_cmdline
from ops.runtime import Services
from ops.settings import DATABASE_NAME, ENV_STACK_DIR
from ops.stack import KafkaState, LocalStack, live_state, read_state, stack_up
from ops.stack_env import ROLES
from schemas import (
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    ENV_KAFKA_CONFIG_FILE,
    ENV_ROSTER_FILE,
    KafkaSecurity,
)
from tests.support.services import service_root

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def stack_home() -> Iterator[Path]:
    home = service_root("stack-cli")
    yield home
    _recoveryctl(home, "stack", "down", "--purge")
    shutil.rmtree(home, ignore_errors=True)


def _recoveryctl(home: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return _run(home, "ops.cli", *args, timeout=timeout)


def _run(
    home: Path, module: str, *args: str, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` with no RECOVERY_* setting but the stack's folder."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RECOVERY_")}
    env[ENV_STACK_DIR] = str(home)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# It runs the quick benchmark (its own process timeout: 240 s) between a stack's start
# and stop; at load average 13 on the shared 2-core machine the whole passed 120 s.
@pytest.mark.timeout(480)
def test_stack_up_starts_both_services_reports_them_and_down_stops_them(
    stack_home: Path,
) -> None:
    up = _recoveryctl(stack_home, "stack", "up", "--json")
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    assert state["reused"] is False
    assert state["startup_seconds"] < 30
    kafka = KafkaState.model_validate(state["kafka"])
    assert kafka.security_protocol == "SASL_SSL"
    assert set(kafka.client_files) == {
        "admin",
        "controller",
        "relay",
        "tool",
        "worker",
        "siem",
        "bench",
    }
    for path in kafka.client_files.values():
        assert Path(path).stat().st_mode & 0o777 == 0o600
    assert (Path(kafka.data_dir or "") / "sasl-users.json").stat().st_mode & 0o777 == 0o600
    wait_for_kafka(kafka.bootstrap, timeout=5, security=kafka.client("admin"))
    with pytest.raises(StackError, match="did not answer"):
        wait_for_kafka(kafka.bootstrap, timeout=3, security=KafkaSecurity(protocol="PLAINTEXT"))
    with psycopg.connect(state["postgres"]["url"]) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (DATABASE_NAME,)
    _no_open_door(stack_home, state)

    status = _recoveryctl(stack_home, "stack", "status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["running"] is True

    # What `eval "$(recoveryctl stack env admin)"` gives a shell: the superuser's URL
    # and the admin client file, for this role alone (issue #31).
    admin = json.loads(_recoveryctl(stack_home, "stack", "env", "admin", "--json").stdout)
    assert admin[ENV_KAFKA_BOOTSTRAP] == kafka.bootstrap
    assert admin[ENV_DATABASE_URL] == state["postgres"]["url"]
    assert admin[ENV_KAFKA_CONFIG_FILE] == kafka.client_files["admin"]
    assert admin[ENV_CONTROLLER_SIGNING_KEY_FILE] is None  # the controller's alone
    assert Path(admin[ENV_ROSTER_FILE]) == stack_home / "keys" / "roster.json"
    assert Path(admin[ENV_ROSTER_FILE]).is_file()

    again = _recoveryctl(stack_home, "stack", "up")
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stdout
    assert "SASL_SSL" in again.stdout
    # One ready set of variables per role, never the admin's for everyone (issue #31).
    assert 'stack env ROLE)"' in again.stdout
    assert "export" not in again.stdout
    for role in ROLES:
        assert (stack_home / "env" / f"{role}.env").stat().st_mode & 0o777 == 0o600
    worker = json.loads(_recoveryctl(stack_home, "stack", "env", "worker", "--json").stdout)
    assert worker[ENV_KAFKA_CONFIG_FILE] == kafka.client_files["worker"]
    assert worker["RECOVERY_DATABASE_URL"] is None  # a worker needs no database: unset
    shell = _recoveryctl(stack_home, "stack", "env", "controller").stdout
    assert f"export RECOVERY_DATABASE_URL='{state['postgres']['role_urls']['controller']}'" in shell
    # Java clients (Kafka's own tools) beside each librdkafka file, private too.
    java = java_client_file(kafka.client_files["admin"])
    assert java.stat().st_mode & 0o777 == 0o600
    assert 'username="admin"' in java.read_text()

    acls = _recoveryctl(stack_home, "acls", "show", "--json")
    assert acls.returncode == 0, acls.stderr
    assert json.loads(acls.stdout)["authorizer"] is True

    # A fresh stack has its principals but no ACLs (`topics create` makes them): the
    # benchmark provisions its own rather than being refused its scratch topics.
    bench = _run(
        stack_home,
        "ops.bench",
        "--quick",
        "--json-out",
        str(stack_home / "bench.json"),
        timeout=240,
    )
    assert bench.returncode == 0, bench.stderr
    saturation = json.loads((stack_home / "bench.json").read_text())["saturation"]
    assert saturation["commands_missing"] == 0
    assert saturation["events_per_second"] > 0
    assert "bench" in _recoveryctl(stack_home, "acls", "show").stdout

    down = _recoveryctl(stack_home, "stack", "down")
    assert down.returncode == 0, down.stderr
    assert "stopped: kafka, postgres" in down.stdout
    assert not pid_alive(state["kafka"]["pid"])
    gone = _recoveryctl(stack_home, "stack", "env", "controller")
    assert gone.returncode != 0
    assert "no local stack runs" in gone.stderr
    assert not pid_alive(state["postgres"]["pid"])
    after = _recoveryctl(stack_home, "stack", "status")
    assert after.returncode == 1
    assert "no local stack recorded" in after.stdout


def test_stack_up_plaintext_only_when_asked_and_never_reused_as_secured(
    stack_home: Path,
) -> None:
    up = _recoveryctl(stack_home, "stack", "up", "--plaintext", "--json")
    assert up.returncode == 0, up.stderr
    kafka = KafkaState.model_validate(json.loads(up.stdout)["kafka"])
    assert kafka.security_protocol == "PLAINTEXT"
    assert kafka.client_files == {}
    wait_for_kafka(kafka.bootstrap, timeout=5, security=KafkaSecurity(protocol="PLAINTEXT"))

    secured = _recoveryctl(stack_home, "stack", "up")
    assert secured.returncode == 1
    assert "is plaintext, but a secured one was asked for" in secured.stderr
    assert "recoveryctl stack down" in secured.stderr


def test_stack_up_uses_services_named_by_the_environment(
    stack_home: Path, kafka_bootstrap: str, postgres_server: str
) -> None:
    external = {ENV_KAFKA_BOOTSTRAP: kafka_bootstrap, ENV_DATABASE_URL: postgres_server}
    up = subprocess.run(
        [sys.executable, "-m", "ops.cli", "stack", "up"],
        env={**os.environ, **external, ENV_STACK_DIR: str(stack_home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    assert "(external)" in up.stdout
    assert f"using existing services named by {ENV_KAFKA_BOOTSTRAP}" in up.stdout
    assert not (stack_home / "kafka").exists()
    assert not (stack_home / "postgres").exists()


def test_stack_up_stops_the_started_broker_when_postgres_is_unusable(
    stack_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_KAFKA_BOOTSTRAP, raising=False)
    # Nothing listens on port 1: the external server never answers.
    monkeypatch.setenv(ENV_DATABASE_URL, "postgresql://postgres@127.0.0.1:1/recovery")

    with pytest.raises(StackError, match="did not accept a connection"):
        stack_up(stack_home, external_timeout=1.0)

    assert (stack_home / "kafka" / "server.log").is_file()  # the broker did start
    assert read_state(stack_home) is None
    assert _processes_using(stack_home / "kafka") == []


def _processes_using(folder: Path) -> list[int]:
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and str(folder) in pid_cmdline(int(entry.name))
    ]


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid), f"pid {pid} survived SIGKILL"


def test_stack_up_restarts_only_the_service_that_died(stack_home: Path) -> None:
    first = json.loads(_recoveryctl(stack_home, "stack", "up", "--json").stdout)
    kafka_pid, postgres_pid = first["kafka"]["pid"], first["postgres"]["pid"]

    os.kill(kafka_pid, signal.SIGKILL)  # the broker dies; PostgreSQL lives on
    _wait_gone(kafka_pid)
    up = _recoveryctl(stack_home, "stack", "up", "--json")
    assert up.returncode == 0, up.stderr
    second = json.loads(up.stdout)
    assert "kafka restarted" in up.stderr
    assert "postgres still running" in up.stderr
    assert second["reused"] is True  # the stack stays its starter's to stop
    assert second["postgres"]["pid"] == postgres_pid
    assert second["kafka"]["pid"] != kafka_pid
    assert second["kafka"]["bootstrap"] == first["kafka"]["bootstrap"]  # same port
    recorded = read_state(stack_home)
    assert recorded is not None
    wait_for_kafka(second["kafka"]["bootstrap"], timeout=5, security=recorded.kafka.client("admin"))

    assert second["restarted"] == ["kafka"]

    os.kill(postgres_pid, signal.SIGKILL)  # now the server dies; the broker lives on
    _wait_gone(postgres_pid)
    # What a person reads: what was restarted, never "already running".
    said = _recoveryctl(stack_home, "stack", "up")
    assert said.returncode == 0, said.stderr
    assert said.stdout.startswith("restarted postgres: its process had died"), said.stdout
    assert "already running" not in said.stdout
    assert "kafka kept running" in said.stdout
    up = _recoveryctl(stack_home, "stack", "up", "--json")
    assert up.returncode == 0, up.stderr
    third = json.loads(up.stdout)
    assert third["restarted"] == []
    assert third["kafka"]["pid"] == second["kafka"]["pid"]
    assert third["postgres"]["pid"] != postgres_pid
    with psycopg.connect(third["postgres"]["url"]) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (DATABASE_NAME,)
    status = _recoveryctl(stack_home, "stack", "status", "--json")
    assert json.loads(status.stdout)["running"] is True


def test_stack_up_brokers_3_runs_a_cluster_and_restarts_only_its_dead_node(
    stack_home: Path,
) -> None:
    up = _recoveryctl(stack_home, "stack", "up", "--brokers", "3", "--json")
    assert up.returncode == 0, up.stderr
    first = json.loads(up.stdout)
    kafka = KafkaState.model_validate(first["kafka"])
    assert kafka.brokers == 3
    assert kafka.security_protocol == "SASL_SSL"
    assert len(kafka.bootstrap.split(",")) == len(set(kafka.node_pids)) == 3
    assert all(pid_alive(pid) for pid in kafka.node_pids)
    wait_for_kafka(kafka.bootstrap, timeout=10, security=kafka.client("admin"), brokers=3)

    os.kill(kafka.node_pids[1], signal.SIGKILL)  # node 2 dies; the others live on
    _wait_gone(kafka.node_pids[1])
    up = _recoveryctl(stack_home, "stack", "up", "--json")  # the recorded size is kept
    assert up.returncode == 0, up.stderr
    assert "starting nodes [2] of the 3-node Kafka cluster" in up.stderr
    assert "postgres still running" in up.stderr
    second = KafkaState.model_validate(json.loads(up.stdout)["kafka"])
    assert second.node_pids[0] == kafka.node_pids[0]
    assert second.node_pids[2] == kafka.node_pids[2]
    assert second.node_pids[1] != kafka.node_pids[1]
    assert second.bootstrap == kafka.bootstrap  # the same ports
    assert json.loads(up.stdout)["postgres"]["pid"] == first["postgres"]["pid"]
    status = _recoveryctl(stack_home, "stack", "status", "--json")
    assert json.loads(status.stdout)["running"] is True, status.stdout

    one = _recoveryctl(stack_home, "stack", "up", "--brokers", "1")
    assert one.returncode == 1
    assert "runs 3 broker(s), but --brokers 1 was asked for" in one.stderr


def _as_nobody(*command: str) -> subprocess.CompletedProcess[str]:
    """`command` as another local user, who has no business with the stack."""
    return subprocess.run(
        ["runuser", "-u", "nobody", "--", *command],
        capture_output=True, text=True, timeout=30, check=False, cwd="/",
    )  # fmt: skip


def _no_open_door(home: Path, state: dict[str, Any]) -> None:
    """Another local user gets nothing from the stack: no database session without a
    password (not even the superuser's, not even with the stack's password file), no
    Kafka log segment, no key, password or client file."""
    postgres = state["postgres"]
    bare = postgres["admin_url"].split("?", 1)[0]  # the URL without its password file
    for url in (bare, postgres["admin_url"], postgres["url"]):
        tried = _as_nobody("psql", url, "-w", "-c", "SELECT 1")
        assert tried.returncode != 0, (url, tried.stdout)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(bare, connect_timeout=5)  # the stack's owner too needs the password
    hba = Path(postgres["root"]) / "data" / "pg_hba.conf"
    assert not [line for line in hba.read_text().splitlines() if "trust" in line.split("#")[0]]
    private = [
        home / "db-roles.json",
        home / "keys" / "controller.key",
        Path(postgres["root"]) / "pgpass",
        Path(state["kafka"]["data_dir"]) / "sasl-users.json",
        Path(state["kafka"]["client_files"]["admin"]),
    ]
    segments = sorted(Path(state["kafka"]["data_dir"]).rglob("*.log"))
    assert segments, "the broker wrote no log segment yet"
    for path in [*private, segments[0], Path(state["kafka"]["data_dir"])]:
        denied = _as_nobody("cat" if path.is_file() else "ls", str(path))
        assert denied.returncode != 0, f"nobody read {path}"
    for folder in (Path(state["kafka"]["data_dir"]), home / "keys"):
        assert folder.stat().st_mode & 0o077 == 0, folder
    assert home.stat().st_mode & 0o777 == 0o711


def _resolved() -> Services | None:
    """The runtime's services as every command resolves them, or None when none is known."""
    try:
        return Context(argparse.Namespace()).runtime_services()
    except NotConfigured:
        return None


def test_no_command_trusts_the_state_of_a_stack_that_is_gone(
    stack_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_KAFKA_BOOTSTRAP, raising=False)
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.setenv(ENV_STACK_DIR, str(stack_home))
    # Stopped by the process that started it (as `ops/dev bench` does): forgotten.
    stack = stack_up(stack_home)
    assert _resolved() is not None
    stack.stop()
    assert read_state(stack_home) is None
    assert _resolved() is None
    # Killed behind the state file's back: the file stays, but nobody trusts it.
    killed = stack_up(stack_home)
    state = killed.state
    assert state.kafka.pid is not None
    assert state.postgres.pid is not None
    for pid in (state.kafka.pid, state.postgres.pid):
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid)
    assert killed.kafka is not None
    assert killed.kafka.process is not None
    killed.kafka.process.wait(5)  # reap our child
    assert read_state(stack_home) == state
    assert live_state(stack_home) is None
    assert _resolved() is None
    migrate = _recoveryctl(stack_home, "db", "migrate")
    assert migrate.returncode == 2
    assert "no database: pass --database-url" in migrate.stderr
    # And `stack up` starts both again.
    again = stack_up(stack_home)
    try:
        assert not again.reused
        assert again.alive()
    finally:
        again.stop()
    assert read_state(stack_home) is None


@pytest.mark.timeout(400)
def test_stack_up_ha_runs_a_failover_pair_that_outlives_its_primary(stack_home: Path) -> None:
    up = _recoveryctl(stack_home, "stack", "up", "--ha", "--json", timeout=240)
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)["postgres"]
    assert state["ha"] is True
    ports = state["node_ports"]
    hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
    for url in (state["url"], *state["role_urls"].values()):
        assert f"@{hosts}/" in url
        assert "target_session_attrs=read-write" in url
    with psycopg.connect(state["role_urls"]["controller"]) as conn:
        row = conn.execute("SELECT current_user, current_setting('transaction_read_only')")
        assert row.fetchone() == ("recovery_controller", "off")
    recorded = read_state(stack_home)
    assert recorded is not None
    pair = LocalStack.from_state(recorded).postgres
    assert isinstance(pair, HaPostgres)
    primary = pair.primary()
    assert primary is not None
    pair.kill(primary)

    # The CLI waits for the standby's promotion instead of failing.
    migrate = _recoveryctl(stack_home, "db", "migrate", timeout=120)
    assert migrate.returncode == 0, migrate.stderr
    assert pair.primary() not in (None, primary)
    again = _recoveryctl(stack_home, "stack", "up", "--json", timeout=240)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["postgres"]["node_ports"] == ports
    assert pair.complete()  # the killed node runs again, as the standby
    assert pair.wait_synchronous(60) != primary
    down = _recoveryctl(stack_home, "stack", "down", "--purge")
    assert down.returncode == 0, down.stderr
    assert not any(pair.running(name) for name in ("monitor", *NODES))
