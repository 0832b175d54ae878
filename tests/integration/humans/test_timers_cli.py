"""What waits, for operators (issue #29): `recoveryctl ops list --overdue` names the timers
due and not decided, fired or not, and `ops show` says what an operation waits for and
when each timer fires, from the real database, in a subprocess."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from ledger import PostgresLedger
from tests.integration.humans.test_review_and_approve import recoveryctl
from tests.unit.ledger.ledger_support import GROUP, T0, TOPIC, event, feed

pytestmark = pytest.mark.integration


@pytest.fixture
def seeded(database_url: str) -> str:
    """Two operations opened at 2026-01-01, their timers long due: `op-fired` had them
    fired (their events not decided), `op-unfired` had nobody fire them."""
    ledger = PostgresLedger(database_url, max_size=2)
    try:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, [event("op-fired", 0, "TOOL_TIMEOUT")], epoch=claim.epoch)
        ledger.fire_timers(GROUP, {(TOPIC, 0): claim.epoch}, T0 + timedelta(hours=2), limit=10)
        feed(ledger, [event("op-unfired", 1, "TOOL_TIMEOUT")], epoch=claim.epoch, first_offset=1)
    finally:
        ledger.close()
    return database_url


def test_ops_list_overdue_names_each_stuck_timer_fired_or_not(seeded: str) -> None:
    done = recoveryctl("ops", "list", "--overdue", "--database-url", seeded, "--json")
    assert done.returncode == 0, done.stderr
    overdue = json.loads(done.stdout)["overdue"]
    found = {(t["operation_id"], t["kind"], t["fired_at"] is not None) for t in overdue}
    assert found == {
        ("op-fired", "stalled", True),
        ("op-fired", "deadline", True),
        ("op-unfired", "stalled", False),
        ("op-unfired", "deadline", False),
    }
    assert all(t["late_seconds"] > 3600 for t in overdue)
    assert [t["due_at"] for t in overdue] == sorted(t["due_at"] for t in overdue)
    text = recoveryctl("ops", "list", "--overdue", "--database-url", seeded)
    assert "4 overdue timer(s)" in text.stdout
    assert "yes, not decided" in text.stdout
    assert "not yet" in text.stdout
    # A grace longer than they are late lists none.
    years = recoveryctl("ops", "list", "--overdue", "--grace", "3650d", "--database-url", seeded)
    assert "0 overdue timer(s)" in years.stdout


def test_ops_show_says_what_the_operation_waits_for_and_when(seeded: str) -> None:
    done = recoveryctl("ops", "show", "op-fired", "--database-url", seeded, "--json")
    assert done.returncode == 0, done.stderr
    waiting = json.loads(done.stdout)["waiting"]
    assert not waiting["stalled"]
    timers = {t["kind"]: t for t in waiting["timers"]}
    assert set(timers) == {"stalled", "deadline"}
    stall = timers["stalled"]
    assert stall["state"] == "reconstructing"
    assert stall["due_at"] == (T0 + timedelta(hours=1)).isoformat()
    assert stall["overdue"]
    assert stall["fired_at"] is not None
    assert stall["due_in_seconds"] < 0
    assert "stalled" in stall["does"]
    assert datetime.fromisoformat(waiting["deadline"]) < datetime.now(UTC)
    text = recoveryctl("ops", "show", "op-fired", "--database-url", seeded)
    assert "waiting" in text.stdout
    assert "OVERDUE" in text.stdout
    assert "(fired, not decided)" in text.stdout
