"""Property: however a stream is cut into batches (and whatever is redelivered), the
controller's decisions equal the decision core's over the stream in one go
(`machines.Simulation`), which is what replay checks compare the ledger with."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer import Intake, decide_batch
from consumer.batch import operation_ids, positions_for
from ledger import MemoryLedger
from machines import Decision, Simulation
from tests.support.producers import roster as producer_roster
from tests.unit.consumer.support import CONTROLLER, FOUND, GROUP, TOPIC, encoded, event, pinned

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

steps = st.lists(
    st.tuples(st.sampled_from(["op-1", "op-2", "op-3"]), st.sampled_from(TYPES), st.integers(0, 4)),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    machine=st.sampled_from(["payment-refund", "procurement-request", "email-send"]),
    script=steps,
    cuts=st.lists(st.integers(1, 6), min_size=1, max_size=30),
)
def test_batching_never_changes_a_decision(
    machine: str, script: list[tuple[str, str, int]], cuts: list[int]
) -> None:
    machines, rules = pinned()
    pinned_machine = machines[f"{machine}@1.0.0"]
    # One producer sends every event (it holds every role): an operation has one
    # reporting tool, its opener, and another tool's report would be an incident
    # (`machines.opening`) that the decision core alone knows nothing of.
    evidence = {"VERIFICATION_FOUND": replace(FOUND, verifier="tool-1")}
    # Event ids drawn from a small pool per operation, so redeliveries happen.
    events = [
        event(t, op, event_id=f"{op}-{t}-{n}", machine=machine, evidence=evidence.get(t))
        for op, t, n in script
    ]
    simulation = Simulation(pinned_machine, rules.registry, rules.policy)
    expected = [simulation.feed(e, NOW) for e in events]
    raws = [encoded(e, offset) for offset, e in enumerate(events)]

    ledger = MemoryLedger()
    epochs = {(c.topic, c.partition): c.epoch for c in ledger.claim(GROUP, TOPIC, [0], "me")}
    intake = Intake(machines, roster=producer_roster(), max_record_bytes=65536)
    got = []
    start, cut = 0, iter(cuts * 30)
    while start < len(raws):
        chunk = raws[start : start + next(cut)]
        outcomes = [intake.examine(r) for r in chunk]
        planned = decide_batch(
            outcomes,
            ledger.load_views(operation_ids(outcomes)),
            rules,
            group=GROUP,
            controller=CONTROLLER,
            positions=positions_for(chunk, epochs),
            now=NOW,
        )
        ledger.commit(planned.batch)
        got.extend(planned.decisions)
        start += len(chunk)

    def shape(d: Decision) -> tuple[object, ...]:
        return (d.operation_id, d.outcome, d.state_after, d.sequence, d.capabilities)

    assert [shape(d) for d in got] == [shape(d) for d in expected]
    for op in {e.operation_id for e in events}:
        stored = ledger.load_views([op])[op]
        assert stored.state == simulation.views[op].state
        assert stored.version == simulation.views[op].version
    assert ledger.offsets(GROUP, TOPIC) == {0: len(raws)}
