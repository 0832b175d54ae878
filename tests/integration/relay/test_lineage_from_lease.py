"""The lineage the relay learns from a lease's `operation-opened` audit rows is exactly
what the ledger's operation row holds (PostgreSQL, batches planned by the controller's
own code), so a command published without a lineage query carries the same bytes."""

from __future__ import annotations

from datetime import timedelta

from ledger import PostgresLedger
from machines import Event, Lineage
from producers.relay import LineageCache, lineage_from_ledger
from schemas import TopicNames
from tests.support.scopes import catalogue_scope
from tests.unit.consumer.support import T0, decide, encoded


def _opening(operation: str, lineage: Lineage) -> Event:
    return Event(
        event_type="TOOL_TIMEOUT",
        event_id=f"{operation}-timeout",
        operation_id=operation,
        correlation_id=f"corr-{operation}",
        machine_name="payment-refund",
        machine_version="1.0.0",
        event_time=T0,
        evidence_ref="ref-1",
        producer="tool-1",
        lineage=lineage,
        scope=catalogue_scope("payment-refund"),  # an operation opens only with one
    )


def test_lineage_learnt_from_the_lease_equals_the_operation_rows(
    ledger: PostgresLedger,
) -> None:
    lineages = {
        "op-root": Lineage(agent="agent-1", task="task-1", initiating_principal="alice"),
        "op-child": Lineage(
            agent="agent-2",
            task="task-2",
            initiating_principal="alice",
            origin_operation="op-root",
            parent_operation="op-root",
            delegated_credentials=("cred-9", "cred-3"),
        ),
    }
    raws = [encoded(_opening(op, lin), i) for i, (op, lin) in enumerate(lineages.items())]
    planned = decide(ledger, raws, now=T0 + timedelta(minutes=1), lineage=True)
    ledger.commit(planned.batch)

    asked: list[str] = []

    def lookup(operation_id: str) -> Lineage:
        asked.append(operation_id)
        return lineage_from_ledger(ledger)(operation_id)

    cache = LineageCache(lookup)
    with ledger.lease_outbox(10) as lease:
        assert any("command_id" in r.payload for r in lease.records)  # commands to encode
        cache.learn(lease.records, {TopicNames().audit})
    for op, lineage in lineages.items():
        assert cache(op) == lineage_from_ledger(ledger)(op) == lineage
    assert asked == []
