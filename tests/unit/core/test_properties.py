"""Property tests: random event sequences against every catalogue machine never break a
SPEC §7 invariant, and every decision is reproducible from its inputs.

Each sequence mixes the standard events with unknown ones, duplicates and reused event
ids, trusted, untrusted and self-serving verification, checkpoints valid and not,
approvals valid, forged, replayed, expired and self-signed, classifier noise, time
jumps past deadlines and expiries, timers fired when due, fired again and fired after
their state was left, and (per sequence) guards that raise or cannot be resolved. After
every step the checks below must hold.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from machines import CATALOGUE, Machine, load_catalogue, load_registry
from machines.approvals import insecure_test_key, public_key_b64, review_digest, sign_decision
from machines.casefile import faulted
from machines.decision import Decision, Outcome, apply, decide
from machines.event import (
    CheckpointReport,
    ClassifierOutput,
    Event,
    EvidencePayload,
    HumanDecision,
    Lineage,
)
from machines.evidence import with_evidence
from machines.guards import (
    STANDARD_GUARDS,
    GuardContext,
    GuardResult,
    evidence_unsettled,
    retry_permitted,
    valid_approval,
    verified,
)
from machines.invariants import result_family
from machines.model import CapabilityKind, Transition
from machines.policy import Policy, parse_policy
from machines.timers import RETRY_EVENT, due_timers, timer_event
from machines.view import (
    LineageStatus,
    OperationView,
    Timer,
    ToolFacts,
    checkpoint_digest,
    new_view,
    view_from_json,
    view_from_json_text,
    view_to_json,
)

REGISTRY = load_registry()
MACHINES = load_catalogue(REGISTRY, CATALOGUE)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
AGENT, PARENT = "agent-1", "agent-0"
APPROVERS = ("approver-1", "approver-2")
POLICY: Policy = parse_policy(
    {
        "id": "property",
        "max_retry_attempts": 2,
        "retry_budget": 3,
        "deadline_seconds": 3600,
        # Paced retries (the default, made short), a timeout of its own for one state of
        # two machines, the stall bound for every other state.
        "retry_pacing": {"base": "2s", "cap": "30s"},
        "timeouts": {
            "stalled_after": "10m",
            "states": {
                "procurement-request": {
                    "verifying": {"after": "5m", "event": "VERIFICATION_UNAVAILABLE"}
                },
                "payment-refund": {
                    "verifying": {"after": "5m", "event": "VERIFICATION_UNAVAILABLE"}
                },
            },
        },
        "trusted_verifiers": ["verifier-1", "verifier-2"],
        "approvers": [
            {
                "id": a,
                "public_key": public_key_b64(insecure_test_key(a)),
                "roles": ["recovery-approver"],
            }
            for a in (*APPROVERS, AGENT)
        ],
    }
)
EVENTS = (
    "TOOL_TIMEOUT",
    "TOOL_FAILED",
    "VERIFICATION_FOUND",
    "VERIFICATION_NOT_FOUND",
    "VERIFICATION_UNAVAILABLE",
    "VERIFICATION_CONFLICTING",
    "RETRY_SUCCEEDED",
    "RETRY_FAILED",
    "COMPENSATION_SUCCEEDED",
    "COMPENSATION_FAILED",
    "CONTAINMENT_SUCCEEDED",
    "CONTAINMENT_FAILED",
    "STEP_COMPLETED",
    "STEP_FAILED",
    "HUMAN_APPROVED",
    "HUMAN_REJECTED",
    "ANCESTOR_CONTAINED",
    "RESUME_REQUESTED",
    "DUPLICATE_DETECTED",
    "AUTHORIZATION_DENIED",
    "VALIDATION_DENIED",
    "POLICY_DENIED",
    "UNKNOWN_EVENT",
    "RESUME_NOW",
)
PRODUCERS = (
    "tool-integration",
    "verifier-1",
    "verifier-2",
    "untrusted-verifier",
    AGENT,
    PARENT,
    "approver-1",
)
APPROVAL_KINDS = (
    "valid",
    "forged",
    "replayed",
    "expired",
    "self",
    "stale",
    "other-target",
    "unreviewed",
)

_MATERIAL = (CapabilityKind.RETRY, CapabilityKind.COMPENSATE, CapabilityKind.RESUME)
AUTO = "<auto>"  # the plausible choice for the current state (weighted heavily)

move = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(("new",) * 12 + ("duplicate", "reuse-id") + ("timer",) * 4),
        "event": st.sampled_from((AUTO,) * 2 * len(EVENTS) + EVENTS),
        "producer": st.sampled_from((AUTO,) * 20 + PRODUCERS),
        "advance": st.sampled_from((0, 1, 1, 1, 1, 5, 5, 5, 30, 60, 700, 4000)),
        "outcome": st.sampled_from((AUTO,) * 8 + (None, "applied", "not_applied", "unknown")),
        "verifier": st.sampled_from(
            ("verifier-1",) * 6 + ("verifier-2",) * 2 + ("untrusted-verifier", AGENT)
        ),
        "checkpoint": st.sampled_from(
            ("eligible", None, "eligible", "other-policy", "unvalidated", "relayed")
        ),
        "approval": st.sampled_from(("valid",) * 10 + APPROVAL_KINDS),
        "target": st.sampled_from((AUTO,) * 8 + tuple(range(8))),
        "classifier": st.sampled_from((None,) * 8 + ("noise", "confident")),
        "noise": st.dictionaries(st.sampled_from(EVENTS[:6]), st.floats(0, 1), max_size=3),
        "pick": st.integers(min_value=0, max_value=1000),
        "seek": st.sampled_from((True, True, True, False)),
    }
)
# Steer a sequence towards the states where the invariants bite (or not at all).
goals = st.sampled_from(("resume-pending", "retrying", None))
# A guard may raise, be unresolvable, or lie by always saying yes: the core's own retry
# and resume gates must hold even then.
faults = st.dictionaries(
    st.sampled_from(sorted(REGISTRY.guards)),
    st.sampled_from(("raise", "unavailable", "true")),
    max_size=2,
)


def _always_true(ctx: GuardContext) -> GuardResult:
    return GuardResult(True, ("fault:always-true",))


def _faulted(fault: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    registry, table = faulted(REGISTRY, fault)
    return registry, {**table, "fault.true": _always_true}


facts = st.builds(
    ToolFacts,
    idempotency_key=st.sampled_from(("key-1", "key-1", None)),
    side_effect_possible=st.booleans(),
    side_effect_confirmed=st.sampled_from((False, False, False, True)),
    compensation_supported=st.booleans(),
    status_api=st.booleans(),
)


class Driver:
    """Turns abstract moves into events against the current view."""

    def __init__(self, machine: Machine, fact: ToolFacts, goal: str | None = None) -> None:
        self.machine = machine
        self.goal = goal
        self.view: OperationView = new_view(
            operation_id="op-1",
            machine_name=machine.name,
            machine_digest=machine.digest,
            policy_digest=POLICY.digest,
            initial_state=machine.initial,
            lineage=LineageStatus(agent=AGENT, lineage_agents=frozenset({PARENT})),
            facts=fact,
            budget_limit=3,
            deadline=T0 + timedelta(seconds=3600),
        )
        self.now = T0
        self.sent: list[Event] = []
        self.nonces: list[str] = []
        self.states = sorted(machine.states)
        self.toward = _paths_to(machine, goal) if goal else {}
        # Every timer ever armed: firing one disarmed since is a stale event.
        self.timers: dict[str, Timer] = {}

    def event(self, m: dict[str, Any], index: int) -> Event:
        self.now += timedelta(seconds=m["advance"])
        if m["kind"] == "timer":
            fired = self.timer_event(m["pick"])
            if fired is not None:
                return fired
        if m["kind"] == "duplicate" and self.sent:
            return self.sent[m["pick"] % len(self.sent)]
        event_id = f"e{index}"
        if m["kind"] == "reuse-id" and self.sent:
            event_id = self.sent[m["pick"] % len(self.sent)].event_id
        m = self._resolve(m)
        event = Event(
            event_type=m["event"],
            event_id=event_id,
            operation_id="op-1",
            correlation_id="c-1",
            machine_name=self.machine.name,
            machine_version=self.machine.version,
            event_time=self.now,
            evidence_ref=f"ev://{index}",
            producer=m["producer"],
            lineage=Lineage(agent=AGENT, task="t", initiating_principal="p"),
            evidence=self._evidence(m, index),
            human_decision=self._decision(m, index),
            classifier=self._classifier(m),
            causation=self._causation(m),
        )
        self.sent.append(event)
        return event

    def timer_event(self, pick: int) -> Event | None:
        """The event firing a timer due now, or (one time in four) one fired or
        disarmed earlier, as the controller emits it; None when there is none."""
        due = [t.timer_id for t in due_timers(self.view, self.now)]
        armed = {t.timer_id for t in self.view.timers if not t.spent}
        gone = sorted(set(self.timers) - armed)
        pool = gone if gone and not pick % 4 else due
        if not pool:
            return None
        timer = self.view.timer(pool[pick % len(pool)]) or self.timers[pool[pick % len(pool)]]
        event = timer_event(
            timer,
            operation_id="op-1",
            correlation_id="c-1",
            machine_name=self.machine.name,
            machine_version=self.machine.version,
            lineage=Lineage(agent=AGENT, task="t", initiating_principal="p"),
            producer="recovery-controller",
            at=self.now,
        )
        self.sent.append(event)
        return event

    def took(self, view: OperationView) -> None:
        """Move on to `view`, remembering the timers it holds."""
        self.view = view
        self.timers.update((t.timer_id, t) for t in view.timers)

    def _causation(self, m: dict[str, Any]) -> str | None:
        # Verifications and action results answer an open command half of the time,
        # possibly one sent before a retry (a late answer), so the epoch binding is
        # exercised, or one of another kind (a result for the wrong command).
        family = result_family(m["event"])
        open_commands = sorted(self.view.open_commands)
        if family is None or not open_commands or m["pick"] % 2:
            return None
        if m["pick"] % 4 == 0:
            # Mostly a command of the result's own kind, the way a worker answers.
            open_commands = [c for c in open_commands if self._kind(c) in family]
            if not open_commands:
                return None
        return open_commands[(m["pick"] // 4) % len(open_commands)]

    def _kind(self, command_id: str) -> str | None:
        capability = self.view.command_capability(command_id)
        return None if capability is None else str(REGISTRY.capabilities[capability].kind)

    def _resolve(self, m: dict[str, Any]) -> dict[str, Any]:
        m = dict(m)
        state = self.machine.states[self.view.state]
        seeking = m["event"] == AUTO and m["seek"]
        if seeking and self.view.state in self.toward:
            m["event"] = self.toward[self.view.state]
        elif seeking and self.view.state == "resume-pending":
            gate = ("VERIFICATION_FOUND", "HUMAN_APPROVED", "RESUME_REQUESTED")
            m["event"] = gate[m["pick"] % 3]
        if m["event"] == AUTO:
            accepted = sorted(state.on) or list(EVENTS)
            if "RESUME_REQUESTED" in state.on:
                # Evidence and approval the resume gate needs, even where not accepted.
                accepted += ["VERIFICATION_FOUND", "HUMAN_APPROVED"]
            m["event"] = accepted[m["pick"] % len(accepted)]
        kind = m["event"]
        if m["producer"] == AUTO:
            m["producer"] = (
                "verifier-1"
                if kind.startswith("VERIFICATION_")
                else APPROVERS[0]
                if kind.startswith("HUMAN_")
                else AGENT
                if kind == "RESUME_REQUESTED"
                else "tool-integration"
            )
        if m["outcome"] == AUTO:
            m["outcome"] = {
                "VERIFICATION_FOUND": "applied",
                "VERIFICATION_NOT_FOUND": "not_applied",
                "VERIFICATION_UNAVAILABLE": "unknown",
                "VERIFICATION_CONFLICTING": "unknown",
            }.get(kind)
        if m["target"] == AUTO:
            own = state.on.get(kind) or state.on.get("RESUME_REQUESTED") or ()
            m["target"] = own[0].target if own else self.view.state
        else:
            m["target"] = self.states[m["target"] % len(self.states)]
        return m

    def _evidence(self, m: dict[str, Any], index: int) -> EvidencePayload | None:
        checkpoint = None
        if m["checkpoint"] is not None:
            # A validation is the validator's own report: verifier-1 validates the
            # checkpoints it reports; one "relayed" by another producer is refused.
            validated = m["checkpoint"] == "relayed" or (
                m["checkpoint"] != "unvalidated" and m["producer"] == "verifier-1"
            )
            checkpoint = CheckpointReport(
                checkpoint_id=f"cp-{index}",
                saved_at=self.now,
                reference=f"cp://{index}",
                validated=validated,
                validator="verifier-1",
                validated_machine_digest=self.machine.digest,
                validated_policy_digest=POLICY.digest
                if m["checkpoint"] != "other-policy"
                else "sha256:" + "9" * 64,
            )
        if m["outcome"] is None and checkpoint is None:
            return None
        verifier = m["verifier"] if m["outcome"] is not None else None
        return EvidencePayload(
            outcome=m["outcome"],
            verifier=verifier,
            reference=f"ref://{index}",
            checkpoint=checkpoint,
        )

    def _decision(self, m: dict[str, Any], index: int) -> HumanDecision | None:
        if not m["event"].startswith("HUMAN_"):
            return None
        kind = m["approval"]
        approver = AGENT if kind == "self" else APPROVERS[m["pick"] % 2]
        target = m["target"]
        for_resume = "resume-pending" in (self.view.state, target)
        nonce = f"n{index}"
        if kind == "replayed" and self.nonces:
            nonce = self.nonces[m["pick"] % len(self.nonces)]
        self.nonces.append(nonce)
        decision = HumanDecision(
            approver=approver,
            operation_id="op-1",
            state="nowhere" if kind == "stale" else self.view.state,
            transition=target,
            machine_digest=self.machine.digest,
            expires_at=self.now + timedelta(seconds=-1 if kind == "expired" else 600),
            nonce=nonce,
            decision="approved" if m["event"] == "HUMAN_APPROVED" else "rejected",
            # Reviewed on the driver's view (what a review packet would show), for the
            # resume when it is one; "unreviewed" signs a digest of something else.
            reviewed_digest="sha256:" + "7" * 64
            if kind == "unreviewed"
            else review_digest(self.view, target, self.now, for_resume=for_resume),
            for_resume=for_resume,
        )
        signer = "mallory" if kind == "forged" else approver
        return sign_decision(decision, insecure_test_key(signer))

    def _classifier(self, m: dict[str, Any]) -> ClassifierOutput | None:
        if m["classifier"] is None:
            return None
        probs = m["noise"] if m["classifier"] == "noise" else {m["event"]: 0.97}
        candidate = max(probs, key=lambda k: probs[k]) if probs else None
        return ClassifierOutput(
            identity="clf",
            version="1",
            question="q",
            probabilities=MappingProxyType(probs),
            candidate_event=candidate,
        )


def _paths_to(machine: Machine, goal: str) -> dict[str, str]:
    """For each state, an event whose first transition leads one step closer to `goal`."""
    toward: dict[str, str] = {}
    frontier = [goal]
    while frontier:
        nxt: list[str] = []
        for state in machine.states.values():
            if state.name in toward or state.name == goal:
                continue
            for event, transitions in sorted(state.on.items()):
                if transitions[0].target in frontier:
                    toward[state.name] = event
                    nxt.append(state.name)
                    break
        frontier = nxt
    return toward


def _check_fail_closed(
    machine: Machine,
    before: OperationView,
    event: Event,
    d: Decision,
    ctx: GuardContext,
    registry: Any,
) -> None:
    """Issue 30's classes on one decision: evidence is its producer's own, a result
    answers a command of its kind, and no material route or completion is taken on
    unsettled evidence (nor a compensation without authoritative evidence)."""
    verification, checkpoint = d.evidence.verification, d.evidence.checkpoint
    # The evidence's verifier (or validator) is the event's producer, as on the wire.
    assert verification is None or verification.verifier == event.producer
    assert checkpoint is None or not checkpoint.validated or checkpoint.validator == event.producer
    if d.outcome is not Outcome.TRANSITIONED:
        return
    family = result_family(event.event_type)
    if event.causation is not None and family:
        # A result moves the operation only as the answer to a command of its kind.
        capability = before.command_capability(event.causation)
        assert capability is not None
        assert str(registry.capabilities[capability].kind) in family
    if family and event.event_type.endswith("_SUCCEEDED"):
        # SPEC 7.3: a success moves the state only once every command it awaits of the
        # result's family has answered (a result naming none: at most one awaited).
        waiting = [
            c
            for c in before.awaiting & before.open_commands
            if str(registry.capabilities[before.command_capability(c) or ""].kind) in family
        ]
        others = [c for c in waiting if c != event.causation]
        assert not others or (event.causation is None and len(waiting) == 1), "moved early"
    # SPEC 7.5: no material route, and no completion but a human's, on unknown or
    # conflicting evidence; no compensation without authoritative evidence.
    kinds = [i.kind for i in d.invocations]
    material = any(i.material or i.kind in _MATERIAL for i in d.invocations)
    completes = machine.states[d.state_after].final and d.evidence.approval is None
    if material or completes:
        assert not evidence_unsettled(ctx.view), "material route on unsettled evidence"
    if CapabilityKind.COMPENSATE in kinds:
        assert verified(ctx), "compensation without authoritative evidence"


def _check(
    machine: Machine,
    before: OperationView,
    event: Event,
    d: Decision,
    now: datetime,
    registry: Any,
    table: Any,
) -> None:
    # Replaying the same inputs gives the same decision, field for field.
    again = decide(machine, before, event, POLICY, registry, now, guard_table=table)
    assert again == d
    assert again.to_dict() == d.to_dict()
    state = machine.states[before.state]
    if state.final:
        assert d.state_after == before.state
        # Nothing, but the revocation of credentials a finished descendant still holds
        # when an ancestor is contained (CONFORMANCE L5.3).
        assert all(
            (i.origin, i.kind) in (("containment", "revoke"), ("escalation", "escalate"))
            for i in d.invocations
        )
        # A timer's event after the end is stale: recorded, ignored.
        assert d.outcome in (
            Outcome.FINAL,
            Outcome.DUPLICATE,
            Outcome.CONFLICT,
            Outcome.REFUSED,
            Outcome.STALE,
        )
    if d.outcome is not Outcome.TRANSITIONED:
        assert d.state_after == before.state
        # What a paced retry's timer releases is what its transition held back.
        released = d.outcome is Outcome.FIRED and event.event_type == RETRY_EVENT
        assert released or all(i.origin in ("escalation", "containment") for i in d.invocations)
        assert (
            released
            or event.event_type == "ANCESTOR_CONTAINED"
            or all(i.origin == "escalation" for i in d.invocations)
        )
    if (
        d.outcome is Outcome.TRANSITIONED
        and before.lineage.includes(event.producer)
        and machine.states[d.state_after].final
    ):
        # The affected agent's word never completes the operation (SPEC 7.7); only an
        # approval-gated transition (a resume) may end in a final state on its request.
        assert d.approval_used is not None, "the affected agent completed its own operation"
    trusted = with_evidence(before, d.evidence)
    verification = d.evidence.verification
    if verification is not None and event.causation is not None:
        # Evidence answers the attempt of the command it names, never a later one.
        assert verification.epoch == before.command_epoch(event.causation)
        assert verification.epoch <= before.epoch
    kinds = [i.kind for i in d.invocations]
    target = d.transition_target or before.state
    ctx = GuardContext(trusted, POLICY, now, Transition(before.state, event.event_type, 0, target))
    _check_fail_closed(machine, before, event, d, ctx, registry)
    if CapabilityKind.RETRY in kinds:
        assert kinds.count(CapabilityKind.RETRY) == 1
        assert retry_permitted(ctx).value, "retry without retry.permitted"
        assert not trusted.denials, "a denied call retried unchanged"
        assert trusted.current_outcomes() == {"not_applied"}
        assert trusted.facts.idempotency_key
        assert not trusted.facts.key_declared_late, "retry on a key minted after the failure"
        retry = next(i for i in d.invocations if i.kind == CapabilityKind.RETRY)
        assert retry.params["idempotency_key"] == trusted.facts.idempotency_key
    if CapabilityKind.RESUME in kinds:
        approval = valid_approval(ctx)
        assert approval is not None, "resume without a valid approval"
        assert d.approval_consumed
        assert d.approval_used == approval.event_id
        assert approval.approver in APPROVERS
        assert now < approval.expires_at
        # Verified: trusted verifiers agree, or the tool confirmed the effect uncontested.
        outcomes = trusted.current_outcomes()
        assert outcomes in ({"applied"}, {"not_applied"}) or (
            trusted.facts.side_effect_confirmed and outcomes <= {"applied"}
        )
        chosen = trusted.newest_eligible_checkpoint(now)
        assert chosen is not None
        resume = next(i for i in d.invocations if i.kind == CapabilityKind.RESUME)
        assert resume.params["checkpoint_id"] == chosen.checkpoint_id
        assert resume.params["checkpoint_digest"] == checkpoint_digest(chosen)
        assert "from" not in resume.params


@pytest.mark.parametrize("name", sorted(MACHINES))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(moves=st.lists(move, min_size=1, max_size=30), fault=faults, fact=facts, goal=goals)
def test_random_sequences_never_break_an_invariant(name, moves, fault, fact, goal):  # type: ignore[no-untyped-def]
    machine = MACHINES[name]
    registry, table = _faulted(fault)
    driver = Driver(machine, fact, goal)
    trace: list[tuple[Event, datetime, Decision]] = []
    escalated: set[str | None] = set()
    for index, m in enumerate(moves):
        event = driver.event(m, index)
        before = driver.view
        d = decide(machine, before, event, POLICY, registry, driver.now, guard_table=table)
        trace.append((event, driver.now, d))
        _check(machine, before, event, d, driver.now, registry, table)
        # No escalation storms: one escalation per open condition while in a state.
        if any(i.origin == "escalation" for i in d.invocations):
            assert d.escalation not in escalated, f"escalated {d.escalation} twice"
            escalated.add(d.escalation)
        after = apply(before, d)
        if after.state != before.state:
            escalated.clear()
        assert after.retry_attempts >= before.retry_attempts
        assert after.budget_spent >= before.budget_spent
        assert after.recovery_attempts >= before.recovery_attempts
        assert after.used_nonces >= before.used_nonces
        assert after.retry_attempts <= POLICY.max_retry_attempts
        _check_timers(machine, before, d, after)
        driver.took(after)
    # Replaying the whole sequence from the initial view yields the same decisions.
    view = Driver(machine, fact, goal).view
    for event, now, d in trace:
        again = decide(machine, view, event, POLICY, registry, now, guard_table=table)
        assert again == d
        view = apply(view, again)
    assert view == driver.view
    # And the view a ledger would store round-trips through JSON unchanged.
    assert view_from_json(json.loads(json.dumps(view_to_json(view)))) == view
    assert view_from_json_text(json.dumps(view_to_json(view))) == view


def _check_timers(
    machine: Machine, before: OperationView, d: Decision, after: OperationView
) -> None:
    """Nothing waits forever, and a timer fires once (`machines.timers`)."""
    scoped = [t for t in after.timers if t.kind in ("state", "stalled")]
    if machine.states[after.state].final:
        assert after.timers == (), "a final operation keeps a timer"
    elif after.version > 0:
        # Every state that is not final has its timer (a timeout or the stall bound),
        # armed when it was entered.
        assert [t.state for t in scoped] == [after.state], "a state without its timer"
    for timer in after.timers:
        assert timer.due_at >= timer.armed_at
        if timer.kind == "retry" and after.deadline is not None:
            assert timer.due_at < after.deadline or timer.due_at == timer.armed_at
    assert len({t.timer_id for t in after.timers}) == len(after.timers)
    if d.outcome is Outcome.STALE:
        # Recorded and ignored: nothing but the event's id and the version moved.
        assert d.invocations == ()
        assert d.timers.armed == ()
        assert replace(after, version=before.version, seen_events=before.seen_events) == before
    spent = d.timers.spent
    if spent is not None:
        # Only an armed, unspent timer fires; its firing spends it.
        timer = before.timer(spent)
        assert timer is not None
        assert not timer.spent
        assert after.timer(spent) is None or after.timer(spent).spent  # type: ignore[union-attr]


def _auto(**spec: Any) -> dict[str, Any]:
    return {
        "kind": "new",
        "event": AUTO,
        "producer": AUTO,
        "advance": 1,
        "outcome": AUTO,
        "verifier": "verifier-1",
        "checkpoint": None,
        "approval": "valid",
        "target": AUTO,
        "classifier": None,
        "noise": {},
        "pick": 0,
        "seek": True,
        **spec,
    }


def _run(machine: Machine, goal: str, moves: list[dict[str, Any]]) -> list[str]:
    driver = Driver(machine, ToolFacts(idempotency_key="key-1"), goal)
    kinds: list[str] = []
    for index, m in enumerate(moves):
        event = driver.event(m, index)
        d = decide(machine, driver.view, event, POLICY, REGISTRY, driver.now)
        _check(machine, driver.view, event, d, driver.now, REGISTRY, STANDARD_GUARDS)
        kinds.extend(i.kind for i in d.invocations)
        driver.took(apply(driver.view, d))
    return kinds


@pytest.mark.parametrize("name", ["procurement-request", "payment-refund"])
def test_driver_can_steer_into_a_permitted_retry(name):  # type: ignore[no-untyped-def]
    # The invariant checks only bite if retries happen: the steering reaches one.
    # A paced retry goes out when its timer fires (at most `cap` later).
    kinds = _run(
        MACHINES[name], "retrying", [_auto(), _auto(), _auto(kind="timer", advance=30, pick=1)]
    )
    assert CapabilityKind.RETRY in kinds


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_driver_can_steer_into_a_permitted_resume(name):  # type: ignore[no-untyped-def]
    # Likewise for resumption: evidence, checkpoint and approval, then the gate opens.
    moves = [_auto(checkpoint="eligible") for _ in range(4)]
    moves += [_auto(checkpoint="eligible", pick=p) for p in (0, 1, 2)]
    assert CapabilityKind.RESUME in _run(MACHINES[name], "resume-pending", moves)


@pytest.mark.parametrize("name", ["procurement-request", "payment-refund", "multistep-deployment"])
def test_a_lying_retry_guard_cannot_cause_a_retry(name):  # type: ignore[no-untyped-def]
    machine = MACHINES[name]
    registry, table = _faulted({"retry.permitted": "true"})
    driver = Driver(machine, ToolFacts(idempotency_key=None), "retrying")
    outcomes = []
    for index, m in enumerate([_auto(), _auto()]):
        event = driver.event(m, index)
        d = decide(machine, driver.view, event, POLICY, registry, driver.now, guard_table=table)
        outcomes.append((d.outcome, [n.code for n in d.refusals]))
        assert CapabilityKind.RETRY not in [i.kind for i in d.invocations]
        driver.view = apply(driver.view, d)
    assert outcomes[-1] == (Outcome.REFUSED, ["retry-not-permitted"])


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_a_lying_resume_guard_cannot_cause_a_resume(name):  # type: ignore[no-untyped-def]
    # Verified state and an eligible checkpoint, but no approval: the machine's guard says
    # yes, the core's own resume gate says no.
    machine = MACHINES[name]
    registry, table = _faulted({"resume.permitted": "true"})
    driver = Driver(machine, ToolFacts(idempotency_key="key-1"), None)
    driver.view = replace(driver.view, state="resume-pending")
    evidence = _auto(event="VERIFICATION_FOUND", checkpoint="eligible", seek=False)
    request = _auto(event="RESUME_REQUESTED", seek=False)
    decisions = []
    for index, m in enumerate([evidence, request]):
        event = driver.event(m, index)
        d = decide(machine, driver.view, event, POLICY, registry, driver.now, guard_table=table)
        decisions.append(d)
        driver.view = apply(driver.view, d)
    assert driver.view.newest_eligible_checkpoint(driver.now) is not None
    resume = decisions[-1]
    assert resume.guards[0].value is True  # the lying guard
    assert resume.outcome is Outcome.REFUSED
    assert [n.code for n in resume.refusals] == ["resume-not-permitted"]
    assert CapabilityKind.RESUME not in [i.kind for i in resume.invocations]
