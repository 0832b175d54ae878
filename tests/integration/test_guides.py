"""The guides' examples run as a user runs them: `recoveryctl run` under the example
policy as one process, the example script as another, both against the session's broker
and a database of this test's own, on topics of its own (named through RECOVERY_TOPIC_*).
Each example must exit 0 and print the steps its guide describes."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

import pytest

from schemas import (
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    ENV_ROSTER_FILE,
    TopicNames,
)
from tests.support.commands import worker_roster
from tests.support.kafka import TopicFactory
from tests.support.keys import ensure_controller_key
from tests.support.roles import log_tail, role_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT: Final = Path(__file__).resolve().parents[2]
EXAMPLES: Final = ROOT / "docs" / "examples"
# An example waits this long for its scenario before it gives up and exits 1.
SCENARIO_TIMEOUT: Final = "45"


@pytest.fixture
def guide_env(topic_factory: TopicFactory, tmp_path: Path) -> dict[str, str]:
    """RECOVERY_TOPIC_* naming topics of this test's own, our code on the path, and the
    examples' producer keys and roster, made as the guide says (`example_keys.py`)."""
    names = TopicNames(
        events=topic_factory(3),
        commands=topic_factory(3),
        evidence=topic_factory(3),
        audit=topic_factory(3),
        dlq=topic_factory(3),
    )
    env = {f"RECOVERY_TOPIC_{field.upper()}": value for field, value in names.model_dump().items()}
    made = subprocess.run(
        [sys.executable, str(EXAMPLES / "example_keys.py"), str(tmp_path / "keys")],
        cwd=ROOT,
        env=role_env({"PYTHONPATH": str(ROOT)}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    roster = Path(made.stdout.strip())
    assert (roster.parent / "coupa-worker.pem").stat().st_mode & 0o777 == 0o600
    # The controller signs with the session's key; the examples' workers verify against
    # a roster naming it, as docs/capability-worker.md tells a worker to.
    workers = tmp_path / "worker-roster.json"
    workers.write_text(json.dumps(worker_roster().model_dump(mode="json")), encoding="utf-8")
    return {
        **env,
        "PYTHONPATH": str(ROOT),
        "RECOVERY_CONTROLLER_ROSTER_PATH": str(roster),
        ENV_CONTROLLER_SIGNING_KEY_FILE: str(ensure_controller_key()),
        ENV_ROSTER_FILE: str(workers),
    }


@pytest.fixture
def runtime(
    kafka_bootstrap: str, database_url: str, guide_env: Mapping[str, str], tmp_path: Path
) -> Iterator[Path]:
    """`recoveryctl run` (controller and relay) as the guides start it, with the example
    policy; yields its log file and stops it with SIGTERM afterwards."""
    log_path = tmp_path / "recoveryctl-run.log"
    # `python -m ops.cli` is the `recoveryctl` entry point, under this test's interpreter.
    env = {
        **guide_env,
        "RECOVERY_CONTROLLER_POLICY_PATH": str(EXAMPLES / "policy.yaml"),
        "RECOVERY_CONTROLLER_GROUP_ID": f"guides-{uuid.uuid4().hex[:8]}",
        # `recoveryctl run` runs both roles on this one administrative URL of the test
        # server; the controller refuses a superuser unless told to.
        "RECOVERY_CONTROLLER_ALLOW_SUPERUSER": "1",
    }
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ops.cli",
                "run",
                "--bootstrap",
                kafka_bootstrap,
                "--database-url",
                database_url,
            ],
            cwd=ROOT,
            env=role_env(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield log_path
        assert proc.poll() is None, f"recoveryctl run died:\n{log_tail(log_path, 40)}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def run_example(
    name: str, kafka_bootstrap: str, database_url: str, env: Mapping[str, str], log: Path
) -> str:
    """Run docs/examples/`name` as a user would; return its stdout after asserting exit 0."""
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / name),
            "--bootstrap",
            kafka_bootstrap,
            "--database-url",
            database_url,
            "--timeout",
            SCENARIO_TIMEOUT,
            "--keys",
            str(Path(env["RECOVERY_CONTROLLER_ROSTER_PATH"]).parent),
        ],
        cwd=ROOT,
        env=role_env(env),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, (
        f"{name} exited {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-3000:]}"
        f"\nrecoveryctl run:\n{log_tail(log, 30)}"
    )
    return done.stdout


def assert_in_order(output: str, patterns: list[str]) -> None:
    """Each pattern matches a line of `output`, in this order."""
    lines, at = output.splitlines(), 0
    for pattern in patterns:
        found = next((i for i in range(at, len(lines)) if re.search(pattern, lines[i])), None)
        assert found is not None, f"no line matching {pattern!r} after line {at}:\n{output}"
        at = found + 1


def test_tool_timeout_is_verified_not_applied_and_retried_with_the_same_key(
    kafka_bootstrap: str, database_url: str, guide_env: dict[str, str], runtime: Path
) -> None:
    out = run_example("tool_timeout.py", kafka_bootstrap, database_url, guide_env, runtime)

    key = re.search(r"idempotency key (req-\S+)", out)
    assert key is not None, out
    assert_in_order(
        out,
        [
            rf"^tool: calling procurement\.create-request with idempotency key {key[1]}$",
            r"^tool: .*the effect is unknown$",
            r"^tool: reported TOOL_TIMEOUT ",
            r"^worker: verify \S+:1:0: status API has no request under .*: not_applied$",
            rf"^worker: retry \S+:3:0 with idempotency key {key[1]}: created REQ-00001",
            r"^ledger: TOOL_TIMEOUT: failure-reported -> verifying$",
            r"^ledger: VERIFICATION_NOT_FOUND: verifying -> retrying$",
            # The retry is paced: the controller's timer commands it (issue #29).
            r"^ledger: RETRY_DUE: retrying -> retrying$",
            r"^ledger: RETRY_SUCCEEDED: retrying -> completed$",
            rf"^OK: verified not applied, retried once with {key[1]}, completed$",
        ],
    )


def test_capability_worker_executes_a_redelivered_command_once_after_a_crash(
    kafka_bootstrap: str, database_url: str, guide_env: dict[str, str], runtime: Path
) -> None:
    out = run_example("capability_worker.py", kafka_bootstrap, database_url, guide_env, runtime)

    assert_in_order(
        out,
        [
            r"^tool: reported TOOL_TIMEOUT for (\S+) \(idempotency key req-\S+\)$",
            r"^worker-1: verify \S+:1:0: not_applied$",
            r"^worker-1: executed (\S+:3:0): created REQ-00001 with key req-\S+$",
            r"^worker-1: crashing before reporting the result$",
            r"^worker-1: gone; the offset of its last command is not committed$",
            r"^worker-2: starting in the same group$",
            r"^worker-2: verify \S+:4:0: applied$",
            r"^worker-2: stopped after 1 command\(s\) executed, 1 in flight before, "
            r"2 result\(s\) reported$",
            r"^ledger: RETRY_DUE \(event timer:\S+:2:retry, causation None\): "
            r"retrying -> retrying$",
            r"^ledger: RETRY_FAILED \(event result:(\S+:3:0), causation \S+:3:0\): "
            r"retrying -> verifying$",
            r"^ledger: VERIFICATION_FOUND \(event result:(\S+:4:0), causation \S+:4:0\): "
            r"verifying -> completed$",
            r"^OK: the retry ran once across the crash",
        ],
    )
    assert out.count("created REQ-") == 1


@pytest.mark.parametrize("name", ["tool_timeout.py", "capability_worker.py"])
def test_an_example_without_services_exits_2_naming_the_variables(name: str) -> None:
    env = role_env({"PYTHONPATH": str(ROOT)})
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert ENV_KAFKA_BOOTSTRAP in done.stderr
    assert ENV_DATABASE_URL in done.stderr
