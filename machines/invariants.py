"""The SPEC §7 invariants, enforced by the core whatever the machine says.

Two kinds of check live here. `authority_refusal` decides whether an event's producer
may say what the event says at all (SPEC §7.7: the affected agent and its lineage cannot
approve, cannot supply authoritative evidence about their own effect, cannot change
trust status). `action_refusal` decides whether one capability invocation may go out
now: the retry gate (§7.1-7.2), the resume gate (§7.6), approval for material actions,
forbidden capabilities and the separation of stop and revoke (§7.3). Each refusal is a
`Notice` the decision records; nothing here raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from machines.event import Event
from machines.guards import (
    GuardContext,
    approval_granted,
    evidence_unsettled,
    resume_permitted,
    retry_permitted,
    verified,
)
from machines.model import ActionRef, CapabilityKind, CapabilitySpec, Registry
from machines.policy import Policy
from machines.view import OperationView

RESULT_WRONG_COMMAND: Final = "result-wrong-command"
EVIDENCE_UNSETTLED: Final = "evidence-unsettled"
COMPENSATION_UNVERIFIED: Final = "compensation-unverified"
RETRY_AFTER_DENIAL: Final = "retry-after-denial"
AWAITING_ACTIONS: Final = "awaiting-actions"
RESULT_UNATTRIBUTED: Final = "result-unattributed"


@dataclass(frozen=True, slots=True)
class Notice:
    """A recorded refusal or controller error: a stable code and a message for people."""

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """Plain JSON-ready form."""
        return {"code": self.code, "message": self.message}


VERIFICATION_EVENTS: frozenset[str] = frozenset(
    {
        "VERIFICATION_FOUND",
        "VERIFICATION_NOT_FOUND",
        "VERIFICATION_UNAVAILABLE",
        "VERIFICATION_CONFLICTING",
    }
)
HUMAN_EVENTS: frozenset[str] = frozenset({"HUMAN_APPROVED", "HUMAN_REJECTED"})
# Reports that the operation's call (or a retry of it) was refused for a reason that
# holds until its inputs or authority legitimately change (practice §1): the same call
# is never retried unchanged after one.
DENIAL_EVENTS: frozenset[str] = frozenset(
    {"AUTHORIZATION_DENIED", "VALIDATION_DENIED", "POLICY_DENIED"}
)

# Events that assert authority or evidence about the operation's effect. The affected
# agent and its lineage may report that something failed; they may not report what
# their own effect was, that a recovery action worked, or that trust status changed.
AUTHORITY_EVENTS: frozenset[str] = (
    VERIFICATION_EVENTS
    | HUMAN_EVENTS
    | {
        "RETRY_SUCCEEDED",
        "RETRY_FAILED",
        "COMPENSATION_SUCCEEDED",
        "COMPENSATION_FAILED",
        "CONTAINMENT_SUCCEEDED",
        "CONTAINMENT_FAILED",
        "ANCESTOR_CONTAINED",
    }
)

# Parameter names that would fold revocation into a stop (or the reverse): SPEC §7.3
# wants two invocations, each with its own result event and audit record.
_REVOKE_PARAMS = frozenset({"revoke", "revoke_credentials", "revoke_authority", "and_revoke"})
_STOP_PARAMS = frozenset({"stop", "stop_task", "stop_execution", "and_stop"})


# Capability kinds whose outcome comes back as an event naming the command (SPEC §6.4);
# their command ids stay open until then.
ANSWERED_KINDS: frozenset[str] = frozenset(
    str(k)
    for k in (
        CapabilityKind.VERIFY,
        CapabilityKind.RETRY,
        CapabilityKind.COMPENSATE,
        CapabilityKind.STOP,
        CapabilityKind.REVOKE,
        CapabilityKind.ISOLATE,
        CapabilityKind.RESUME,
    )
)


_STOPPING: Final = frozenset(
    str(k) for k in (CapabilityKind.STOP, CapabilityKind.REVOKE, CapabilityKind.ISOLATE)
)
# The kinds of command each family of result events answers (SPEC §6.4, §8 step 9): a
# verification answers a verify command, a retry result a retry, a containment result a
# stop, a revocation or an isolation. Keys are event-type prefixes.
_RESULT_FAMILIES: Final[Mapping[str, frozenset[str]]] = {
    "VERIFICATION_": frozenset({str(CapabilityKind.VERIFY)}),
    "RETRY_": frozenset({str(CapabilityKind.RETRY)}),
    "COMPENSATION_": frozenset({str(CapabilityKind.COMPENSATE)}),
    "CONTAINMENT_": _STOPPING,
    "RESUME_": frozenset({str(CapabilityKind.RESUME)}),
}
_RESULT_SUFFIXES: Final = ("_SUCCEEDED", "_FAILED")


def result_family(event_type: str) -> frozenset[str] | None:
    """The command kinds `event_type` reports on, when it is a verification or an action
    result (`RETRY_SUCCEEDED`, `CONTAINMENT_FAILED`, ...); None for any other event."""
    if event_type in VERIFICATION_EVENTS:
        return _RESULT_FAMILIES["VERIFICATION_"]
    if not event_type.endswith(_RESULT_SUFFIXES):
        return None
    for prefix, kinds in _RESULT_FAMILIES.items():
        if event_type.startswith(prefix):
            return kinds
    return None


def causation_refusal(event: Event, view: OperationView, registry: Registry) -> Notice | None:
    """An action result or verification that names a command must name one this
    operation issued, that is still open, and of the kind the result reports on (a
    `RETRY_SUCCEEDED` answers a retry, never a verification); a result for another
    command is not evidence of anything. Events without causation are decided on their
    own, for producers that do not report command ids."""
    causation = event.causation
    if causation is None or event.event_type not in AUTHORITY_EVENTS:
        return None
    if causation not in view.open_commands:
        return Notice(
            "unknown-command",
            f"{event.event_type} {event.event_id} answers command {causation}, which "
            f"operation {view.operation_id} has not issued or has already had answered",
        )
    family = result_family(event.event_type)
    capability = view.command_capability(causation)
    spec = registry.capabilities.get(capability) if capability is not None else None
    if family is None or (spec is not None and str(spec.kind) in family):
        return None
    kind = spec.kind if spec is not None else "unknown"
    return Notice(
        RESULT_WRONG_COMMAND,
        f"{event.event_type} {event.event_id} names command {causation} "
        f"({capability or 'unknown capability'}, kind {kind}), but a {event.event_type} "
        f"reports on a command of kind {' or '.join(sorted(family))}; it is not a result "
        f"for that command and moves nothing in operation {view.operation_id}",
    )


def authority_refusal(event: Event, view: OperationView) -> Notice | None:
    """Why the event's producer may not say what it says, or None. Checks SPEC §7.7."""
    lineage = view.lineage
    if not lineage.includes(event.producer):
        return None
    who = f"producer {event.producer} is the affected agent or in its lineage"
    if event.event_type in HUMAN_EVENTS:
        return Notice("affected-agent-cannot-approve", f"{event.event_type} refused: {who}")
    if event.event_type in AUTHORITY_EVENTS:
        return Notice(
            "affected-agent-evidence",
            f"{event.event_type} refused: {who}; it cannot supply evidence about its own "
            "effect; have the tool's verifier or the capability worker report it",
        )
    evidence = event.evidence
    if evidence is not None and (evidence.outcome is not None or evidence.verifier is not None):
        return Notice(
            "affected-agent-evidence",
            f"{event.event_type} refused: {who}; it carries verification evidence about "
            "its own effect",
        )
    return None


def action_refusal(
    action: ActionRef, spec: CapabilitySpec | None, ctx: GuardContext
) -> Notice | None:
    """Why `action` may not be invoked now, or None. `ctx.view` must already count the
    invocations planned earlier in the same decision, so two retries in one transition
    cannot both pass the gate."""
    capability = action.capability
    if spec is None:
        return Notice(
            "capability-unregistered",
            f"capability {capability} is not in the administrator registry; register it or "
            "fix the machine",
        )
    policy = ctx.policy
    if capability in policy.forbidden_capabilities:
        return Notice("capability-forbidden", f"capability {capability} is forbidden by policy")
    combined = _combined_stop_revoke(action, spec)
    if combined is not None:
        return combined
    if (
        spec.kind is CapabilityKind.RETRY
        and "idempotency_key" in action.params
        and (action.params["idempotency_key"] != ctx.view.facts.idempotency_key)
    ):
        return Notice(
            "idempotency-key-mismatch",
            f"retry {capability} refused: its params name idempotency key "
            f"{action.params['idempotency_key']!r}, not the key the tool declared for the "
            "original call; a retry carries exactly that key, so drop the param",
        )
    if spec.kind is CapabilityKind.RETRY and ctx.view.denials:
        return Notice(
            RETRY_AFTER_DENIAL,
            f"retry {capability} refused: operation {ctx.view.operation_id}'s call was "
            f"denied ({', '.join(ctx.view.denials)}); a permanent denial is not retried "
            "unchanged, a human decides what changes",
        )
    if spec.kind is CapabilityKind.RETRY and not retry_permitted(ctx).value:
        return Notice(
            "retry-not-permitted",
            f"retry {capability} refused: retry.permitted is false now (needs authoritative "
            "not-applied evidence, the idempotency key declared with the failure, attempts, "
            "deadline and budget, and no "
            "contained ancestor)",
        )
    if spec.kind is CapabilityKind.RESUME and not resume_permitted(ctx).value:
        return Notice(
            "resume-not-permitted",
            f"resume {capability} refused: needs verified state, a valid approval for "
            f"{ctx.transition.target}, an eligible checkpoint, a clear lineage and recovery "
            "attempts within policy",
        )
    if needs_approval(action, spec, policy) and not approval_granted(ctx).value:
        return Notice(
            "approval-required",
            f"capability {capability} needs a valid approval for {ctx.transition.target} "
            "from an accountable human under policy",
        )
    return None


def needs_approval(action: ActionRef, spec: CapabilitySpec, policy: Policy) -> bool:
    """Whether invoking `action` needs (and spends) a valid approval: every resume, every
    capability the policy lists, and every material one when the policy says so."""
    return (
        spec.kind is CapabilityKind.RESUME
        or action.capability in policy.approval_required_capabilities
        or (spec.material and policy.require_approval_for_material)
    )


def _combined_stop_revoke(action: ActionRef, spec: CapabilitySpec) -> Notice | None:
    if spec.kind is CapabilityKind.STOP and _REVOKE_PARAMS & set(action.params):
        return Notice(
            "stop-revoke-combined",
            f"stop capability {action.capability} may not also revoke; invoke a revoke "
            "capability separately",
        )
    if spec.kind is CapabilityKind.REVOKE and _STOP_PARAMS & set(action.params):
        return Notice(
            "stop-revoke-combined",
            f"revoke capability {action.capability} may not also stop; invoke a stop "
            "capability separately",
        )
    return None


# Capability kinds that act on the effect itself: they need settled evidence whatever
# the machine's guard says (SPEC §7.5), as a retry needs not-applied evidence.
_MATERIAL_KINDS: Final = frozenset(
    {CapabilityKind.RETRY, CapabilityKind.COMPENSATE, CapabilityKind.RESUME}
)


def route_refusal(
    specs: Sequence[CapabilitySpec], completes: bool, ctx: GuardContext
) -> Notice | None:
    """Why the candidate transition `ctx.transition` may not be taken on the evidence
    `ctx.view` holds, or None (SPEC §7.5, enforced independently of the machine).
    `specs` are the capabilities it would invoke (its actions, then its target's entry
    actions); `completes` says it enters a final state other than on an accountable
    human's decision. A material route (a retry, compensation, resume or any material
    capability) and a completion are refused while the current epoch's trusted evidence
    conflicts or says unknown; a compensation (a rollback, a cancellation) also needs
    authoritative evidence of the effect's state, as a retry needs authoritative
    not-applied evidence. The decision then takes the machine's next candidate and
    escalates."""
    material = [s for s in specs if s.material or s.kind in _MATERIAL_KINDS]
    if not material and not completes:
        return None
    view, target = ctx.view, ctx.transition.target
    if evidence_unsettled(view):
        what = material[0].id if material else f"completion in {target}"
        outcomes = ", ".join(sorted(view.current_outcomes()))
        return Notice(
            EVIDENCE_UNSETTLED,
            f"operation {view.operation_id}: {what} ({view.state} -> {target}) refused: "
            f"trusted evidence for effect epoch {view.epoch} is unknown or conflicting "
            f"({outcomes}); conflicting or unknown evidence fails closed and escalates",
        )
    compensation = next((s for s in specs if s.kind is CapabilityKind.COMPENSATE), None)
    if compensation is not None and not verified(ctx):
        return Notice(
            COMPENSATION_UNVERIFIED,
            f"operation {view.operation_id}: compensation {compensation.id} ({view.state} -> "
            f"{target}) refused: no authoritative evidence of the effect's state for effect "
            f"epoch {view.epoch}; verify before undoing an effect that may not exist",
        )
    return None


def awaited_refusal(
    event: Event, view: OperationView, registry: Registry
) -> tuple[Notice | None, bool]:
    """Whether a success result may move the operation yet (SPEC §7.3, §8 step 9): the
    notice and True (hold: the result is recorded, the state waits) while another
    command the state awaits, of the kinds the result reports on, is unanswered; the
    notice and False (refuse) for a result that names no command while several are
    awaited, since the core cannot tell which one answered; (None, False) otherwise."""
    family = result_family(event.event_type)
    if family is None or not event.event_type.endswith("_SUCCEEDED"):
        return None, False
    waiting = sorted(
        c for c in view.awaiting & view.open_commands if _kind_of(view, registry, c) in family
    )
    causation = event.causation
    if causation is None:
        if len(waiting) <= 1:
            return None, False  # one awaited command (or none): the result is its answer
        return Notice(
            RESULT_UNATTRIBUTED,
            f"{event.event_type} {event.event_id} names no command, but operation "
            f"{view.operation_id} in {view.state} awaits {', '.join(waiting)}; report each "
            "action's result with the command id it answers",
        ), False
    others = [c for c in waiting if c != causation]
    if not others:
        return None, False
    described = ", ".join(f"{c} ({view.command_capability(c)})" for c in others)
    return Notice(
        AWAITING_ACTIONS,
        f"{event.event_type} {event.event_id} answers {causation}; operation "
        f"{view.operation_id} stays in {view.state} until {described} "
        f"{'has' if len(others) == 1 else 'have'} answered too (a failure of any takes "
        "the machine's failure path)",
    ), True


def _kind_of(view: OperationView, registry: Registry, command_id: str) -> str | None:
    capability = view.command_capability(command_id)
    spec = registry.capabilities.get(capability) if capability is not None else None
    return None if spec is None else str(spec.kind)
