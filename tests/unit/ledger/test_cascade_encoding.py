"""A cascade event planned by the ledger goes through the relay's encoder to a
`recovery.EventEnvelope` the controller's intake reads back as the same event."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from ledger import OutboxRecord
from ledger.cascade import plan_lineage
from machines import Change, Containment, LineageRow
from machines.event import Lineage
from producers.encoding import RecordEncoder, UnpublishableRow
from schemas import DEFAULT_CONTROLLER_ID, AvroSingleObjectCodec, TopicNames, record_to_event

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TOPICS = TopicNames(events="prod.events")


def _no_lineage(operation_id: str) -> Lineage:
    raise AssertionError(f"an event row carries its own lineage ({operation_id})")


def _row() -> OutboxRecord:
    stored = {
        "root": LineageRow(
            "root", "corr", "delegated-research", "1.0.0", "x", "orch", "t", "p", None, None
        ),
        "kid": LineageRow(
            "kid",
            "corr",
            "delegated-research",
            "1.0.0",
            "x",
            "worker",
            "t",
            "p",
            "root",
            "root",
            ("cred-kid",),
            ancestors=("root",),
        ),
    }
    change = Containment("root", Change.CONTAIN, 3, "ev-9", "HUMAN_REJECTED", NOW, "root#3/ev-9")
    (event,) = plan_lineage(stored, (), (change,), NOW, DEFAULT_CONTROLLER_ID).events
    return OutboxRecord(
        1,
        event.record_id,
        "recovery.events",
        event.key,
        dict(event.headers),
        json.loads(event.payload_json),
    )


def test_a_cascade_row_is_published_as_an_event_envelope_on_the_configured_topic() -> None:
    row = _row()
    encoded = RecordEncoder(TOPICS, _no_lineage).encode(row)
    assert (encoded.topic, encoded.key) == ("prod.events", "kid")
    assert encoded.headers["recovery-causation-chain"] == "root#3/ev-9"
    name, record = AvroSingleObjectCodec().decode(encoded.value)
    assert name == "recovery.EventEnvelope"
    event = record_to_event(record)
    assert (event.event_type, event.operation_id) == ("ANCESTOR_CONTAINED", "kid")
    assert event.lineage.delegated_credentials == ("cred-kid",)
    assert event.evidence is not None
    assert event.evidence.ancestor_operation == "root"
    assert event.evidence_ref == "cascade:root#3/ev-9"


def test_a_malformed_event_row_is_held_back_not_published() -> None:
    row = _row()
    broken = OutboxRecord(
        row.position,
        row.record_id,
        row.topic,
        row.key,
        row.headers,
        {**row.payload, "event_type": "not upper"},
    )
    with pytest.raises(UnpublishableRow, match=row.record_id):
        RecordEncoder(TOPICS, _no_lineage).encode(broken)
