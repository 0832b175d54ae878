"""The capability command value: what the controller asks a capability worker to do.

A command is built from a recorded decision's `Invocation` plus the operation's context
(`from_invocation`), published on `recovery.commands` as a `recovery.CapabilityCommand`
record, and read back by workers (`from_record`). `command_id` is deterministic, so a
redelivered command is recognised; the worker's result event names it as causation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from machines import Invocation, Lineage, canonical_bytes
from schemas.errors import WireCode, WireError

__all__ = ["DRILL_OPERATION_PREFIX", "CapabilityCommand", "is_drill_operation"]

# Operations whose id starts with this are response drills (`recoveryctl drill`,
# CONFORMANCE L4.6): the controller decides them like any other, and every command it
# emits for them carries the id, so a worker answers them without touching the world.
DRILL_OPERATION_PREFIX: Final = "drill-"


def is_drill_operation(operation_id: str) -> bool:
    """Whether `operation_id` names a drill (see `DRILL_OPERATION_PREFIX`)."""
    return operation_id.startswith(DRILL_OPERATION_PREFIX)


@dataclass(frozen=True, slots=True)
class CapabilityCommand:
    """One capability invocation, with everything a worker needs to act and to report."""

    command_id: str
    capability: str
    kind: str
    material: bool
    params: Mapping[str, Any]
    origin: str
    operation_id: str
    correlation_id: str
    causation_event_id: str
    machine_name: str
    machine_version: str
    machine_digest: str
    sequence: int
    lineage: Lineage
    issued_at: datetime
    deadline: datetime | None = None
    idempotency_key: str | None = None

    @property
    def drill(self) -> bool:
        """Whether this command belongs to a drill operation: answer it, never act."""
        return is_drill_operation(self.operation_id)

    @classmethod
    def from_invocation(
        cls,
        invocation: Invocation,
        *,
        operation_id: str,
        correlation_id: str,
        causation_event_id: str,
        machine_name: str,
        machine_version: str,
        machine_digest: str,
        sequence: int,
        lineage: Lineage,
        issued_at: datetime,
        deadline: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> CapabilityCommand:
        """The command for one invocation of a recorded decision (the relay calls this
        when it turns an outbox row into a record)."""
        return cls(
            command_id=invocation.command_id,
            capability=invocation.capability,
            kind=invocation.kind,
            material=invocation.material,
            params=dict(invocation.params),
            origin=invocation.origin,
            operation_id=operation_id,
            correlation_id=correlation_id,
            causation_event_id=causation_event_id,
            machine_name=machine_name,
            machine_version=machine_version,
            machine_digest=machine_digest,
            sequence=sequence,
            lineage=lineage,
            issued_at=issued_at,
            deadline=deadline,
            idempotency_key=idempotency_key,
        )

    def to_record(self) -> dict[str, Any]:
        """The `recovery.CapabilityCommand` record; params travel as canonical JSON."""
        return {
            "command_id": self.command_id,
            "capability": self.capability,
            "kind": self.kind,
            "material": self.material,
            "params_json": canonical_bytes(dict(self.params)).decode("utf-8"),
            "origin": self.origin,
            "operation_id": self.operation_id,
            "correlation_id": self.correlation_id,
            "causation_event_id": self.causation_event_id,
            "machine_name": self.machine_name,
            "machine_version": self.machine_version,
            "machine_digest": self.machine_digest,
            "sequence": self.sequence,
            "lineage": self.lineage.to_dict(),
            "issued_at": self.issued_at,
            "deadline": self.deadline,
            "idempotency_key": self.idempotency_key,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> CapabilityCommand:
        """The command from a decoded record; raises `WireError` (`record-invalid`) when
        `params_json` is not a JSON object or a field is missing."""
        try:
            params = json.loads(record["params_json"])
            if not isinstance(params, dict):
                raise ValueError("params_json is not a JSON object")
            raw_lineage = record["lineage"]
            lineage = Lineage(
                agent=raw_lineage["agent"],
                task=raw_lineage["task"],
                initiating_principal=raw_lineage["initiating_principal"],
                origin_operation=raw_lineage.get("origin_operation"),
                parent_operation=raw_lineage.get("parent_operation"),
                delegated_credentials=tuple(raw_lineage.get("delegated_credentials") or ()),
            )
            return cls(
                params=params,
                lineage=lineage,
                **{k: record[k] for k in _SCALARS},
                deadline=record.get("deadline"),
                idempotency_key=record.get("idempotency_key"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            command_id = record.get("command_id", "<no command_id>")
            raise WireError(
                WireCode.RECORD_INVALID, f"command {command_id}: not a valid command: {exc}"
            ) from exc


_SCALARS = (
    "command_id",
    "capability",
    "kind",
    "material",
    "origin",
    "operation_id",
    "correlation_id",
    "causation_event_id",
    "machine_name",
    "machine_version",
    "machine_digest",
    "sequence",
    "issued_at",
)
