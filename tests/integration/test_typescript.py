"""Across languages, end to end: the TypeScript tool and worker (producers/typescript, the
example of docs/tool-integration-typescript.md) against the session's secured broker,
`recoveryctl run` (the Python controller and relay) and PostgreSQL. A timeout is
verified not applied and retried with the same idempotency key; the TypeScript worker
executes the retry once, is killed with SIGKILL before it records or reports it, and its
restart on the same execution store reports an unknown outcome instead of executing
again; the machine verifies again and completes."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

import psycopg
import pytest

from tests.integration.test_guides import guide_env, runtime  # noqa: F401 (fixtures)
from tests.support.roles import log_tail, role_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

ROOT: Final = Path(__file__).resolve().parents[2]
PACKAGE: Final = ROOT / "producers" / "typescript"
EXAMPLES: Final = PACKAGE / "dist" / "src" / "examples"


class NodeProcess:
    """A node process whose stdout lines are collected by a thread."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log: Path) -> None:
        self.lines: list[str] = []
        self.log = log
        self.proc = subprocess.Popen(
            ["node", *argv],
            cwd=ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._copier = threading.Thread(target=self._copy, daemon=True)
        self._copier.start()

    def _copy(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("w", encoding="utf-8") as out:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                out.write(line)
                out.flush()

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return
            if self.proc.poll() is not None and not any(text in line for line in self.lines):
                time.sleep(0.2)
                break
            time.sleep(0.1)
        raise AssertionError(f"no line with {text!r}:\n" + "\n".join(self.lines[-40:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._copier.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def node_env(guide_env: dict[str, str], kafka_bootstrap: str) -> dict[str, str]:  # noqa: F811
    assert (EXAMPLES / "worker.js").exists(), "producers/typescript is not built: ops/dev bootstrap"
    return role_env({**guide_env, "RECOVERY_KAFKA_BOOTSTRAP": kafka_bootstrap})


@pytest.fixture
def workers() -> Iterator[list[NodeProcess]]:
    started: list[NodeProcess] = []
    yield started
    for process in started:
        process.stop()


def _state(database_url: str, operation: str) -> str | None:
    """The operation's state in the ledger (read only to check the scenario)."""
    with psycopg.connect(database_url) as db:
        row = db.execute(
            "SELECT state FROM operations WHERE operation_id = %s", (operation,)
        ).fetchone()
    return None if row is None else str(row[0])


def test_a_typescript_tool_and_worker_recover_a_timeout_once_across_a_kill(
    node_env: dict[str, str],
    runtime: Path,  # noqa: F811
    database_url: str,
    tmp_path: Path,
    workers: list[NodeProcess],
) -> None:
    keys = Path(node_env["RECOVERY_CONTROLLER_ROSTER_PATH"]).parent
    operation = f"op-ts-{uuid.uuid4().hex[:8]}"
    system, store = tmp_path / "procurement-system.txt", tmp_path / "worker-store.sqlite"
    group = f"ts-worker-{uuid.uuid4().hex[:8]}"
    worker_args = [
        str(EXAMPLES / "worker.js"),
        "--keys",
        str(keys),
        "--store",
        str(store),
        "--system",
        str(system),
        "--group",
        group,
    ]
    first = NodeProcess([*worker_args, "--hang-after-effect"], node_env, tmp_path / "w1.log")
    workers.append(first)
    first.wait_for("worker: assigned", 60)

    tool = subprocess.run(
        ["node", str(EXAMPLES / "tool-timeout.js"), "--keys", str(keys), "--operation", operation],
        cwd=ROOT,
        env=node_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert tool.returncode == 0, tool.stdout + tool.stderr + log_tail(runtime, 30)
    assert "reported TOOL_TIMEOUT evt-" in tool.stdout

    first.wait_for(f"verify {operation}:1:0: not_applied", 60)
    first.wait_for(f"executed {operation}:2:0 with idempotency key req-{operation}", 60)
    first.wait_for("hanging before recording", 10)
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(timeout=10)

    second = NodeProcess(worker_args, node_env, tmp_path / "w2.log")
    workers.append(second)
    second.wait_for(f"{operation}:2:0 was in flight when a worker stopped", 60)
    second.wait_for(f"verify {operation}:3:0: applied", 60)

    deadline = time.monotonic() + 45
    state = None
    while time.monotonic() < deadline:
        state = _state(database_url, operation)
        if state == "completed":
            break
        time.sleep(0.3)
    assert state == "completed", f"operation {operation} is {state}\n{log_tail(runtime, 40)}"
    assert system.read_text(encoding="utf-8").splitlines() == [f"req-{operation}"]
    executed = [line for w in workers for line in w.lines if "worker: executed" in line]
    assert len(executed) == 1, executed
