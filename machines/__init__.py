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
from machines.registry import DEFAULT_REGISTRY, load_registry, parse_registry

__all__ = [
    "CATALOGUE",
    "DEFAULT_REGISTRY",
    "SPEC_VERSION",
    "ActionRef",
    "AppliesTo",
    "AuditSpec",
    "CapabilityKind",
    "CapabilitySpec",
    "Code",
    "GuardSpec",
    "Location",
    "Machine",
    "MachineError",
    "MachineInvalid",
    "MachineSelectionError",
    "OperationScope",
    "Problem",
    "ProvenanceError",
    "Registry",
    "RegistryInvalid",
    "Severity",
    "State",
    "Transition",
    "ValidationReport",
    "applies",
    "canonical_json",
    "catalogue_packages",
    "digest_of",
    "load_catalogue",
    "load_machine",
    "load_registry",
    "overlap_warning",
    "overlapping_pairs",
    "parse_registry",
    "redact",
    "select_machine",
    "validate_path",
    "validate_text",
]
