"""The controller refuses to run as a PostgreSQL superuser unless told to (issue #15)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumer.errors import ControllerError
from consumer.service import run_controller
from consumer.settings import ControllerSettings
from tests.integration.consumer.harness import write_policy
from tests.support.db import with_user
from tests.support.kafka import TopicFactory
from tests.support.producers import DEMO_ENV

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def test_controller_refuses_to_start_as_a_superuser_and_says_what_to_do(
    database_url: str,
) -> None:
    settings = ControllerSettings(
        bootstrap="127.0.0.1:9",
        database_url=database_url,
        instance_id="controller-su",
        policy_path=ROOT / "ops" / "policy.production.yaml",
    )
    with pytest.raises(ControllerError) as caught:
        run_controller(settings, threading.Event())
    message = str(caught.value)
    assert message.startswith("controller-superuser-refused: ")
    assert "controller controller-su connects to the ledger as postgres" in message
    assert "recovery_controller" in message
    assert "RECOVERY_CONTROLLER_ALLOW_SUPERUSER=1" in message


def _start(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "consumer"],
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _read_until(process: subprocess.Popen[bytes], marker: bytes, timeout: float) -> bytes:
    """The process's output up to the first line holding `marker` (or its end)."""
    assert process.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        seen += line
        if marker in line or (not line and process.poll() is not None):
            break
    return seen


@pytest.mark.parametrize("allow", [False, True])
def test_python_m_consumer_as_superuser_runs_only_with_the_override(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    tmp_path: Path,
    allow: bool,
) -> None:
    env = {
        "RECOVERY_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RECOVERY_DATABASE_URL": database_url,
        "RECOVERY_TOPIC_EVENTS": topic_factory(),
        "RECOVERY_CONTROLLER_GROUP_ID": f"g-{uuid.uuid4().hex}",
        "RECOVERY_CONTROLLER_POLICY_PATH": str(
            write_policy(tmp_path, Ed25519PrivateKey.generate())
        ),
        **DEMO_ENV,
    }
    if allow:
        env["RECOVERY_CONTROLLER_ALLOW_SUPERUSER"] = "1"
    process = _start(env)
    try:
        output = _read_until(process, b" assigned ", 60).decode("utf-8", "replace")
        if not allow:
            assert process.wait(timeout=30) == 1, output
            assert "controller-superuser-refused" in output
            return
        assert process.poll() is None, output
        assert "WARNING consumer: controller" in output
        assert "RUNS AS POSTGRESQL SUPERUSER postgres" in output
        assert " assigned " in output
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_python_m_consumer_as_the_controller_role_starts_without_a_warning(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> None:
    env = {
        "RECOVERY_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RECOVERY_DATABASE_URL": with_user(database_url, "recovery_controller"),
        "RECOVERY_TOPIC_EVENTS": topic_factory(),
        "RECOVERY_CONTROLLER_GROUP_ID": f"g-{uuid.uuid4().hex}",
        "RECOVERY_CONTROLLER_POLICY_PATH": str(
            write_policy(tmp_path, Ed25519PrivateKey.generate())
        ),
        **DEMO_ENV,
    }
    process = _start(env)
    try:
        output = _read_until(process, b" assigned ", 60).decode("utf-8", "replace")
        assert " assigned " in output, output
        assert "SUPERUSER" not in output
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
