"""`recoveryctl drill` against a running controller, relay and capability worker (real
broker and database): a drill passes and no handler is called; a deployment whose
worker does not answer the drill's command fails it, naming the missing step."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from machines import write_private_key
from producers import ActionResult, CapabilityWorker, EventPublisher, RecoveryClient
from schemas import CapabilityCommand, TopicNames
from tests.integration.humans.test_review_and_approve import recoveryctl
from tests.integration.lineage.children import Child
from tests.support.commands import worker_roster
from tests.support.kafka import TopicFactory
from tests.support.producers import DEMO_ENV, key_of, roster_document, signers
from tests.support.worker import fresh_store

pytestmark = pytest.mark.integration

WORKER = "capability-worker"
DRILLER = "demo-tool"


@pytest.fixture
def deployment(
    request: pytest.FixtureRequest,
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    tmp_path: Path,
) -> Iterator[dict[str, Any]]:
    """A controller and a relay as processes, on this test's topics and database. With
    the param True, the worker's roster entry loses its verifier grant (a wrong policy:
    its verifications are refused)."""
    producers = roster_document()
    if getattr(request, "param", False):
        for entry in producers:
            if entry["id"] == WORKER:
                entry["grants"] = [g for g in entry["grants"] if g["role"] != "verifier"]
    topics = TopicNames(
        events=topic_factory(2),
        commands=topic_factory(2),
        evidence=topic_factory(1),
        audit=topic_factory(1),
        dlq=topic_factory(1),
    )
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps({"id": "drill", "producers": producers}),
        encoding="utf-8",
    )
    env = {
        "RECOVERY_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RECOVERY_DATABASE_URL": database_url,
        "RECOVERY_CONTROLLER_GROUP_ID": f"drill-{uuid.uuid4().hex[:8]}",
        "RECOVERY_CONTROLLER_POLICY_PATH": str(policy),
        "RECOVERY_CONTROLLER_BATCH_MAX_WAIT_MS": "50",
        **DEMO_ENV,
        **{
            f"RECOVERY_TOPIC_{s.upper()}": getattr(topics, s)
            for s in ("events", "commands", "evidence", "audit", "dlq")
        },
    }
    key_file = tmp_path / "driller.key"
    write_private_key(key_file, key_of(DRILLER))
    children = [Child(role, env, tmp_path / f"{role}.log") for role in ("controller", "relay")]
    try:
        children[0].wait_assigned(60)
        yield {"topics": topics, "policy": policy, "key_file": key_file}
    finally:
        for child in children:
            child.stop()


@contextmanager
def _worker(bootstrap: str, topics: TopicNames, calls: list[str]) -> Iterator[None]:
    """A procurement worker whose handlers record every call (a drill must make none)."""

    def handler(command: CapabilityCommand) -> ActionResult:
        calls.append(command.command_id)
        return ActionResult(succeeded=True)

    stop = threading.Event()
    with EventPublisher(bootstrap, signer=signers(), topics=topics) as publisher:
        worker = CapabilityWorker(
            bootstrap,
            f"workers-{uuid.uuid4().hex[:8]}",
            RecoveryClient(publisher, producer=WORKER),
            {"procurement.verify-request": handler, "procurement.create-request": handler},
            topics=topics,
            poll_timeout=0.2,
            roster=worker_roster(),
            store=fresh_store(),
        )
        thread = threading.Thread(target=worker.run, args=(stop,))
        thread.start()
        try:
            assert worker.assigned.wait(timeout=60), "the worker got no partitions"
            yield
        finally:
            stop.set()
            thread.join(timeout=30)


def _drill(
    scenario: str,
    deployment: dict[str, Any],
    bootstrap: str,
    database_url: str,
    timeout: int,
    *json_flag: str,
) -> Any:
    topics: TopicNames = deployment["topics"]
    return recoveryctl(
        "drill",
        scenario,
        *("--producer", DRILLER, "--key-file", str(deployment["key_file"])),
        *("--policy", str(deployment["policy"]), "--timeout", str(timeout)),
        *("--bootstrap", bootstrap, "--database-url", database_url),
        *("--events-topic", topics.events, "--commands-topic", topics.commands),
        *json_flag,
        timeout=timeout + 60,
    )


def test_a_drill_passes_against_a_deployment_and_no_handler_is_called(
    kafka_bootstrap: str, database_url: str, deployment: dict[str, Any]
) -> None:
    calls: list[str] = []
    with _worker(kafka_bootstrap, deployment["topics"], calls):
        done = _drill(
            "timeout-before-side-effect", deployment, kafka_bootstrap, database_url, 60, "--json"
        )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == "pass", report["problems"]
    assert report["operation_id"].startswith("drill-")
    assert report["path"] == ["failure-reported", "verifying", "retrying", "completed"]
    assert [s["event_type"] for s in report["recorded"]] == [
        "TOOL_TIMEOUT",
        "VERIFICATION_NOT_FOUND",
        "RETRY_DUE",  # the paced retry's timer (docs/decision-core.md, "Timers")
        "RETRY_SUCCEEDED",
    ]
    assert report["recorded"] == report["predicted"]
    assert calls == [], "a worker's handler ran for a drill's command"
    assert "decision(s)" in done.stderr  # progress while waiting
    with _worker(kafka_bootstrap, deployment["topics"], calls):
        text = _drill("timeout-after-side-effect", deployment, kafka_bootstrap, database_url, 60)
    assert text.returncode == 0, text.stdout + text.stderr
    assert "PASS: the deployment responded as its machine requires" in text.stdout
    assert "failure-reported -> verifying -> completed" in text.stdout
    assert calls == []

    listed = recoveryctl(
        "ops",
        "list",
        "--json",
        "--database-url",
        database_url,
        "--policy",
        str(deployment["policy"]),
    )
    assert listed.returncode == 0, listed.stderr
    by_id = {o["operation_id"]: o for o in json.loads(listed.stdout)["operations"]}
    assert by_id[report["operation_id"]]["drill"] is True


def test_a_drill_fails_when_no_worker_answers_its_command(
    kafka_bootstrap: str, database_url: str, deployment: dict[str, Any]
) -> None:
    calls: list[str] = []
    # The procurement worker runs, but nothing serves agent.stop-task.
    with _worker(kafka_bootstrap, deployment["topics"], calls):
        done = _drill("containment", deployment, kafka_bootstrap, database_url, 6, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == "fail"
    assert report["path"] == ["failure-reported", "containing"]
    assert any(
        p.startswith("step 2: no decision of CONTAINMENT_SUCCEEDED") for p in report["problems"]
    ), report["problems"]
    text = _drill("containment", deployment, kafka_bootstrap, database_url, 3)
    assert text.returncode == 1
    assert "FAIL" in text.stdout


@pytest.mark.parametrize("deployment", [True], indirect=True)
def test_a_drill_fails_on_a_policy_that_does_not_let_the_worker_verify(
    kafka_bootstrap: str, database_url: str, deployment: dict[str, Any]
) -> None:
    calls: list[str] = []
    with _worker(kafka_bootstrap, deployment["topics"], calls):
        done = _drill(
            "timeout-after-side-effect", deployment, kafka_bootstrap, database_url, 10, "--json"
        )
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    # The controller refuses the worker's verification (role not permitted): the
    # operation stays in verifying, never completed as the scenario requires.
    assert report["path"] == ["failure-reported", "verifying"]
    assert any(
        p.startswith("step 2: no decision of VERIFICATION_FOUND") for p in report["problems"]
    ), report["problems"]
    assert calls == []
