"""The machine format and its meaning: model, loader, validation, pinning, decisions, the
fold of a sequence of decisions per operation (`BatchFold`) and containment semantics. No
I/O beyond reading the files it is asked to load; imports nothing from `ledger`, `consumer`,
`producers` or `ops`."""

from __future__ import annotations

from machines.applicability import (
    OperationScope,
    applies,
    matching_scope,
    overlap_warning,
    overlapping_pairs,
    scope_refusal,
)
from machines.approvals import (
    check_decision,
    public_key_b64,
    review_digest,
    sign_decision,
    signing_payload,
)
from machines.batch import (
    BatchFold,
    OperationSetup,
    Rules,
)
from machines.call_context import call_context_claims, issue_call_context, prove_lineage
from machines.casefile import (
    SCENARIOS,
    CaseError,
    CaseResult,
    SuiteResult,
    discover,
    load_case,
    run_case,
)
from machines.containment import (
    MAX_LINEAGE_DEPTH,
    Arrival,
    Change,
    Containment,
    LineageRow,
    arrival_of,
    containment_of,
    lineage_below,
    with_lineage,
)
from machines.decision import (
    CORRELATION_MISMATCH,
    Decision,
    Invocation,
    Outcome,
    apply,
    decide,
)
from machines.digest import (
    canonical_ascii_json,
    canonical_json,
    canonical_text,
)
from machines.ed25519 import sign as ed25519_sign
from machines.ed25519 import verify as ed25519_verify
from machines.errors import (
    MachineError,
    Problem,
    RegistryInvalid,
)
from machines.event import (
    ClassifierOutput,
    DeclaredFacts,
    Event,
    EventError,
    EvidencePayload,
    HumanDecision,
    Lineage,
    Scope,
    Verdict,
    canonical_bytes,
    parse_event,
)
from machines.invariants import ANSWERED_KINDS
from machines.keys import (
    KeyFileError,
    load_private_key,
    public_key_bytes,
    public_key_from_text,
    write_private_key,
)
from machines.loader import (
    CATALOGUE,
    ValidationReport,
    load_catalogue,
    load_machine,
    validate_path,
)
from machines.minimization import minimize_event
from machines.model import (
    Machine,
    Registry,
)
from machines.opening import (
    OPENING_CONFLICT,
    OpeningConflict,
    correlation_conflict,
    opening_conflict,
)
from machines.policy import (
    Policy,
    PolicyError,
    check_policy_against_machines,
    check_policy_against_registry,
    load_policy,
    load_roster,
    parse_policy,
    public_name_keys,
    wildcard_agent_grants,
)
from machines.producer_roles import (
    check_event_role,
    check_opening,
)
from machines.provenance import (
    LockFile,
    dump_model,
    key_id,
    load_lock,
    load_locked_machines,
    load_pinned_machine,
    load_trusted_publishers,
    lock_entry,
    public_key_text,
    sign_machine,
    signature_path,
)
from machines.registry import (
    DEFAULT_REGISTRY,
    load_registry,
)
from machines.replay import (
    compare_decisions,
    replay_decisions,
)
from machines.review import (
    ReviewPacket,
    awaits_human,
    review_packet,
)
from machines.roster import (
    ANY,
    AuthenticationError,
    AuthRefusal,
    Grant,
    ProducerEntry,
    ProducerKey,
    Role,
    Roster,
)
from machines.simulation import (
    Simulation,
    SimulationError,
)
from machines.testkeys import insecure_test_key
from machines.view import (
    LineageStatus,
    OperationView,
    ToolFacts,
    new_view,
    view_from_json,
    view_from_json_text,
    view_to_json,
)

__all__ = [
    "ANSWERED_KINDS",
    "ANY",
    "CATALOGUE",
    "CORRELATION_MISMATCH",
    "DEFAULT_REGISTRY",
    "MAX_LINEAGE_DEPTH",
    "OPENING_CONFLICT",
    "SCENARIOS",
    "Arrival",
    "AuthRefusal",
    "AuthenticationError",
    "BatchFold",
    "CaseError",
    "CaseResult",
    "Change",
    "ClassifierOutput",
    "Containment",
    "Decision",
    "DeclaredFacts",
    "Event",
    "EventError",
    "EvidencePayload",
    "Grant",
    "HumanDecision",
    "Invocation",
    "KeyFileError",
    "Lineage",
    "LineageRow",
    "LineageStatus",
    "LockFile",
    "Machine",
    "MachineError",
    "OpeningConflict",
    "OperationScope",
    "OperationSetup",
    "OperationView",
    "Outcome",
    "Policy",
    "PolicyError",
    "Problem",
    "ProducerEntry",
    "ProducerKey",
    "Registry",
    "RegistryInvalid",
    "ReviewPacket",
    "Role",
    "Roster",
    "Rules",
    "Scope",
    "Simulation",
    "SimulationError",
    "SuiteResult",
    "ToolFacts",
    "ValidationReport",
    "Verdict",
    "applies",
    "apply",
    "arrival_of",
    "awaits_human",
    "call_context_claims",
    "canonical_ascii_json",
    "canonical_bytes",
    "canonical_json",
    "canonical_text",
    "check_decision",
    "check_event_role",
    "check_opening",
    "check_policy_against_machines",
    "check_policy_against_registry",
    "compare_decisions",
    "containment_of",
    "correlation_conflict",
    "decide",
    "discover",
    "dump_model",
    "ed25519_sign",
    "ed25519_verify",
    "insecure_test_key",
    "issue_call_context",
    "key_id",
    "lineage_below",
    "load_case",
    "load_catalogue",
    "load_lock",
    "load_locked_machines",
    "load_machine",
    "load_pinned_machine",
    "load_policy",
    "load_private_key",
    "load_registry",
    "load_roster",
    "load_trusted_publishers",
    "lock_entry",
    "matching_scope",
    "minimize_event",
    "new_view",
    "opening_conflict",
    "overlap_warning",
    "overlapping_pairs",
    "parse_event",
    "parse_policy",
    "prove_lineage",
    "public_key_b64",
    "public_key_bytes",
    "public_key_from_text",
    "public_key_text",
    "public_name_keys",
    "replay_decisions",
    "review_digest",
    "review_packet",
    "run_case",
    "scope_refusal",
    "sign_decision",
    "sign_machine",
    "signature_path",
    "signing_payload",
    "validate_path",
    "view_from_json",
    "view_from_json_text",
    "view_to_json",
    "wildcard_agent_grants",
    "with_lineage",
    "write_private_key",
]
