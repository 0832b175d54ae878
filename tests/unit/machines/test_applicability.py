"""applies_to selects exactly one machine per operation; audit.redact keeps sensitive
payload fields out of the audit trail as references."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from machines import (
    Machine,
    OperationScope,
    applies,
    load_catalogue,
    load_registry,
    overlapping_pairs,
)
from machines.applicability import MachineSelectionError, select_machine
from machines.errors import Code
from machines.loader import CATALOGUE
from machines.minimization import redact
from machines.model import AppliesTo, AuditSpec
from ops.cli import main

SCOPED = AppliesTo(
    capabilities=("payment.create-refund",), tools=("stripe",), environments=("production",)
)


@pytest.fixture(scope="module")
def catalogue() -> dict[str, Machine]:
    return load_catalogue(load_registry())


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        (OperationScope("payment.create-refund", "stripe", "agent-1", "production"), True),
        (OperationScope("payment.create-refund", "adyen", "agent-1", "production"), False),
        (OperationScope("payment.create-refund", "stripe", "agent-1", "staging"), False),
        (OperationScope("payment.create-refund", None, "agent-1", "production"), False),
        (OperationScope("email.send", "stripe", "agent-1", "production"), False),
    ],
)
def test_applies_needs_the_capability_and_every_listed_dimension(
    scope: OperationScope, expected: bool
) -> None:
    assert applies(SCOPED, scope) is expected


def test_empty_dimension_means_any_value() -> None:
    any_tool = AppliesTo(capabilities=("email.send",))
    assert applies(any_tool, OperationScope("email.send", tool=None, environment="anything"))


def test_select_machine_picks_the_single_governing_catalogue_machine(
    catalogue: dict[str, Machine],
) -> None:
    scope = OperationScope("procurement.create-request", "coupa", "agent-7", "production")
    assert select_machine(catalogue.values(), scope).name == "procurement-request"


def test_select_machine_refuses_an_operation_no_machine_governs(
    catalogue: dict[str, Machine],
) -> None:
    with pytest.raises(MachineSelectionError) as caught:
        select_machine(catalogue.values(), OperationScope("crm.delete-contact"))
    assert caught.value.codes == (Code.NO_MACHINE_APPLIES,)


def test_select_machine_refuses_when_two_machines_govern_one_operation(
    catalogue: dict[str, Machine],
) -> None:
    twin = replace(catalogue["email-send"], name="email-send-twin")
    with pytest.raises(MachineSelectionError) as caught:
        select_machine(
            [catalogue["email-send"], twin],
            OperationScope("email.send", "postfix", "a-1", "staging"),
        )
    assert caught.value.codes == (Code.APPLIES_TO_OVERLAP,)
    assert "email-send-twin@1.0.0" in str(caught.value)


def test_catalogue_machines_do_not_overlap(catalogue: dict[str, Machine]) -> None:
    assert overlapping_pairs(catalogue.values()) == []


def test_validate_warns_about_overlapping_machines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    twin = tmp_path / "email-send-twin"
    shutil.copytree(CATALOGUE / "email-send", twin)
    text = (twin / "RECOVERY.yaml").read_text()
    (twin / "RECOVERY.yaml").write_text(text.replace("name: email-send", "name: email-send-twin"))
    assert main(["validate", "--json", str(CATALOGUE / "email-send"), str(twin)]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [[w["code"] for w in r["warnings"]] for r in results] == [["applies-to-overlap"]] * 2


def test_redact_replaces_listed_payload_fields_with_a_marker_and_no_digest() -> None:
    audit = AuditSpec(retention_days=30, redact=("payload.body", "payload.customer.email"))
    payload = {"body": "secret text", "customer": {"email": "a@b.c", "id": "c-1"}, "n": 1}
    cleaned = redact(audit, payload)
    # No digest of the value: a digest of a small value gives it back to a guesser.
    assert cleaned["body"] == {"redacted": True}
    assert cleaned["customer"]["email"] == {"redacted": True}
    assert cleaned["customer"]["id"] == "c-1"
    assert cleaned["n"] == 1
    assert payload["body"] == "secret text"  # the input is not modified
    assert payload["customer"]["email"] == "a@b.c"
