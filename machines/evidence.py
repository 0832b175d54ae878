"""Admitting evidence: what one event may add to the operation's trusted view, and the fold.

An event offers evidence; the core decides whether it is trusted. A verification result
counts only from a verifier the policy trusts that is not the affected agent's lineage;
a human decision counts only once `machines.approvals.check_decision` accepts it; a
checkpoint is stored either way but marked validated only when a trusted validator
vouched for it; a contained ancestor is recorded as lineage status; declared tool facts
count under `machines.facts.admit_facts`'s rule. The accepted part
is an `EvidenceDelta`, carried in the decision and folded into the view by `apply`.
Evidence is a fact about the world, so it is recorded even when no transition fires.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from machines.approvals import basis_digest, check_decision
from machines.event import EffectOutcome, Event
from machines.facts import admit_facts
from machines.invariants import DENIAL_EVENTS, HUMAN_EVENTS, VERIFICATION_EVENTS, Notice
from machines.policy import Policy
from machines.roster import Role
from machines.view import (
    Approval,
    Checkpoint,
    OperationView,
    ToolFacts,
    Verification,
    evolve,
)

# The refusal of an event naming another identity than its producer's: the code intake
# dead-letters such a record with (`machines.AuthRefusal.IDENTITY_MISMATCH`).
IDENTITY_MISMATCH = "identity-mismatch"

_OUTCOME_OF: dict[str, EffectOutcome] = {
    "VERIFICATION_FOUND": "applied",
    "VERIFICATION_NOT_FOUND": "not_applied",
    "VERIFICATION_UNAVAILABLE": "unknown",
    "VERIFICATION_CONFLICTING": "unknown",
}


@dataclass(frozen=True, slots=True)
class EvidenceDelta:
    """The trusted facts one event adds. Empty when the event carried none we accept."""

    verification: Verification | None = None
    approval: Approval | None = None
    checkpoint: Checkpoint | None = None
    contained_ancestor: str | None = None
    facts: ToolFacts | None = None
    # The event reports a permanent denial of the operation's call (`DENIAL_EVENTS`).
    denial: str | None = None
    # The opening event declared an idempotency key another operation owns: that
    # operation and the verdict, "duplicate" or "conflict" (`machines.claims`).
    key_reuse: tuple[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form; absent parts are omitted."""
        out: dict[str, Any] = {}
        if self.verification is not None:
            v = self.verification
            out["verification"] = {
                "verifier": v.verifier,
                "outcome": v.outcome,
                "reference": v.reference,
                "epoch": v.epoch,
            }
        if self.approval is not None:
            a = self.approval
            out["approval"] = {
                "approver": a.approver,
                "decision": a.decision,
                "state": a.state,
                "transition": a.transition,
                "expires_at": a.expires_at.isoformat(),
                "nonce": a.nonce,
            }
        if self.checkpoint is not None:
            c = self.checkpoint
            out["checkpoint"] = {"id": c.checkpoint_id, "validated": c.validated}
        if self.contained_ancestor is not None:
            out["contained_ancestor"] = self.contained_ancestor
        if self.facts is not None:
            f = self.facts
            out["facts"] = {
                "declared_by": f.declared_by,
                "idempotency_key": f.idempotency_key,
                "side_effect_possible": f.side_effect_possible,
                "side_effect_confirmed": f.side_effect_confirmed,
                "compensation_supported": f.compensation_supported,
                "status_api": f.status_api,
            }
            if f.key_declared_late:
                out["facts"]["key_declared_late"] = True
            if f.arguments_digest is not None:
                out["facts"]["arguments_digest"] = f.arguments_digest
        if self.denial is not None:
            out["denial"] = self.denial
        if self.key_reuse is not None:
            owner, verdict = self.key_reuse
            out["key_reuse"] = {"operation": owner, "verdict": verdict}
        return out


NO_EVIDENCE = EvidenceDelta()


def admit_evidence(
    event: Event, view: OperationView, policy: Policy, now: datetime
) -> tuple[EvidenceDelta, Notice | None]:
    """The trusted evidence `event` adds to `view`, or the reason it is refused. A refused
    verification or human decision refuses the whole event: acting on an event whose
    evidence we do not trust would let the event's type speak for the evidence. The same
    holds for a refused declaration of tool facts."""
    facts, refusal = admit_facts(event, view, policy)
    if refusal is not None:
        return NO_EVIDENCE, refusal
    delta, refusal = _offered(event, view, policy, now)
    if refusal is not None or facts is None:
        return delta, refusal
    return replace(delta, facts=facts), None


def _offered(
    event: Event, view: OperationView, policy: Policy, now: datetime
) -> tuple[EvidenceDelta, Notice | None]:
    event_type = event.event_type
    refusal = _validator_mismatch(event)
    if refusal is not None:
        return NO_EVIDENCE, refusal
    if event_type in VERIFICATION_EVENTS:
        verification, notice = _verification(event, view, policy)
        if notice is not None:
            return NO_EVIDENCE, notice
        return EvidenceDelta(
            verification=verification, checkpoint=_checkpoint(event, view, policy)
        ), None
    if event_type in HUMAN_EVENTS:
        rejection = check_decision(
            event.human_decision, event_type=event_type, view=view, policy=policy, now=now
        )
        if rejection is not None:
            approver = event.human_decision.approver if event.human_decision else "<none>"
            return NO_EVIDENCE, Notice(
                str(rejection),
                f"{event_type} {event.event_id} from approver {approver} refused in state "
                f"{view.state}: {rejection}",
            )
        return EvidenceDelta(approval=_approval(event, view, now)), None
    contained = _contained_ancestor(event) if event_type == "ANCESTOR_CONTAINED" else None
    checkpoint = _checkpoint(event, view, policy)
    denial = event.event_id if event_type in DENIAL_EVENTS else None
    if contained is None and checkpoint is None and denial is None:
        return NO_EVIDENCE, None
    return EvidenceDelta(checkpoint=checkpoint, contained_ancestor=contained, denial=denial), None


def _verification(
    event: Event, view: OperationView, policy: Policy
) -> tuple[Verification | None, Notice | None]:
    evidence = event.evidence
    expected = _OUTCOME_OF[event.event_type]
    if evidence is None or evidence.verifier is None:
        return None, Notice(
            "verification-missing-evidence",
            f"{event.event_type} {event.event_id} carries no verifier identity; a verifier "
            "must report through an evidence block",
        )
    verifier = evidence.verifier
    if verifier != event.producer:
        # Intake refuses such a record before the core sees it (`identity-mismatch`,
        # `machines.producer_roles`); the core refuses it too, so a simulation or a case
        # file decides exactly as the wire does (defence in depth).
        return None, Notice(
            IDENTITY_MISMATCH,
            f"{event.event_type} {event.event_id} names verifier {verifier} but is produced "
            f"by {event.producer}; a verification is the verifier's own report",
        )
    if not trusted_verifier(policy, verifier, view, event.causation) or view.lineage.includes(
        verifier
    ):
        return None, Notice(
            "verifier-untrusted",
            f"{event.event_type} {event.event_id}: verifier {verifier} is not trusted by policy "
            f"{policy.id} for capability {view.capability or '<none>'}; grant it role "
            "verifier in the roster (or, without a roster, list it in trusted_verifiers)",
        )
    if evidence.outcome is not None and evidence.outcome != expected:
        return None, Notice(
            "verification-inconsistent",
            f"{event.event_type} {event.event_id} says outcome {evidence.outcome}, which "
            f"contradicts its type ({expected})",
        )
    reference = evidence.reference or event.evidence_ref
    # A verification answers one command of one attempt: it describes the effect epoch
    # the command it names was issued in, and an answer to a command sent before a
    # retry or compensation is recorded for that older epoch, where no guard reads it.
    epoch = view.epoch if event.causation is None else view.command_epoch(event.causation)
    return Verification(verifier, expected, reference, event.event_id, epoch), None


def _validator_mismatch(event: Event) -> Notice | None:
    """A checkpoint reported as validated by someone other than the event's producer:
    refused, as intake refuses it (the validator vouches in its own signed record)."""
    evidence = event.evidence
    report = evidence.checkpoint if evidence is not None else None
    if report is None or not report.validated or report.validator in (None, event.producer):
        return None
    return Notice(
        IDENTITY_MISMATCH,
        f"{event.event_type} {event.event_id} reports checkpoint {report.checkpoint_id} "
        f"validated by {report.validator} but is produced by {event.producer}; a "
        "validation is the validator's own report",
    )


def trusted_verifier(
    policy: Policy, verifier: str, view: OperationView, causation: str | None = None
) -> bool:
    """Whether `verifier` is authoritative about `view`'s effect: the roster grants it
    role verifier for the operation's capability (or the capability of the open
    verification command `causation`), or (for simulations and policies
    without a roster) the policy lists it in `trusted_verifiers`. The live controller
    admits a verification only from its authenticated signer holding that grant
    (`machines.producer_roles`), so the list never widens what the roster permits."""
    if verifier in policy.trusted_verifiers:
        return True
    entry = policy.roster.producer(verifier)
    if entry is None:
        return False
    answered = view.command_capability(causation)
    return entry.permits(Role.VERIFIER, capability=view.capability) or (
        answered is not None and entry.permits(Role.VERIFIER, capability=answered)
    )


def _roster_validator(policy: Policy, validator: str, view: OperationView) -> bool:
    entry = policy.roster.producer(validator)
    return entry is not None and entry.permits(Role.VALIDATOR, agent=view.lineage.agent)


def _approval(event: Event, view: OperationView, now: datetime) -> Approval:
    decision = event.human_decision
    assert decision is not None  # check_decision refused a missing block
    return Approval(
        for_resume=decision.for_resume,
        basis=basis_digest(view, now, for_resume=decision.for_resume),
        approver=decision.approver,
        state=decision.state,
        transition=decision.transition,
        machine_digest=decision.machine_digest,
        expires_at=decision.expires_at,
        nonce=decision.nonce,
        decision=decision.decision,
        event_id=event.event_id,
    )


def _checkpoint(event: Event, view: OperationView, policy: Policy) -> Checkpoint | None:
    evidence = event.evidence
    report = evidence.checkpoint if evidence is not None else None
    if report is None:
        return None
    validator = report.validator
    trusted = (
        report.validated
        and validator is not None
        and (validator in policy.trusted_verifiers or _roster_validator(policy, validator, view))
        and not view.lineage.includes(validator)
        # The affected agent may report that it saved a checkpoint, but its word that a
        # verifier validated it is not evidence (SPEC §7.7).
        and not view.lineage.includes(event.producer)
    )
    return Checkpoint(
        checkpoint_id=report.checkpoint_id,
        saved_at=report.saved_at,
        reference=report.reference,
        validated=trusted,
        validator=validator,
        machine_digest=report.validated_machine_digest,
        policy_digest=report.validated_policy_digest,
        valid_until=report.valid_until,
        event_id=event.event_id,
    )


def _contained_ancestor(event: Event) -> str | None:
    evidence = event.evidence
    if evidence is not None and evidence.ancestor_operation:
        return evidence.ancestor_operation
    return event.lineage.parent_operation or event.lineage.origin_operation or event.operation_id


def with_evidence(view: OperationView, delta: EvidenceDelta) -> OperationView:
    """`view` with the delta's trusted facts added (what guards read for this event)."""
    if delta is NO_EVIDENCE:
        return view
    return evolve(view, evidence_changes(view, delta))


def evidence_changes(view: OperationView, delta: EvidenceDelta) -> dict[str, Any]:
    """The fields of `view` the delta's trusted facts change, with their new values, for
    a caller that folds more changes into the same new view (`machines.decision.apply`)."""
    changes: dict[str, Any] = {}
    if delta is NO_EVIDENCE:
        return changes
    if delta.verification is not None:
        changes["verifications"] = (*view.verifications, delta.verification)
    if delta.approval is not None:
        earlier = view.approvals
        if delta.approval.decision == "rejected":
            # A later rejection by an accountable approver withdraws earlier approvals.
            earlier = tuple(
                replace(a, withdrawn=True) if a.decision == "approved" else a for a in earlier
            )
        changes["approvals"] = (*earlier, delta.approval)
        changes["used_nonces"] = view.used_nonces | {delta.approval.nonce}
    if delta.facts is not None:
        changes["facts"] = delta.facts
    if delta.checkpoint is not None:
        changes["checkpoints"] = (*view.checkpoints, delta.checkpoint)
    if delta.denial is not None:
        changes["denials"] = (*view.denials, delta.denial)
    if delta.contained_ancestor is not None and (
        delta.contained_ancestor not in view.lineage.contained_ancestors
    ):
        lineage = view.lineage
        changes["lineage"] = replace(
            lineage, contained_ancestors=(*lineage.contained_ancestors, delta.contained_ancestor)
        )
    return changes
