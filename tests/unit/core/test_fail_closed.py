"""Properties of issue 30's classes over every catalogue machine: whatever state an
operation is in and whatever the machine's guards say, the core fails closed.

Each property builds an operation's view directly (a state, the trusted evidence of
its effect epoch, the commands it awaits) rather than steering a random walk there, so
the situation it is about is met on every example, and decides one event on it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machines import CATALOGUE, Machine, load_catalogue, load_registry
from machines.decision import Outcome, apply, decide
from machines.event import DeclaredFacts, EffectOutcome, Event, EvidencePayload, Lineage
from machines.evidence import with_evidence
from machines.guards import GuardContext, evidence_unsettled, retry_permitted, verified
from machines.invariants import result_family
from machines.model import CapabilityKind, Transition
from machines.policy import parse_policy
from machines.view import (
    KeyClaim,
    LineageStatus,
    OperationView,
    ToolFacts,
    Verification,
    new_view,
)

REGISTRY = load_registry()
MACHINES = load_catalogue(REGISTRY, CATALOGUE)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
VERIFIERS = ("verifier-1", "verifier-2")
POLICY = parse_policy(
    {"id": "fail-closed", "max_retry_attempts": 3, "trusted_verifiers": list(VERIFIERS)}
)
MATERIAL = (CapabilityKind.RETRY, CapabilityKind.COMPENSATE, CapabilityKind.RESUME)
OUTCOME_OF: dict[str, EffectOutcome] = {
    "VERIFICATION_FOUND": "applied",
    "VERIFICATION_NOT_FOUND": "not_applied",
    "VERIFICATION_UNAVAILABLE": "unknown",
    "VERIFICATION_CONFLICTING": "unknown",
}


def _situations(machine: Machine) -> list[tuple[str, str]]:
    """Every (non-final state, event it accepts) of `machine`."""
    return sorted(
        (state.name, event)
        for state in machine.states.values()
        if not state.final
        for event in state.on
    )


SITUATIONS = [(name, s, e) for name, m in sorted(MACHINES.items()) for s, e in _situations(m)]

facts = st.builds(
    ToolFacts,
    idempotency_key=st.sampled_from(("key-1", None)),
    side_effect_confirmed=st.booleans(),
    compensation_supported=st.booleans(),
    declared_by=st.just("tool-integration"),
)
# The current epoch's trusted results, one per verifier (or none), unsettled or not.
results = st.fixed_dictionaries(
    {v: st.sampled_from((None, "applied", "not_applied", "unknown")) for v in VERIFIERS}
)


def view_of(
    machine: Machine, state: str, fact: ToolFacts, latest: dict[str, Any], **changes: Any
) -> OperationView:
    base = new_view(
        operation_id="op-1",
        machine_name=machine.name,
        machine_digest=machine.digest,
        policy_digest=POLICY.digest,
        initial_state=state,
        lineage=LineageStatus(agent="agent-1"),
        facts=fact,
        budget_limit=5,
        deadline=T0 + timedelta(hours=1),
    )
    verifications = tuple(
        Verification(v, outcome, f"ref://{v}", f"ev-{v}", 0)
        for v, outcome in sorted(latest.items())
        if outcome is not None
    )
    return replace(base, verifications=verifications, **changes)


def event_for(machine: Machine, view: OperationView, event_type: str, producer: str) -> Event:
    evidence = None
    if event_type in OUTCOME_OF:
        evidence = EvidencePayload(outcome=OUTCOME_OF[event_type], verifier=producer)
    return Event(
        event_type=event_type,
        event_id="e-under-test",
        operation_id=view.operation_id,
        correlation_id="c-1",
        machine_name=machine.name,
        machine_version=machine.version,
        event_time=T0,
        evidence_ref="ev://under-test",
        producer=producer,
        lineage=Lineage(agent="agent-1", task="t", initiating_principal="p"),
        evidence=evidence,
    )


@pytest.mark.parametrize(("name", "state", "event_type"), SITUATIONS)
@settings(max_examples=25, deadline=None)
@given(fact=facts, latest=results, producer=st.sampled_from((*VERIFIERS, "tool-integration")))
def test_no_material_route_or_completion_on_unsettled_evidence(
    name: str, state: str, event_type: str, fact: ToolFacts, latest: dict[str, Any], producer: str
) -> None:
    """SPEC 7.5, class 1: a retry, compensation, resume or completion is never taken
    while the current epoch's trusted evidence conflicts or says unknown, and a
    compensation never without authoritative evidence; a route refused for that
    escalates."""
    machine = MACHINES[name]
    view = view_of(machine, state, fact, latest)
    event = event_for(machine, view, event_type, producer)
    d = decide(machine, view, event, POLICY, REGISTRY, T0)
    trusted = with_evidence(view, d.evidence)
    refused_on_evidence = {"evidence-unsettled", "compensation-unverified"} & {
        n.code for n in d.refusals
    }
    if refused_on_evidence:
        assert any(i.kind == CapabilityKind.ESCALATE for i in d.invocations) or (
            d.escalation_suppressed
        )
    if d.outcome is not Outcome.TRANSITIONED:
        return
    target = d.transition_target
    assert target is not None
    material = any(i.material or i.kind in MATERIAL for i in d.invocations)
    if material or machine.states[target].final:
        assert not evidence_unsettled(trusted), f"{d.transition_target} on unsettled evidence"
    if any(i.kind == CapabilityKind.COMPENSATE for i in d.invocations):
        ctx = GuardContext(trusted, POLICY, T0, Transition(state, event_type, 0, target))
        assert verified(ctx), "compensation without authoritative evidence"


@pytest.mark.parametrize(("name", "state", "event_type"), SITUATIONS)
@settings(max_examples=10, deadline=None)
@given(
    denial=st.sampled_from(("AUTHORIZATION_DENIED", "VALIDATION_DENIED", "POLICY_DENIED")),
    producer=st.sampled_from((*VERIFIERS, "tool-integration")),
)
def test_no_retry_after_a_permanent_denial(
    name: str, state: str, event_type: str, denial: str, producer: str
) -> None:
    """Practice §1-2, class 4: once the call (or a retry of it) was denied, nothing
    retries it, whatever evidence, key and budget say."""
    machine = MACHINES[name]
    fact = ToolFacts(idempotency_key="key-1", declared_by="tool-integration")
    view = view_of(machine, state, fact, dict.fromkeys(VERIFIERS, "not_applied"))
    denied = decide(
        machine, view, event_for(machine, view, denial, "tool-integration"), POLICY, REGISTRY, T0
    )
    assert denied.evidence.denial == "e-under-test"
    after = replace(view, denials=(denied.evidence.denial,))
    event = replace(event_for(machine, after, event_type, producer), event_id="e-next")
    d = decide(machine, after, event, POLICY, REGISTRY, T0)
    assert CapabilityKind.RETRY not in [i.kind for i in d.invocations]


def _success_situations() -> list[tuple[str, str, str]]:
    return [
        (n, s, e)
        for n, s, e in SITUATIONS
        if e.endswith("_SUCCEEDED") and result_family(e) and REGISTRY_KINDS.get(e)
    ]


# Capabilities of the registry by the kinds a result family answers.
REGISTRY_KINDS = {
    e: [c for c in sorted(REGISTRY.capabilities) if REGISTRY.capabilities[c].kind in family]
    for e in {e for _, _, e in SITUATIONS}
    if (family := result_family(e))
}


@pytest.mark.parametrize(("name", "state", "event_type"), _success_situations())
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_success_moves_only_once_every_awaited_action_answered(
    name: str, state: str, event_type: str, data: st.DataObject
) -> None:
    """SPEC 7.3, CONFORMANCE L4.1, class 2: with several commands of the result's kind
    awaited, a success naming one is recorded and the state waits (`awaiting`), one
    naming none is refused (which answered is unknown), and the answer to the last one
    moves the operation; a failure of any takes the machine's failure path."""
    machine = MACHINES[name]
    capabilities = data.draw(
        st.lists(st.sampled_from(REGISTRY_KINDS[event_type]), min_size=1, max_size=3)
    )
    commands = tuple((f"op-1:0:{i}", c) for i, c in enumerate(capabilities))
    ids = frozenset(c for c, _ in commands)
    fact = ToolFacts(idempotency_key="key-1", declared_by="tool-integration")
    view = view_of(
        machine,
        state,
        fact,
        {},
        open_commands=ids,
        awaiting=ids,
        command_capabilities=commands,
        command_epochs=tuple((c, 0) for c in ids),
    )
    named = data.draw(st.sampled_from((None, *sorted(ids))))
    event = replace(event_for(machine, view, event_type, "worker-1"), causation=named)
    d = decide(machine, view, event, POLICY, REGISTRY, T0)
    if named is None and len(ids) > 1:
        assert d.outcome is Outcome.REFUSED
        assert [n.code for n in d.refusals][-1:] == ["result-unattributed"]
    elif named is not None and len(ids) > 1:
        assert d.outcome is Outcome.AWAITING, d.refusals
        assert d.state_after == state
        assert d.invocations == ()
        after = apply(view, d)
        assert after.awaiting == ids - {named}
        assert after.open_commands == ids - {named}
    else:
        assert d.outcome is not Outcome.AWAITING
    failure = replace(event, event_type=event_type.replace("_SUCCEEDED", "_FAILED"))
    if failure.event_type in machine.states[state].on and named is not None:
        f = decide(machine, view, failure, POLICY, REGISTRY, T0)
        assert f.outcome is not Outcome.AWAITING


OPENINGS = [
    (name, event)
    for name, machine in sorted(MACHINES.items())
    for event in sorted(machine.states[machine.initial].on)
]
DIGESTS = ("sha256:" + "1" * 64, "sha256:" + "2" * 64, None)


@pytest.mark.parametrize(("name", "event_type"), OPENINGS)
@settings(max_examples=10, deadline=None)
@given(mine=st.sampled_from(DIGESTS), theirs=st.sampled_from(DIGESTS))
def test_a_second_operation_claiming_a_key_is_a_duplicate_or_refused(
    name: str, event_type: str, mine: str | None, theirs: str | None
) -> None:
    """Practice §4, class 6: an operation whose opening event declares an idempotency
    key another operation owns (laid on its view by the fold) is decided on the
    machine's duplicate route when both declared the same arguments, refused as a
    conflicting reuse otherwise, and never retries with that key."""
    machine = MACHINES[name]
    base = view_of(machine, machine.initial, ToolFacts(), dict.fromkeys(VERIFIERS, "not_applied"))
    view = replace(base, key_owner=KeyClaim("op-owner", theirs))
    event = replace(
        event_for(machine, view, event_type, "tool-integration"),
        facts=DeclaredFacts(idempotency_key="key-1", arguments_digest=mine),
        payload_digest="",
    )
    d = decide(machine, view, event, POLICY, REGISTRY, T0)
    assert CapabilityKind.RETRY not in [i.kind for i in d.invocations]
    duplicate = mine is not None and mine == theirs
    assert d.evidence.key_reuse == ("op-owner", "duplicate" if duplicate else "conflict")
    if not duplicate:
        assert d.outcome is Outcome.REFUSED
        assert [n.code for n in d.refusals] == ["idempotency-key-conflict"]
        return
    routes = machine.states[machine.initial].on.get("DUPLICATE_DETECTED")
    if routes is None:
        assert [n.code for n in d.refusals] == ["duplicate-operation"]
    else:
        assert d.transition_target in {t.target for t in routes}
    # Later events decide normally, but the key stays the owner's: never a retry.
    assert not retry_permitted(GuardContext(apply(view, d), POLICY, T0, routes_any(machine))).value


def routes_any(machine: Machine) -> Transition:
    return Transition(machine.initial, "ANY", 0, machine.initial)


ALL_STATES = [(n, s) for n, m in sorted(MACHINES.items()) for s in sorted(m.states)]


@pytest.mark.parametrize(("name", "state"), ALL_STATES)
@settings(max_examples=5, deadline=None)
@given(
    revoked=st.booleans(),
    stopped=st.booleans(),
    credentials=st.sampled_from(((), ("cred-1",), ("c-1", "c-2"))),
)
def test_an_ancestors_containment_reaches_every_state(
    name: str, state: str, revoked: bool, stopped: bool, credentials: tuple[str, ...]
) -> None:
    """CONFORMANCE L5.2, L5.3, class 7: a trusted ANCESTOR_CONTAINED stops a running
    descendant and revokes the credentials it still holds, whether or not its machine
    routes the event in that state; a finished one (final state) gets the revocation
    only, once; what its own containment already stopped or revoked is not again
    unless its machine's route does it."""
    machine = MACHINES[name]
    view = replace(
        view_of(machine, state, ToolFacts(), {}),
        credentials=credentials,
        revoked=revoked,
        stopped=stopped,
    )
    event = replace(
        event_for(machine, view, "ANCESTOR_CONTAINED", "recovery-controller"),
        evidence=EvidencePayload(ancestor_operation="op-ancestor"),
        payload_digest="",
    )
    d = decide(machine, view, event, POLICY, REGISTRY, T0)
    kinds = [i.kind for i in d.invocations]
    holds = bool(credentials) and not revoked
    if machine.states[state].final:
        assert d.outcome is Outcome.FINAL
        assert kinds == (["revoke"] if holds else [])
        return
    assert d.evidence.contained_ancestor == "op-ancestor"
    routed = "ANCESTOR_CONTAINED" in machine.states[state].on
    assert ("stop" in kinds) is (routed or not stopped)
    if holds:
        assert "revoke" in kinds
    after = apply(view, d)
    assert after.lineage.contained_ancestors == ("op-ancestor",)
    assert after.revoked is (revoked or "revoke" in kinds)
    assert after.stopped is (stopped or "stop" in kinds)
