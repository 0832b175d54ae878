"""The in-memory ledger and PostgreSQL write the same records for the same batches:
same views, same decisions, same audit chain hashes, same outbox rows in the same order.
The abstract suite checks behaviour; this checks the bytes do not drift either."""

from __future__ import annotations

import pytest

from ledger import Ledger, MemoryLedger, PostgresLedger
from tests.unit.ledger.ledger_support import GROUP, TOPIC, event, feed, sequence, with_approval
from tests.unit.ledger.ledger_support import decide_batch as decide

pytestmark = pytest.mark.integration


def _drive(ledger: Ledger) -> None:
    ledger.claim(GROUP, TOPIC, [0], "controller-a")
    feed(ledger, sequence("op-1") + sequence("op-2", parent="op-1"), epoch=1)
    ledger.commit(
        with_approval(
            decide(ledger, [event("op-3", 0, "TOOL_TIMEOUT")], epoch=1, first_offset=6), "nonce-1"
        )
    )
    forged = event("op-1", 9, "VERIFICATION_FOUND", outcome="applied", event_id="op-1-e0")
    feed(ledger, [forged, *sequence("op-1")], epoch=1, first_offset=7)


def _snapshot(ledger: Ledger) -> dict[str, object]:
    ops = ("op-1", "op-2", "op-3")
    with ledger.lease_outbox(100) as lease:
        outbox = [(r.record_id, r.topic, r.key, dict(r.headers), r.payload) for r in lease.records]
    return {
        "views": ledger.load_views(list(ops)),
        "decisions": {op: ledger.decisions(op) for op in ops},
        "audit": {
            op: [(r.sequence, r.kind, r.hash) for r in ledger.audit_chain(op)[0]] for op in ops
        },
        "heads": {op: ledger.audit_chain(op)[1] for op in ops},
        "outbox": outbox,
        "lineage": (ledger.operation("op-2"), ledger.descendants("op-1")),
        "offsets": ledger.offsets(GROUP, TOPIC),
    }


def test_memory_and_postgres_ledgers_write_identical_records(database_url: str) -> None:
    memory = MemoryLedger()
    postgres = PostgresLedger(database_url)
    try:
        _drive(memory)
        _drive(postgres)
        expected, actual = _snapshot(memory), _snapshot(postgres)
    finally:
        postgres.close()
    for key in expected:
        assert actual[key] == expected[key], key
