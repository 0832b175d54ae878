"""The exact JSON form of an `OperationView`, stored in `operations.view`.

`load_views` must give the decision core the very view `apply` produced, or a replayed
batch would be decided differently from the first time. So every field is written,
sets are written sorted (a stable encoding) and datetimes as ISO-8601 with their offset,
and `view_from_json(view_to_json(v)) == v` for every view (a unit test holds us to it).
"""

from __future__ import annotations

from datetime import datetime
from types import MappingProxyType
from typing import Any

from ledger.jsonutil import dumps
from machines.event import Event
from machines.view import (
    Approval,
    Checkpoint,
    LineageStatus,
    OperationView,
    ToolFacts,
    Verification,
)

__all__ = ["envelope_json", "facts_to_json", "view_from_json", "view_to_json"]


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _parse_time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _required_time(value: str) -> datetime:
    return datetime.fromisoformat(value)


def view_to_json(view: OperationView) -> dict[str, Any]:
    """The view as plain JSON-ready data, with a fixed key set and sorted sets."""
    return {
        "operation_id": view.operation_id,
        "machine_name": view.machine_name,
        "machine_digest": view.machine_digest,
        "policy_digest": view.policy_digest,
        "state": view.state,
        "lineage": {
            "agent": view.lineage.agent,
            "lineage_agents": sorted(view.lineage.lineage_agents),
            "contained_ancestors": list(view.lineage.contained_ancestors),
        },
        "facts": facts_to_json(view.facts),
        "version": view.version,
        "epoch": view.epoch,
        "verifications": [
            {
                "verifier": v.verifier,
                "outcome": v.outcome,
                "reference": v.reference,
                "event_id": v.event_id,
                "epoch": v.epoch,
            }
            for v in view.verifications
        ],
        "retry_attempts": view.retry_attempts,
        "recovery_attempts": view.recovery_attempts,
        "budget_limit": view.budget_limit,
        "budget_spent": view.budget_spent,
        "deadline": _time(view.deadline),
        "approvals": [_approval_to_json(a) for a in view.approvals],
        "used_nonces": sorted(view.used_nonces),
        "checkpoints": [_checkpoint_to_json(c) for c in view.checkpoints],
        "entry_approval": view.entry_approval,
        "seen_events": dict(sorted(view.seen_events.items())),
    }


def facts_to_json(facts: ToolFacts) -> dict[str, Any]:
    """The tool integration's declared facts as JSON (also the `operations.facts` column)."""
    return {
        "idempotency_key": facts.idempotency_key,
        "side_effect_possible": facts.side_effect_possible,
        "side_effect_confirmed": facts.side_effect_confirmed,
        "compensation_supported": facts.compensation_supported,
        "status_api": facts.status_api,
    }


def _approval_to_json(a: Approval) -> dict[str, Any]:
    return {
        "approver": a.approver,
        "state": a.state,
        "transition": a.transition,
        "machine_digest": a.machine_digest,
        "expires_at": a.expires_at.isoformat(),
        "nonce": a.nonce,
        "decision": a.decision,
        "event_id": a.event_id,
        "consumed": a.consumed,
    }


def _checkpoint_to_json(c: Checkpoint) -> dict[str, Any]:
    return {
        "checkpoint_id": c.checkpoint_id,
        "saved_at": c.saved_at.isoformat(),
        "reference": c.reference,
        "validated": c.validated,
        "validator": c.validator,
        "machine_digest": c.machine_digest,
        "policy_digest": c.policy_digest,
        "valid_until": _time(c.valid_until),
        "event_id": c.event_id,
    }


def view_from_json(data: dict[str, Any]) -> OperationView:
    """Rebuild the exact `OperationView` that `view_to_json` wrote."""
    lineage = data["lineage"]
    return OperationView(
        operation_id=data["operation_id"],
        machine_name=data["machine_name"],
        machine_digest=data["machine_digest"],
        policy_digest=data["policy_digest"],
        state=data["state"],
        lineage=LineageStatus(
            agent=lineage["agent"],
            lineage_agents=frozenset(lineage["lineage_agents"]),
            contained_ancestors=tuple(lineage["contained_ancestors"]),
        ),
        facts=ToolFacts(**data["facts"]),
        version=data["version"],
        epoch=data["epoch"],
        verifications=tuple(Verification(**v) for v in data["verifications"]),
        retry_attempts=data["retry_attempts"],
        recovery_attempts=data["recovery_attempts"],
        budget_limit=data["budget_limit"],
        budget_spent=data["budget_spent"],
        deadline=_parse_time(data["deadline"]),
        approvals=tuple(
            Approval(**{**a, "expires_at": _required_time(a["expires_at"])})
            for a in data["approvals"]
        ),
        used_nonces=frozenset(data["used_nonces"]),
        checkpoints=tuple(
            Checkpoint(
                **{
                    **c,
                    "saved_at": _required_time(c["saved_at"]),
                    "valid_until": _parse_time(c["valid_until"]),
                }
            )
            for c in data["checkpoints"]
        ),
        entry_approval=data["entry_approval"],
        seen_events=MappingProxyType(dict(data["seen_events"])),
    )


def envelope_json(event: Event) -> str:
    """The canonical JSON of `event.to_dict()` (the full envelope, SPEC §6.2), written
    field by field for the common shapes because `to_dict`'s generic walk dominated the
    cost of a batch; rarer shapes (human decisions, classifier output, checkpoints) go
    through `to_dict`. A unit test holds both paths to the same result."""
    evidence = event.evidence
    if (
        event.human_decision is not None
        or event.classifier is not None
        or (evidence is not None and evidence.checkpoint is not None)
    ):
        return dumps(event.to_dict())
    lineage = event.lineage
    return dumps(
        {
            "event_type": event.event_type,
            "event_id": event.event_id,
            "operation_id": event.operation_id,
            "correlation_id": event.correlation_id,
            "machine_name": event.machine_name,
            "machine_version": event.machine_version,
            "event_time": event.event_time.isoformat(),
            "evidence_ref": event.evidence_ref,
            "producer": event.producer,
            "lineage": {
                "agent": lineage.agent,
                "task": lineage.task,
                "initiating_principal": lineage.initiating_principal,
                "origin_operation": lineage.origin_operation,
                "parent_operation": lineage.parent_operation,
                "delegated_credentials": list(lineage.delegated_credentials),
            },
            "evidence": None
            if evidence is None
            else {
                "outcome": evidence.outcome,
                "verifier": evidence.verifier,
                "reference": evidence.reference,
                "checkpoint": None,
                "ancestor_operation": evidence.ancestor_operation,
            },
            "human_decision": None,
            "classifier": None,
            "causation": event.causation,
            "payload_digest": event.payload_digest,
        }
    )
