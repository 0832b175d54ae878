"""Across languages, end to end: the TypeScript tool and worker (producers/typescript, the
example of docs/tool-integration-typescript.md) against the session's secured broker,
`recoveryctl run` (the Python controller and relay) and PostgreSQL. A timeout is
verified not applied and retried with the same idempotency key; the TypeScript worker
executes the retry once, is killed with SIGKILL before it records or reports it, and its
restart on the same execution store reports an unknown outcome instead of executing
again; the machine verifies again and completes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import LedgerInspector
from machines import Lineage, public_key_text, write_private_key
from producers import EventPublisher
from schemas import CapabilityCommand, TopicNames
from tests.integration.test_guides import guide_env, runtime  # noqa: F401 (fixtures)
from tests.support.commands import controller_signer, send_command
from tests.support.producers import signers
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


def _retry(operation: str) -> CapabilityCommand:
    """A retry of `operation`'s procurement request, as the controller issues one."""
    return CapabilityCommand(
        command_id=f"{operation}:2:0",
        capability="procurement.create-request",
        kind="retry",
        material=True,
        params={},
        origin="transition",
        operation_id=operation,
        correlation_id=f"corr-{operation}",
        causation_event_id=f"result:{operation}:1:0",
        machine_name="procurement-request",
        machine_version="1.0.0",
        machine_digest="sha256:" + "ab" * 32,
        sequence=2,
        lineage=Lineage(agent="procurement-agent", task="t", initiating_principal="alice"),
        issued_at=datetime.now(UTC),
        idempotency_key=f"req-{operation}",
    )


def _send(bootstrap: str, env: Mapping[str, str], *commands: CapabilityCommand) -> None:
    topics = TopicNames(
        events=env["RECOVERY_TOPIC_EVENTS"], commands=env["RECOVERY_TOPIC_COMMANDS"]
    )
    with EventPublisher(bootstrap, signer=signers(), topics=topics) as publisher:
        for command in commands:
            send_command(publisher, topics.commands, command, controller_signer())


def test_a_typescript_worker_group_misses_no_command_published_after_it_first_joined(
    node_env: dict[str, str],
    kafka_bootstrap: str,
    tmp_path: Path,
    workers: list[NodeProcess],
) -> None:
    # History before the group exists is not executed (a new group starts at the end);
    # a member killed before its first command has committed that start, so the command
    # published while no member runs is executed by the next one, as by a Python worker.
    keys = Path(node_env["RECOVERY_CONTROLLER_ROSTER_PATH"]).parent
    run = uuid.uuid4().hex[:8]
    old, missed = _retry(f"op-old-{run}"), _retry(f"op-between-{run}")
    _send(kafka_bootstrap, node_env, old)
    argv = [
        str(EXAMPLES / "worker.js"),
        *("--keys", str(keys), "--store", str(tmp_path / "store.sqlite")),
        *("--system", str(tmp_path / "system.txt"), "--group", f"ts-start-{run}"),
    ]
    first = NodeProcess(argv, node_env, tmp_path / "w1.log")
    workers.append(first)
    first.wait_for("worker: assigned", 60)
    first.wait_for("group starts 3 partition(s)", 5)
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(timeout=10)

    _send(kafka_bootstrap, node_env, missed)
    second = NodeProcess(argv, node_env, tmp_path / "w2.log")
    workers.append(second)
    second.wait_for(f"executed {missed.command_id}", 60)
    time.sleep(2)  # time for a wrongly executed historical command to show too
    executed = [line for w in workers for line in w.lines if "worker: executed" in line]
    assert executed == [
        f"worker: executed {missed.command_id} with idempotency key req-{missed.operation_id}"
    ]
    assert not any("group starts" in line for line in second.lines), second.lines


SHARED_TOOL: Final = "ts-shared-tool"
RUNTIME: Final = "ts-agent-runtime"


@pytest.fixture
def shared_tool(guide_env: dict[str, str]) -> Path:  # noqa: F811
    """The examples' roster, before the controller reads it, with a procurement tool
    whose grant names no agent and the agent's runtime (`orchestrator` for it), each
    with its key in the examples' keys folder; returns that folder."""
    roster_path = Path(guide_env["RECOVERY_CONTROLLER_ROSTER_PATH"])
    roster = json.loads(roster_path.read_text(encoding="utf-8"))
    grants = {
        SHARED_TOOL: [
            {
                "role": "tool",
                "capabilities": ["procurement.create-request"],
                "tools": ["coupa"],
                "environments": ["production"],
            }
        ],
        RUNTIME: [{"role": "orchestrator", "agents": ["procurement-agent"]}],
    }
    for producer, grant in grants.items():
        key = Ed25519PrivateKey.generate()
        write_private_key(roster_path.parent / f"{producer}.pem", key)
        public = public_key_text(key.public_key())
        roster["producers"].append(
            {"id": producer, "keys": [{"public_key": public}], "grants": grant}
        )
    roster_path.write_text(json.dumps(roster), encoding="utf-8")
    return roster_path.parent


def test_a_typescript_tool_forwards_the_runtime_call_context_that_proves_the_agent(
    node_env: dict[str, str],
    shared_tool: Path,
    runtime: Path,  # noqa: F811
    database_url: str,
) -> None:
    # A shared tool's grant names no agent: the operation opens only on the call context
    # the agent's runtime signed (TypeScript, issueCallContext) and the tool forwarded;
    # without one, the opening is dead-lettered as agent-unproven.
    run = uuid.uuid4().hex[:8]
    vouched, bare = f"op-ctx-{run}", f"op-bare-{run}"
    example = [str(EXAMPLES / "tool-timeout.js"), "--keys", str(shared_tool)]
    for operation, extra in ((vouched, ["--runtime", RUNTIME]), (bare, [])):
        tool = subprocess.run(
            ["node", *example, "--producer", SHARED_TOOL, "--operation", operation, *extra],
            cwd=ROOT,
            env=node_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert tool.returncode == 0, tool.stdout + tool.stderr
        assert (f"with the call context of {RUNTIME}" in tool.stdout) == bool(extra)
    inspector = LedgerInspector(database_url, max_size=1)
    try:
        deadline = time.monotonic() + 45
        letters: dict[str, str] = {}
        views: dict[str, Any] = {}
        while time.monotonic() < deadline and not (letters and views):
            views = dict(inspector.load_views([vouched]))
            letters = {
                d.payload["operation_id"]: d.payload["reason_code"]
                for d in inspector.dead_letters(node_env["RECOVERY_TOPIC_DLQ"])
            }
            time.sleep(0.3)
    finally:
        inspector.close()
    assert letters == {bare: "agent-unproven"}, f"{letters}\n{log_tail(runtime, 30)}"
    view = views[vouched]
    assert (view.opened_by, view.agent_proof) == (SHARED_TOOL, f"call-context:{RUNTIME}")
    with psycopg.connect(database_url) as db:
        row = db.execute("SELECT runtime FROM operations WHERE operation_id = %s", (vouched,))
        assert row.fetchone() == ("procurement-runtime-3",)  # lineage.runtime, envelope v6
    assert _state(database_url, bare) is None
