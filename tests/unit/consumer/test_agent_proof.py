"""The affected agent is proven, not named (issue 28): an operation opens for an agent
only when the opener's tool grant names that agent, or when the agent's runtime signed
a call context for the call that the tool forwards (`machines.call_context`); grants
for any agent are refused outside demo mode. So a tool cannot aim a containment at a
bystander."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumer import ControllerSettings, DecidedBatch, Intake, PolicyRefused, decide_batch
from consumer.batch import operation_ids, positions_for
from consumer.service import controller_policy
from ledger import MemoryLedger
from machines import (
    ANY,
    Event,
    Grant,
    Lineage,
    ProducerEntry,
    Role,
    Roster,
    Scope,
    issue_call_context,
)
from schemas import HEADER_CALL_CONTEXT
from tests.support.producers import key_of, producer_entry, roster_with
from tests.unit.consumer.support import GROUP, T0, TOPIC, encoded, event, pinned

EMAIL = Scope(capability="email.send", tool="smtp-relay", environment="production")
NOW = T0 + timedelta(minutes=1)
LINEAGE = Lineage(agent="mail-agent", task="task-1", initiating_principal="alice")


def _tool(name: str, agents: tuple[str, ...] = ()) -> ProducerEntry:
    grant = Grant(
        role=Role.TOOL,
        capabilities=("email.send",),
        tools=("smtp-relay",),
        environments=(ANY,),
        agents=agents,
    )
    return producer_entry(name, (grant,))


def _runtime(name: str, agents: tuple[str, ...]) -> ProducerEntry:
    return producer_entry(name, (Grant(role=Role.ORCHESTRATOR, agents=agents),))


# A shared mail tool that speaks for no agent by itself, one that names its agent, the
# mail agent's runtime, and a runtime of another agent.
ROSTER = roster_with(
    _tool("mail-tool"),
    _tool("mail-tool-named", ("mail-agent",)),
    _runtime("mail-runtime", ("mail-agent",)),
    _runtime("other-runtime", ("other-agent",)),
    producer_entry("stop-worker", (Grant(role=Role.WORKER, capabilities=(ANY,)),)),
)


def _plan(*raws_and_headers: tuple[Event, str | None]) -> DecidedBatch:
    machines, base = pinned()
    raws = []
    for offset, (ev, context) in enumerate(raws_and_headers):
        raw = encoded(ev, offset)
        if context is not None:
            # The tool's signature does not cover the context: the runtime's does.
            raw = replace(raw, headers=(*raw.headers, (HEADER_CALL_CONTEXT, context.encode())))
        raws.append(raw)
    intake = Intake(machines, roster=ROSTER, max_record_bytes=65536, clock=lambda: NOW)
    outcomes = [intake.examine(r) for r in raws]
    ledger = MemoryLedger()
    epochs = {(c.topic, c.partition): c.epoch for c in ledger.claim(GROUP, TOPIC, [0], "me")}
    policy = base.policy.model_copy(update={"producers": ROSTER.producers})
    return decide_batch(
        outcomes,
        ledger.load_views(operation_ids(outcomes)),
        replace(base, policy=policy),
        group=GROUP,
        controller="controller-1",
        positions=positions_for(raws, epochs),
        now=NOW,
    )


def _report(producer: str = "mail-tool", agent: str = "mail-agent", op: str = "op-1") -> Event:
    ev = event(
        "TOOL_TIMEOUT",
        op,
        event_id=f"{op}-{producer}-{agent}",
        machine="email-send",
        agent=agent,
        producer=producer,
        scope=EMAIL,
    )
    return replace(ev, lineage=replace(LINEAGE, agent=agent))


def _context(
    issuer: str = "mail-runtime",
    op: str = "op-1",
    lineage: Lineage = LINEAGE,
    *,
    now=NOW,  # type: ignore[no-untyped-def]
    lifetime: timedelta = timedelta(minutes=15),
    key: Ed25519PrivateKey | None = None,
) -> str:
    return issue_call_context(
        issuer, key or key_of(issuer), op, lineage, now=now, lifetime=lifetime
    )


def _refusals(planned: DecidedBatch) -> list[tuple[str, str]]:
    return [(r.code, r.reason) for _, r in planned.refused]


def test_a_shared_tool_opens_for_the_agent_its_runtime_vouched_for() -> None:
    planned = _plan((_report(), _context()))
    assert planned.refused == ()
    assert [d.event_id for d in planned.decisions] == ["op-1-mail-tool-mail-agent"]
    view = planned.batch.folded["op-1"]
    assert (view.opened_by, view.agent_proof) == ("mail-tool", "call-context:mail-runtime")


def test_without_a_context_the_tool_must_name_the_agent_in_its_grant() -> None:
    unproven = _plan((_report(), None))
    [(code, reason)] = _refusals(unproven)
    assert code == "agent-unproven"
    assert "mail-agent" in reason
    assert "recovery-call-context" in reason
    named = _plan((_report("mail-tool-named"), None))
    assert named.refused == ()
    assert named.batch.folded["op-1"].agent_proof == "grant"


def test_a_bystander_cannot_be_named_as_the_agent_a_containment_stops() -> None:
    # The tool that names its own agent reports a denial "for" a bystander: refused
    # before the core decides, so no containment command is planned.
    denial = replace(_report("mail-tool-named", agent="innocent-bystander"))
    denial = replace(denial, event_type="AUTHORIZATION_DENIED")
    planned = _plan((denial, None))
    assert [c for c, _ in _refusals(planned)] == ["agent-unproven"]
    assert planned.decisions == ()
    # Nor does a context its runtime signed for the tool's own agent cover the bystander.
    planned = _plan((denial, _context()))
    [(code, reason)] = _refusals(planned)
    assert code == "call-context-invalid"
    assert "lineage" in reason


@pytest.mark.parametrize(
    ("context", "why"),
    [
        (lambda: _context(op="op-other"), "issued for operation 'op-other'"),
        (lambda: _context("other-runtime"), "does not hold orchestrator for agent mail-agent"),
        (lambda: _context(now=NOW - timedelta(minutes=20)), "expired"),
        (lambda: _context(now=NOW + timedelta(minutes=10)), "after now"),
        (
            lambda: _context(lineage=replace(LINEAGE, task="another task")),
            "is not the event's",
        ),
        (lambda: "not json", "not JSON"),
        (lambda: json.dumps({"context": {}, "signature": ""}), "must hold exactly"),
        (lambda: " " * 9000, "larger than"),
    ],
)
def test_a_context_that_proves_nothing_refuses_the_opening(context, why: str) -> None:  # type: ignore[no-untyped-def]
    # Refused even from the tool whose grant names the agent: a bad context is an attack.
    planned = _plan((_report("mail-tool-named"), context()))
    [(code, reason)] = _refusals(planned)
    assert code == "call-context-invalid", reason
    assert why in reason


def test_a_context_signed_with_a_key_the_runtime_does_not_hold_is_refused() -> None:
    forged = _context(key=Ed25519PrivateKey.generate())
    [(code, _)] = _refusals(_plan((_report(), forged)))
    assert code == "key-unknown"
    document = json.loads(_context())
    document["context"]["issued_at"] = "2026-11-30T12:00:30Z"  # altered after signing
    [(code, _)] = _refusals(_plan((_report(), json.dumps(document))))
    assert code == "signature-invalid"


def test_a_context_is_read_on_the_opening_only() -> None:
    # A later report of the open operation carries no context and needs none.
    later = replace(_report(), event_id="later", event_type="TOOL_FAILED")
    planned = _plan((_report(), _context()), (later, None))
    assert planned.refused == ()
    assert len(planned.decisions) == 2


def _policy_file(tmp_path: Path, roster: Roster) -> Path:
    path = tmp_path / "policy.json"
    producers = [p.model_dump(mode="json", exclude_defaults=True) for p in roster.producers]
    path.write_text(json.dumps({"id": "t", "producers": producers}), encoding="utf-8")
    return path


def test_a_grant_for_any_agent_is_refused_outside_demo_mode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wild = Roster(
        producers=(
            producer_entry(
                "wild-tool", (Grant(role=Role.TOOL, capabilities=(ANY,), agents=(ANY,)),)
            ),
            producer_entry("wild-runtime", (Grant(role=Role.ORCHESTRATOR, agents=(ANY,)),)),
        )
    )
    path = _policy_file(tmp_path, wild)
    settings = ControllerSettings(bootstrap="b:9092", database_url="unused", policy_path=path)
    with pytest.raises(PolicyRefused) as refused:
        controller_policy(settings)
    message = str(refused.value)
    assert message.startswith("controller-wildcard-agent-refused")
    assert "producers[wild-tool] grant tool agents [*]" in message
    assert "producers[wild-runtime] grant orchestrator agents [*]" in message
    caplog.set_level(logging.WARNING)
    controller_policy(settings.model_copy(update={"demo_mode": True}))
    assert "speaks for ANY AGENT: producers[wild-tool]" in caplog.text
    # Named agents load without demo mode.
    controller_policy(
        ControllerSettings(
            bootstrap="b:9092",
            database_url="unused",
            policy_path=_policy_file(tmp_path, Roster(producers=ROSTER.producers[-5:])),
        )
    )
