"""The pure decision (SPEC §6.5, §7, §8 steps 4-7) and the fold that yields the next view.

`decide(machine, view, event, policy, registry, now)` reads no clock, socket or database.
It returns a `Decision`: everything SPEC §10 asks the controller to record for one event
(states before and after, identifiers and evidence reference, every guard evaluated with
the evidence it read, the selected or rejected transition, the capabilities to invoke,
refusals, controller errors, classifier evidence). `apply(view, decision)` folds the
decision into the next `OperationView`; nothing else changes a view. The same two
functions serve the live controller, `recoveryctl test`/`simulate` and property tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from machines.claims import reuse_of
from machines.classifier import ClassifierRecord, classifier_refusal
from machines.compiled import CompiledTransition, GuardEvaluation, compile_machine
from machines.event import Event
from machines.evidence import (
    NO_EVIDENCE,
    EvidenceDelta,
    admit_evidence,
    evidence_changes,
    with_evidence,
)
from machines.guards import (
    STANDARD_GUARDS,
    GuardContext,
    GuardFn,
    retry_permitted,
    valid_approval,
)
from machines.invariants import (
    ANSWERED_KINDS,
    RETRY_AFTER_DENIAL,
    Notice,
    action_refusal,
    authority_refusal,
    awaited_refusal,
    causation_refusal,
    needs_approval,
    route_refusal,
)
from machines.model import ActionRef, CapabilityKind, CapabilitySpec, Machine, Registry, Transition
from machines.policy import Policy
from machines.timers import (
    NO_TIMER_CHANGE,
    TimerChange,
    TimerKind,
    holds_retry,
    is_timer_event,
    plan_timers,
    retry_after_seconds,
)
from machines.view import (
    Approval,
    HeldAction,
    OperationView,
    Timer,
    checkpoint_digest,
    evolve,
)

CORRELATION_MISMATCH = "correlation-mismatch"
ESCALATION_SUPPRESSED = "escalation-suppressed"
AFFECTED_AGENT_FINAL = "affected-agent-final"
FINAL_STATE = "final-state"
DUPLICATE_DETECTED = "DUPLICATE_DETECTED"
ANCESTOR_CONTAINED = "ANCESTOR_CONTAINED"
ANCESTOR_CONTAINED_UNROUTED = "ancestor-contained-unrouted"
CONTAINMENT_UNAVAILABLE = "containment-unavailable"
STOP, REVOKE = str(CapabilityKind.STOP), str(CapabilityKind.REVOKE)
IDEMPOTENCY_KEY_CONFLICT = "idempotency-key-conflict"
DUPLICATE_OPERATION = "duplicate-operation"


class Outcome(StrEnum):
    """What the decision did with the event."""

    TRANSITIONED = "transitioned"  # a transition was selected and recorded
    REJECTED = "rejected"  # no transition accepted the event; state unchanged (§6.5)
    REFUSED = "refused"  # validation or an invariant refused it; state unchanged (§7)
    FINAL = "final"  # the operation is in a final state, which accepts nothing
    AWAITING = "awaiting"  # a result recorded; the state waits for its other actions (§7.3)
    DUPLICATE = "duplicate"  # same event id, same payload: already decided
    CONFLICT = "conflict"  # same event id, different payload: dead-letter it
    # A timer's event did what the timer does without a transition: a stalled or
    # deadline timer escalated, a paced retry's timer commanded what it held back.
    FIRED = "fired"
    # A timer's event arrived after its timer was disarmed (its state was left): recorded
    # and ignored (`machines.timers`).
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class Invocation:
    """One capability to invoke after the decision is recorded. `command_id` is
    deterministic (operation, sequence, index) so redelivered commands dedupe."""

    command_id: str
    capability: str
    kind: str
    material: bool
    params: Mapping[str, Any]
    origin: str  # "transition", "entry", "escalation" or "containment"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form."""
        return {
            "command_id": self.command_id,
            "capability": self.capability,
            "kind": self.kind,
            "material": self.material,
            "params": dict(self.params),
            "origin": self.origin,
        }


@dataclass(frozen=True, slots=True)
class Decision:
    """The record of one decided event (SPEC §10). Frozen; `to_dict` is stable JSON."""

    operation_id: str
    sequence: int
    machine_name: str
    machine_version: str
    machine_digest: str
    policy_digest: str
    decided_at: datetime
    event_id: str
    event_type: str
    correlation_id: str
    event_time: datetime
    evidence_ref: str
    producer: str
    payload_digest: str
    causation: str | None
    outcome: Outcome
    state_before: str
    state_after: str
    guards: tuple[GuardEvaluation, ...] = ()
    transition_index: int | None = None
    transition_target: str | None = None
    invocations: tuple[Invocation, ...] = ()
    refusals: tuple[Notice, ...] = ()
    errors: tuple[Notice, ...] = ()
    evidence: EvidenceDelta = NO_EVIDENCE
    classifier: ClassifierRecord | None = None
    approval_used: str | None = None
    approval_consumed: bool = False
    # The open condition this decision escalated, or met again and only counted
    # (`escalation_suppressed`): its refusal code, and the event type when the machine
    # knows it (a stream of unknown types is one condition).
    escalation: str | None = None
    escalation_suppressed: bool = False
    # The machine version the event named when it is not the version that decided it:
    # an operation stays on the version it opened under (docs/machine-format.md,
    # "Rollout"), and the mismatch is recorded, never a refusal.
    named_version: str | None = None
    # A signed migration to another version of the machine (`machines.migration`):
    # `{"from": {version, digest}, "to": {version, digest}, "states": {old: new}}`; the
    # decision names the version it moved the operation to.
    migration: Mapping[str, Any] | None = None
    # The timers this decision armed, disarmed and spent (`machines.timers`).
    timers: TimerChange = NO_TIMER_CHANGE

    @property
    def capabilities(self) -> tuple[str, ...]:
        """The capability ids to invoke, in order."""
        return tuple(i.capability for i in self.invocations)

    def to_dict(self) -> dict[str, Any]:
        """The decision as plain JSON-ready data with a fixed key set; the machine block
        adds `named_version` only for an event that named another version."""
        # The ledger builds this record for every decided event: the parts most
        # decisions leave empty are written without a comprehension (each one is a
        # call), and the shared empty evidence without asking it. Same dict either way.
        guards, invocations = self.guards, self.invocations
        refusals, errors, evidence = self.refusals, self.errors, self.evidence
        machine = {
            "name": self.machine_name,
            "version": self.machine_version,
            "digest": self.machine_digest,
        }
        if self.named_version is not None:
            machine["named_version"] = self.named_version
        record: dict[str, Any] = {
            "operation_id": self.operation_id,
            "sequence": self.sequence,
            "machine": machine,
            "policy_digest": self.policy_digest,
            "decided_at": self.decided_at.isoformat(),
            "event": {
                "id": self.event_id,
                "type": self.event_type,
                "correlation_id": self.correlation_id,
                "time": self.event_time.isoformat(),
                "evidence_ref": self.evidence_ref,
                "producer": self.producer,
                "payload_digest": self.payload_digest,
                "causation": self.causation,
            },
            "outcome": str(self.outcome),
            "state_before": self.state_before,
            "state_after": self.state_after,
            "guards": [g.to_dict() for g in guards] if guards else [],
            "transition": None
            if self.transition_index is None
            else {"index": self.transition_index, "target": self.transition_target},
            "invocations": [i.to_dict() for i in invocations] if invocations else [],
            "refusals": [n.to_dict() for n in refusals] if refusals else [],
            "errors": [n.to_dict() for n in errors] if errors else [],
            "evidence": {} if evidence is NO_EVIDENCE else evidence.to_dict(),
            "classifier": None if self.classifier is None else self.classifier.to_dict(),
            "approval": {"used": self.approval_used, "consumed": self.approval_consumed},
            "escalation": None
            if self.escalation is None
            else {"condition": self.escalation, "suppressed": self.escalation_suppressed},
            "timers": self.timers.to_dict(),
        }
        if self.migration is not None:
            record["migration"] = dict(self.migration)
        return record


class _Draft:
    """The parts of a decision still being worked out. Building the frozen `Decision`
    once at the end, instead of copying it at every step, keeps `decide` fast."""

    __slots__ = (
        "approval_consumed",
        "approval_used",
        "classifier",
        "condition_scope",
        "errors",
        "escalation",
        "escalation_suppressed",
        "evidence",
        "guards",
        "held",
        "invocations",
        "outcome",
        "refusals",
        "sequence",
        "spent",
        "state_after",
        "transition",
    )

    def __init__(self, view: OperationView) -> None:
        self.sequence = view.version + 1
        self.outcome = Outcome.REJECTED
        self.state_after = view.state
        self.guards: tuple[GuardEvaluation, ...] = ()
        self.transition: Transition | None = None
        self.invocations: tuple[Invocation, ...] = ()
        self.refusals: tuple[Notice, ...] = ()
        self.errors: tuple[Notice, ...] = ()
        self.evidence = NO_EVIDENCE
        self.classifier: ClassifierRecord | None = None
        self.approval_used: str | None = None
        self.approval_consumed = False
        self.condition_scope = ""
        self.escalation: str | None = None
        self.escalation_suppressed = False
        # A paced retry's commands, held back on a timer; the timer this event fired.
        self.held: tuple[HeldAction, ...] = ()
        self.spent: str | None = None


def decide(
    machine: Machine,
    view: OperationView,
    event: Event,
    policy: Policy,
    registry: Registry,
    now: datetime,
    *,
    guard_table: Mapping[str, GuardFn] = STANDARD_GUARDS,
) -> Decision:
    """Decide what `event` does to the operation `view` describes under the pinned
    `machine`, `policy` and `registry` at time `now`. Pure and deterministic: the same
    inputs give an equal `Decision`. Never raises for a bad event or a failing guard;
    every refusal and error is recorded in the decision instead. `guard_table` maps the
    registry's implementation names to guards; tests pass a table with faults in it."""
    draft = _Draft(view)
    # A timer's event (`machines.timers`) once it is new and its envelope is this
    # operation's; everything else, and a timer's duplicate, the usual way.
    timed = (
        is_timer_event(event.event_id)
        and event.event_id not in view.seen_events
        and _envelope_refusal(machine, view, event) is None
    )
    draft_one = _decide_timer if timed else _draft_decision
    draft_one(draft, machine, view, event, policy, registry, now, guard_table)
    return _finish(draft, machine, view, event, policy, now)


def _draft_decision(
    draft: _Draft,
    machine: Machine,
    view: OperationView,
    event: Event,
    policy: Policy,
    registry: Registry,
    now: datetime,
    guard_table: Mapping[str, GuardFn],
) -> None:
    seen = view.seen_events.get(event.event_id)
    if seen is not None:
        draft.outcome = Outcome.DUPLICATE if seen == event.payload_digest else Outcome.CONFLICT
        draft.sequence = view.version
        return
    refusal = _envelope_refusal(machine, view, event) or _state_refusal(machine, view, event)
    if refusal is not None:
        final = refusal.code == FINAL_STATE
        draft.outcome, draft.refusals = (Outcome.FINAL if final else Outcome.REFUSED), (refusal,)
        if final and event.event_type == ANCESTOR_CONTAINED:
            _finished(draft, machine, view, event, policy, registry, now)
        return
    if event.event_type in _events_of(machine):
        draft.condition_scope = event.event_type
    refusal = _admission(draft, view, event, policy, registry, now)
    candidates: tuple[CompiledTransition, ...] = ()
    if refusal is None:
        candidates, refusal = _candidates(draft, machine, view, event, registry, guard_table)
    if draft.outcome is Outcome.AWAITING:
        return
    if refusal is not None:
        _withhold(draft, Outcome.REFUSED, refusal, view, policy, registry)
    elif not candidates and draft.evidence.contained_ancestor is not None:
        _contain_unrouted(draft, machine, view, event, policy, registry)
    else:
        _select(draft, candidates, _finals_of(machine), view, event, policy, registry, now)


def _admission(
    draft: _Draft,
    view: OperationView,
    event: Event,
    policy: Policy,
    registry: Registry,
    now: datetime,
) -> Notice | None:
    """Whether the event may say what it says, and the trusted evidence it adds (into
    the draft): the classifier boundary, the producer's authority, the command it
    answers, then evidence admission; the first refusal, or None."""
    draft.classifier, refusal = classifier_refusal(event, policy)
    refusal = refusal or authority_refusal(event, view) or causation_refusal(event, view, registry)
    if refusal is None:
        draft.evidence, refusal = admit_evidence(event, view, policy, now)
    return refusal


def _finished(
    draft: _Draft,
    machine: Machine,
    view: OperationView,
    event: Event,
    policy: Policy,
    registry: Registry,
    now: datetime,
) -> None:
    """An ancestor's containment reaching an operation in a final state (CONFORMANCE
    L5.3): its machine accepts nothing, but if it still holds the credentials delegated
    to it, the controller revokes them; the contained ancestor is recorded as evidence.
    An event the core would refuse anywhere (from the agent's lineage, say) is refused
    here too."""
    refusal = _admission(draft, view, event, policy, registry, now)
    if refusal is not None:
        _withhold(draft, Outcome.REFUSED, refusal, view, policy, registry)
        return
    if view.credentials and not view.revoked:
        draft.invocations = _containment(draft, machine, view, policy, registry, stop=False)


def _contain_unrouted(
    draft: _Draft,
    machine: Machine,
    view: OperationView,
    event: Event,
    policy: Policy,
    registry: Registry,
) -> None:
    """A trusted contained ancestor reported in a state the machine gives no route for
    it (CONFORMANCE L5.2, L5.3): the controller stops the task and its queued work and
    revokes the credentials it still holds itself, with the machine's own stop and
    revoke capabilities, as two commands (SPEC §7.3), and escalates; the state does not
    change, and the held lineage keeps retry and resume shut."""
    notice = Notice(
        ANCESTOR_CONTAINED_UNROUTED,
        f"operation {view.operation_id}: {event.event_type} {event.event_id} (ancestor "
        f"{draft.evidence.contained_ancestor}) has no route in state {view.state}; the "
        "controller stops the task and revokes its delegated credentials itself",
    )
    contained = _containment(draft, machine, view, policy, registry, stop=True)
    _withhold(draft, Outcome.REJECTED, notice, view, policy, registry)
    draft.invocations = contained + tuple(
        replace(i, command_id=f"{view.operation_id}:{draft.sequence}:{len(contained) + n}")
        for n, i in enumerate(draft.invocations)
    )


def _containment(
    draft: _Draft,
    machine: Machine,
    view: OperationView,
    policy: Policy,
    registry: Registry,
    *,
    stop: bool,
) -> tuple[Invocation, ...]:
    """The controller's own containment commands: the machine's stop (when `stop`) and,
    while the operation holds delegated credentials it has not had revoked, its revoke
    capability (`_containment_actions`); one it lacks, or the policy forbids, is recorded
    as a `containment-unavailable` error."""
    wanted = (STOP, REVOKE) if stop else (REVOKE,)
    actions = _containment_actions(machine, registry)
    out: list[Invocation] = []
    for kind in wanted:
        if (kind == REVOKE and (not view.credentials or view.revoked)) or (
            kind == STOP and view.stopped
        ):
            continue  # nothing delegated, or already revoked or stopped since it resumed
        action = actions.get(kind)
        spec = registry.capabilities.get(action.capability) if action else None
        if action is None or spec is None or action.capability in policy.forbidden_capabilities:
            draft.errors = (
                *draft.errors,
                Notice(
                    CONTAINMENT_UNAVAILABLE,
                    f"operation {view.operation_id}: machine {machine.name} names no usable "
                    f"{kind} capability; the controller cannot {kind} it itself",
                ),
            )
            continue
        out.append(_invocation(view, draft.sequence, len(out), action, spec, "containment"))
    return tuple(out)


def _containment_actions(machine: Machine, registry: Registry) -> Mapping[str, ActionRef]:
    """The machine's own stop and revoke actions (with their params): those of its
    `ANCESTOR_CONTAINED` transitions first, else the first of each kind any transition
    invokes, in machine order. Not cached: only a contained ancestor's event in a state
    without a route, or in a final state, asks."""
    transitions = [t for st in machine.states.values() for ts in st.on.values() for t in ts]
    ordered = [t for t in transitions if t.event == ANCESTOR_CONTAINED] + transitions
    chosen: dict[str, ActionRef] = {}
    for action in (a for t in ordered for a in t.actions):
        spec = registry.capabilities.get(action.capability)
        if spec is not None and str(spec.kind) in (STOP, REVOKE):
            chosen.setdefault(str(spec.kind), action)
    return chosen


def _candidates(
    draft: _Draft,
    machine: Machine,
    view: OperationView,
    event: Event,
    registry: Registry,
    guard_table: Mapping[str, GuardFn],
) -> tuple[tuple[CompiledTransition, ...], Notice | None]:
    """The transitions the event may take in the current state, in machine order, or why
    it takes none: the event type it is decided as (`_routed_type`), without the final
    ones for the affected agent's own report (`_lineage_candidates`); a success result
    that waits for other actions sets the draft's outcome to `awaiting` instead."""
    routed, refusal = _routed_type(draft, view, event)
    if refusal is not None:
        return (), refusal
    candidates = compile_machine(machine, registry, guard_table).get((view.state, routed), ())
    if routed != event.event_type and not candidates:
        return (), _no_duplicate_route(view, event)
    if view.lineage.includes(event.producer):
        refusal, candidates = _lineage_candidates(machine, view, event, candidates)
    if refusal is None and candidates:
        refusal, hold = awaited_refusal(event, view, registry)
        if hold and refusal is not None:
            draft.outcome, draft.refusals = Outcome.AWAITING, (refusal,)
            return (), None
    return candidates, refusal


def _routed_type(draft: _Draft, view: OperationView, event: Event) -> tuple[str, Notice | None]:
    """The event type the operation's opening event is decided as, or why it is refused
    (practice §4, `machines.claims`): when it declares an idempotency key another
    operation owns (`view.key_owner`, laid by the fold), the same arguments make it a
    duplicate business operation, decided on the machine's `DUPLICATE_DETECTED` route;
    other (or undeclared) arguments make it a conflicting reuse of the key, refused
    (`idempotency-key-conflict`). Either way the decision's evidence records it."""
    owner = view.key_owner
    facts = draft.evidence.facts or view.facts
    if owner is None or view.version != 0 or facts.idempotency_key is None:
        return event.event_type, None
    verdict = reuse_of(owner, facts.arguments_digest)
    draft.evidence = replace(draft.evidence, key_reuse=(owner.operation_id, verdict))
    if verdict == "duplicate":
        return DUPLICATE_DETECTED, None
    return event.event_type, Notice(
        IDEMPOTENCY_KEY_CONFLICT,
        f"operation {view.operation_id}: {event.event_type} {event.event_id} declares "
        f"idempotency key {facts.idempotency_key!r}, which operation {owner.operation_id} "
        "already holds for other arguments (or without an arguments digest to compare); a "
        "key is never reused for another call (practice §4): refused, a human decides",
    )


def _no_duplicate_route(view: OperationView, event: Event) -> Notice:
    return Notice(
        DUPLICATE_OPERATION,
        f"operation {view.operation_id}: {event.event_type} {event.event_id} is a duplicate of "
        f"operation {view.key_owner.operation_id if view.key_owner else '?'} (same idempotency "
        f"key and arguments), and state {view.state} has no {DUPLICATE_DETECTED} route; "
        "refused, a human decides",
    )


def _state_refusal(machine: Machine, view: OperationView, event: Event) -> Notice | None:
    """Why the operation's state takes no event at all: a state the machine does not
    define (only a ledger written under another machine; pinning prevents it), or a
    final one (`FINAL_STATE`)."""
    state = machine.states.get(view.state)
    if state is None:
        return Notice(
            "unknown-state",
            f"operation {view.operation_id} is in state {view.state}, which machine "
            f"{machine.name} {machine.version} does not define; check the pinned machine",
        )
    if state.final:
        return Notice(
            FINAL_STATE,
            f"operation {view.operation_id} is in final state {view.state}; "
            f"{event.event_type} {event.event_id} changes nothing",
        )
    return None


def _lineage_candidates(
    machine: Machine,
    view: OperationView,
    event: Event,
    candidates: tuple[CompiledTransition, ...],
) -> tuple[Notice | None, tuple[CompiledTransition, ...]]:
    """SPEC 7.7: the affected agent's word is not evidence; its own report never moves
    the operation to a final state (the pipeline or a verifier must). Approval-gated
    transitions stay: a human decides those (the agent may ask to resume; the resume
    gate, not its word, lets it). The candidates kept, or why none is."""
    finals = _finals_of(machine)
    kept = tuple(
        c
        for c in candidates
        if c.uses_approval
        or c.transition.guard in _APPROVAL_GUARDS
        or c.transition.target not in finals
    )
    if not candidates or kept:
        return None, kept
    return Notice(
        AFFECTED_AGENT_FINAL,
        f"{event.event_type} {event.event_id} refused in state {view.state}: "
        f"producer {event.producer} is the affected agent or in its lineage, and its "
        "own report never completes the operation; have the pipeline, the tool or "
        "a verifier report it",
    ), kept


_EVENTS: dict[str, frozenset[str]] = {}
_FINALS: dict[str, frozenset[str]] = {}
_APPROVAL_GUARDS = frozenset({"approval.granted", "resume.permitted"})


def _finals_of(machine: Machine) -> frozenset[str]:
    """The final states of `machine` (cached by digest)."""
    finals = _FINALS.get(machine.digest)
    if finals is None:
        finals = frozenset(n for n, s in machine.states.items() if s.final)
        if len(_FINALS) > 256:
            _FINALS.clear()
        _FINALS[machine.digest] = finals
    return finals


def _events_of(machine: Machine) -> frozenset[str]:
    """Every event type some state of `machine` accepts (cached by digest)."""
    events = _EVENTS.get(machine.digest)
    if events is None:
        events = frozenset(e for state in machine.states.values() for e in state.on)
        if len(_EVENTS) > 256:
            _EVENTS.clear()
        _EVENTS[machine.digest] = events
    return events


def _finish(
    draft: _Draft,
    machine: Machine,
    view: OperationView,
    event: Event,
    policy: Policy,
    now: datetime,
) -> Decision:
    transition = draft.transition
    timers = NO_TIMER_CHANGE
    if draft.outcome not in (Outcome.DUPLICATE, Outcome.CONFLICT, Outcome.STALE):
        # Only what the core accepted may ask a retry to wait (never a refused event).
        asked = (
            retry_after_seconds(event.payload)
            if draft.outcome in (Outcome.TRANSITIONED, Outcome.REJECTED)
            else None
        )
        timers = plan_timers(
            machine,
            policy,
            view,
            sequence=draft.sequence,
            state_after=draft.state_after,
            entered=transition is not None,
            now=now,
            held=draft.held,
            spent=draft.spent,
            retry_after=asked,
        )
    return Decision(
        operation_id=view.operation_id,
        sequence=draft.sequence,
        machine_name=machine.name,
        machine_version=machine.version,
        machine_digest=machine.digest,
        policy_digest=policy.digest,
        decided_at=now,
        event_id=event.event_id,
        event_type=event.event_type,
        correlation_id=event.correlation_id,
        event_time=event.event_time,
        evidence_ref=event.evidence_ref,
        producer=event.producer,
        payload_digest=event.payload_digest,
        causation=event.causation,
        outcome=draft.outcome,
        state_before=view.state,
        state_after=draft.state_after,
        guards=draft.guards,
        transition_index=None if transition is None else transition.index,
        transition_target=None if transition is None else transition.target,
        invocations=draft.invocations,
        refusals=draft.refusals,
        errors=draft.errors,
        evidence=draft.evidence,
        classifier=draft.classifier,
        approval_used=draft.approval_used,
        approval_consumed=draft.approval_consumed,
        escalation=draft.escalation,
        escalation_suppressed=draft.escalation_suppressed,
        named_version=None if event.machine_version == machine.version else event.machine_version,
        timers=timers,
    )


def _envelope_refusal(machine: Machine, view: OperationView, event: Event) -> Notice | None:
    if event.operation_id != view.operation_id:
        return Notice(
            "wrong-operation",
            f"event {event.event_id} is for operation {event.operation_id}, not "
            f"{view.operation_id}; route it by operation id",
        )
    if view.correlation_id and event.correlation_id != view.correlation_id:
        return Notice(
            CORRELATION_MISMATCH,
            f"event {event.event_id} carries correlation id {event.correlation_id}; "
            f"operation {view.operation_id} was opened with {view.correlation_id}; send "
            "the operation's own correlation id (SPEC 6.2)",
        )
    # Another *version* of the operation's machine is no refusal: the operation is
    # decided by the version it is pinned to, and the decision records the version the
    # event named (`Decision.named_version`).
    if event.machine_name != machine.name or view.machine_digest != machine.digest:
        return Notice(
            "machine-mismatch",
            f"event {event.event_id} names machine {event.machine_name} "
            f"{event.machine_version}; operation {view.operation_id} is pinned to "
            f"{view.machine_name} ({view.machine_digest}), not {machine.name} "
            f"{machine.version} ({machine.digest})",
        )
    return None


def _select(
    draft: _Draft,
    candidates: tuple[CompiledTransition, ...],
    finals: frozenset[str],
    view: OperationView,
    event: Event,
    policy: Policy,
    registry: Registry,
    now: datetime,
    *,
    escalate: bool = False,
) -> None:
    trusted = with_evidence(view, draft.evidence)
    evaluations: list[GuardEvaluation] = []
    errors: list[Notice] = []
    blocked: list[Notice] = []
    # A human's accepted decision that ends the operation (a rejection closing it) is
    # not a completion on evidence: the human saw the evidence in the review packet.
    human = draft.evidence.approval is not None
    for candidate in candidates:
        transition = candidate.transition
        ctx = GuardContext(trusted, policy, now, transition)
        if transition.guard is not None:
            evaluation = candidate.evaluate(ctx)
            evaluations.append(evaluation)
            if evaluation.error is not None:
                code = evaluation.error.split(":", 1)[0]
                errors.append(Notice(code, _guard_error_message(evaluation, view)))
            if not evaluation.value:
                continue
        # SPEC 7.5, whatever the machine's guard said: a material route or a completion
        # on unknown or conflicting evidence is not taken; the next candidate (the
        # machine's fallback, usually an escalation) is considered instead.
        specs = [s for _, a in candidate.planned if (s := registry.capabilities.get(a.capability))]
        completes = transition.target in finals and not human
        refusal = route_refusal(specs, completes, ctx)
        if refusal is not None:
            blocked.append(refusal)
            continue
        draft.guards, draft.errors = tuple(evaluations), tuple(errors)
        _take(draft, candidate, trusted, view, policy, registry, now)
        if blocked:
            _blocked_routes(draft, blocked, view, policy, registry)
        return
    draft.guards, draft.errors = tuple(evaluations), tuple(errors)
    if blocked:
        # Nothing else to take: refused and escalated whatever the policy says about
        # rejected events, because unknown or conflicting evidence always escalates.
        draft.refusals = (*draft.refusals, *blocked[1:])
        _withhold(draft, Outcome.REFUSED, blocked[0], view, policy, registry)
        return
    notice = Notice(
        "no-transition",
        f"operation {view.operation_id}: event {event.event_type} {event.event_id} rejected in "
        f"state {view.state}: no accepted transition"
        + (" (every guard was false)" if candidates else ""),
    )
    if policy.escalate_rejected_events or escalate:
        _withhold(draft, Outcome.REJECTED, notice, view, policy, registry)
    else:
        draft.refusals = (*draft.refusals, notice)


def _decide_timer(
    draft: _Draft,
    machine: Machine,
    view: OperationView,
    event: Event,
    policy: Policy,
    registry: Registry,
    now: datetime,
    guard_table: Mapping[str, GuardFn],
) -> None:
    """Decide a timer's event (`machines.timers`): stale unless its timer is armed and
    unspent; a state timeout's event is selected among the state's transitions like any
    other (the evidence rule of `_select` included), and escalated if none takes it
    whatever the policy says of rejections (the timeout must not end in silence); a
    stalled or deadline timer escalates once; a retry timer commands what its transition
    held back. A timer's event is the controller's own (intake takes it from nobody
    else) and carries no evidence, causation, facts or classifier block: `_admission`
    has nothing to admit, and the armed timer its id names is what it is checked
    against."""
    timer = view.timer(event.event_id)
    if timer is None or timer.spent or timer.event_type != event.event_type:
        draft.outcome = Outcome.STALE
        draft.refusals = (
            Notice(
                "timer-stale",
                f"operation {view.operation_id}: {event.event_type} {event.event_id} fires "
                f"a timer no longer armed in state {view.state} (the state it was armed in "
                "was left, or the operation ended); recorded, nothing changes",
            ),
        )
        return
    draft.spent = timer.timer_id
    if timer.kind == TimerKind.STATE:
        draft.condition_scope = event.event_type
        compiled = compile_machine(machine, registry, guard_table)
        candidates = compiled.get((view.state, event.event_type), ())
        finals = _finals_of(machine)
        _select(draft, candidates, finals, view, event, policy, registry, now, escalate=True)
    elif timer.kind == TimerKind.RETRY:
        _release(draft, timer, view, policy, registry, now)
    else:
        _withhold(draft, Outcome.FIRED, _waited(timer, view, policy), view, policy, registry)


def _waited(timer: Timer, view: OperationView, policy: Policy) -> Notice:
    """Why a stalled or deadline timer escalates."""
    if timer.kind == TimerKind.DEADLINE:
        return Notice(
            "deadline-passed",
            f"operation {view.operation_id} passed its deadline "
            f"{timer.due_at.isoformat()} in state {view.state}, which is not final "
            "(policy deadline_seconds); escalated once",
        )
    return Notice(
        "stalled",
        f"operation {view.operation_id} has waited in state {view.state} since "
        f"{timer.armed_at.isoformat()} ({policy.timeouts.stalled_after}s, policy "
        "timeouts.stalled_after) with nothing moving it; escalated once, it shows as "
        "stalled until an event moves it",
    )


def _release(
    draft: _Draft,
    timer: Timer,
    view: OperationView,
    policy: Policy,
    registry: Registry,
    now: datetime,
) -> None:
    """Command what a paced retry's transition held back, in order, if the retry is
    still permitted now (the evidence, deadline, budget and lineage may have moved
    since): anything refused withholds them all and escalates. What the transition was
    checked for when it was taken (approvals, which it spent) is not asked again."""
    transition = Transition(view.state, timer.event_type, -1, view.state)
    work = view
    invocations: list[Invocation] = []
    for held in timer.held:
        spec = registry.capabilities.get(held.capability)
        action = ActionRef(held.capability, MappingProxyType(dict(held.params)))
        refusal = _release_refusal(action, spec, GuardContext(work, policy, now, transition))
        if refusal is not None:
            _withhold(draft, Outcome.REFUSED, refusal, view, policy, registry)
            return
        assert spec is not None  # _release_refusal refuses unregistered capabilities
        action = _bound(action, spec, work, now)
        counted = _counters(work, (spec.kind,))
        if counted:
            work = evolve(work, counted)
        invocations.append(
            _invocation(view, draft.sequence, len(invocations), action, spec, held.origin)
        )
    draft.outcome = Outcome.FIRED
    draft.invocations = tuple(invocations)


def _release_refusal(
    action: ActionRef, spec: CapabilitySpec | None, ctx: GuardContext
) -> Notice | None:
    if spec is None or action.capability in ctx.policy.forbidden_capabilities:
        return Notice(
            "capability-forbidden" if spec is not None else "capability-unregistered",
            f"held {action.capability} not commanded: it is no longer registered or is "
            "forbidden by policy",
        )
    if spec.kind is CapabilityKind.RETRY and ctx.view.denials:
        return Notice(
            RETRY_AFTER_DENIAL,
            f"paced retry {action.capability} not commanded when its timer fired: "
            f"operation {ctx.view.operation_id}'s call was denied meanwhile "
            f"({', '.join(ctx.view.denials)}); a permanent denial is not retried unchanged",
        )
    if spec.kind is CapabilityKind.RETRY and not retry_permitted(ctx).value:
        return Notice(
            "retry-not-permitted",
            f"paced retry {action.capability} not commanded when its timer fired: "
            "retry.permitted is false now (evidence, attempts, deadline, budget, "
            "lineage or the key's owner moved since it was scheduled)",
        )
    # The evidence rule (SPEC §7.5) as when the route was taken: unknown or conflicting
    # evidence reported since holds every material command back.
    return route_refusal((spec,), False, ctx)


def _blocked_routes(
    draft: _Draft,
    blocked: list[Notice],
    view: OperationView,
    policy: Policy,
    registry: Registry,
) -> None:
    """Record the routes the evidence rule refused before the one taken, and make sure
    the decision escalates (SPEC §7.5): the taken route's own escalation does, else the
    policy's escalation is added to its invocations."""
    draft.refusals = (*blocked, *draft.refusals)
    if draft.outcome is not Outcome.TRANSITIONED:
        return  # withheld by an invariant after all: `_withhold` escalated
    if any(i.kind == CapabilityKind.ESCALATE for i in draft.invocations):
        return
    taken = draft.invocations
    draft.invocations = taken + tuple(
        replace(i, command_id=f"{view.operation_id}:{draft.sequence}:{len(taken)}")
        for i in _escalate(draft, blocked[0], view, policy, registry)
    )


def _guard_error_message(evaluation: GuardEvaluation, view: OperationView) -> str:
    return (
        f"operation {view.operation_id} state {view.state}: guard {evaluation.guard} "
        f"({evaluation.implementation or 'unresolved'}) evaluated false: {evaluation.error}; "
        "fix the registry or the guard implementation"
    )


def _take(
    draft: _Draft,
    candidate: CompiledTransition,
    trusted: OperationView,
    view: OperationView,
    policy: Policy,
    registry: Registry,
    now: datetime,
) -> None:
    transition = candidate.transition
    ctx = GuardContext(trusted, policy, now, transition)
    approval = valid_approval(ctx) if candidate.uses_approval else None
    consumed = False
    invocations: list[Invocation] = []
    planned: list[HeldAction] = []
    work = trusted
    for origin, action in candidate.planned:
        spec = registry.capabilities.get(action.capability)
        ctx = GuardContext(work, policy, now, transition)
        refusal = action_refusal(action, spec, ctx)
        if refusal is not None:
            # One refused action withholds the whole transition: entering a state whose
            # action never ran would leave the operation waiting for a result forever.
            _withhold(draft, Outcome.REFUSED, refusal, view, policy, registry)
            return
        assert spec is not None  # action_refusal refuses unregistered capabilities
        if needs_approval(action, spec, policy):
            # A material action spends the approval: one approval, one resumption.
            approval = approval or valid_approval(ctx)
            consumed = True
        planned.append(HeldAction(action.capability, dict(action.params), origin))
        action = _bound(action, spec, work, now)
        counted = _counters(work, (spec.kind,))
        if counted:
            work = evolve(work, counted)
        invocations.append(
            _invocation(view, draft.sequence, len(invocations), action, spec, origin)
        )
    draft.outcome = Outcome.TRANSITIONED
    draft.transition = transition
    draft.state_after = transition.target
    draft.invocations = tuple(invocations)
    if any(i.kind == CapabilityKind.RETRY for i in invocations) and holds_retry(policy, view, now):
        # A paced retry (agent-failure-recovery practice §2): the transition is recorded
        # now; its commands go out when the retry timer fires (`_release`).
        draft.held, draft.invocations = tuple(planned), ()
    draft.approval_used = approval.event_id if approval is not None else None
    draft.approval_consumed = consumed and approval is not None


def _bound(
    action: ActionRef, spec: CapabilitySpec, work: OperationView, now: datetime
) -> ActionRef:
    """`action` with what the decision chose bound into its params: a retry carries
    exactly the idempotency key declared for the original call; a resume names the
    checkpoint the gate selected (the newest eligible, which may be older than the
    newest saved) by id and digest, never a symbolic "last-verified-checkpoint"."""
    if spec.kind is CapabilityKind.RETRY:
        params = {**action.params, "idempotency_key": work.facts.idempotency_key}
    elif spec.kind is CapabilityKind.RESUME:
        chosen = work.newest_eligible_checkpoint(now)
        if chosen is None:  # action_refusal withholds a resume without one
            return action
        params = {k: v for k, v in action.params.items() if k != "from"}
        params["checkpoint_id"] = chosen.checkpoint_id
        params["checkpoint_digest"] = checkpoint_digest(chosen)
    else:
        return action
    return ActionRef(capability=action.capability, params=MappingProxyType(params))


def _invocation(
    view: OperationView,
    sequence: int,
    index: int,
    action: ActionRef,
    spec: CapabilitySpec,
    origin: str,
) -> Invocation:
    return Invocation(
        command_id=f"{view.operation_id}:{sequence}:{index}",
        capability=action.capability,
        kind=str(spec.kind),
        material=spec.material,
        params=action.params,
        origin=origin,
    )


def _withhold(
    draft: _Draft,
    outcome: Outcome,
    notice: Notice,
    view: OperationView,
    policy: Policy,
    registry: Registry,
) -> None:
    """State unchanged, the notice recorded, and the policy's escalation invoked."""
    draft.outcome = outcome
    draft.refusals = (*draft.refusals, notice)
    draft.invocations = _escalate(draft, notice, view, policy, registry)


def _escalate(
    draft: _Draft, notice: Notice, view: OperationView, policy: Policy, registry: Registry
) -> tuple[Invocation, ...]:
    """The policy's escalation of `notice`, invoked after what the draft already invokes
    (none when the condition is already open, or escalation is unavailable: an error
    says which)."""
    condition = f"{notice.code}:{draft.condition_scope}" if draft.condition_scope else notice.code
    draft.escalation = condition
    repeats = view.escalated(condition)
    if repeats:
        draft.escalation_suppressed = True
        # No escalation storms: the condition is open and a human was told; this event
        # is recorded and counted, not paged again.
        draft.errors = (
            *draft.errors,
            Notice(
                ESCALATION_SUPPRESSED,
                f"operation {view.operation_id} state {view.state}: condition {condition} "
                f"was already escalated; not escalated again (repeat {repeats} since, "
                "counted in the view)",
            ),
        )
        return ()
    spec = registry.capabilities.get(policy.escalation_capability)
    if spec is None or policy.escalation_capability in policy.forbidden_capabilities:
        missing = Notice(
            "escalation-unavailable",
            f"policy {policy.id} escalation capability {policy.escalation_capability} is not "
            "registered or is forbidden; the refusal is recorded but nobody is told",
        )
        draft.errors = (*draft.errors, missing)
        return ()
    # The decision record already names the state, event and machine; the params carry
    # only what the escalation capability's schema accepts.
    params = MappingProxyType({**policy.escalation_params, "reason": notice.code})
    action = ActionRef(capability=spec.id, params=params)
    return (_invocation(view, draft.sequence, 0, action, spec, "escalation"),)


def _open_commands(
    view: OperationView, decision: Decision
) -> tuple[frozenset[str], tuple[tuple[str, int], ...]]:
    """The open command ids after `decision`, and the effect epoch each was issued in:
    the epoch after the invocations planned before it in the same decision (a verify
    after a retry in one transition checks the retry's attempt)."""
    current = view.open_commands
    answered = {_answered(decision)} - {None}
    issued: list[tuple[str, int]] = []
    epoch = view.epoch
    for invocation in decision.invocations:
        if invocation.kind in _EPOCH_KINDS:
            epoch += 1
        if invocation.kind in ANSWERED_KINDS:
            issued.append((invocation.command_id, epoch))
    if not issued and not (answered & current):
        return current, view.command_epochs
    still = (current - answered) | {c for c, _ in issued}
    epochs = tuple((c, e) for c, e in view.command_epochs if c in still) + tuple(issued)
    return still, epochs


def _awaiting(
    view: OperationView, decision: Decision, still_open: frozenset[str]
) -> frozenset[str]:
    """The commands the state after `decision` awaits (`OperationView.awaiting`): a taken
    transition awaits what it issued, plus the awaited commands still open when it was
    taken on the result of one of them; any other decision only drops the command it
    answered."""
    answered = _answered(decision)
    if decision.outcome is not Outcome.TRANSITIONED:
        return view.awaiting - {answered} if answered in view.awaiting else view.awaiting
    issued = {i.command_id for i in decision.invocations if i.kind in ANSWERED_KINDS}
    carried = view.awaiting & still_open if answered in view.awaiting else frozenset()
    return frozenset(issued) | carried


def _escalations(view: OperationView, decision: Decision) -> tuple[tuple[str, int], ...]:
    """The open escalation conditions after `decision`: none once the state changes; a
    condition escalated by this decision opens with count 1; a suppressed repeat adds 1."""
    if decision.state_after != decision.state_before:
        return ()
    current = view.escalations
    condition = decision.escalation
    if condition is None:
        return current
    if decision.escalation_suppressed:
        return tuple((c, n + 1 if c == condition else n) for c, n in current)
    if any(i.origin == "escalation" for i in decision.invocations):
        return (*current, (condition, 1))
    return current


_EPOCH_KINDS = frozenset({str(CapabilityKind.RETRY), str(CapabilityKind.COMPENSATE)})
_CONTAINED_KINDS = frozenset({STOP, REVOKE, str(CapabilityKind.RESUME)})


def _answered(decision: Decision) -> str | None:
    """The command `decision` took an answer for: the event's causation, unless the event
    was refused (a result for the wrong command, from the wrong producer, on evidence
    the core does not trust is no answer; the command stays open for the real one)."""
    return None if decision.outcome is Outcome.REFUSED else decision.causation


def _command_capabilities(view: OperationView, decision: Decision) -> tuple[tuple[str, str], ...]:
    answered = _answered(decision)
    kept = tuple((c, cap) for c, cap in view.command_capabilities if c != answered)
    issued = tuple(
        (i.command_id, i.capability) for i in decision.invocations if i.kind in ANSWERED_KINDS
    )
    return kept + issued


def _counters(view: OperationView, kinds: Sequence[str]) -> dict[str, int]:
    """The counters that invoking capabilities of `kinds` advances, as `evolve` changes:
    a retry spends an attempt and a unit of budget and starts a new epoch, a compensation
    starts a new epoch, a resumption counts a recovery attempt; other kinds count nothing.
    `decide` counts one action at a time (a later action's checks see the earlier ones),
    `apply` a decision's invocations at once; both through this one function."""
    # A StrEnum member equals its value, so `CapabilityKind` members and the `kind`
    # strings of recorded invocations are counted alike.
    retries = kinds.count(CapabilityKind.RETRY)
    compensations = kinds.count(CapabilityKind.COMPENSATE)
    resumes = kinds.count(CapabilityKind.RESUME)
    changes: dict[str, int] = {}
    if retries:
        changes["retry_attempts"] = view.retry_attempts + retries
        changes["budget_spent"] = view.budget_spent + retries
    if retries or compensations:
        changes["epoch"] = view.epoch + retries + compensations
    if resumes:
        changes["recovery_attempts"] = view.recovery_attempts + resumes
    return changes


def apply(view: OperationView, decision: Decision) -> OperationView:
    """The next ledger view after `decision`. Duplicates and conflicts change nothing
    (a conflict keeps the first payload's digest); every other decision records the
    event id, folds accepted evidence and counters, and moves to `state_after`."""
    if decision.outcome in (Outcome.DUPLICATE, Outcome.CONFLICT):
        return view
    seen = dict(view.seen_events)
    seen[decision.event_id] = decision.payload_digest
    # Every change is gathered first and the new view built once: a copy per evidence
    # fact and per counted invocation was a third of the fold's cost, and the ledger
    # folds every decision again at commit.
    changes = evidence_changes(view, decision.evidence)
    if decision.invocations:
        changes.update(_counters(view, [i.kind for i in decision.invocations]))
    approvals: tuple[Approval, ...] = changes.get("approvals", view.approvals)
    used = decision.approval_used
    if used is not None and decision.approval_consumed:
        changes["approvals"] = tuple(
            replace(a, consumed=True) if a.event_id == used else a for a in approvals
        )
    if decision.state_after != decision.state_before:
        changes["entry_approval"] = None if decision.approval_consumed else used
    changes["open_commands"], changes["command_epochs"] = _open_commands(view, decision)
    awaiting = _awaiting(view, decision, changes["open_commands"])
    if awaiting != view.awaiting:
        changes["awaiting"] = awaiting
    escalations = _escalations(view, decision)
    if escalations is not view.escalations:
        changes["escalations"] = escalations
    if decision.invocations or view.command_capabilities:
        changes["command_capabilities"] = _command_capabilities(view, decision)
    changes.update(decision.timers.applied_to(view))
    kinds = {i.kind for i in decision.invocations}
    if kinds & _CONTAINED_KINDS:
        # A stop or revocation holds until a resumption gives the task back its run and
        # its authority.
        resumed = str(CapabilityKind.RESUME) in kinds
        changes["stopped"] = STOP in kinds or (view.stopped and not resumed)
        changes["revoked"] = REVOKE in kinds or (view.revoked and not resumed)
    if decision.migration is not None and decision.outcome is Outcome.TRANSITIONED:
        # A signed migration (`machines.migration`) moves the operation to the version
        # it was decided under; nothing else ever changes an operation's machine.
        changes["machine_digest"] = decision.machine_digest
        changes["machine_version"] = decision.machine_version
    changes["state"] = decision.state_after
    changes["version"] = decision.sequence
    changes["seen_events"] = MappingProxyType(seen)
    return evolve(view, changes)
