"""Frozen, typed values for a loaded recovery machine and the administrator registry.

These are the contract between the loader (which builds them from validated YAML) and
the decision core (which reads them). Nothing here does I/O. Field names follow the
RECOVERY.yaml format of `machines/recovery-machine.schema.json`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

SPEC_VERSION = "agent-recovery/0.2"

JsonValue = Any  # a value that survives json.dumps/json.loads unchanged

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class CapabilityKind(StrEnum):
    """What a registered capability does; the core's invariants key on this (SPEC §7)."""

    VERIFY = "verify"
    RETRY = "retry"
    COMPENSATE = "compensate"
    STOP = "stop"
    REVOKE = "revoke"
    ISOLATE = "isolate"
    NOTIFY = "notify"
    ESCALATE = "escalate"
    RESUME = "resume"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class ActionRef:
    """One capability invocation named by a machine: an opaque id and static params."""

    capability: str
    params: Mapping[str, JsonValue] = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True, slots=True)
class Transition:
    """One candidate transition for `event` in `source`; `index` is its position in the list."""

    source: str
    event: str
    index: int
    target: str
    guard: str | None = None
    actions: tuple[ActionRef, ...] = ()


@dataclass(frozen=True, slots=True)
class State:
    """An atomic state. `on` maps an event to its ordered candidate transitions."""

    name: str
    final: bool = False
    entry: tuple[ActionRef, ...] = ()
    on: Mapping[str, tuple[Transition, ...]] = field(default_factory=lambda: _EMPTY)
    # The machine's own words for what the state means (a review packet shows them).
    description: str = ""


@dataclass(frozen=True, slots=True)
class AppliesTo:
    """Which operations a machine governs. An empty tuple means "any" for that dimension,
    except `capabilities`, which must name at least one tool capability."""

    capabilities: tuple[str, ...]
    tools: tuple[str, ...] = ()
    agents: tuple[str, ...] = ()
    environments: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AuditSpec:
    """What the controller must record and retain for operations under this machine."""

    retention_days: int
    record: tuple[str, ...] = ()
    redact: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MachineProvenance:
    """Who vouched for a pinned machine (SPEC §8 step 1, §10, §12): the publisher its lock
    entry names, the id of the trusted key its signature verified under, and the digest
    of that signature (`sha256:` over the raw Ed25519 signature bytes), so an auditor can
    match the ledger's record with the very `RECOVERY.sig` that was checked."""

    publisher: str
    key_id: str
    signature_digest: str

    def to_dict(self) -> dict[str, str]:
        """The provenance as JSON-ready data (what audit records carry)."""
        return {
            "publisher": self.publisher,
            "key_id": self.key_id,
            "signature_digest": self.signature_digest,
        }


@dataclass(frozen=True, slots=True)
class Machine:
    """A validated RECOVERY.yaml. `digest` is the canonical digest (`sha256:<hex>`);
    `provenance` is set once the machine's pin and publisher signature have been checked
    (`machines.provenance.load_pinned_machine`), and never enters the digest."""

    name: str
    description: str
    version: str
    spec_version: str
    applies_to: AppliesTo
    initial: str
    states: Mapping[str, State]
    audit: AuditSpec
    digest: str
    # Per event type, the producer roles it must come from (RECOVERY.yaml `producers`).
    producers: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    provenance: MachineProvenance | None = None

    def producer_roles(self, event_type: str) -> tuple[str, ...]:
        """The producer roles `event_type` must come from for this machine (SPEC §7.7):
        what the machine declares, else the core's default for the event (verifications
        from a `verifier`, human decisions from an `approver`, action results from a
        `worker`, lineage containment from the `controller`); empty means any role. The
        roster's intake check compares it with the authenticated producer's roles."""
        declared = self.producers.get(event_type)
        if declared is not None:
            return declared
        return default_producer_roles(event_type)

    def transitions_for(self, state: str, event: str) -> tuple[Transition, ...]:
        """The ordered candidate transitions for `event` in `state` (empty if not accepted)."""
        found = self.states.get(state)
        if found is None or found.final:
            return ()
        return found.on.get(event, ())


PRODUCER_ROLES: tuple[str, ...] = (
    "tool",
    "verifier",
    "worker",
    "validator",
    "orchestrator",
    "classifier",
    "approver",
    "controller",
)
"""The producer roles a roster grants and a machine's `producers` block names."""

_RESULT_PREFIXES = ("RETRY_", "COMPENSATION_", "CONTAINMENT_", "RESUME_")


def default_producer_roles(event_type: str) -> tuple[str, ...]:
    """The core's default producer roles of an event type (empty: any role)."""
    if event_type.startswith("VERIFICATION_"):
        return ("verifier",)
    if event_type in ("HUMAN_APPROVED", "HUMAN_REJECTED"):
        return ("approver",)
    if event_type == "ANCESTOR_CONTAINED":
        return ("controller",)
    if event_type.startswith(_RESULT_PREFIXES) and event_type.endswith(("_SUCCEEDED", "_FAILED")):
        return ("worker",)
    return ()


@dataclass(frozen=True, slots=True)
class GuardSpec:
    """A guard id registered by the administrator and the implementation it resolves to."""

    id: str
    implementation: str
    description: str = ""
    # True when the guard holds only on authoritative evidence that the effect was NOT
    # applied; the validator requires such a guard on every retry (CONFORMANCE L1.5).
    requires_not_applied: bool = False


@dataclass(frozen=True, slots=True)
class CapabilitySpec:
    """A capability id registered by the administrator."""

    id: str
    kind: CapabilityKind
    material: bool
    params_schema: Mapping[str, JsonValue] = field(default_factory=lambda: _EMPTY)
    description: str = ""


@dataclass(frozen=True, slots=True)
class Registry:
    """The administrator registry: the only guards and capabilities a machine may name."""

    guards: Mapping[str, GuardSpec]
    capabilities: Mapping[str, CapabilitySpec]
