"""`recoveryctl test` and `recoveryctl simulate` end to end on the catalogue."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from machines import CATALOGUE
from machines.casefile import SCENARIOS
from ops.cli import main

PROCUREMENT = CATALOGUE / "procurement-request"


def test_catalogue_cases_all_pass_and_name_every_scenario(capsys: pytest.CaptureFixture[str]):
    assert main(["test", str(CATALOGUE), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True
    assert report["counts"]["failed"] == 0
    assert report["scenarios_covered"] == list(SCENARIOS)


def _package_with_case(tmp_path: Path, case: str) -> Path:
    package = tmp_path / "procurement-request"
    (package / "tests").mkdir(parents=True)
    shutil.copy(PROCUREMENT / "RECOVERY.yaml", package / "RECOVERY.yaml")
    (package / "tests" / "case.yaml").write_text(case)
    return package


def test_failing_case_exits_1_with_expected_and_actual(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    package = _package_with_case(
        tmp_path,
        """
name: wrong expectation
scenario: timeout before a side effect
steps:
  - event: TOOL_TIMEOUT
    expect: {state: completed, invocations: []}
""",
    )
    assert main(["test", str(package)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out
    assert 'expected "completed"' in out
    assert 'actual   "verifying"' in out
    assert 'actual   ["procurement.verify-request"]' in out


def test_malformed_case_exits_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    package = _package_with_case(tmp_path, "name: x\nscenario: not a scenario\nsteps: []\n")
    assert main(["test", str(package)]) == 2
    assert "case.yaml" in capsys.readouterr().err


def test_simulate_prints_one_decision_per_event_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    base = {
        "operation_id": "op-9",
        "correlation_id": "c-9",
        "machine_name": "procurement-request",
        "machine_version": "1.0.0",
        "evidence_ref": "ev://1",
        "producer": "coupa-adapter",
        "lineage": {"agent": "agent-1", "task": "t-1", "initiating_principal": "alice"},
    }
    lines = [
        {
            "operation": {
                "id": "op-9",
                "agent": "agent-1",
                "start": "2026-01-01T00:00:00Z",
                "facts": {"idempotency_key": "k-9", "status_api": True},
            }
        },
        dict(base, event_type="TOOL_TIMEOUT", event_id="e1", event_time="2026-01-01T00:00:01Z"),
        dict(
            base,
            event_type="VERIFICATION_NOT_FOUND",
            event_id="e2",
            event_time="2026-01-01T00:00:02Z",
            producer="status-api",
            evidence={"verifier": "status-api", "outcome": "not_applied"},
        ),
        {"advance": "30s"},  # the paced retry's timer fires within it
        dict(base, event_type="TOOL_TIMEOUT", event_id="e1", event_time="2026-01-01T00:00:01Z"),
    ]
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text("id: sim\ntrusted_verifiers: [status-api]\n")
    code = main(["simulate", str(PROCUREMENT), "--events", str(events), "--policy", str(policy)])
    assert code == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    outcomes = ["transitioned", "transitioned", "fired", "duplicate"]
    assert [r["outcome"] for r in records] == outcomes
    assert [r["state_after"] for r in records] == ["verifying", "retrying", "retrying", "retrying"]
    assert records[1]["invocations"] == []
    assert records[2]["event"]["type"] == "RETRY_DUE"
    assert records[2]["invocations"][0]["capability"] == "procurement.create-request"


def test_simulate_reports_invalid_lines_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    events = tmp_path / "events.jsonl"
    events.write_text('{"event_type": "TOOL_TIMEOUT"}\nnot json\n')
    assert main(["simulate", str(PROCUREMENT), "--events", str(events)]) == 1
    err = capsys.readouterr().err
    assert "events.jsonl:1: dead-letter" in err
    assert "events.jsonl:2: dead-letter" in err
