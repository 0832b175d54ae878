"""docs/operations.md, "Upgrading a machine" and "Changing the rules without a restart",
run as written: each ```sh block of those sections in bash, against a controller process
(`python -m consumer`, as a deployment runs it) on the session's broker and a database of
this test's own, with an operation in flight on the old version. The test sets only what
the page says the blocks use (the controller's settings, `$NEW`, `$PUBLISHER`,
`$PUBLISHER_KEY`, `$APPROVER_KEY`, `$OP`, `$NEW_POLICY`, `$CONTROLLER_PIDS`) and checks
the ledger between blocks: nothing lost, nothing dead-lettered, each decision under the
version and policy it names, the controller never restarted."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest

from consumer import rules_chain_id
from ledger import PostgresLedger
from machines import write_private_key
from tests.integration.consumer.harness import Tool, open_ledger, write_policy
from tests.integration.lineage.children import Child, wait_until
from tests.support.kafka import TopicFactory
from tests.support.producers import DEMO_ENV, key_of
from tests.support.roles import role_env
from tests.support.rollout import PUBLISHER, package, review_renamed, signed_lock

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT: Final = Path(__file__).resolve().parents[2]
PAGE: Final = ROOT / "docs" / "operations.md"
BLOCK: Final = re.compile(r"^```sh\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def section_blocks(title: str) -> list[str]:
    """The ```sh blocks of the section `## title` of the page, in order."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return BLOCK.findall(text[start : end if end > 0 else len(text)])


def test_the_runbooks_have_the_blocks_this_test_runs() -> None:
    upgrade = section_blocks("Upgrading a machine")
    assert len(upgrade) == 4, upgrade
    assert "machines promote" in upgrade[1]
    assert "ops migrate" in upgrade[2]
    assert "machines retire" in upgrade[3]
    (policy,) = section_blocks("Changing the rules without a restart")
    assert "kill -HUP" in policy


@pytest.fixture
def deployment(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """A controller process under a lock pinning email-send 1.0.0 only (signed by a
    publisher of the test's own), the new version's package unsigned beside it, and the
    environment the runbooks' blocks expect."""
    signed = signed_lock(tmp_path / "machines", [("email-send", "1.0.0", None)])
    new = package(tmp_path / "machines", signed.key, "email-send", "2.0.0", review_renamed)
    (new / "RECOVERY.sig").unlink()
    publisher_key = tmp_path / "publisher.pem"
    write_private_key(publisher_key, signed.key)
    approver_key = tmp_path / "approver.pem"
    write_private_key(approver_key, key_of("approver-1"))
    policy = write_policy(tmp_path, key_of("approver-1"))
    new_policy = tmp_path / "policy-next.yaml"
    stricter = {**json.loads(policy.read_text()), "max_retry_attempts": 1}
    new_policy.write_text(json.dumps(stricter), encoding="utf-8")
    topic = topic_factory(2)
    env = {
        "RECOVERY_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RECOVERY_DATABASE_URL": database_url,
        "RECOVERY_TOPIC_EVENTS": topic,
        "RECOVERY_CONTROLLER_GROUP_ID": f"rollout-{uuid.uuid4().hex[:8]}",
        "RECOVERY_CONTROLLER_POLICY_PATH": str(policy),
        "RECOVERY_CONTROLLER_LOCK_PATH": str(signed.lock),
        "RECOVERY_CONTROLLER_TRUSTED_PUBLISHERS_PATH": str(signed.trust),
        # Only the runbooks' signals reload it: the watch would race the blocks.
        "RECOVERY_CONTROLLER_RULES_WATCH_SECONDS": "0",
        "RECOVERY_CONTROLLER_BATCH_MAX_WAIT_MS": "50",
        **DEMO_ENV,
    }
    controller = Child("controller", env, tmp_path / "controller.log")
    try:
        controller.wait_assigned(90)
        yield {
            "env": env,
            "topic": topic,
            "controller": controller,
            "blocks": {
                **env,
                "NEW": str(new),
                "PUBLISHER": PUBLISHER,
                "PUBLISHER_KEY": str(publisher_key),
                "APPROVER_KEY": str(approver_key),
                "NEW_POLICY": str(new_policy),
                "CONTROLLER_PIDS": str(controller.pid),
            },
            "log": tmp_path / "controller.log",
        }
    finally:
        controller.stop()


def _run(blocks: list[str], env: Mapping[str, str]) -> str:
    script = "set -euo pipefail\n" + "\n".join(blocks)
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env=role_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return output


def _decided(ledger: PostgresLedger, op: str, count: int) -> None:
    wait_until(lambda: len(ledger.decisions(op)) >= count, 60, f"{count} decision(s) on {op}")


def _changes(ledger: PostgresLedger, group: str) -> list[dict[str, Any]]:
    records, _ = ledger.audit_chain(rules_chain_id(group))
    return [dict(r.record) for r in records]


def test_a_machine_is_upgraded_and_the_policy_changed_with_work_in_flight(
    deployment: dict[str, Any], database_url: str
) -> None:
    ledger = open_ledger(database_url)
    group = deployment["env"]["RECOVERY_CONTROLLER_GROUP_ID"]
    tool = Tool(deployment["env"]["RECOVERY_KAFKA_BOOTSTRAP"], deployment["topic"])
    try:
        # In flight on 1.0.0 before the upgrade: escalated, its commands open.
        tool.event("email-send", "op-old", "TOOL_TIMEOUT")
        tool.flush()
        _decided(ledger, "op-old", 1)
        assert ledger.operation("op-old").state == "unresolved"
        assert [c["kind"] for c in _changes(ledger, group)] == ["rules-loaded"]

        upgrade = section_blocks("Upgrading a machine")
        env = {**deployment["blocks"], "OP": "op-old"}
        out = _run(upgrade[:2], env)
        assert "current email-send@1.0.0" in out  # locking keeps the current version
        assert "current email-send@2.0.0 (was 1.0.0)" in out
        wait_until(
            lambda: [c["kind"] for c in _changes(ledger, group)][-1:] == ["rules-changed"],
            30,
            "the controller to reload the lock",
        )
        change = _changes(ledger, group)[-1]
        assert change["new"]["current"] == {"email-send": "2.0.0"}
        assert change["trigger"].startswith("SIGHUP")

        # A new operation opens on 2.0.0; the old one stays on 1.0.0 whatever its
        # events name, and nothing is dead-lettered.
        tool.event("email-send", "op-new", "TOOL_TIMEOUT")
        tool.event("email-send", "op-old", "TOOL_FAILED", version="2.0.0")
        tool.flush()
        _decided(ledger, "op-new", 1)
        _decided(ledger, "op-old", 2)
        assert ledger.operation("op-new").machine_version == "2.0.0"
        assert ledger.operation("op-new").state == "awaiting-review"
        named = ledger.decisions("op-old")[1]["machine"]
        assert (named["version"], named["named_version"]) == ("1.0.0", "2.0.0")

        out = _run(upgrade[2:], env)
        assert "retire refused: operations in flight" in out
        assert "op-old" in out
        assert "published MIGRATION_APPROVED" in out
        assert "transitioned, unresolved -> awaiting-review" in out
        assert "retired email-send@1.0.0" in out
        assert "2 of 2 operation(s) replay as recorded" in out
        info = ledger.operation("op-old")
        assert (info.machine_version, info.state) == ("2.0.0", "awaiting-review")
        migration = ledger.decisions("op-old")[-1]["migration"]
        assert migration["states"] == {"unresolved": "awaiting-review"}
        wait_until(
            lambda: _changes(ledger, group)[-1]["new"]["machines"].keys() == {"email-send@2.0.0"},
            30,
            "the controller to reload the lock without 1.0.0",
        )

        # The policy changes under the running controller; an invalid one is refused.
        (policy_block,) = section_blocks("Changing the rules without a restart")
        before = ledger.decisions("op-old")[-1]["policy_digest"]
        out = _run([policy_block], env)
        wait_until(
            lambda: _changes(ledger, group)[-1]["changed"] == ["policy"],
            30,
            "the controller to reload the policy",
        )
        after = _changes(ledger, group)[-1]["new"]["policy"]["digest"]
        assert after != before
        assert after in out  # `policy digest` prints it
        tool.event("email-send", "op-old", "TOOL_TIMEOUT", version="1.0.0")
        tool.flush()
        _decided(ledger, "op-old", 4)
        assert ledger.decisions("op-old")[-1]["policy_digest"] == after

        Path(env["RECOVERY_CONTROLLER_POLICY_PATH"]).write_text("id: [", encoding="utf-8")
        deployment["controller"].hangup()
        wait_until(
            lambda: _changes(ledger, group)[-1]["kind"] == "rules-change-refused",
            30,
            "the controller to refuse the broken policy",
        )
        tool.event("email-send", "op-new", "TOOL_FAILED")
        tool.flush()
        _decided(ledger, "op-new", 2)
        assert ledger.decisions("op-new")[-1]["policy_digest"] == after

        # Nothing dead-lettered, the audit intact, every decision replays under the
        # version and the policy it names; the controller ran throughout.
        assert not [r for r in ledger.audit_operation_ids() if r.startswith("intake:")]
        assert ledger.verify_audit() == ()
        assert deployment["controller"].alive()
    finally:
        tool.close()
        ledger.close()


def test_the_replay_of_the_runbook_deployment_uses_the_recorded_policies(
    deployment: dict[str, Any], database_url: str
) -> None:
    """`replay --verify` after a policy change, with the new policy loaded: the
    decisions made under the old one replay under the old one's recorded document."""
    ledger = open_ledger(database_url)
    group = deployment["env"]["RECOVERY_CONTROLLER_GROUP_ID"]
    tool = Tool(deployment["env"]["RECOVERY_KAFKA_BOOTSTRAP"], deployment["topic"])
    env = {**deployment["blocks"], "OP": "op-p"}
    try:
        tool.event("email-send", "op-p", "TOOL_TIMEOUT")
        tool.flush()
        _decided(ledger, "op-p", 1)
        (policy_block,) = section_blocks("Changing the rules without a restart")
        _run([policy_block], env)
        wait_until(lambda: _changes(ledger, group)[-1]["changed"] == ["policy"], 30, "the reload")
        tool.event("email-send", "op-p", "TOOL_FAILED")
        tool.flush()
        _decided(ledger, "op-p", 2)
        digests = [d["policy_digest"] for d in ledger.decisions("op-p")]
        assert digests[0] != digests[1]
        out = _run([".venv/bin/recoveryctl replay --verify op-p --json"], env)
        report = json.loads(out[out.index("{") :])
        assert report["operations"][0]["status"] == "ok", report
    finally:
        tool.close()
        ledger.close()
