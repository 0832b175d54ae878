"""`recoveryctl run` and `python -m consumer` refuse to start without an explicit policy,
or with a key derived from a public name, unless in demo mode (issues 19 and 14 item 4);
against the real broker and a migrated ledger, so nothing but the policy stops them."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Final

import pytest

from tests.support.db import with_user
from tests.support.kafka import TopicFactory
from tests.support.roles import role_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT: Final = Path(__file__).resolve().parents[3]
DEMO_POLICY: Final = ROOT / "ops" / "demo_policy.yaml"


def _recoveryctl_run(
    kafka_bootstrap: str, database_url: str, topic: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    env = {"RECOVERY_TOPIC_EVENTS": topic, "RECOVERY_CONTROLLER_GROUP_ID": uuid.uuid4().hex}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ops.cli",
            "run",
            "--role",
            "controller",
            "--bootstrap",
            kafka_bootstrap,
            "--database-url",
            with_user(database_url, "recovery_controller"),
            *flags,
        ],
        cwd=ROOT,
        env=role_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_recoveryctl_run_refuses_a_public_name_key_and_names_it(
    kafka_bootstrap: str, database_url: str, topic_factory: TopicFactory
) -> None:
    done = _recoveryctl_run(
        kafka_bootstrap, database_url, topic_factory(), "--policy", str(DEMO_POLICY)
    )
    assert done.returncode == 2, done.stderr
    assert "controller-public-name-key-refused: policy demo" in done.stderr
    assert "approvers[approver-dana]" in done.stderr
    assert "insecure_test_key('approver-dana')" in done.stderr
    assert "running" not in done.stderr  # nothing started


def test_recoveryctl_run_refuses_to_start_without_a_policy(
    kafka_bootstrap: str, database_url: str, topic_factory: TopicFactory
) -> None:
    done = _recoveryctl_run(kafka_bootstrap, database_url, topic_factory())
    assert done.returncode == 2, done.stderr
    assert "controller-policy-missing" in done.stderr
    assert "ops/policy.production.yaml" in done.stderr
    assert "--demo" in done.stderr


def test_recoveryctl_run_in_demo_mode_starts_and_names_each_public_name_key(
    kafka_bootstrap: str, database_url: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    log_path = tmp_path / "run.log"
    env = {
        "RECOVERY_TOPIC_EVENTS": topic_factory(),
        "RECOVERY_CONTROLLER_GROUP_ID": uuid.uuid4().hex,
    }
    argv = [sys.executable, "-m", "ops.cli", "run", "--role", "controller", "--demo"]
    argv += ["--policy", str(DEMO_POLICY), "--bootstrap", kafka_bootstrap]
    argv += ["--database-url", with_user(database_url, "recovery_controller")]
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=role_env(env), stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 60
        while " assigned " not in log_path.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()
            time.sleep(0.2)
        text = log_path.read_text()
        assert " assigned " in text, text
        assert "RUNS IN DEMO MODE (RECOVERY_DEMO_MODE): policy demo" in text
        assert "PUBLIC-NAME KEY" in text
        assert "approvers[approver-dana]" in text
        assert "starting IN DEMO MODE: policy demo" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, log_path.read_text()


def test_python_m_consumer_refuses_a_public_name_key_with_status_2(
    kafka_bootstrap: str, database_url: str, topic_factory: TopicFactory
) -> None:
    env = {
        "RECOVERY_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RECOVERY_DATABASE_URL": database_url,
        "RECOVERY_TOPIC_EVENTS": topic_factory(),
        "RECOVERY_CONTROLLER_POLICY_PATH": str(DEMO_POLICY),
    }
    done = subprocess.run(
        [sys.executable, "-m", "consumer"],
        cwd=ROOT,
        env=role_env(env, "controller"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "error: controller-public-name-key-refused" in done.stderr
