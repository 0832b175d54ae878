"""`recoveryctl db migrate` and `recoveryctl audit verify` against the real server."""

from __future__ import annotations

import json

import psycopg
import pytest

from ledger import (
    LOGIN_ROLES,
    PostgresLedger,
    available_migrations,
    with_user,
)
from ledger.audit import chain_records
from ledger.jsonutil import dumps
from ops.cli import main
from tests.support.keys import controller_signer
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
        feed(ledger, sequence("op-1") + sequence("op-2"), epoch=1, sign=controller_signer())
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


def test_db_migrate_reports_an_unreachable_server(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a wait: how long recoveryctl waits for a read-write database is
    # RECOVERY_DATABASE_WAIT_S (tests/unit/ledger/test_waiting.py).
    monkeypatch.setenv("RECOVERY_DATABASE_WAIT_S", "0")
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


def test_an_audit_row_written_with_the_controllers_database_role_alone_is_unproven(
    audited: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The controller's login role may insert audit rows and move a chain's head (it does
    # every batch); without the controller's key it cannot sign the row's outbox record.
    ledger = PostgresLedger(audited)
    try:
        records, head = ledger.audit_chain("op-1")
    finally:
        ledger.close()
    assert head is not None
    # A record that commits to no decision row and no operation row, so the chain and
    # its subject stay consistent.
    body = {"note": "written by hand", "after": records[-1].hash}
    [forged] = chain_records("op-1", head, [("note", body, dumps(body))])
    with psycopg.connect(with_user(audited, LOGIN_ROLES["controller"])) as conn:
        conn.execute(
            "INSERT INTO audit_records (operation_id, sequence, kind, prev_hash, hash, record) "
            "VALUES (%s, %s, %s, %s, %s, %s::json)",
            (forged.operation_id, forged.sequence, forged.kind, forged.prev_hash, forged.hash,
             forged.body_json()),
        )  # fmt: skip
        conn.execute(
            "UPDATE operations SET audit_sequence = %s, audit_head = %s WHERE operation_id = %s",
            (forged.sequence, forged.hash, "op-1"),
        )
    # The chain is consistent: only the author check tells.
    assert main(["audit", "verify", "--database-url", audited, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["breaks"] == []
    [finding] = report["authors"]
    assert (finding["code"], finding["chain"], finding["sequence"]) == (
        "unsigned-audit-row",
        "op-1",
        forged.sequence,
    )
