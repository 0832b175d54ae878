"""The machine format and its meaning: model, loader, validation, pinning, decisions. No I/O
beyond reading the files it is asked to load."""

from __future__ import annotations

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

__all__ = [
    "SPEC_VERSION",
    "ActionRef",
    "AppliesTo",
    "AuditSpec",
    "CapabilityKind",
    "CapabilitySpec",
    "GuardSpec",
    "Machine",
    "Registry",
    "State",
    "Transition",
]
