"""What the reviewer's browser signs, and checking what it sends back.

For each decision the packet's state accepts, the console renders the exact bytes the
controller verifies (`machines.signing_payload`: canonical JSON with the domain tag, over
the approver, operation, state shown, target state, machine digest, expiry, a fresh
nonce and the verdict), next to the packet digest. The page signs those bytes with the
reviewer's non-extractable WebCrypto key and posts back the payload and the signature
only. `submitted_decision` parses the payload back into a `HumanDecision`, refuses one
that is not byte for byte the canonical form, for another approver or verdict, and
attaches the signature; the caller then checks it against the operation as it is now
(`machines.check_decision`, the controller's own check) before publishing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from machines import HumanDecision, OperationView, ReviewPacket, Verdict, signing_payload
from ops.usecases import VERDICT_EVENTS, proposed_decision

__all__ = ["CHECK_DOMAIN", "PendingDecision", "SigningRefused", "pending", "submitted_decision"]

# The key check a page signs after importing a key: not a decision, never published.
CHECK_DOMAIN = "agent-recovery/console-key-check/v1"

_FIELDS = frozenset(
    {
        "domain",
        "approver",
        "operation_id",
        "state",
        "transition",
        "machine_digest",
        "expires_at",
        "nonce",
        "decision",
        "reviewed_digest",
        "for_resume",
    }
)


class SigningRefused(Exception):
    """A submitted decision was refused before it reached the broker (message says why)."""


@dataclass(frozen=True, slots=True)
class PendingDecision:
    """One decision a reviewer may sign: the verdict, the event it becomes, and the
    exact payload text (UTF-8 of the signed bytes)."""

    verdict: Verdict
    event_type: str
    target: str
    guard: str | None
    payload: str


def pending(
    packet: ReviewPacket,
    *,
    view: OperationView,
    approver: str,
    now: datetime,
    ttl: timedelta,
    nonce: str,
) -> list[PendingDecision]:
    """The decisions `approver` may sign on `packet` of the operation whose view is
    `view` (one per verdict its state accepts), each valid for `ttl` from `now`. Nonces
    are `nonce` with the verdict."""
    decisions = []
    for verdict, event_type in VERDICT_EVENTS.items():
        proposal = packet.proposal(event_type)
        if proposal is None:
            continue
        decision = proposed_decision(
            proposal,
            verdict=verdict,
            approver=approver,
            view=view,
            expires_at=(now + ttl).replace(microsecond=0),
            nonce=f"{nonce}-{verdict}",
        )
        decisions.append(
            PendingDecision(
                verdict=verdict,
                event_type=event_type,
                target=decision.transition,
                guard=proposal.get("guard"),
                payload=signing_payload(decision).decode("utf-8"),
            )
        )
    return decisions


def submitted_decision(
    payload: str, signature: str, *, approver: str, verdict: str
) -> HumanDecision:
    """The signed `HumanDecision` the page sent back; raises `SigningRefused` when the
    payload is not a canonical decision payload for this approver and verdict."""
    try:
        fields = json.loads(payload)
    except ValueError as exc:
        raise SigningRefused(f"the signed payload is not JSON ({exc}); reload the page") from exc
    if not isinstance(fields, dict) or set(fields) != _FIELDS:
        raise SigningRefused("the signed payload is not a human decision; reload the page")
    if fields["approver"] != approver:
        raise SigningRefused(
            f"the payload is for approver {fields['approver']}, but you are signed in as {approver}"
        )
    if fields["decision"] != verdict:
        raise SigningRefused(f"the payload decides {fields['decision']}, not {verdict}")
    try:
        decision = HumanDecision(
            approver=str(fields["approver"]),
            operation_id=str(fields["operation_id"]),
            state=str(fields["state"]),
            transition=str(fields["transition"]),
            machine_digest=str(fields["machine_digest"]),
            expires_at=datetime.fromisoformat(str(fields["expires_at"])),
            nonce=str(fields["nonce"]),
            decision=fields["decision"],
            reviewed_digest=str(fields["reviewed_digest"]),
            for_resume=fields["for_resume"] is True,
            signature=signature,
        )
    except (TypeError, ValueError) as exc:
        raise SigningRefused(f"the signed payload does not parse as a decision: {exc}") from exc
    if decision.expires_at.utcoffset() != timedelta(0):
        raise SigningRefused("the payload's expiry is not in UTC; reload the page")
    if signing_payload(decision).decode("utf-8") != payload:
        raise SigningRefused(
            "the signed payload is not in canonical form (the bytes the controller verifies); "
            "sign the payload exactly as the page shows it"
        )
    return decision
