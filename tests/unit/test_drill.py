"""The drill's prediction, without services: each drill scenario, decided through the
core with the workers' drill answers under the demo policy, takes the scenario's path;
a recorded step that differs, is missing or was acted on for real is named."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import (
    DEFAULT_REGISTRY,
    Event,
    Machine,
    Rules,
    load_policy,
    load_registry,
    public_key_text,
    write_private_key,
)
from machines.provenance import load_locked_machines, load_trusted_publishers
from ops.cli import main
from ops.demo_scenarios import DEMO_POLICY, Scenario, operation_id_for
from ops.drill import (
    DRILL_SCENARIOS,
    DrillStep,
    compare,
    drill_lineage,
    opening_event,
    path_of,
    predict,
)
from schemas import DRILL_OPERATION_PREFIX, is_drill_operation

_NOW = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def _setup(name: str) -> tuple[Scenario, Machine, Rules, Event]:
    folder = Path(DEFAULT_REGISTRY).parent
    registry = load_registry(DEFAULT_REGISTRY)
    trust = load_trusted_publishers(folder / "trusted-publishers.yaml")
    machines = {
        m.name: m for m in load_locked_machines(folder / "machines.lock", registry, trust).values()
    }
    scenario = DRILL_SCENARIOS[name]
    machine = machines[scenario.machine]
    rules = Rules(load_policy(DEMO_POLICY), registry)
    op = operation_id_for(scenario, "unit", prefix=DRILL_OPERATION_PREFIX)
    opening = opening_event(
        scenario, machine, op, "unit", "demo-tool", drill_lineage("unit", scenario), _NOW
    )
    return scenario, machine, rules, opening


@pytest.mark.parametrize("name", sorted(DRILL_SCENARIOS))
def test_each_drill_is_predicted_along_its_scenario_path(name: str) -> None:
    scenario, machine, rules, opening = _setup(name)
    assert is_drill_operation(opening.operation_id)
    predicted = predict(machine, rules, opening, {})
    assert path_of(predicted) == scenario.path
    assert sorted(c for s in predicted for c in s.commands) == sorted(scenario.commands)
    assert compare(scenario, predicted, predicted, []) == []


def test_a_missing_a_differing_and_a_real_answer_are_each_named() -> None:
    scenario, machine, rules, opening = _setup("timeout-before-side-effect")
    predicted = predict(machine, rules, opening, {})
    # The paced retry's timer fires (RETRY_DUE) between the verification and its answer.
    first, verify, due, retry = predicted
    assert (due.event_type, due.commands) == ("RETRY_DUE", ("procurement.create-request",))
    missing = compare(scenario, predicted, (first, verify, due), [])
    assert any("step 4: no decision of RETRY_SUCCEEDED" in p for p in missing)
    wrong = DrillStep(
        verify.event_type, verify.causation, "verifying", "escalated", ("human.escalate",)
    )
    differs = compare(scenario, predicted, (first, wrong), [])
    assert any(
        p.startswith("step 2: recorded VERIFICATION_NOT_FOUND: verifying -> escalated")
        for p in differs
    )
    acted = [
        {
            "event": {
                "type": "RETRY_SUCCEEDED",
                "causation": retry.causation,
                "evidence_ref": "coupa:REQ-1",
            }
        }
    ]
    real = compare(scenario, predicted, predicted, acted)
    assert real == [
        f"the answer to command {retry.causation} (RETRY_SUCCEEDED) has evidence 'coupa:REQ-1', "
        "not a drill answer: a worker acted on a drill's command"
    ]


def _cli_drill(
    tmp_path: Path, producer: str, key_holder: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    keys = {name: Ed25519PrivateKey.generate() for name in ("tool-a", "tool-b")}
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps(
            {
                "id": "drill-unit",
                "producers": [
                    {
                        "id": name,
                        "keys": [{"public_key": public_key_text(key.public_key())}],
                        "grants": [{"role": "tool", "capabilities": ["*"]}],
                    }
                    for name, key in keys.items()
                ],
            }
        ),
        encoding="utf-8",
    )
    key_file = tmp_path / "drill.key"
    write_private_key(key_file, keys[key_holder])
    code = main(
        [
            "drill",
            "containment",
            *("--producer", producer, "--key-file", str(key_file), "--policy", str(policy)),
            # Never reached: the roster check comes before the broker and the ledger.
            *("--bootstrap", "127.0.0.1:9", "--database-url", "postgresql://nobody@127.0.0.1:9/x"),
        ]
    )
    return code, capsys.readouterr().err


def test_a_drill_signed_by_a_producer_outside_the_roster_is_not_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _cli_drill(tmp_path, "mallory", "tool-a", capsys)
    assert code == 2
    assert "producer mallory is not in the controller's roster" in err
    assert "nothing was published" in err


def test_a_drill_whose_key_is_not_the_producers_is_not_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _cli_drill(tmp_path, "tool-a", "tool-b", capsys)
    assert code == 2
    assert "not one of roster producer tool-a's keys" in err
