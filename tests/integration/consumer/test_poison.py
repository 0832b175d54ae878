"""No record can stop the group, against the real broker and PostgreSQL: a far-future
event time is refused at intake, one inside intake's window is decided on the
controller's clock (its deadline and timers count from the controller's time, not the
event's: the reported crash was that deadline overflowing), and the offset moves past
them all. A record whose handling raises is dead-lettered as `record-failed` naming the
stage (tests/unit/consumer/test_poison.py makes every stage raise)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger, intake_chain_id
from schemas import CONTENT_TYPE_JSON, event_to_record
from tests.integration.consumer.harness import (
    VERIFIER,
    Tool,
    open_ledger,
    outbox,
    running,
    settings_for,
    wait_for,
)
from tests.support.kafka import TopicFactory
from tests.support.producers import roster_document
from tests.unit.consumer.support import event

pytestmark = pytest.mark.integration

# About 7,900 years: counted from the event's time (2150, inside intake's window) it
# overflowed `datetime.max` the way 9999-12-31 overflowed the default hour; counted from
# the controller's clock, as every deadline and timer now is, it fits.
DEADLINE_SECONDS = 250_000_000_000


@pytest.fixture
def ledger(database_url: str) -> Any:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _json(operation: str, at: datetime) -> bytes:
    data = event_to_record(event("TOOL_TIMEOUT", operation, event_id=f"{operation}-e"))
    data["event_time"] = at.isoformat()
    return json.dumps(data, default=str).encode("utf-8")


def test_far_future_event_times_are_refused_or_decided_on_the_controllers_clock(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, ledger: Ledger,
    tmp_path: Path,
) -> None:  # fmt: skip
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        json.dumps(
            {
                "id": "poison",
                "trusted_verifiers": [VERIFIER],
                "deadline_seconds": DEADLINE_SECONDS,
                "producers": roster_document(),
            }
        ),
        encoding="utf-8",
    )
    topic = topic_factory(partitions=1)
    tool = Tool(kafka_bootstrap, topic)
    tool.raw("op-a", _json("op-a", datetime(2026, 11, 30, tzinfo=UTC)), CONTENT_TYPE_JSON)  # 0
    far = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    tool.raw("op-far", _json("op-far", far), CONTENT_TYPE_JSON)  # 1: the reported record
    tool.raw("op-late", _json("op-late", datetime(2150, 1, 1, tzinfo=UTC)), CONTENT_TYPE_JSON)
    tool.raw("op-b", _json("op-b", datetime(2026, 11, 30, tzinfo=UTC)), CONTENT_TYPE_JSON)  # 3
    tool.close()
    group = f"poison-{uuid.uuid4().hex[:8]}"
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    with running(settings, ledger):
        wait_for(lambda: ledger.offsets(group, topic) == {0: 4}, 60, "all four records settled")
    assert len(ledger.decisions("op-a")) == 1
    assert len(ledger.decisions("op-b")) == 1
    [late] = ledger.decisions("op-late")
    decided_at = datetime.fromisoformat(late["decided_at"])
    assert decided_at.year == datetime.now(UTC).year
    view = ledger.load_views(["op-late"])["op-late"]
    assert view.deadline == decided_at + timedelta(seconds=DEADLINE_SECONDS)
    stall = next(t for t in view.timers if t.kind == "stalled")
    assert stall.due_at == decided_at + timedelta(hours=1)
    rows = outbox(ledger)
    letters = {r.payload["source_offset"]: r.payload for r in rows if r.topic == "recovery.dlq"}
    assert {o: p["reason_code"] for o, p in letters.items()} == {1: "event-time-out-of-range"}
    assert "9999-12-31" in letters[1]["reason"]
    chain = intake_chain_id(group, topic, 0)
    audit = [
        r for r in rows if r.topic == "recovery.audit" and r.payload.get("operation_id") == chain
    ]
    assert [r.payload["record"]["reason_code"] for r in audit] == ["event-time-out-of-range"]
    assert ledger.verify_audit() == ()
