"""Authenticated producers at intake and in the batch: every refusal code, and the
attacks of issue 14 (forged evidence, a first record that picks the machine, a
bystander named in the lineage) refused before anything is decided."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumer import DecidedBatch, Intake, RawRecord, Rejected, decide_batch
from consumer.batch import operation_ids, positions_for
from ledger import MemoryLedger
from machines import (
    ANY,
    Event,
    EvidencePayload,
    Grant,
    Lineage,
    ProducerEntry,
    Role,
    Roster,
    Rules,
    Scope,
)
from schemas import HEADER_KEY_ID, HEADER_PRODUCER, HEADER_SIGNATURE
from tests.support.producers import producer_entry, roster_with, signer
from tests.unit.consumer.support import GROUP, T0, TOPIC, encoded, event, pinned, signed

REFUND = Scope(capability="payment.create-refund", tool="stripe", environment="production")
EMAIL = Scope(capability="email.send", tool="smtp-relay", environment="production")


def _tool(name: str, capability: str, tool: str, agents: tuple[str, ...]) -> ProducerEntry:
    return producer_entry(
        name,
        (
            Grant(
                role=Role.TOOL,
                capabilities=(capability,),
                tools=(tool,),
                environments=(ANY,),
                agents=agents,
            ),
        ),
    )


# The deployment's producers: the refund tool, the email tool, the refund verifier, a
# verifier of deployments, a worker for stop commands, and an outsider with a key.
PRODUCERS = (
    _tool("stripe-tool", "payment.create-refund", "stripe", ("billing-agent",)),
    _tool("mail-tool", "email.send", "smtp-relay", ("mail-agent",)),
    producer_entry(
        "refund-verifier", (Grant(role=Role.VERIFIER, capabilities=("payment.verify-refund",)),)
    ),
    producer_entry(
        "deploy-verifier", (Grant(role=Role.VERIFIER, capabilities=("deploy.verify-steps",)),)
    ),
    producer_entry("stop-worker", (Grant(role=Role.WORKER, capabilities=("agent.stop-task",)),)),
    producer_entry("mallory", ()),
)


def _roster(*extra: ProducerEntry) -> Roster:
    return roster_with(*PRODUCERS, *extra)


def _rules(roster: Roster) -> Rules:
    _machines, rules = pinned()
    policy = rules.policy.model_copy(update={"producers": roster.producers})
    return replace(rules, policy=policy)


def _plan(raws: list[RawRecord], roster: Roster | None = None) -> DecidedBatch:
    roster = roster or _roster()
    machines, _ = pinned()
    intake = Intake(machines, roster=roster, max_record_bytes=65536, clock=lambda: T0)
    outcomes = [intake.examine(r) for r in raws]
    ledger = MemoryLedger()
    views = ledger.load_views(operation_ids(outcomes))
    epochs = {(c.topic, c.partition): c.epoch for c in ledger.claim(GROUP, TOPIC, [0], "me")}
    return decide_batch(
        outcomes,
        views,
        _rules(roster),
        group=GROUP,
        controller="controller-1",
        positions=positions_for(raws, epochs),
        now=T0 + timedelta(minutes=1),
    )


def _refused(planned: DecidedBatch) -> dict[str, str]:
    """event id (or coordinates) -> refusal code, for every dead letter of the batch."""
    return {(r.event_id or raw.coordinates): r.code for raw, r in planned.refused}


def _refund_timeout(producer: str = "stripe-tool", agent: str = "billing-agent", **fields):  # type: ignore[no-untyped-def]
    return event(
        "TOOL_TIMEOUT",
        "op-refund",
        event_id="refund-timeout",
        machine="payment-refund",
        agent=agent,
        producer=producer,
        scope=REFUND,
        **fields,
    )


def _not_found(producer: str, verifier: str, causation: str | None = "op-refund:1:0"):  # type: ignore[no-untyped-def]
    return event(
        "VERIFICATION_NOT_FOUND",
        "op-refund",
        event_id=f"forged-{producer}-{verifier}",
        machine="payment-refund",
        agent="billing-agent",
        producer=producer,
        causation=causation,
        evidence=EvidencePayload(outcome="not_applied", verifier=verifier, reference="r"),
    )


def _decided(planned: DecidedBatch) -> dict[str, tuple[str, str]]:
    return {d.event_id: (d.state_before, d.state_after) for d in planned.decisions}


def test_the_real_refund_tool_opens_its_operation_and_the_real_verifier_is_decided() -> None:
    planned = _plan(
        [
            encoded(_refund_timeout(), 0),
            encoded(_not_found("refund-verifier", "refund-verifier"), 1),
        ]
    )
    assert _refused(planned) == {}
    decided = _decided(planned)
    assert decided["refund-timeout"] == ("failure-reported", "verifying")
    assert decided["forged-refund-verifier-refund-verifier"][0] == "verifying"
    view = planned.batch.folded["op-refund"]
    assert (view.capability, view.tool, view.environment) == (
        "payment.create-refund",
        "stripe",
        "production",
    )


# -- intake: the signature ------------------------------------------------------------


def _intake_code(raw: RawRecord, roster: Roster | None = None) -> str:
    machines, _ = pinned()
    intake = Intake(machines, roster=roster or _roster(), max_record_bytes=65536, clock=lambda: T0)
    result = intake.examine(raw)
    assert isinstance(result, Rejected), result
    return result.refusal.code


def test_an_unsigned_event_is_refused() -> None:
    raw = encoded(_refund_timeout(), 0)
    unsigned = replace(raw, headers=raw.headers[:1])
    assert _intake_code(unsigned) == "signature-missing"


def test_a_signature_that_is_not_base64_is_refused() -> None:
    raw = encoded(_refund_timeout(), 0)
    headers = tuple((k, b"not base64!" if k == HEADER_SIGNATURE else v) for k, v in raw.headers)
    assert _intake_code(replace(raw, headers=headers)) == "signature-malformed"


def test_a_producer_not_in_the_roster_is_refused() -> None:
    raw = encoded(_refund_timeout(producer="eve"), 0, producer="eve")
    assert _intake_code(raw) == "producer-unknown"


def test_a_key_the_producer_does_not_list_is_refused() -> None:
    other = signer("stripe-tool", Ed25519PrivateKey.generate())
    raw = encoded(_refund_timeout(), 0)
    headers = tuple(other.sign(raw.topic, raw.key, raw.value, raw.headers))
    assert _intake_code(replace(raw, headers=headers)) == "key-unknown"


def test_a_tampered_value_fails_the_signature() -> None:
    raw = encoded(_refund_timeout(), 0)
    forged = encoded(_refund_timeout(causation="changed"), 0)
    assert _intake_code(replace(forged, headers=raw.headers)) == "signature-invalid"


def test_a_signature_moved_to_another_record_key_fails() -> None:
    raw = encoded(_refund_timeout(), 0)
    moved = replace(raw, key=b"op-other")
    assert _intake_code(moved) == "signature-invalid"


@pytest.mark.parametrize(
    ("key_fields", "code"),
    [
        ({"revoked": True}, "key-revoked"),
        ({"not_after": T0 - timedelta(seconds=1)}, "key-expired"),
        ({"not_before": T0 + timedelta(days=1)}, "key-not-yet-valid"),
    ],
)
def test_revoked_expired_and_future_keys_are_refused(key_fields: dict, code: str) -> None:  # type: ignore[type-arg]
    entry = producer_entry("stripe-tool", PRODUCERS[0].grants, **key_fields)
    raw = encoded(_refund_timeout(), 0)
    assert _intake_code(raw, _roster(entry)) == code


def test_a_rotated_key_is_accepted_while_both_are_listed() -> None:
    new = Ed25519PrivateKey.generate()
    old = producer_entry("stripe-tool", PRODUCERS[0].grants)
    fresh = producer_entry("stripe-tool", PRODUCERS[0].grants, key=new)
    both = ProducerEntry(id="stripe-tool", keys=old.keys + fresh.keys, grants=old.grants)
    raw = encoded(_refund_timeout(), 0)
    headers = tuple(signer("stripe-tool", new).sign(raw.topic, raw.key, raw.value, raw.headers))
    planned = _plan([replace(raw, headers=headers)], _roster(both))
    assert _refused(planned) == {}


def test_a_producer_field_that_is_not_the_signer_is_refused() -> None:
    raw = encoded(_refund_timeout(producer="stripe-tool"), 0, producer="mail-tool")
    assert _intake_code(raw) == "identity-mismatch"
    assert HEADER_PRODUCER in dict(raw.headers)
    assert HEADER_KEY_ID in dict(raw.headers)


# -- forged evidence: no retry of a possibly-applied effect ----------------------------


def test_forged_not_found_claiming_the_verifier_is_refused_unsigned() -> None:
    forged = encoded(_not_found("refund-verifier", "refund-verifier"), 1)
    unsigned = replace(forged, headers=forged.headers[:1])
    planned = _plan([encoded(_refund_timeout(), 0), unsigned])
    assert list(_refused(planned).values()) == ["signature-missing"]
    assert planned.batch.folded["op-refund"].state == "verifying"
    assert not any(i.kind == "retry" for d in planned.decisions for i in d.invocations)


def test_forged_not_found_signed_by_another_producer_is_refused() -> None:
    as_verifier = encoded(_not_found("refund-verifier", "refund-verifier"), 1, producer="mallory")
    as_itself = encoded(_not_found("mallory", "refund-verifier"), 2, producer="mallory")
    planned = _plan([encoded(_refund_timeout(), 0), as_verifier, as_itself])
    assert sorted(_refused(planned).values()) == ["identity-mismatch", "role-not-permitted"]
    assert planned.batch.folded["op-refund"].state == "verifying"


def test_a_verifier_of_another_capability_is_refused_for_a_refund() -> None:
    own_name = encoded(
        _not_found("deploy-verifier", "deploy-verifier"), 1, producer="deploy-verifier"
    )
    claimed = encoded(
        _not_found("deploy-verifier", "refund-verifier"), 2, producer="deploy-verifier"
    )
    planned = _plan([encoded(_refund_timeout(), 0), own_name, claimed])
    assert list(_refused(planned).values()) == ["role-not-permitted", "role-not-permitted"]
    assert planned.batch.folded["op-refund"].state == "verifying"
    assert not any(i.kind == "retry" for d in planned.decisions for i in d.invocations)


def test_a_worker_result_for_another_capability_is_refused() -> None:
    result = event(
        "CONTAINMENT_SUCCEEDED",
        "op-refund",
        event_id="fake-result",
        machine="payment-refund",
        agent="billing-agent",
        producer="stop-worker",
        causation="op-refund:1:0",  # the verify command, not a stop
    )
    planned = _plan([encoded(_refund_timeout(), 0), encoded(result, 1)])
    assert _refused(planned) == {"fake-result": "role-not-permitted"}


# -- the first record does not pick the machine, scope or lineage -------------------


def test_a_first_record_from_a_tool_without_the_capability_opens_nothing() -> None:
    # The mail tool reports its email operation as a procurement request.
    hijack = event(
        "TOOL_TIMEOUT",
        "op-mail",
        event_id="hijack",
        machine="procurement-request",
        agent="mail-agent",
        producer="mail-tool",
        scope=Scope(
            capability="procurement.create-request", tool="coupa", environment="production"
        ),
    )
    real = event(
        "TOOL_TIMEOUT",
        "op-mail",
        event_id="real",
        machine="email-send",
        agent="mail-agent",
        producer="mail-tool",
        scope=EMAIL,
    )
    planned = _plan([encoded(hijack, 0), encoded(real, 1)])
    assert _refused(planned) == {"hijack": "role-not-permitted"}
    assert planned.batch.folded["op-mail"].machine_name == "email-send"
    assert _decided(planned)["real"] == ("failure-reported", "unresolved")


def test_a_first_record_without_scope_opens_nothing() -> None:
    # Without a scope no grant can be checked (and applies_to cannot be matched, SPEC §8
    # step 2): the opening is refused whoever signed it.
    bare = event(
        "TOOL_TIMEOUT",
        "op-bare",
        event_id="bare",
        agent="mail-agent",
        producer="mail-tool",
        scope=None,
    )
    planned = _plan([encoded(bare, 0)])
    assert [d.reason_code for d in planned.batch.dead_letters] == ["scope-missing"]
    assert planned.decisions == ()
    assert "op-bare" not in planned.batch.folded


def test_a_first_record_from_a_verifier_opens_nothing() -> None:
    planned = _plan([encoded(_not_found("refund-verifier", "refund-verifier", None), 0)])
    assert list(_refused(planned).values()) == ["role-not-permitted"]


def test_an_operation_naming_a_bystander_agent_is_refused() -> None:
    # The mail tool names the billing agent as the affected agent of its report.
    bystander = event(
        "TOOL_TIMEOUT",
        "op-bystander",
        event_id="bystander",
        machine="email-send",
        agent="billing-agent",
        producer="mail-tool",
        scope=EMAIL,
    )
    planned = _plan([encoded(bystander, 0)])
    assert _refused(planned) == {"bystander": "agent-unproven"}


def test_an_operation_hung_below_another_agents_operation_is_refused() -> None:
    parent = _refund_timeout()
    child = replace(
        event(
            "TOOL_TIMEOUT",
            "op-child",
            event_id="child",
            machine="email-send",
            agent="mail-agent",
            producer="mail-tool",
            scope=EMAIL,
        ),
        lineage=Lineage(
            agent="mail-agent",
            task="t",
            initiating_principal="alice",
            parent_operation="op-refund",
        ),
        payload_digest="",
    )
    planned = _plan([encoded(parent, 0), encoded(child, 1)])
    assert _refused(planned) == {"child": "role-not-permitted"}
    orchestrator = producer_entry(
        "mail-tool",
        (
            *PRODUCERS[1].grants,
            Grant(role=Role.ORCHESTRATOR, agents=("billing-agent",)),
        ),
    )
    planned = _plan([encoded(parent, 0), encoded(child, 1)], _roster(orchestrator))
    assert _refused(planned) == {}


def test_an_approval_needs_the_approver_role_and_its_own_name() -> None:
    approval = event(
        "HUMAN_APPROVED",
        "op-refund",
        event_id="approval",
        machine="payment-refund",
        agent="billing-agent",
        producer="stripe-tool",
    )
    planned = _plan([encoded(_refund_timeout(), 0), encoded(approval, 1)])
    assert _refused(planned) == {"approval": "role-not-permitted"}


def test_a_decision_signed_elsewhere_may_be_forwarded_by_an_approval_service() -> None:
    # The console (or an approval service) holds the approver role and forwards a
    # decision the human signed in the browser: intake passes it, and the core checks
    # the decision's own signature against the policy's approvers.
    forwarded = event(
        "HUMAN_APPROVED",
        "op-refund",
        event_id="forwarded",
        machine="payment-refund",
        agent="billing-agent",
        producer="approval-console",
    )
    console = producer_entry("approval-console", [Grant(role=Role.APPROVER)])
    planned = _plan([encoded(_refund_timeout(), 0), encoded(forwarded, 1)], _roster(console))
    assert _refused(planned) == {}
    assert [d.event_id for d in planned.decisions][-1] == "forwarded"


def test_signed_records_for_the_test_roster_still_decide() -> None:
    # The shared test roster holds every role: the default test events pass.
    raw = signed(encoded(event("TOOL_TIMEOUT"), 0), "tool-1")
    machines, rules = pinned()
    intake = Intake(machines, roster=rules.policy.roster, max_record_bytes=65536)
    assert not isinstance(intake.examine(raw), Rejected)


# -- a drill is linked only with drills (CONFORMANCE L4.6) --------------------------


def _opening(operation: str, parent: str | None) -> Event:
    opening = event(
        "TOOL_TIMEOUT",
        operation,
        event_id=f"open-{operation}",
        machine="payment-refund",
        agent="billing-agent",
        producer="stripe-tool",
        scope=REFUND,
    )
    if parent is None:
        return opening
    lineage = replace(opening.lineage, origin_operation=parent, parent_operation=parent)
    return replace(opening, lineage=lineage)


@pytest.mark.parametrize(
    ("parent", "child", "refused"),
    [
        ("drill-parent", "op-real-child", True),  # a real child would act on a drill's word
        ("op-real-parent", "drill-child", True),  # a drill below real work
        ("drill-parent", "drill-child", False),
        ("op-real-parent", "op-real-child", False),
    ],
)
def test_a_drill_and_a_real_operation_are_never_linked(
    parent: str, child: str, refused: bool
) -> None:
    planned = _plan([encoded(_opening(parent, None), 0), encoded(_opening(child, parent), 1)])
    assert (_refused(planned) == {f"open-{child}": "role-not-permitted"}) is refused
    assert (child in planned.batch.folded) is not refused
    assert parent in planned.batch.folded
