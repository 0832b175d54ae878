"""Signed human decisions (SPEC §9): canonical encoding, Ed25519 signing and verification.

A HUMAN_APPROVED or HUMAN_REJECTED event carries a `HumanDecision` whose Ed25519
signature covers, in a canonical encoding with a domain tag, the approver, the
operation id, the state the human looked at, the proposed transition (target state),
the machine digest, an expiry and a single-use nonce. Approval is therefore bound to
event-time evidence, not a permanent label (paper notes §1, §7.2): a decision for
another state, machine or operation, a stale or replayed one, or one signed by the
affected agent's lineage is refused, each with its own reason code.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from machines import ed25519
from machines.event import HumanDecision, canonical_bytes, sha256_digest
from machines.keys import public_key_bytes
from machines.policy import Policy

# Re-exported: test cases import it from here.
from machines.testkeys import insecure_test_key as insecure_test_key
from machines.view import OperationView, checkpoint_digest

# v2 (issue #16): the signature also covers `reviewed_digest` and `for_resume`, so a v1
# signature never verifies under v2 and an approval is bound to what was reviewed.
SIGNATURE_DOMAIN = "agent-recovery/human-decision/v2"
REVIEW_DOMAIN = "agent-recovery/review/v1"


class ApprovalRejection(StrEnum):
    """Why a human decision was refused; each is recorded distinctly."""

    MISSING = "approval-missing"
    DECISION_MISMATCH = "approval-decision-mismatch"
    UNKNOWN_APPROVER = "approval-unknown-approver"
    ROLE_NOT_PERMITTED = "approval-role-not-permitted"
    BAD_SIGNATURE = "approval-bad-signature"
    WRONG_OPERATION = "approval-wrong-operation"
    STALE_STATE = "approval-stale-state"
    OTHER_MACHINE = "approval-other-machine"
    EXPIRED = "approval-expired"
    REPLAYED_NONCE = "approval-replayed-nonce"
    APPROVER_IN_LINEAGE = "approval-approver-in-lineage"
    REVIEW_MISMATCH = "approval-review-mismatch"


def evidence_basis(view: OperationView, now: datetime, *, for_resume: bool) -> dict[str, Any]:
    """The evidence an approval is given on: every trusted verification of the current
    effect epoch (verifier, outcome, reference, event id) and, for a resume, the
    checkpoint the resume would start from (the newest eligible, id and digest)."""
    epoch = view.epoch
    verifications = sorted(
        (
            {
                "verifier": v.verifier,
                "outcome": v.outcome,
                "reference": v.reference,
                "event_id": v.event_id,
            }
            for v in view.verifications
            if v.epoch == epoch
        ),
        key=lambda v: v["event_id"],
    )
    basis: dict[str, Any] = {"epoch": epoch, "verifications": verifications}
    if for_resume:
        chosen = view.newest_eligible_checkpoint(now)
        basis["checkpoint"] = (
            None
            if chosen is None
            else {"id": chosen.checkpoint_id, "digest": checkpoint_digest(chosen)}
        )
    return basis


def review_digest(
    view: OperationView, transition: str, now: datetime, *, for_resume: bool = False
) -> str:
    """The digest an approver signs as `reviewed_digest` (SPEC §9; paper notes §1, §3.2):
    over the operation, its machine, the ledger position (`view.version`) and state it
    was reviewed at, the proposed transition (target state) and `evidence_basis`. The
    controller recomputes it from its own view when the approval arrives; a review
    packet shows it so the approver signs exactly what they saw."""
    return sha256_digest(
        {
            "domain": REVIEW_DOMAIN,
            "operation_id": view.operation_id,
            "machine_digest": view.machine_digest,
            "position": view.version,
            "state": view.state,
            "transition": transition,
            "for_resume": for_resume,
            "evidence": evidence_basis(view, now, for_resume=for_resume),
        }
    )


def basis_digest(view: OperationView, now: datetime, *, for_resume: bool) -> str:
    """`sha256` of `evidence_basis`: kept with an accepted approval and compared when
    it is used, so evidence that arrived after signing voids it."""
    return sha256_digest(evidence_basis(view, now, for_resume=for_resume))


def signing_payload(decision: HumanDecision) -> bytes:
    """The exact bytes an approver signs: the domain tag and every bound field."""
    return canonical_bytes({"domain": SIGNATURE_DOMAIN, **decision.signed_fields()})


def sign_decision(decision: HumanDecision, private_key: Ed25519PrivateKey) -> HumanDecision:
    """`decision` with its `signature` set (base64) by `private_key`. Used by the approver
    client and by test cases; the controller itself never holds a private key."""
    signature = ed25519.sign(private_key, signing_payload(decision))
    return replace(decision, signature=base64.b64encode(signature).decode("ascii"))


def public_key_b64(private_key: Ed25519PrivateKey) -> str:
    """The raw public key of `private_key`, base64, as the policy roster stores it."""
    raw = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def _signature_valid(decision: HumanDecision, public_key: str) -> bool:
    try:
        signature = base64.b64decode(decision.signature, validate=True)
        raw = public_key_bytes(public_key)
    except (binascii.Error, ValueError):
        return False
    return ed25519.verify(raw, signature, signing_payload(decision))


def check_decision(
    decision: HumanDecision | None,
    *,
    event_type: str,
    view: OperationView,
    policy: Policy,
    now: datetime,
    reviewed: str | None = None,
) -> ApprovalRejection | None:
    """Verify a human decision against the operation as it is now. Returns None when the
    decision is authentic and bound to this operation, state, machine and moment, or the
    first reason it is not. Cheap checks run before the signature check; the lineage
    check runs before the roster so an affected agent is named as such even if listed.
    `reviewed` is the digest an approval must have signed when it is not the review
    digest of its transition (a migration's plan, `machines.migration`); such a decision
    is always an approval."""
    if decision is None:
        return ApprovalRejection.MISSING
    approving = event_type == "HUMAN_APPROVED" or reviewed is not None
    expected = "approved" if approving else "rejected"
    if decision.decision != expected:
        return ApprovalRejection.DECISION_MISMATCH
    if view.lineage.includes(decision.approver):
        return ApprovalRejection.APPROVER_IN_LINEAGE
    approver = policy.approver(decision.approver)
    if approver is None:
        return ApprovalRejection.UNKNOWN_APPROVER
    if not set(approver.roles) & set(policy.approval_roles):
        return ApprovalRejection.ROLE_NOT_PERMITTED
    if not _signature_valid(decision, approver.public_key):
        return ApprovalRejection.BAD_SIGNATURE
    return _check_binding(decision, view, now, reviewed)


def _check_binding(
    decision: HumanDecision, view: OperationView, now: datetime, reviewed: str | None
) -> ApprovalRejection | None:
    if decision.operation_id != view.operation_id:
        return ApprovalRejection.WRONG_OPERATION
    if decision.machine_digest != view.machine_digest:
        return ApprovalRejection.OTHER_MACHINE
    if decision.state != view.state:
        return ApprovalRejection.STALE_STATE
    if now >= decision.expires_at:
        return ApprovalRejection.EXPIRED
    if decision.nonce in view.used_nonces:
        return ApprovalRejection.REPLAYED_NONCE
    # An approval authorises what the approver saw; a rejection fails closed whatever
    # was seen, so only approvals must match the controller's own view of the review.
    if reviewed is None and decision.decision == "approved":
        reviewed = review_digest(view, decision.transition, now, for_resume=decision.for_resume)
    if reviewed is not None and decision.reviewed_digest != reviewed:
        return ApprovalRejection.REVIEW_MISMATCH
    return None
