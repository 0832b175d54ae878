"""The pure lineage planning (`machines.containment`, `ledger.cascade`): what counts as
containing, linking, the cascade, release, and the lineage status laid over a stored
view."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from ledger.cascade import plan_lineage
from machines import Change, Containment, LineageRow, containment_of, with_lineage
from machines.decision import decide
from machines.view import LineageStatus
from schemas import DEFAULT_CONTROLLER_ID
from tests.unit.ledger.ledger_support import POLICY, core, event, opened_view

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _row(op: str, parent: str | None = None, **changes: object) -> LineageRow:
    row = LineageRow(
        operation_id=op,
        correlation_id="corr",
        machine_name="delegated-research",
        machine_version="1.0.0",
        state="failure-reported",
        agent=f"agent-{op}",
        task=f"task-{op}",
        initiating_principal="alice",
        origin_operation=None,
        parent_operation=parent,
        delegated_credentials=(f"cred-{op}",),
    )
    return replace(row, **changes)  # type: ignore[arg-type]


def _change(op: str, change: Change, sequence: int = 3) -> Containment:
    return Containment(op, change, sequence, f"{op}-e", "X", NOW, f"{op}#{sequence}/{op}-e")


def test_a_transition_invoking_a_stop_capability_starts_containment() -> None:
    machine, registry = core()
    view = opened_view("op", "agent-1")
    ev = event("op", 0, "AUTHORIZATION_DENIED")
    decision = decide(machine, view, ev, POLICY, registry, NOW)
    found = containment_of(ev, decision)
    assert found is not None
    assert (found.change, found.chain) == (Change.CONTAIN, "op#1/op-e0")


def test_a_transition_without_stop_isolate_or_resume_changes_nothing() -> None:
    machine, registry = core()
    ev = event("op", 0, "STEP_FAILED")
    decision = decide(machine, opened_view("op", "agent-1"), ev, POLICY, registry, NOW)
    assert containment_of(ev, decision) is None


def test_a_cascaded_containment_extends_the_causation_chain() -> None:
    machine, registry = core()
    ev = replace(event("op", 0, "ANCESTOR_CONTAINED"), evidence_ref="cascade:root#4/root-e9")
    decision = decide(machine, opened_view("op", "agent-1"), ev, POLICY, registry, NOW)
    found = containment_of(ev, decision)
    assert found is not None
    assert found.chain == "op#1/op-e0 <- root#4/root-e9"


def test_release_clears_the_ancestor_from_every_descendant_without_new_events() -> None:
    stored = {
        "root": _row("root", containing=True, containment_cause="root#3/root-e"),
        "a": _row("a", "root", ancestors=("root",), contained_ancestors=("root",)),
        "a1": _row("a1", "a", ancestors=("a", "root"), contained_ancestors=("root", "a")),
    }
    plan = plan_lineage(
        stored, (), (_change("root", Change.RELEASE, 7),), NOW, DEFAULT_CONTROLLER_ID
    )
    assert plan.events == ()
    assert plan.rows["root"].containing is False
    assert plan.rows["a"].contained_ancestors == ()
    assert plan.rows["a1"].contained_ancestors == ("a",)


def test_contain_then_release_in_one_batch_owes_descendants_nothing() -> None:
    stored = {"root": _row("root"), "a": _row("a", "root", ancestors=("root",))}
    changes = (_change("root", Change.CONTAIN, 2), _change("root", Change.RELEASE, 5))
    plan = plan_lineage(stored, (), changes, NOW, DEFAULT_CONTROLLER_ID)
    # Nothing is contained at the end, so no event is owed.
    assert plan.events == ()
    assert plan.rows == {}  # every lineage column ends as it was


def test_an_arrival_below_a_containing_ancestor_is_signalled_and_audited() -> None:
    stored = {"root": _row("root", containing=True, containment_cause="root#3/root-e")}
    plan = plan_lineage(stored, (_row("a", "root"),), (), NOW, DEFAULT_CONTROLLER_ID)
    assert [e.key for e in plan.events] == ["a"]
    assert [b["kind"] for b in plan.audit["a"]] == ["contained-on-arrival"]


def test_an_arrival_that_took_ancestor_contained_itself_is_audited_but_not_signalled_again() -> (
    None
):
    # The tool reported ANCESTOR_CONTAINED as the child's first event, so the child's own
    # machine already stopped it in this batch: a second signal would only be rejected.
    stored = {"root": _row("root", containing=True, containment_cause="root#3/root-e")}
    told = replace(_change("a", Change.CONTAIN, 1), event_type="ANCESTOR_CONTAINED")
    plan = plan_lineage(stored, (_row("a", "root"),), (told,), NOW, DEFAULT_CONTROLLER_ID)
    assert plan.events == ()
    assert plan.rows["a"].containing is True
    assert plan.rows["a"].contained_ancestors == ("root",)
    assert "contained-on-arrival" in [b["kind"] for b in plan.audit["a"]]


def test_an_arrival_that_contained_itself_for_another_reason_is_still_signalled() -> None:
    # Its own transition (AUTHORIZATION_DENIED, say) stops and revokes at task scope; the
    # ancestor's signal may reach further, so it is still owed.
    stored = {"root": _row("root", containing=True, containment_cause="root#3/root-e")}
    plan = plan_lineage(
        stored, (_row("a", "root"),), (_change("a", Change.CONTAIN, 1),), NOW, DEFAULT_CONTROLLER_ID
    )
    assert [e.key for e in plan.events] == ["a"]


def test_a_reported_parent_cycle_does_not_loop() -> None:
    stored = {"x": _row("x", "y")}
    plan = plan_lineage(stored, (_row("y", "x"),), (), NOW, DEFAULT_CONTROLLER_ID)
    assert set(plan.rows) <= {"x", "y"}
    assert len(plan.rows["y"].ancestors) <= 64


def test_the_ledger_is_authoritative_for_known_ancestors_only() -> None:
    view = opened_view("op", "agent-1")
    view = replace(
        view,
        lineage=LineageStatus(agent="agent-1", contained_ancestors=("root", "elsewhere")),
    )
    laid = with_lineage(view, ("root",), ("agent-root",), ())
    # The ledger says root was released; an ancestor it does not know stays contained.
    assert laid.lineage.contained_ancestors == ("elsewhere",)
    assert laid.lineage.includes("agent-root")
    assert laid.lineage.agent == "agent-1"
