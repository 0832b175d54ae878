"""Batch planning: decisions folded in order per operation, refusals as dead letters, and
what the ledger (in memory here; the same plan runs on PostgreSQL) stores from it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumer import Accepted, DecidedBatch, Refusal
from consumer.batch import positions_for
from ledger import MemoryLedger, Position, intake_chain_id
from machines import Decision, HumanDecision, Outcome, sign_decision
from schemas import TopicNames
from tests.unit.consumer.support import (
    FOUND,
    GROUP,
    T0,
    TOPIC,
    decide,
    encoded,
    event,
    pinned,
    record,
)


def _plan(raws: list, ledger: MemoryLedger, **kwargs: object) -> DecidedBatch:  # type: ignore[type-arg]
    return decide(ledger, raws, now=T0 + timedelta(minutes=1), partitions=(0, 1), **kwargs)


def test_events_of_one_operation_are_decided_in_order_on_the_folded_view() -> None:
    ledger = MemoryLedger()
    raws = [
        encoded(event("TOOL_TIMEOUT", machine="payment-refund"), 0),
        encoded(event("VERIFICATION_FOUND", machine="payment-refund", evidence=FOUND), 1),
    ]
    planned = _plan(raws, ledger)
    assert [(d.state_before, d.state_after) for d in planned.decisions] == [
        ("failure-reported", "verifying"),
        ("verifying", "completed"),
    ]
    assert [d.sequence for d in planned.decisions] == [1, 2]
    ledger.commit(planned.batch)
    assert ledger.operation("op-1").state == "completed"
    assert ledger.offsets(GROUP, TOPIC) == {0: 2}


def test_a_new_operation_opens_at_the_initial_state_with_the_policy_budget() -> None:
    planned = _plan([encoded(event("TOOL_TIMEOUT"), 0)], MemoryLedger())
    view = planned.batch.views["op-1"]
    assert (view.version, view.state, view.budget_limit) == (0, "failure-reported", 10)
    assert view.lineage.agent == "agent-1"
    # The deadline counts from the controller's clock, never the event's time.
    assert view.deadline == T0 + timedelta(minutes=1) + timedelta(hours=1)


def test_positions_advance_past_the_last_record_of_each_partition() -> None:
    raws = [record(b"x", 4, partition=0), record(b"x", 9, partition=1), record(b"x", 5)]
    positions = positions_for(raws, {(TOPIC, 0): 3, (TOPIC, 1): 8})
    assert positions == (Position(TOPIC, 0, 3, 6), Position(TOPIC, 1, 8, 10))


def test_a_redelivered_event_is_a_duplicate_and_writes_nothing_new() -> None:
    ledger = MemoryLedger()
    ledger.commit(_plan([encoded(event("TOOL_TIMEOUT"), 0)], ledger).batch)
    again = _plan([encoded(event("TOOL_TIMEOUT"), 1)], ledger)
    assert [d.outcome for d in again.decisions] == [Outcome.DUPLICATE]
    assert again.duplicates == 1
    result = ledger.commit(again.batch)
    assert (result.decisions, result.outbox_rows) == (0, 0)
    assert ledger.offsets(GROUP, TOPIC) == {0: 2}


def test_an_event_id_reused_with_another_payload_is_a_conflict_the_ledger_dead_letters() -> None:
    ledger = MemoryLedger()
    ledger.commit(_plan([encoded(event("TOOL_TIMEOUT", event_id="e-1"), 0)], ledger).batch)
    reused = _plan([encoded(event("TOOL_FAILED", event_id="e-1"), 1)], ledger)
    assert reused.conflicts == 1
    ledger.commit(reused.batch)
    with ledger.lease_outbox(100) as lease:
        topics = [r.topic for r in lease.records]
    assert topics.count("recovery.dlq") == 1


def test_an_event_id_used_by_two_operations_in_one_batch_dead_letters_the_second() -> None:
    raws = [
        encoded(event("TOOL_TIMEOUT", "op-1", event_id="same"), 0),
        encoded(event("TOOL_TIMEOUT", "op-2", event_id="same"), 1),
    ]
    planned = _plan(raws, MemoryLedger())
    assert [d.operation_id for d in planned.decisions] == ["op-1"]
    assert [(r.offset, f.code) for r, f in planned.refused] == [(1, "event-id-conflict")]


def test_an_event_naming_another_machine_than_its_operation_is_dead_lettered() -> None:
    ledger = MemoryLedger()
    ledger.commit(_plan([encoded(event("TOOL_TIMEOUT"), 0)], ledger).batch)
    # A tool's report under another machine is a conflicting opening (an incident,
    # tests/unit/consumer/test_opening_conflict.py); a verifier's answer is refused.
    report = event("TOOL_FAILED", machine="payment-refund")
    answer = event("VERIFICATION_FOUND", machine="payment-refund", evidence=FOUND, scope=None)
    other = _plan([encoded(report, 1), encoded(answer, 2)], ledger)
    assert other.decisions == ()
    assert [f.code for _, f in other.refused] == ["opening-conflict", "machine-not-applicable"]


def test_a_record_the_ledger_named_is_dead_lettered_on_the_next_plan() -> None:
    raws = [encoded(event("TOOL_TIMEOUT"), 0), encoded(event("TOOL_FAILED", "op-2"), 1)]
    refusal = Refusal("approval-nonce-replayed", "replayed", "x", "op-2")
    planned = _plan(raws, MemoryLedger(), excluded={f"{TOPIC}[0]@1": refusal})
    assert [d.operation_id for d in planned.decisions] == ["op-1"]
    assert [f.code for _, f in planned.refused] == ["approval-nonce-replayed"]


def _forged(machine_digest: str) -> HumanDecision:
    return sign_decision(
        HumanDecision(
            approver="approver-1",
            operation_id="op-1",
            state="unresolved",
            transition="containing",
            machine_digest=machine_digest,
            expires_at=T0 + timedelta(hours=1),
            nonce="n-1",
            decision="rejected",
        ),
        Ed25519PrivateKey.generate(),
    )


def test_a_forged_human_decision_is_recorded_as_refused_and_dead_lettered() -> None:
    ledger = MemoryLedger()
    machines, _ = pinned()
    digest = machines["email-send@1.0.0"].digest
    raws = [
        encoded(event("TOOL_TIMEOUT"), 0),
        encoded(event("HUMAN_REJECTED", human_decision=_forged(digest)), 1),
    ]
    planned = _plan(raws, ledger)
    assert planned.decisions[1].outcome is Outcome.REFUSED
    assert [f.code for _, f in planned.refused] == ["forged-signature"]
    result = ledger.commit(planned.batch)
    assert (result.decisions, result.dead_letters) == (2, 1)


def test_dead_letters_are_audited_on_the_partitions_intake_chain_and_verify() -> None:
    ledger = MemoryLedger()
    raws = [record(b"junk", 0), encoded(event("TOOL_TIMEOUT"), 1), record(b"more junk", 2)]
    planned = _plan(raws, ledger)
    assert [r.offset for r, _ in planned.refused] == [0, 2]
    result = ledger.commit(planned.batch)
    assert result.dead_letters == 2
    chain = intake_chain_id(GROUP, TOPIC, 0)
    records, head = ledger.audit_chain(chain)
    assert [r.record["coordinates"] for r in records] == [f"{TOPIC}[0]@0", f"{TOPIC}[0]@2"]
    assert head is not None
    assert head.sequence == 2
    assert ledger.verify_audit() == ()
    assert ledger.offsets(GROUP, TOPIC) == {0: 3}


@pytest.mark.parametrize("partition", [0, 1])
def test_dead_letter_ids_are_deterministic_per_group_and_coordinates(partition: int) -> None:
    first = _plan([record(b"junk", 5, partition=partition)], MemoryLedger())
    second = _plan([record(b"junk", 5, partition=partition)], MemoryLedger())
    assert first.batch.dead_letters[0].record_id == second.batch.dead_letters[0].record_id


def test_a_record_the_core_fails_on_is_dead_lettered_and_the_rest_decided() -> None:
    def broken(item: Accepted, run: Callable[[], Decision]) -> tuple[Decision, dict[str, str]]:
        if item.event.operation_id == "op-2":
            raise RuntimeError("core bug")
        return run(), {}

    raws = [encoded(event("TOOL_TIMEOUT", "op-2"), 0), encoded(event("TOOL_TIMEOUT", "op-3"), 1)]
    planned = _plan(raws, MemoryLedger(), observe=broken)
    assert [d.operation_id for d in planned.decisions] == ["op-3"]
    assert [(r.offset, f.code) for r, f in planned.refused] == [(0, "decision-failed")]
    assert "core bug" in planned.refused[0][1].reason


def test_outbox_rows_go_to_the_configured_output_topics() -> None:
    ledger = MemoryLedger()
    raws = [encoded(event("TOOL_TIMEOUT"), 0), record(b"junk", 1)]
    topics = TopicNames(commands="cmd.t", audit="audit.t", dlq="dlq.t")
    ledger.commit(_plan(raws, ledger, topics=topics).batch)
    with ledger.lease_outbox(100) as lease:
        found = {r.topic for r in lease.records}
    assert found == {"cmd.t", "audit.t", "dlq.t"}
