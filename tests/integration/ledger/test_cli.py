"""`recoveryctl db migrate` and `recoveryctl audit verify` against the real server."""

from __future__ import annotations

import json

import psycopg
import pytest

from ledger import (
    PostgresLedger,
    available_migrations,
)
from ops.cli import main
from tests.unit.ledger.ledger_support import GROUP, TOPIC, feed, sequence

pytestmark = pytest.mark.integration

# The append-only trigger (migration 0010) refuses these edits; a superuser can skip
# triggers, and that rewrite is what audit verification must still catch.
BYPASS_TRIGGERS = "SET session_replication_role = replica"


@pytest.fixture
def audited(database_url: str) -> str:
    ledger = PostgresLedger(database_url)
    try:
        ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1") + sequence("op-2"), epoch=1)
    finally:
        ledger.close()
    return database_url


def test_db_migrate_applies_every_migration_then_nothing(
    empty_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "migrate", "--database-url", empty_database, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert len(first["applied"]) == len(available_migrations())
    assert main(["db", "migrate", "--database-url", empty_database]) == 0
    assert "up to date" in capsys.readouterr().out


def test_db_migrate_reports_an_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql://postgres@127.0.0.1:1/nowhere"
    assert main(["db", "migrate", "--database-url", url]) == 2
    assert "cannot connect" in capsys.readouterr().err


def test_audit_verify_exits_zero_when_every_chain_is_intact(
    audited: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "verify", "--database-url", audited]) == 0
    assert "audit intact: 2 chain(s)" in capsys.readouterr().out


def test_audit_verify_names_the_first_break_of_a_tampered_chain(
    audited: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(audited) as conn:
        conn.execute(BYPASS_TRIGGERS)
        conn.execute(
            "UPDATE audit_records SET record = jsonb_set(record::jsonb, '{outcome}', "
            "'\"transitioned\"')::json WHERE operation_id = 'op-2' AND sequence = 4"
        )
    assert main(["audit", "verify", "--database-url", audited, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["intact"] is False
    (found,) = report["breaks"]
    assert (found["operation_id"], found["sequence"], found["reason"]) == ("op-2", 4, "was altered")
    assert found["expected"] != found["found"]
    assert main(["audit", "verify", "--database-url", audited, "--operation", "op-1"]) == 0


def test_audit_verify_names_a_deleted_record(
    audited: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(audited) as conn:
        conn.execute(BYPASS_TRIGGERS)
        conn.execute("DELETE FROM audit_records WHERE operation_id = 'op-1' AND sequence = 2")
    assert main(["audit", "verify", "--database-url", audited, "--operation", "op-1"]) == 1
    out = capsys.readouterr().out
    assert "BROKEN operation op-1: audit record 2 is missing" in out


def test_audit_verify_refuses_an_unknown_operation(
    audited: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "verify", "--database-url", audited, "--operation", "op-9"]) == 2
    assert "op-9" in capsys.readouterr().err
