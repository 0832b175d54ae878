"""audit/2: `recoveryctl audit verify` detects edits of what decides (issue 15).

Each edit below is made by SQL on the real server, as someone with write access to the
database would, on columns the audit/1 chain did not cover."""

from __future__ import annotations

import json

import psycopg
import pytest

from ledger import PostgresLedger
from ops.cli import main
from tests.support.keys import controller_signer
from tests.unit.ledger.ledger_support import GROUP, TOPIC, feed, sequence

pytestmark = pytest.mark.integration

EDITS = {
    "state": ("UPDATE operations SET state = 'succeeded' WHERE operation_id = 'op-1'", "state"),
    "retry": (
        "UPDATE operations SET retry_attempts = retry_attempts + 1 WHERE operation_id = 'op-1'",
        "retry_attempts",
    ),
    "budget": (
        "UPDATE operations SET budget_spent = budget_spent + 5 WHERE operation_id = 'op-1'",
        "budget_spent",
    ),
    "view": (
        "UPDATE operations SET view = jsonb_set(view::jsonb, '{recovery_attempts}', '7')::json"
        " WHERE operation_id = 'op-1'",
        "view_digest",
    ),
    "outcome": (
        "UPDATE decisions SET outcome = 'rejected' WHERE operation_id = 'op-1' AND sequence = 1",
        "column outcome",
    ),
    "decision": (
        "UPDATE decisions SET decision = jsonb_set(decision::jsonb, '{state_after}', "
        "'\"x\"')::json WHERE operation_id = 'op-1' AND sequence = 1",
        "its record",
    ),
}


@pytest.fixture
def audited(database_url: str) -> str:
    ledger = PostgresLedger(database_url)
    try:
        ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1") + sequence("op-2"), epoch=1, sign=controller_signer())
    finally:
        ledger.close()
    return database_url


def test_new_records_are_audit_2_and_verify_clean(
    audited: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(audited) as conn:
        formats = {r[0] for r in conn.execute("SELECT record->>'format' FROM audit_records")}
        committed = conn.execute(
            "SELECT count(*) FROM audit_records WHERE (record::jsonb) ? 'operation'"
        ).fetchone()
    assert formats == {"audit/2"}
    assert committed is not None
    assert committed[0] >= 2
    assert main(["audit", "verify", "--database-url", audited]) == 0
    assert "audit intact: 2 chain(s)" in capsys.readouterr().out


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edit_of_what_decides_is_reported(
    audited: str, edit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    statement, named = EDITS[edit]
    with psycopg.connect(audited) as conn:
        # The edit is a database administrator's who bypasses the append-only trigger
        # (a superuser may: triggers do not fire for a replica session); what remains
        # to catch it is the chain.
        conn.execute("SET session_replication_role = replica")
        assert conn.execute(statement).rowcount == 1
    assert main(["audit", "verify", "--database-url", audited, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (found,) = report["breaks"]
    assert found["operation_id"] == "op-1"
    assert named in found["reason"]
    assert found["expected"] != found["found"]
    assert main(["audit", "verify", "--database-url", audited, "--operation", "op-2"]) == 0
