"""A batch that opens an operation decides it with the lineage the ledger links it into
(`Ledger.arrival_lineage`), read once for every operation the batch opens."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta

import pytest

from consumer import Accepted, Intake, IntakeResult, decide_batch
from consumer.batch import (
    DecidedBatch,
    claim_keys,
    decide_on_openers,
    openings,
    operation_ids,
    positions_for,
)
from ledger import MemoryLedger, VersionConflict
from machines import ClaimKey, Event, EvidencePayload, Lineage, OperationView, Simulation
from machines.event import DeclaredFacts
from tests.support.producers import roster as producer_roster
from tests.unit.consumer.support import CONTROLLER, GROUP, TOPIC, encoded, event, pinned


def _below(ev: Event, parent: str) -> Event:
    lineage = Lineage(
        agent="agent-child",
        task="task-child",
        initiating_principal="alice",
        origin_operation=parent,
        parent_operation=parent,
    )
    return replace(ev, lineage=lineage)


Decide = Callable[[Mapping[str, str | None] | None, Sequence[ClaimKey] | None], DecidedBatch]


def _decider(
    ledger: MemoryLedger, events: list[Event], first: int
) -> tuple[Decide, list[IntakeResult], Mapping[str, OperationView]]:
    """How to decide `events` (offsets from `first`) on `ledger`, given the openings to
    read the arrival lineage of and the claim keys to read the owners of (None: read
    nothing), with the batch's intake results and stored views."""
    machines, rules = pinned()
    epochs = {(TOPIC, 0): ledger.claim(GROUP, TOPIC, [0], "me")[0].epoch}
    raws = [encoded(e, first + i) for i, e in enumerate(events)]
    intake = Intake(machines, roster=producer_roster(), max_record_bytes=65536)
    outcomes = [intake.examine(r) for r in raws]
    views = ledger.load_views(operation_ids(outcomes))

    def decide(
        read: Mapping[str, str | None] | None, keys: Sequence[ClaimKey] | None
    ) -> DecidedBatch:
        return decide_batch(
            outcomes,
            views,
            rules,
            group=GROUP,
            controller=CONTROLLER,
            positions=positions_for(raws, epochs),
            now=events[0].event_time + timedelta(minutes=1),
            arrivals=None if read is None else ledger.arrival_lineage(read),
            claims=None if keys is None else ledger.key_claims(keys),
        )

    return decide, outcomes, views


def _commit(
    ledger: MemoryLedger, events: list[Event], first: int, *, arrivals: bool, claims: bool = False
) -> None:
    """Decide `events` on the reads for each new operation's first event (`openings`,
    `claim_keys`; each only when asked) and commit them."""
    decide, outcomes, views = _decider(ledger, events, first)
    planned = decide(
        openings(outcomes, views) if arrivals else None,
        claim_keys(outcomes, views) if claims else None,
    )
    ledger.commit(planned.batch)


def test_openings_name_each_new_operation_with_the_parent_its_first_event_names() -> None:
    machines, _ = pinned()
    events = [
        _below(event("TOOL_TIMEOUT", "op-child"), "op-parent"),
        event("TOOL_TIMEOUT", "op-stored", event_id="s-1"),
        event("TOOL_FAILED", "op-child", event_id="c-2"),
        event("TOOL_TIMEOUT", "op-top", event_id="t-1"),
    ]
    intake = Intake(machines, roster=producer_roster(), max_record_bytes=65536)
    outcomes = [intake.examine(encoded(e, i)) for i, e in enumerate(events)]
    stored = MemoryLedger()
    _commit(stored, [event("TOOL_TIMEOUT", "op-stored", event_id="s-0")], 0, arrivals=True)
    views = stored.load_views(["op-stored"])
    assert openings(outcomes, views) == {"op-child": "op-parent", "op-top": None}


def test_a_new_child_of_a_contained_parent_is_decided_as_held_from_its_first_event() -> None:
    ledger = MemoryLedger()
    _commit(ledger, [event("AUTHORIZATION_DENIED", "op-parent")], 0, arrivals=True)
    assert ledger.lineage("op-parent").containing
    _commit(ledger, [_below(event("TOOL_TIMEOUT", "op-child"), "op-parent")], 1, arrivals=True)
    (first,) = ledger.decisions("op-child")
    assert ledger.load_views(["op-child"])["op-child"].lineage.contained_ancestors == ("op-parent",)
    assert first["event"]["type"] == "TOOL_TIMEOUT"


def test_a_batch_planned_without_the_arrival_lineage_is_refused_at_commit() -> None:
    ledger = MemoryLedger()
    _commit(ledger, [event("AUTHORIZATION_DENIED", "op-parent")], 0, arrivals=True)
    child = [_below(event("TOOL_TIMEOUT", "op-child"), "op-parent")]
    with pytest.raises(VersionConflict, match="op-child: its lineage changed"):
        _commit(ledger, child, 1, arrivals=False)
    assert ledger.decisions("op-child") == ()


def _plan_one_batch(ledger: MemoryLedger, events: list[Event], first: int = 0) -> DecidedBatch:
    """Plan `events` as the controller does (`Controller._attempt`): the arrival lineage
    and the key owners read for the operations' openers."""
    decide, outcomes, views = _decider(ledger, events, first)
    return decide_on_openers(decide, openings(outcomes, views), claim_keys(outcomes, views))


def test_a_child_opened_in_its_parents_first_batch_is_decided_below_the_parents_agent() -> None:
    ledger = MemoryLedger()
    by_parent_agent = replace(
        _below(event("VERIFICATION_NOT_FOUND", "op-child", event_id="c-2"), "op-parent"),
        producer="agent-1",  # the parent's agent, in the child's lineage (SPEC §7.7)
        evidence=EvidencePayload(outcome="not_applied", verifier="agent-1", reference="v-2"),
    )
    planned = _plan_one_batch(
        ledger,
        [
            event("TOOL_TIMEOUT", "op-parent"),
            _below(event("TOOL_TIMEOUT", "op-child"), "op-parent"),
            by_parent_agent,
        ],
    )
    assert "agent-1" in planned.batch.views["op-child"].lineage.lineage_agents
    refused = next(d for d in planned.decisions if d.event_id == "c-2")
    assert "affected-agent-evidence" in {n.code for n in refused.refusals}
    ledger.commit(planned.batch)  # the commit's arrival check agrees: no VersionConflict
    assert "agent-1" in ledger.load_views(["op-child"])["op-child"].lineage.lineage_agents


def test_a_parent_contained_earlier_in_the_batch_holds_a_child_opened_after_it() -> None:
    ledger = MemoryLedger()
    planned = _plan_one_batch(
        ledger,
        [
            event("AUTHORIZATION_DENIED", "op-parent"),
            _below(event("TOOL_TIMEOUT", "op-child"), "op-parent"),
        ],
    )
    child = planned.batch.views["op-child"]
    assert child.lineage.contained_ancestors == ("op-parent",)
    ledger.commit(planned.batch)  # committed first time
    assert ledger.lineage("op-parent").containing
    stored = ledger.load_views(["op-child"])["op-child"]
    assert stored.lineage.contained_ancestors == ("op-parent",)


def test_a_parent_opened_after_its_child_in_one_batch_counts_the_childs_agent() -> None:
    ledger = MemoryLedger()
    planned = _plan_one_batch(
        ledger,
        [
            _below(event("TOOL_TIMEOUT", "op-child"), "op-parent"),
            event("TOOL_TIMEOUT", "op-parent"),
        ],
    )
    assert "agent-child" in planned.batch.views["op-parent"].lineage.lineage_agents
    ledger.commit(planned.batch)
    assert ledger.lineage("op-parent").descendant_agents == ("agent-child",)


def test_a_simulation_opens_a_child_below_its_parent_as_one_batch_does() -> None:
    machines, rules = pinned()
    events = [
        event("AUTHORIZATION_DENIED", "op-parent"),
        _below(event("TOOL_TIMEOUT", "op-child"), "op-parent"),
        _below(event("TOOL_FAILED", "op-child", event_id="c-2"), "op-parent"),
    ]
    decided = _plan_one_batch(MemoryLedger(), events)
    simulation = Simulation(machines["email-send@1.0.0"], rules.registry, rules.policy)
    now = events[0].event_time + timedelta(minutes=1)
    intake = Intake(machines, roster=producer_roster(), max_record_bytes=65536)
    consumed = [intake.examine(encoded(e, i)) for i, e in enumerate(events)]
    simulated = [simulation.feed(r.event, now) for r in consumed if isinstance(r, Accepted)]
    assert simulated == list(decided.decisions)
    # The simulation authenticates nothing, so it proves no agent (`agent_proof`).
    folded = {op: replace(v, agent_proof="") for op, v in (decided.batch.folded or {}).items()}
    assert dict(simulation.views) == folded
    assert simulation.views["op-child"].lineage.contained_ancestors == ("op-parent",)


@pytest.mark.parametrize(
    ("first_names", "opener_names"),
    [(None, "op-parent"), ("op-other", "op-parent"), ("op-parent", "op-other")],
)
def test_an_operation_opened_by_its_second_event_is_decided_below_that_events_parent(
    first_names: str | None, opener_names: str | None
) -> None:
    # The operation's first event can open it (`openings` reads its parent), but the
    # fold refuses it (its id is another operation's in the batch) and the next event,
    # naming another parent, opens it. Decided below the first one's parent, the plan
    # was refused by the commit's lineage check every time: a partition stalled by three
    # records of one producer.
    ledger = MemoryLedger()
    _commit(ledger, [event("AUTHORIZATION_DENIED", "op-parent", event_id="p-1")], 0, arrivals=True)
    _commit(ledger, [event("TOOL_TIMEOUT", "op-other", event_id="o-1")], 1, arrivals=True)
    refused = event("TOOL_TIMEOUT", "op-x", event_id="dup")
    opener = event("TOOL_FAILED", "op-x", event_id="x-2")
    batch = [
        event("TOOL_TIMEOUT", "op-a", event_id="dup"),
        refused if first_names is None else _below(refused, first_names),
        opener if opener_names is None else _below(opener, opener_names),
    ]
    with pytest.raises(VersionConflict, match="op-x: its lineage changed"):
        _commit(ledger, batch, 2, arrivals=True)  # the arrival read for `openings` alone

    planned = _plan_one_batch(ledger, batch, 2)
    assert planned.openers["op-x"].event_id == "x-2"
    ledger.commit(planned.batch)
    row = ledger.lineage("op-x")
    assert (row.parent_operation, row.ancestors) == (opener_names, (opener_names,))
    assert row.contained_ancestors == (opener_names,)  # both parents are containing


def test_an_operation_opened_by_its_second_event_is_decided_on_that_events_claim() -> None:
    # The same, for the idempotency key: the first event declares one nobody holds, the
    # opener one a stored operation holds. Decided blind to that owner, the plan was
    # refused by the commit's claim check every time; decided on it, the opener's key
    # is a reuse of the owner's.
    ledger = MemoryLedger()
    owned = DeclaredFacts(idempotency_key="key-2", status_api=True)
    _commit(
        ledger, [event("TOOL_TIMEOUT", "op-owner", event_id="w-1", facts=owned)], 0, arrivals=True
    )
    free = DeclaredFacts(idempotency_key="key-1", status_api=True)
    batch = [
        event("TOOL_TIMEOUT", "op-a", event_id="dup"),
        event("TOOL_TIMEOUT", "op-x", event_id="dup", facts=free),
        event("TOOL_FAILED", "op-x", event_id="x-2", facts=owned),
    ]
    with pytest.raises(VersionConflict, match="op-x: idempotency key 'key-2'"):
        _commit(ledger, batch, 1, arrivals=True, claims=True)  # claims read for `claim_keys`

    planned = _plan_one_batch(ledger, batch, 1)
    ledger.commit(planned.batch)
    owner = ledger.load_views(["op-x"])["op-x"].key_owner
    assert owner is not None
    assert owner.operation_id == "op-owner"
