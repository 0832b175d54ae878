"""The machine format and its meaning: model, loader, validation, pinning, decisions. No I/O
beyond reading the files it is asked to load."""

from __future__ import annotations

from machines.applicability import (
    MachineSelectionError,
    OperationScope,
    applies,
    overlap_warning,
    overlapping_pairs,
    redact,
    select_machine,
)
from machines.approvals import ApprovalRejection, check_decision, sign_decision
from machines.compiled import GuardEvaluation
from machines.decision import Decision, Invocation, Outcome, apply, decide
from machines.digest import canonical_json, digest_of
from machines.errors import (
    Code,
    Location,
    MachineError,
    MachineInvalid,
    Problem,
    ProvenanceError,
    RegistryInvalid,
    Severity,
)
from machines.event import (
    CheckpointReport,
    ClassifierOutput,
    Event,
    EventError,
    EvidencePayload,
    HumanDecision,
    Lineage,
    parse_event,
)
from machines.guards import STANDARD_GUARDS, GuardContext, GuardResult
from machines.invariants import Notice
from machines.loader import (
    CATALOGUE,
    ValidationReport,
    catalogue_packages,
    load_catalogue,
    load_machine,
    validate_path,
    validate_text,
)
from machines.model import (
    SPEC_VERSION,
    ActionRef,
    AppliesTo,
    AuditSpec,
    CapabilityKind,
    CapabilitySpec,
    GuardSpec,
    Machine,
    Registry,
    State,
    Transition,
)
from machines.policy import (
    Policy,
    PolicyError,
    check_policy_against_registry,
    load_policy,
    parse_policy,
)
from machines.registry import DEFAULT_REGISTRY, load_registry, parse_registry
from machines.simulation import OperationSetup, Simulation
from machines.view import (
    LineageStatus,
    OperationView,
    ToolFacts,
    new_view,
    view_from_json,
    view_to_json,
)

__all__ = [
    "CATALOGUE",
    "DEFAULT_REGISTRY",
    "SPEC_VERSION",
    "STANDARD_GUARDS",
    "ActionRef",
    "AppliesTo",
    "ApprovalRejection",
    "AuditSpec",
    "CapabilityKind",
    "CapabilitySpec",
    "CheckpointReport",
    "ClassifierOutput",
    "Code",
    "Decision",
    "Event",
    "EventError",
    "EvidencePayload",
    "GuardContext",
    "GuardEvaluation",
    "GuardResult",
    "GuardSpec",
    "HumanDecision",
    "Invocation",
    "Lineage",
    "LineageStatus",
    "Location",
    "Machine",
    "MachineError",
    "MachineInvalid",
    "MachineSelectionError",
    "Notice",
    "OperationScope",
    "OperationSetup",
    "OperationView",
    "Outcome",
    "Policy",
    "PolicyError",
    "Problem",
    "ProvenanceError",
    "Registry",
    "RegistryInvalid",
    "Severity",
    "Simulation",
    "State",
    "ToolFacts",
    "Transition",
    "ValidationReport",
    "applies",
    "apply",
    "canonical_json",
    "catalogue_packages",
    "check_decision",
    "check_policy_against_registry",
    "decide",
    "digest_of",
    "load_catalogue",
    "load_machine",
    "load_policy",
    "load_registry",
    "new_view",
    "overlap_warning",
    "overlapping_pairs",
    "parse_event",
    "parse_policy",
    "parse_registry",
    "redact",
    "select_machine",
    "sign_decision",
    "validate_path",
    "validate_text",
    "view_from_json",
    "view_to_json",
]
