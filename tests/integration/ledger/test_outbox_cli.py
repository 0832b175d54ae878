"""`recoveryctl outbox held` and `recoveryctl outbox release` against the real server."""

from __future__ import annotations

import json

import pytest

from ledger import PostgresLedger
from ops.cli import main
from tests.unit.ledger.ledger_support import GROUP, TOPIC, feed, sequence

pytestmark = pytest.mark.integration


@pytest.fixture
def held_record(database_url: str) -> str:
    """The id of a held row heading key op-1 (op-2's rows stay ordinary)."""
    ledger = PostgresLedger(database_url)
    try:
        ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1") + sequence("op-2"), epoch=1)
        with ledger.lease_outbox(1) as lease:
            head = lease.records[0]
            lease.hold(head.record_id, f"outbox row {head.record_id}: unknown topic")
        return head.record_id
    finally:
        ledger.close()


def test_outbox_held_lists_each_held_row_with_its_key_and_reason(
    database_url: str, held_record: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["outbox", "held", "--database-url", database_url, "--json"]) == 1
    (row,) = json.loads(capsys.readouterr().out)["held"]
    assert (row["record_id"], row["key"]) == (held_record, "op-1")
    assert row["reason"] == f"outbox row {held_record}: unknown topic"
    assert row["waiting"] > 0
    assert main(["outbox", "held", "--database-url", database_url]) == 1
    assert f"HELD {held_record} key=op-1" in capsys.readouterr().out


def test_outbox_release_lifts_the_hold_once(
    database_url: str, held_record: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["outbox", "release", held_record, "--database-url", database_url]) == 0
    assert "retries key op-1" in capsys.readouterr().out
    assert main(["outbox", "release", held_record, "--database-url", database_url]) == 1
    assert f"no held, unpublished outbox row {held_record}" in capsys.readouterr().err
    assert main(["outbox", "held", "--database-url", database_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"held": []}


def test_outbox_held_reports_an_unreachable_server(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECOVERY_DATABASE_WAIT_S", "0")  # without a wait, as above
    url = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    assert main(["outbox", "held", "--database-url", url]) == 2
    assert "recoveryctl outbox held:" in capsys.readouterr().err
