"""Idempotency-key claims: how the controller tells a duplicate business operation from
a new one (agent-failure-recovery practice §4; CONFORMANCE scenario "duplicate
business operation detection").

A tool declares, on the event that opens an operation, the idempotency key it sent
with the call and the digest of the call's canonical arguments (`facts`, envelope v6).
The key is scoped by who asked and for what: a `ClaimKey` is the initiating principal,
the capability and the key. The first operation to declare it owns it (`KeyClaim`); a
later operation declaring the same claim key is a **duplicate** when both declared the
same arguments digest, and a **conflicting reuse** otherwise (different arguments, or
either side declared none, so nobody can show they are the same call).

What this module holds is pure: the claim key an opening event asks for, what a
folded view claims, and the verdict on a reuse. The ledger stores claims
(`Ledger.key_claims`, written in the commit of the batch that opens the owner, where a
unique key makes a concurrent second owner impossible); `machines.batch.BatchFold`
lays an owner found there, or opened earlier in the same fold, over the view a second
operation is opened with, and `machines.decision.decide` routes its opening event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from machines.event import Event
from machines.view import KeyClaim, OperationView

__all__ = [
    "ClaimKey",
    "KeyClaim",
    "Reuse",
    "claim_key_of",
    "claimed_by",
    "reuse_of",
]

Reuse = Literal["duplicate", "conflict"]
DUPLICATE: Final = "duplicate"
CONFLICT: Final = "conflict"


@dataclass(frozen=True, slots=True, order=True)
class ClaimKey:
    """An idempotency key as it is unique: per initiating principal and capability."""

    principal: str
    capability: str
    idempotency_key: str


def claim_key_of(event: Event) -> ClaimKey | None:
    """The claim key `event` asks for when it opens its operation: the key its `facts`
    block declares, with its principal and its scope's capability; None when it
    declares no key or carries no scope."""
    facts, scope = event.facts, event.scope
    if facts is None or facts.idempotency_key is None or scope is None:
        return None
    return ClaimKey(event.lineage.initiating_principal, scope.capability, facts.idempotency_key)


def claimed_by(view: OperationView) -> tuple[ClaimKey, KeyClaim] | None:
    """The claim `view`'s operation holds: its idempotency key, declared when it was
    opened (not later: a key declared after the failure is not the call's, practice
    §4), with its principal and capability, unless it reused another operation's key.
    None when it holds none."""
    facts = view.facts
    if (
        facts.idempotency_key is None
        or facts.declared_by is None
        or facts.key_declared_late
        or view.key_owner is not None
        or view.principal is None
        or view.capability is None
    ):
        return None
    key = ClaimKey(view.principal, view.capability, facts.idempotency_key)
    return key, KeyClaim(view.operation_id, facts.arguments_digest)


def reuse_of(owner: KeyClaim, arguments_digest: str | None) -> Reuse:
    """A second operation declaring `owner`'s key with `arguments_digest`: a duplicate
    when both declared the same arguments, a conflicting reuse otherwise (fail closed:
    without both digests nobody can show it is the same call)."""
    if arguments_digest is not None and arguments_digest == owner.arguments_digest:
        return DUPLICATE
    return CONFLICT
