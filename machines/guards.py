"""The standard guard library (SPEC §6.3): deterministic predicates over trusted evidence.

A guard takes a `GuardContext` (the operation's trusted ledger view, the policy, the
decision time and the candidate transition) and returns a `GuardResult`: its value and
the evidence references it read, which the audit records. A guard cannot see the event,
its classifier block or anything the affected agent said about itself: the context does
not hold them. Implementations are resolved only through `STANDARD_GUARDS`, an explicit
table keyed by the implementation names the administrator registry maps guard ids to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType

from machines.approvals import basis_digest
from machines.model import Transition
from machines.policy import Policy
from machines.view import Approval, OperationView


@dataclass(frozen=True, slots=True)
class GuardContext:
    """What a guard may read. `transition` is the candidate being evaluated."""

    view: OperationView
    policy: Policy
    now: datetime
    transition: Transition


@dataclass(frozen=True, slots=True)
class GuardResult:
    """A guard's value and the evidence references it was decided on."""

    value: bool
    evidence: tuple[str, ...] = ()


GuardFn = Callable[[GuardContext], GuardResult]


def not_applied(ctx: GuardContext) -> GuardResult:
    """Authoritative not-applied: every trusted verification of the current effect epoch
    says the effect was not applied, there is at least one, and the tool has not
    confirmed the side effect. A lost response is not evidence (SKILL §1)."""
    view = ctx.view
    outcomes = view.current_outcomes()
    value = outcomes == {"not_applied"} and not view.facts.side_effect_confirmed
    return GuardResult(value, view.current_verification_refs())


def applied(ctx: GuardContext) -> GuardResult:
    """Authoritative applied: the current epoch's trusted verifications all say applied,
    or the tool confirmed the side effect and no trusted verifier contradicts it."""
    view = ctx.view
    outcomes = view.current_outcomes()
    if view.facts.side_effect_confirmed:
        value = "not_applied" not in outcomes and "unknown" not in outcomes
    else:
        value = outcomes == {"applied"}
    return GuardResult(value, view.current_verification_refs())


def evidence_unsettled(view: OperationView) -> bool:
    """Trusted evidence about the current effect epoch contradicts itself or says it
    cannot tell: a verifier's latest result is `unknown`, verifiers' latest results
    disagree, or a trusted result contradicts the tool's confirmation. No result at all
    is not unsettled, only absent (SPEC §7.5 fails closed on the first two)."""
    outcomes = view.current_outcomes()
    if "unknown" in outcomes or len(outcomes) > 1:
        return True
    return view.facts.side_effect_confirmed and "not_applied" in outcomes


def verified(ctx: GuardContext) -> bool:
    """The effect's state is established for the current epoch: applied or not applied
    on authoritative evidence (what a resume and a compensation need)."""
    return applied(ctx).value or not_applied(ctx).value


def unknown_or_conflicting(ctx: GuardContext) -> GuardResult:
    """The effect's state is not established: no trusted verification yet, an `unknown`
    result, or results that disagree. This is the fail-closed branch (SPEC §7.5)."""
    determinate = applied(ctx).value or not_applied(ctx).value
    return GuardResult(not determinate, ctx.view.current_verification_refs())


def attempts_remaining(ctx: GuardContext) -> GuardResult:
    """Retries so far are below the policy's limit. Counters survive restarts."""
    view = ctx.view
    return GuardResult(
        view.retry_attempts < ctx.policy.max_retry_attempts,
        (f"attempts:{view.retry_attempts}/{ctx.policy.max_retry_attempts}",),
    )


def _within_deadline(view: OperationView, now: datetime) -> bool:
    return view.deadline is None or now < view.deadline


def _within_budget(view: OperationView, policy: Policy) -> bool:
    limit = min(view.budget_limit, policy.retry_budget)
    return view.budget_spent < limit


def _key_state(view: OperationView) -> str:
    facts = view.facts
    if not facts.idempotency_key:
        return "absent"
    return "declared-late" if facts.key_declared_late else "present"


def retry_permitted(ctx: GuardContext) -> GuardResult:
    """Retry is safe right now (SPEC §7.1-7.2, SKILL §2, §4): authoritative not-applied
    evidence for the current epoch, the idempotency key declared at or before the failure
    report (not one declared afterwards), attempts below the policy limit,
    before the deadline and within the retry budget, a clear lineage (a descendant
    of a contained operation does not carry on with its effect, CONFORMANCE L5.5), and
    no permanent denial of the call recorded (SKILL §1-2: never retried unchanged), and
    the key its own (not another operation's, SKILL §4: `machines.claims`). The
    core evaluates this itself before any retry-kind capability, whatever guard the
    machine put on the transition."""
    view = ctx.view
    evidence = not_applied(ctx)
    lineage = lineage_clear(ctx)
    key = _key_state(view)
    value = (
        evidence.value
        and key == "present"
        and view.retry_attempts < ctx.policy.max_retry_attempts
        and _within_deadline(view, ctx.now)
        and _within_budget(view, ctx.policy)
        and lineage.value
        and not view.denials
        and view.key_owner is None
    )
    refs = (
        *evidence.evidence,
        f"idempotency-key:{key}",
        f"attempts:{view.retry_attempts}/{ctx.policy.max_retry_attempts}",
        f"budget:{view.budget_spent}/{min(view.budget_limit, ctx.policy.retry_budget)}",
        f"deadline:{view.deadline.isoformat() if view.deadline else 'none'}",
        *lineage.evidence,
        *(f"denied:{event_id}" for event_id in view.denials),
        *(() if view.key_owner is None else (f"key-owner:{view.key_owner.operation_id}",)),
    )
    return GuardResult(value, refs)


def compensation_supported(ctx: GuardContext) -> GuardResult:
    """The tool integration declared that this operation's effect can be compensated."""
    return GuardResult(ctx.view.facts.compensation_supported, ("fact:compensation_supported",))


def valid_approval(ctx: GuardContext) -> Approval | None:
    """The first verified, unused approval for this machine that is still in force now
    and covers the candidate transition: either signed for exactly this state and this
    target, or the approval that authorised entering the current state (the route the
    human approved continues through it, paper notes §1)."""
    view = ctx.view
    for approval in view.approvals:
        if (
            approval.decision != "approved"
            or approval.consumed
            or approval.withdrawn
            or approval.machine_digest != view.machine_digest
            or ctx.now >= approval.expires_at
        ):
            continue
        exact = approval.state == view.state and approval.transition == ctx.transition.target
        # The approval that moved the operation into this state carries on only when it
        # was given for what comes next (the resume itself), not merely for the route.
        entry = approval.event_id == view.entry_approval and approval.for_resume
        if not (exact or entry):
            continue
        # New evidence, or another eligible checkpoint, since it was signed voids it.
        if approval.basis and approval.basis != basis_digest(
            view, ctx.now, for_resume=approval.for_resume
        ):
            continue
        return approval
    return None


def approval_granted(ctx: GuardContext) -> GuardResult:
    """An accountable human approved this transition from this state, the approval is
    still in force now, and it has not been used. Expiry is checked against `now`, so a
    restart never revives an expired approval (SKILL §7)."""
    approval = valid_approval(ctx)
    if approval is None:
        return GuardResult(False, ())
    return GuardResult(True, (f"approval:{approval.event_id}",))


def lineage_clear(ctx: GuardContext) -> GuardResult:
    """No ancestor operation in this operation's lineage is contained (CONFORMANCE L5.5)."""
    contained = ctx.view.lineage.contained_ancestors
    return GuardResult(not contained, tuple(f"contained:{op}" for op in contained))


def resume_permitted(ctx: GuardContext) -> GuardResult:
    """Material resumption is allowed now (SPEC §7.6, §9; paper notes §3.2-3.5): the
    effect's state is verified (applied or not-applied, not unknown), a valid approval
    covers this transition, a checkpoint is eligible for the current machine and policy,
    the lineage is clear, and recovery attempts are within the policy bound."""
    view = ctx.view
    settled = verified(ctx)
    approval = approval_granted(ctx)
    checkpoint = view.newest_eligible_checkpoint(ctx.now)
    lineage = lineage_clear(ctx)
    within = view.recovery_attempts < ctx.policy.max_recovery_attempts
    value = settled and approval.value and checkpoint is not None and lineage.value and within
    refs = (
        *view.current_verification_refs(),
        *approval.evidence,
        f"checkpoint:{checkpoint.checkpoint_id if checkpoint else 'none-eligible'}",
        *lineage.evidence,
        f"recovery-attempts:{view.recovery_attempts}/{ctx.policy.max_recovery_attempts}",
    )
    return GuardResult(value, refs)


STANDARD_GUARDS: Mapping[str, GuardFn] = MappingProxyType(
    {
        "standard.not_applied": not_applied,
        "standard.applied": applied,
        "standard.unknown_or_conflicting": unknown_or_conflicting,
        "standard.retry_permitted": retry_permitted,
        "standard.attempts_remaining": attempts_remaining,
        "standard.compensation_supported": compensation_supported,
        "standard.approval_granted": approval_granted,
        "standard.lineage_clear": lineage_clear,
        "standard.resume_permitted": resume_permitted,
    }
)
"""Implementation name -> guard. The registry maps guard ids to these names; nothing
else is resolvable, so a machine cannot name code into existence."""
