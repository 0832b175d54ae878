"""The views after a batch that its planner passes in `Batch.folded` are exactly what
`ledger.batch_rows` would fold itself: with them and without them, a batch plans the same
rows (both ledgers commit through `batch_rows`), so skipping the second fold changes no
stored or published byte."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer import DecidedBatch, Intake
from ledger import Batch, MemoryLedger, batch_rows
from machines import CATALOGUE, Event, EvidencePayload, load_catalogue, load_registry
from machines.event import DeclaredFacts
from ops.bench.ledger import build_batches
from tests.support.producers import roster as producer_roster
from tests.unit.consumer.support import FOUND, decide, encoded, event, pinned

NOW = event("TOOL_TIMEOUT").event_time + timedelta(minutes=1)
TYPES = [
    "TOOL_TIMEOUT",
    "TOOL_FAILED",
    "VERIFICATION_FOUND",
    "VERIFICATION_NOT_FOUND",
    "RETRY_SUCCEEDED",
    "AUTHORIZATION_DENIED",
    "CONTAINMENT_SUCCEEDED",
]
KEYED = DeclaredFacts(idempotency_key="key-declared-later", status_api=True)
NOT_FOUND = EvidencePayload(outcome="not_applied", verifier="verifier-1", reference="v-2")


def _assert_same_plan(batch: Batch) -> None:
    assert batch.folded is not None
    with_folded = batch_rows(batch)
    refolded = batch_rows(replace(batch, folded=None))
    assert with_folded == refolded
    # Spelled out, for a readable failure on the fields a stale view would change.
    assert [r.view for r in with_folded.operations] == [r.view for r in refolded.operations]
    assert [r.payload_json for r in with_folded.commands] == [
        r.payload_json for r in refolded.commands
    ]


def _plan(intake: Intake, ledger: MemoryLedger, events: list[Event], first: int) -> DecidedBatch:
    raws = [encoded(e, first + n) for n, e in enumerate(events)]
    return decide(ledger, raws, now=NOW, intake=intake, owners=True)


def _story_event(machine: str, op: str, kind: str, n: int, later_facts: bool) -> Event:
    """An event of `kind`; ids are drawn from a small pool per operation, so the same id
    comes back with the same payload (a duplicate) or another type (a conflict)."""
    ev = event(
        kind,
        op,
        event_id=f"{op}-{n}",
        machine=machine,
        evidence=FOUND if kind == "VERIFICATION_FOUND" else None,
    )
    if later_facts:
        # A trusted verifier declaring the tool facts after the operation opened: the
        # idempotency key changes mid-batch, so commands before and after it differ.
        ev = replace(ev, producer="verifier-1", facts=KEYED)
    return ev


steps = st.lists(
    st.tuples(
        st.sampled_from(["op-1", "op-2", "op-3"]),
        st.sampled_from(TYPES),
        st.integers(0, 5),
        st.booleans(),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    machine=st.sampled_from(["payment-refund", "procurement-request", "email-send"]),
    script=steps,
    cuts=st.lists(st.integers(1, 8), min_size=1, max_size=30),
)
def test_a_consumer_batch_plans_the_same_rows_with_its_folded_views_as_without(
    machine: str, script: list[tuple[str, str, int, bool]], cuts: list[int]
) -> None:
    machines, _rules = pinned()
    events = [_story_event(machine, op, kind, n, facts) for op, kind, n, facts in script]
    ledger = MemoryLedger()
    intake = Intake(machines, roster=producer_roster(), max_record_bytes=65536)
    start, cut = 0, 0
    while start < len(events):
        size = cuts[cut % len(cuts)]
        planned = _plan(intake, ledger, events[start : start + size], start)
        _assert_same_plan(planned.batch)
        ledger.commit(planned.batch)
        start, cut = start + size, cut + 1


def test_a_batch_whose_facts_are_declared_mid_batch_keys_each_command_as_the_fold_does() -> None:
    machines, _rules = pinned()
    machine = "payment-refund"
    events = [
        event("TOOL_TIMEOUT", machine=machine, event_id="e-1"),
        # A trusted verifier declares the facts the opening left out (its answer to the
        # verification command; a tool report from it would be a conflicting opening).
        replace(
            event("VERIFICATION_NOT_FOUND", machine=machine, event_id="e-2", evidence=NOT_FOUND),
            facts=KEYED,
        ),
        event("TOOL_TIMEOUT", machine=machine, event_id="e-3"),
        event("TOOL_FAILED", machine=machine, event_id="e-1"),  # a conflict
    ]
    planned = _plan(
        Intake(machines, roster=producer_roster(), max_record_bytes=65536),
        MemoryLedger(),
        events,
        0,
    )
    assert planned.conflicts == 1
    assert planned.batch.folded is not None
    assert planned.batch.folded["op-1"].facts.idempotency_key == "key-declared-later"
    _assert_same_plan(planned.batch)
    keys = [
        json.loads(r.payload_json)["idempotency_key"] for r in batch_rows(planned.batch).commands
    ]
    # The first command predates the declaration; the later ones carry its key.
    assert keys[0] is None
    assert len(keys) > 1
    assert set(keys[1:]) == {"key-declared-later"}


def test_a_consumer_batch_opening_operations_below_a_parent_plans_the_same_rows() -> None:
    machines, _rules = pinned()
    parent = event("TOOL_TIMEOUT", "op-p", machine="payment-refund")
    child = event("TOOL_TIMEOUT", "op-c", machine="payment-refund")
    child = replace(child, lineage=replace(child.lineage, parent_operation="op-p"))
    contain = event("CONTAINMENT_SUCCEEDED", "op-p", machine="payment-refund")
    planned = _plan(
        Intake(machines, roster=producer_roster(), max_record_bytes=65536),
        MemoryLedger(),
        [parent, contain, child],
        0,
    )
    _assert_same_plan(planned.batch)


def test_the_ledger_benchmark_batches_plan_the_same_rows_with_their_folded_views() -> None:
    registry = load_registry()
    machine = load_catalogue(registry, CATALOGUE)["delegated-research"]
    batches = build_batches(machine, registry, 120, 60)
    assert len(batches) == 8
    for batch in batches:
        _assert_same_plan(batch)


def test_a_folded_mapping_missing_a_touched_operation_is_refused_as_a_caller_bug() -> None:
    events = [event("TOOL_TIMEOUT", "op-1"), event("TOOL_TIMEOUT", "op-2")]
    machines, _rules = pinned()
    planned = _plan(
        Intake(machines, roster=producer_roster(), max_record_bytes=65536),
        MemoryLedger(),
        events,
        0,
    )
    assert planned.batch.folded is not None
    partial = {"op-1": planned.batch.folded["op-1"]}
    with pytest.raises(ValueError, match="op-2 has no folded view"):
        batch_rows(replace(planned.batch, folded=partial))
