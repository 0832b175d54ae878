"""Property: whatever order the operations of a delegation tree reach the ledger in
(children before parents included), and wherever containments happen, every operation
ends linked to its true ancestor chain, knows every descendant's agent, is held by
exactly its containing ancestors, and is signalled by exactly one ANCESTOR_CONTAINED
event if it has any."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import MemoryLedger
from machines.event import parse_event
from tests.unit.ledger.ledger_support import GROUP, TOPIC, feed
from tests.unit.ledger.lineage_contract import tree_event


@st.composite
def trees(draw: st.DrawFn) -> tuple[list[int | None], list[int], set[int]]:
    """Parent index per operation (0 is the root), an arrival order, and the operations
    whose first event contains them."""
    size = draw(st.integers(min_value=2, max_value=12))
    parents: list[int | None] = [None]
    for index in range(1, size):
        parents.append(draw(st.integers(min_value=0, max_value=index - 1)))
    order = draw(st.permutations(list(range(size))))
    containing = draw(st.sets(st.integers(min_value=0, max_value=size - 1), max_size=3))
    return parents, order, containing


def _chain(parents: list[int | None], index: int) -> tuple[str, ...]:
    out: list[str] = []
    parent = parents[index]
    while parent is not None:
        out.append(f"n{parent}")
        parent = parents[parent]
    return tuple(out)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_any_arrival_order_links_the_true_tree_and_signals_each_held_operation_once(
    case: tuple[list[int | None], list[int], set[int]],
) -> None:
    parents, order, containing = case
    ledger = MemoryLedger()
    (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
    for offset, index in enumerate(order):
        parent = parents[index]
        kind = "AUTHORIZATION_DENIED" if index in containing else "STEP_FAILED"
        ev = tree_event(f"n{index}", 0, kind, parent=None if parent is None else f"n{parent}")
        feed(ledger, [ev], epoch=claim.epoch, first_offset=offset)
    with ledger.lease_outbox(10_000) as lease:
        events = [parse_event(r.payload) for r in lease.records if r.topic == "recovery.events"]
    signalled = Counter(e.operation_id for e in events)
    for index in range(len(parents)):
        op = f"n{index}"
        row = ledger.lineage(op)
        ancestors = _chain(parents, index)
        assert row.ancestors == ancestors, op
        held = {a for a in ancestors if int(a[1:]) in containing}
        assert set(row.contained_ancestors) == held, op
        assert signalled[op] == (1 if held else 0), op
        assert row.containing == (index in containing), op
        below = {f"agent-n{j}" for j in range(len(parents)) if op in _chain(parents, j)}
        assert set(row.descendant_agents) == below, op
