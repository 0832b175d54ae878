"""Audit records map to OCSF API Activity events that carry their chain link."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas import WireCode, WireError, audit_to_ocsf


def _published(outcome: str = "transitioned", **top: Any) -> dict[str, Any]:
    """An audit record in the ledger's published shape: chain fields and a decision body."""
    record: dict[str, Any] = {
        "operation_id": "op-17",
        "sequence": 4,
        "kind": "decision",
        "prev_hash": "sha256:prev",
        "hash": "sha256:this",
        "record": {
            "decided_at": "2026-11-30T03:00:00.250000+00:00",
            "machine": {"name": "email-send", "version": "1.0.0", "digest": "sha256:m"},
            "event": {
                "id": "evt-1",
                "type": "TOOL_TIMEOUT",
                "correlation_id": "corr-1",
                "producer": "smtp-relay",
            },
            "outcome": outcome,
            "state_before": "failure-reported",
            "state_after": "unresolved",
        },
    }
    record.update(top)
    return record


def test_a_transition_is_a_successful_api_activity_update_with_its_chain_hash() -> None:
    ocsf = audit_to_ocsf(_published())
    assert (ocsf["class_uid"], ocsf["category_uid"], ocsf["activity_id"]) == (6003, 6, 3)
    assert ocsf["type_uid"] == 600303
    assert ocsf["status_id"] == 1
    assert ocsf["time"] == 1_796_007_600_250  # 2026-11-30T03:00:00.250Z in ms
    assert ocsf["metadata"]["uid"] == "sha256:this"
    assert ocsf["metadata"]["correlation_uid"] == "corr-1"
    chain = ocsf["unmapped"]["recovery"]["chain"]
    assert chain == {
        "operation_id": "op-17",
        "sequence": 4,
        "hash": "sha256:this",
        "prev_hash": "sha256:prev",
    }
    assert ocsf["actor"]["user"]["uid"] == "smtp-relay"
    assert ocsf["api"]["operation"] == "TOOL_TIMEOUT"
    assert ocsf["api"]["request"]["uid"] == "evt-1"
    assert ocsf["resources"][0]["uid"] == "op-17"
    assert ocsf["resources"][0]["name"] == "email-send@1.0.0"
    assert ocsf["resources"][0]["data"]["state_after"] == "unresolved"
    json.dumps(ocsf)  # plain JSON a SIEM can ingest


@pytest.mark.parametrize(
    ("outcome", "status", "severity"),
    [("rejected", 2, 3), ("refused", 2, 4), ("conflict", 2, 4), ("duplicate", 1, 1)],
)
def test_refusals_are_failures_and_louder(outcome: str, status: int, severity: int) -> None:
    ocsf = audit_to_ocsf(_published(outcome))
    assert (ocsf["status_id"], ocsf["severity_id"]) == (status, severity)


def test_a_flat_dead_letter_record_maps_to_other_activity() -> None:
    ocsf = audit_to_ocsf(
        {
            "operation_id": "op-9",
            "sequence": 1,
            "kind": "dead_letter",
            "hash": "sha256:h",
            "prev_hash": "sha256:g",
            "occurred_at": "2026-11-30T03:00:00Z",
            "actor": "controller-1",
            "machine_name": "payment-refund",
            "machine_version": "1.0.0",
            "machine_digest": "sha256:m",
        }
    )
    assert (ocsf["activity_id"], ocsf["status_id"], ocsf["severity_id"]) == (99, 2, 4)
    assert ocsf["actor"]["user"]["name"] == "controller-1"
    assert ocsf["unmapped"]["recovery"]["machine"]["digest"] == "sha256:m"


@pytest.mark.parametrize("missing", ["hash", "operation_id", "sequence", "kind"])
def test_a_record_without_its_chain_link_is_refused(missing: str) -> None:
    record = _published()
    record.pop(missing)
    with pytest.raises(WireError) as info:
        audit_to_ocsf(record)
    assert info.value.code is WireCode.RECORD_INVALID
    assert missing in info.value.reason


def test_a_record_without_a_zoned_time_is_refused() -> None:
    record = _published()
    record["record"]["decided_at"] = "2026-11-30T03:00:00"
    with pytest.raises(WireError, match="op-17#4"):
        audit_to_ocsf(record)
