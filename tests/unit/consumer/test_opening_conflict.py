"""A tool report that disagrees with its operation's opening is a security incident
(`machines.opening`, issue 28): dead-lettered as `opening-conflict` with both openings in
its audit record, counted, and never decided; reports of other roles are no openings."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from consumer import DecidedBatch, Intake, decide_batch
from consumer.batch import operation_ids, positions_for
from consumer.metrics import ControllerMetrics
from ledger import MemoryLedger
from machines import Scope
from tests.support.producers import roster as producer_roster
from tests.unit.consumer.support import CONTROLLER, FOUND, GROUP, T0, TOPIC, encoded, event, pinned

ADYEN = Scope(capability="payment.create-refund", tool="adyen", environment="production")
REFUND = "payment-refund"


def _plan(raws: list, ledger: MemoryLedger) -> DecidedBatch:  # type: ignore[type-arg]
    machines, rules = pinned()
    intake = Intake(machines, roster=producer_roster(), max_record_bytes=65536)
    outcomes = [intake.examine(r) for r in raws]
    epochs = {(c.topic, c.partition): c.epoch for c in ledger.claim(GROUP, TOPIC, [0], "me")}
    return decide_batch(
        outcomes,
        ledger.load_views(operation_ids(outcomes)),
        rules,
        group=GROUP,
        controller=CONTROLLER,
        positions=positions_for(raws, epochs),
        now=T0 + timedelta(minutes=1),
    )


def _opened(ledger: MemoryLedger) -> None:
    """op-1 opened by tool-1 under payment-refund (through stripe), for agent-1."""
    planned = _plan([encoded(event("TOOL_TIMEOUT", machine=REFUND), 0)], ledger)
    assert [d.state_after for d in planned.decisions] == ["verifying"]
    ledger.commit(planned.batch)


def _incident(planned: DecidedBatch) -> dict[str, Any]:
    [(_, refusal)] = planned.refused
    assert refusal.code == "opening-conflict"
    [letter] = planned.batch.dead_letters
    assert letter.reason_code == "opening-conflict"
    incident = dict(letter.audit["incident"])
    assert incident == {**dict(refusal.incident or {}), "at": incident["at"]}
    return incident


def test_a_squatted_id_is_an_incident_with_both_openings() -> None:
    ledger = MemoryLedger()
    _opened(ledger)
    # Another tool reports "its" operation under the same id: another machine, scope
    # and agent, and its own conversation.
    report = event(
        "TOOL_FAILED",
        event_id="e-2",
        machine="email-send",
        producer="tool-2",
        agent="agent-7",
        correlation_id="corr-mine",
    )
    planned = _plan([encoded(report, 1)], ledger)
    assert planned.decisions == ()
    incident = _incident(planned)
    assert incident["differs"] == ["machine", "scope", "agent"]
    assert incident["opened"] == {
        "producer": "tool-1",
        "machine": REFUND,
        "capability": "payment.create-refund",
        "tool": "stripe",
        "environment": "production",
        "agent": "agent-1",
        "correlation_id": "corr-op-1",
    }
    assert incident["claimed"]["producer"] == "tool-2"
    assert (incident["claimed"]["event_id"], incident["claimed"]["event_type"]) == (
        "e-2",
        "TOOL_FAILED",
    )
    assert incident["operation_id"] == "op-1"
    [(_, refusal)] = planned.refused
    assert "opened with producer tool-1" in refusal.reason
    assert "recoveryctl incidents" in refusal.reason


def test_another_producer_in_another_conversation_is_refused_and_an_incident() -> None:
    ledger = MemoryLedger()
    _opened(ledger)
    # Same machine, scope and agent, another correlation id: the core refuses it
    # (correlation-mismatch, recorded on the operation) and it is an incident too.
    report = event("TOOL_FAILED", event_id="e-3", machine=REFUND, producer="tool-2")
    planned = _plan([encoded(replace(report, correlation_id="corr-other"), 1)], ledger)
    [decision] = planned.decisions
    assert decision.outcome.value == "refused"
    [(_, refusal)] = planned.refused
    assert refusal.code == "correlation-mismatch"
    [letter] = planned.batch.dead_letters
    incident = letter.audit["incident"]
    assert incident["differs"] == ["producer", "correlation"]
    assert incident["claimed"]["correlation_id"] == "corr-other"


def test_a_second_tool_in_the_same_conversation_is_no_conflict() -> None:
    # Two tools may report on one operation (the tool and the identity provider, say).
    ledger = MemoryLedger()
    _opened(ledger)
    report = event("TOOL_FAILED", event_id="e-4", machine=REFUND, producer="tool-2")
    planned = _plan([encoded(report, 1)], ledger)
    assert planned.refused == ()
    assert len(planned.decisions) == 1


def test_a_report_under_another_machine_scope_or_agent_names_what_differs() -> None:
    ledger = MemoryLedger()
    _opened(ledger)
    cases = {
        "machine": event("TOOL_FAILED", event_id="m", machine="email-send"),
        "scope": event("TOOL_FAILED", event_id="s", machine=REFUND, scope=ADYEN),
        "agent": event("TOOL_FAILED", event_id="a", machine=REFUND, agent="agent-7"),
    }
    for offset, (field, report) in enumerate(cases.items(), start=1):
        incident = _incident(_plan([encoded(report, offset)], ledger))
        assert field in incident["differs"], (field, incident)


def test_a_report_that_agrees_with_the_opening_is_decided() -> None:
    ledger = MemoryLedger()
    _opened(ledger)
    # The same tool, machine, scope and agent; and a later report that leaves the scope out.
    planned = _plan(
        [
            encoded(event("TOOL_FAILED", event_id="again", machine=REFUND), 1),
            encoded(event("TOOL_FAILED", event_id="bare", machine=REFUND, scope=None), 2),
        ],
        ledger,
    )
    assert all(r.code != "opening-conflict" for _, r in planned.refused)
    assert len(planned.decisions) == 2


def test_answers_of_other_roles_are_no_openings() -> None:
    ledger = MemoryLedger()
    _opened(ledger)
    # A verifier naming another machine is refused as before, and is no incident.
    other = event(
        "VERIFICATION_FOUND", event_id="v", machine="email-send", evidence=FOUND, scope=None
    )
    planned = _plan([encoded(other, 1)], ledger)
    [(_, refusal)] = planned.refused
    assert (refusal.code, refusal.incident) == ("machine-not-applicable", None)
    # The verifier's answer for the operation's own machine is decided.
    found = event("VERIFICATION_FOUND", event_id="v2", machine=REFUND, evidence=FOUND)
    decided = _plan([encoded(found, 2)], ledger)
    assert [d.state_after for d in decided.decisions] == ["completed"]


def test_an_incident_is_counted_by_kind_after_its_batch_commits() -> None:
    ledger = MemoryLedger()
    _opened(ledger)
    planned = _plan([encoded(event("TOOL_FAILED", producer="tool-2"), 1)], ledger)
    reader = InMemoryMetricReader()
    metrics = ControllerMetrics(MeterProvider(metric_readers=[reader]), GROUP)
    metrics.committed(planned, 0.01)
    data = reader.get_metrics_data()
    points = {
        (m.name, tuple(sorted(p.attributes.items()))): p.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
        if m.name.endswith(("security_incidents", "dead_lettered"))
    }
    kind = (("consumer.group", GROUP), ("kind", "opening-conflict"))
    reason = (("consumer.group", GROUP), ("reason", "opening-conflict"))
    assert points[("recovery.controller.security_incidents", kind)] == 1
    assert points[("recovery.controller.events.dead_lettered", reason)] == 1
