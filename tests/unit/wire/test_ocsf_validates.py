"""Every audit record kind the controller writes, and every record the relay publishes
on the audit topic (chain heads and tombstones included), is a valid OCSF 1.3 API
Activity (class 6003) event, checked with pydantic-ocsf's own model rather than our
reading of the schema. The records come from the controller's batch pipeline (intake, decision,
lineage, commit) over the in-memory ledger, which the parity tests hold equal to
PostgreSQL; an audit kind this test does not know fails it, so a new kind cannot reach
`recovery.audit` unvalidated."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from typing import Any, Final

from ocsf.v1_3_0.events import ApiActivity

from ledger import AuditRecord, ChainHead, MemoryLedger, OutboxRecord
from ledger.audit import chain_records
from ledger.jsonutil import dumps
from ledger.retention import tombstone_payload
from machines import Event, Lineage
from producers import RecordEncoder
from schemas import DEFAULT_TOPICS, audit_to_ocsf, ocsf_kind
from tests.unit.consumer.support import (
    FOUND,
    decide,
    encoded,
    event,
    record,
)

# Every kind the ledger writes (ledger/records.py, ledger/lineage_step.py,
# ledger/deadletters.py). Add a kind here only together with a record of it below.
KINDS: Final = frozenset(
    {"decision", "operation-opened", "event-conflict", "lineage", "dead-letter"}
)


def _commit(ledger: MemoryLedger, raws: list[Any], first_time: Event) -> None:
    planned = decide(ledger, raws, now=first_time.event_time + timedelta(minutes=1), lineage=True)
    ledger.commit(planned.batch)


def _child(ev: Event) -> Event:
    lineage = Lineage(
        agent="agent-child",
        task="task-child",
        initiating_principal="alice",
        origin_operation="op-parent",
        parent_operation="op-parent",
    )
    return replace(ev, lineage=lineage)


def _every_kind() -> list[AuditRecord]:
    ledger = _ledger_with_every_kind()
    records: list[AuditRecord] = []
    for operation_id in ledger.audit_operation_ids():
        chain, _ = ledger.audit_chain(operation_id)
        records.extend(chain)
    return records


def _ledger_with_every_kind() -> MemoryLedger:
    ledger = MemoryLedger()
    timeout = event("TOOL_TIMEOUT")
    batches = [
        # operation-opened + decision (transitioned)
        [encoded(timeout, 0)],
        # decisions refused (an approval of no pending request) and rejected (a second
        # timeout, which no transition from the new state accepts)
        [encoded(event("HUMAN_APPROVED", event_id="op-1-approved"), 1)],
        [encoded(event("TOOL_TIMEOUT", event_id="op-1-timeout-2"), 2)],
        # event-conflict: the first event's id reused with another payload
        [
            encoded(
                replace(event("VERIFICATION_FOUND", evidence=FOUND), event_id=timeout.event_id), 3
            )
        ],
        # dead-letter: bytes that are no event at all
        [record(b"\x00not an event", 4)],
        # lineage: a parent contained, then a child arriving below it
        [encoded(event("AUTHORIZATION_DENIED", "op-parent"), 5)],
        [encoded(_child(event("TOOL_TIMEOUT", "op-child")), 6)],
    ]
    for raws in batches:
        _commit(ledger, raws, timeout)
    return ledger


def test_every_audit_record_kind_validates_as_ocsf_api_activity() -> None:
    records = _every_kind()
    kinds = {r.kind for r in records}
    assert kinds - KINDS == set(), f"audit kinds without an OCSF check: {sorted(kinds - KINDS)}"
    assert kinds == KINDS, f"kinds this test no longer produces: {sorted(KINDS - kinds)}"
    outcomes = {r.record.get("outcome") for r in records if r.kind == "decision"}
    assert {"transitioned", "refused", "rejected"} <= outcomes, outcomes
    for audit in records:
        published = audit_to_ocsf({**audit.to_dict(), "occurred_at": "2026-11-30T12:00:00Z"})
        ApiActivity.model_validate(published)
        where = f"{audit.kind} {audit.operation_id}#{audit.sequence}"
        assert published["api"]["request"]["uid"], where
        assert published["status_code"], where
        assert published["metadata"]["correlation_uid"], where


def test_every_record_the_relay_publishes_on_the_audit_topic_is_ocsf() -> None:
    # What a SIEM reading `recovery.audit` gets: the relay's encoding of every audit
    # outbox row (the controller signs these same bytes), a purge's tombstone too.
    ledger = _ledger_with_every_kind()
    with ledger.lease_outbox(10_000) as lease:
        rows = [r for r in lease.records if r.topic == DEFAULT_TOPICS.audit]
    chain, _ = ledger.audit_chain("op-1")
    head = ChainHead(chain[-1].sequence, chain[-1].hash)
    body = {
        "format": "tombstone/1",
        "purged_through": head.sequence,
        "purged_head": head.hash,
        "rows_removed": 9,
        "purged_at": "2027-12-01T00:00:00+00:00",
        "reason": "retention",
    }
    [stone] = chain_records("op-1", head, [("tombstone", body, dumps(body))])
    rows.append(
        OutboxRecord(
            10_000,
            "tombstone:op-1",
            DEFAULT_TOPICS.audit,
            "op-1",
            {"kind": "tombstone"},
            tombstone_payload(stone, head, body),
        )
    )
    encoder = RecordEncoder(DEFAULT_TOPICS, _no_lineage)
    kinds: Counter[str] = Counter()
    for row in rows:
        event = json.loads(encoder.encode(row).value)
        ApiActivity.model_validate(event)
        kinds[str(ocsf_kind(event))] += 1
    assert kinds["chain-heads"] >= 7, kinds  # one per committed batch
    assert kinds["tombstone"] == 1
    assert set(kinds) == {*KINDS, "chain-heads", "tombstone"}


def _no_lineage(operation_id: str) -> Lineage:
    raise AssertionError(f"an audit row needs no lineage ({operation_id})")
