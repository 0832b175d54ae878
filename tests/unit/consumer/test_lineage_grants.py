"""Lineage is checked against the opener's grants (issue 30, class 7; DESIGN "The
affected agent is proven, not named"): a child reported before its parent is linked
below the parent only if its opener may speak for the parent's agents, and credentials
reported as delegated to an agent (what a revocation command names) need the opener to
hold `orchestrator` for that agent."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from consumer import Intake
from consumer.batch import DecidedBatch
from ledger import MemoryLedger
from machines import ANY, Event, Grant, Lineage, Role, Roster, Rules
from tests.support.producers import producer_entry
from tests.unit.consumer.support import decide, encoded, event, pinned

MACHINE = "delegated-research"
ORCHESTRATOR, WORKER = "research-orchestrator", "research-worker"


def _tool(*agents: str) -> Grant:
    return Grant(
        role=Role.TOOL, capabilities=(ANY,), tools=(ANY,), environments=(ANY,), agents=agents
    )


ROSTER = Roster(
    producers=(
        producer_entry("tool-1", [_tool(WORKER)]),  # speaks for the worker only
        producer_entry("tool-2", [_tool(ORCHESTRATOR)]),
        producer_entry(
            "research-tool",
            [_tool(WORKER), Grant(role=Role.ORCHESTRATOR, agents=(ORCHESTRATOR, WORKER))],
        ),
        producer_entry("recovery-controller", [Grant(role=Role.CONTROLLER)]),
    )
)


def _event(
    op: str, agent: str, producer: str, parent: str | None = None, **lineage: object
) -> Event:
    ev = event("TOOL_TIMEOUT", op, machine=MACHINE, agent=agent, producer=producer)
    return replace(
        ev,
        lineage=Lineage(
            agent=agent,
            task=f"task-{op}",
            initiating_principal="alice",
            parent_operation=parent,
            origin_operation=parent,
            **lineage,  # type: ignore[arg-type]
        ),
    )


def _commit(ledger: MemoryLedger, events: list[Event], first: int) -> DecidedBatch:
    machines, rules = pinned()
    rules = Rules(rules.policy.model_copy(update={"producers": ROSTER.producers}), rules.registry)
    raws = [encoded(e, first + i) for i, e in enumerate(events)]
    planned = decide(
        ledger,
        raws,
        now=events[0].event_time + timedelta(minutes=1),
        intake=Intake(machines, roster=ROSTER, max_record_bytes=65536),
        rules=rules,
        lineage=True,
    )
    ledger.commit(planned.batch)
    return planned


def test_a_child_reported_first_is_not_linked_below_a_parent_its_opener_cannot_speak_for() -> None:
    ledger = MemoryLedger()
    # tool-1 may report the worker's operations, nothing of the orchestrator's.
    _commit(ledger, [_event("op-child", WORKER, "tool-1", parent="op-parent")], 0)
    # The parent arrives and is contained at once (its authority was misused).
    parent = _event("op-parent", ORCHESTRATOR, "tool-2", parent="op-grand")
    denied = replace(parent, event_type="AUTHORIZATION_DENIED")
    _commit(ledger, [denied], 1)
    assert ledger.lineage("op-parent").containing
    assert ledger.lineage("op-child").ancestors == ()
    assert ledger.lineage("op-child").contained_ancestors == ()
    assert WORKER not in ledger.lineage("op-parent").descendant_agents
    records, _ = ledger.audit_chain("op-parent")
    refused = [r.record for r in records if r.kind == "lineage"]
    assert [(b["kind"], b["children"]) for b in refused] == [("link-refused", ["op-child"])]
    # The grandparent reported later links the parent below it, and still not the child.
    _commit(ledger, [_event("op-grand", ORCHESTRATOR, "tool-2")], 2)
    assert ledger.lineage("op-parent").ancestors == ("op-grand",)
    assert ledger.lineage("op-child").ancestors == ()


def test_a_child_reported_first_by_a_producer_that_may_speak_for_the_parent_is_linked() -> None:
    ledger = MemoryLedger()
    _commit(ledger, [_event("op-child", WORKER, "research-tool", parent="op-parent")], 0)
    _commit(ledger, [_event("op-parent", ORCHESTRATOR, "tool-2")], 1)
    assert ledger.lineage("op-child").ancestors == ("op-parent",)
    assert WORKER in ledger.lineage("op-parent").descendant_agents


def test_a_child_and_its_parent_in_one_batch_are_held_to_the_same_rule() -> None:
    ledger = MemoryLedger()
    planned = _commit(
        ledger,
        [
            _event("op-child", WORKER, "tool-1", parent="op-parent"),
            _event("op-parent", ORCHESTRATOR, "tool-2"),
        ],
        0,
    )
    assert planned.batch.unlinked == {"op-parent": frozenset({"op-child"})}
    assert ledger.lineage("op-child").ancestors == ()


def test_delegated_credentials_need_the_openers_orchestrator_grant() -> None:
    ledger = MemoryLedger()
    claimed = _event("op-a", WORKER, "tool-1", delegated_credentials=("cred-someone-else",))
    planned = _commit(ledger, [claimed], 0)
    assert [d.reason_code for d in planned.batch.dead_letters] == ["role-not-permitted"]
    assert ledger.load_views(["op-a"]) == {}
    allowed = _event("op-b", WORKER, "research-tool", delegated_credentials=("cred-b",))
    planned = _commit(ledger, [allowed], 1)
    assert planned.batch.dead_letters == ()
    assert ledger.operation("op-b").delegated_credentials == ("cred-b",)
