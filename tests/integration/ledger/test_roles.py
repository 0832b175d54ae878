"""The ledger's roles and append-only history against the real server (issue #15).

Each test's database is cloned from the session template, which `ensure_roles` migrated
as `recovery_owner` with the login roles' grants (tests/support/db.py), so these are
the privileges a deployment gets. Rows are written as the controller role, the way the
runtime writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.rows import TupleRow

from ledger import LOGIN_ROLES, ensure_roles
from ops.cli import main
from tests.support.db import with_user
from tests.support.services import ServiceLease

pytestmark = pytest.mark.integration

HISTORY = ("events", "decisions", "evidence", "approvals", "audit_records")
ROWS_PER_OPERATION = 6  # one of each HISTORY table, two audit records


def _connect(url: str, role: str) -> psycopg.Connection[TupleRow]:
    conn = psycopg.connect(with_user(url, role), autocommit=True)
    assert conn.execute("SELECT current_user").fetchone() == (role,)
    return conn


def _seed(conn: psycopg.Connection[TupleRow], op: str, *, published: bool = True) -> None:
    """One operation with a row in every history table and one outbox row."""
    conn.execute(
        "INSERT INTO operations (operation_id, correlation_id, machine_name, machine_version,"
        " machine_digest, policy_digest, state, facts, initiating_principal, agent, task,"
        " view, audit_head) VALUES (%(op)s, 'c', 'm', '1', 'd', 'p', 'unresolved', '{}',"
        " 'u', 'agent-1', 't', '{}', 'h')",
        {"op": op},
    )
    ev = f"{op}-ev"
    conn.execute(
        "INSERT INTO events (event_id, payload_digest, operation_id, event_type, envelope)"
        " VALUES (%s, 'x', %s, 'TOOL_TIMEOUT', '{}')",
        (ev, op),
    )
    conn.execute(
        "INSERT INTO decisions VALUES (%s, 1, %s, 'transitioned', 'a', 'b', now(), '{}')",
        (op, ev),
    )
    conn.execute(
        "INSERT INTO evidence VALUES (%s, %s, 'verification', 'v', true, 'r', '{}')", (op, ev)
    )
    conn.execute(
        "INSERT INTO approvals VALUES (%s, %s, 'alice', 'approved', 'b', 't', 'd',"
        " now(), %s, '{}')",
        (ev, op, f"{op}-nonce"),
    )
    for seq in (1, 2):
        conn.execute(
            "INSERT INTO audit_records VALUES (%s, %s, 'decision', 'p', 'h', '{}')", (op, seq)
        )
    conn.execute(
        "INSERT INTO outbox (record_id, topic, key, headers, audit_sequence) "
        "VALUES (%s, 'recovery.audit', %s, '{}', 2)",
        (f"{op}-audit-2", op),
    )
    if published:
        with _connect(conn.info.dsn, "recovery_relay") as relay:
            relay.execute("UPDATE outbox SET published_at = now() WHERE key = %s", (op,))


def _counts(conn: psycopg.Connection[TupleRow], op: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for table in (*HISTORY, "operations", "outbox"):
        column = "key" if table == "outbox" else "operation_id"
        row = conn.execute(
            f"SELECT count(*) FROM {table} WHERE {column} = %s",  # fixed table names
            (op,),
        ).fetchone()
        counts[table] = int(row[0]) if row else -1
    return counts


@pytest.fixture
def seeded(database_url: str) -> str:
    """The test's database with operations op-a and op-b written by the controller."""
    with _connect(database_url, "recovery_controller") as conn:
        _seed(conn, "op-a")
        _seed(conn, "op-b")
    return database_url


def _changes(table: str) -> tuple[str, ...]:
    return (
        f"UPDATE {table} SET operation_id = operation_id",
        f"DELETE FROM {table}",
        f"TRUNCATE {table} CASCADE",
    )


@pytest.mark.parametrize("table", HISTORY)
def test_the_controller_role_may_not_update_delete_or_truncate_history(
    seeded: str, table: str
) -> None:
    with _connect(seeded, "recovery_controller") as conn:
        for statement in _changes(table):
            with pytest.raises(pg_errors.InsufficientPrivilege) as caught:
                conn.execute(statement)  # type: ignore[call-overload]
            assert f"permission denied for table {table}" in str(caught.value), statement
        assert _counts(conn, "op-a")[table] == (2 if table == "audit_records" else 1)


@pytest.mark.parametrize("role", ["recovery_owner", "postgres"])
@pytest.mark.parametrize("table", HISTORY)
def test_the_trigger_refuses_the_owner_and_a_superuser(seeded: str, table: str, role: str) -> None:
    url = seeded if role == "postgres" else with_user(seeded, role)
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in _changes(table):
            with pytest.raises(pg_errors.InsufficientPrivilege) as caught:
                conn.execute(statement)  # type: ignore[call-overload]
            error = caught.value
            assert error.diag.message_primary is not None
            verb = statement.split()[0]
            assert error.diag.message_primary == (
                f"history-append-only: {verb} on table {table} refused for role {role}"
            )
            assert f"Table {table} is append-only history" in (error.diag.message_detail or "")
            assert "purge_operation_history" in (error.diag.message_hint or "")
        assert _counts(conn, "op-a")[table] == (2 if table == "audit_records" else 1)


def test_purge_deletes_one_operations_history_and_nothing_else(seeded: str) -> None:
    with _connect(seeded, "recovery_owner") as conn:
        before_b = _counts(conn, "op-b")
        row = conn.execute("SELECT purge_operation_history('op-a')").fetchone()
        assert row == (ROWS_PER_OPERATION,)
        after_a = _counts(conn, "op-a")
        assert {t: after_a[t] for t in HISTORY} == dict.fromkeys(HISTORY, 0)
        assert (after_a["operations"], after_a["outbox"]) == (1, 1)  # not history
        assert _counts(conn, "op-b") == before_b
        assert conn.execute("SELECT purge_operation_history('op-a')").fetchone() == (0,)


def test_purge_is_refused_while_the_operation_has_unpublished_outbox_rows(
    database_url: str,
) -> None:
    with _connect(database_url, "recovery_controller") as conn:
        _seed(conn, "op-c", published=False)
    with _connect(database_url, "recovery_owner") as conn:
        with pytest.raises(pg_errors.ObjectInUse) as caught:
            conn.execute("SELECT purge_operation_history('op-c')")
        assert caught.value.diag.message_primary == (
            "purge-unpublished-outbox: operation op-c still has unpublished outbox rows"
        )
        assert _counts(conn, "op-c")["events"] == 1


@pytest.mark.parametrize(
    "role", ["recovery_controller", "recovery_relay", "recovery_reader", "recovery_auditor"]
)
def test_only_the_owner_may_execute_the_purge(seeded: str, role: str) -> None:
    with _connect(seeded, role) as conn:
        with pytest.raises(pg_errors.InsufficientPrivilege, match="purge_operation_history"):
            conn.execute("SELECT purge_operation_history('op-a')")


def test_the_relay_marks_outbox_rows_and_changes_nothing_else(database_url: str) -> None:
    with _connect(database_url, "recovery_controller") as conn:
        _seed(conn, "op-d", published=False)
    with _connect(database_url, "recovery_relay") as relay:
        marked = relay.execute(
            "UPDATE outbox SET held_at = now(), held_reason = 'poison' WHERE key = 'op-d'"
        ).rowcount
        assert marked == 1
        relay.execute("UPDATE outbox SET held_at = NULL, held_reason = NULL WHERE key = 'op-d'")
        marked = relay.execute(
            "UPDATE outbox SET published_at = now() WHERE key = 'op-d' AND published_at IS NULL"
        ).rowcount
        assert marked == 1
        for statement in (
            "UPDATE outbox SET payload = 'x' WHERE key = 'op-d'",
            "UPDATE outbox SET key = 'op-e' WHERE key = 'op-d'",
            "DELETE FROM outbox",
            "INSERT INTO outbox (record_id, topic, key, headers, payload) "
            "VALUES ('r', 't', 'k', '{}', 'x')",
            "UPDATE operations SET state = 'closed'",
            "INSERT INTO audit_records VALUES ('op-d', 9, 'x', 'p', 'h', '{}')",
        ):
            with pytest.raises(pg_errors.InsufficientPrivilege, match="permission denied"):
                relay.execute(statement)  # type: ignore[call-overload]
    with _connect(database_url, "recovery_controller") as conn:
        with pytest.raises(pg_errors.InsufficientPrivilege, match="permission denied"):
            conn.execute("UPDATE outbox SET published_at = now()")


@pytest.mark.parametrize("role", ["recovery_reader", "recovery_auditor"])
def test_reader_and_auditor_may_only_read(seeded: str, role: str) -> None:
    with _connect(seeded, role) as conn:
        assert _counts(conn, "op-a")["audit_records"] == 2
        for statement in (
            "INSERT INTO audit_records VALUES ('op-a', 9, 'x', 'p', 'h', '{}')",
            "UPDATE operations SET state = 'closed'",
            "UPDATE outbox SET published_at = now()",
            "DELETE FROM consumer_offsets",
        ):
            with pytest.raises(pg_errors.InsufficientPrivilege, match="permission denied"):
                conn.execute(statement)  # type: ignore[call-overload]


def test_ensuring_the_roles_again_takes_back_a_privilege_granted_by_hand(seeded: str) -> None:
    with psycopg.connect(seeded, autocommit=True) as admin:
        admin.execute("GRANT UPDATE, DELETE ON audit_records, operations TO recovery_reader")
        admin.execute("ALTER ROLE recovery_controller SUPERUSER")
    try:
        report = ensure_roles(seeded)
    finally:
        with psycopg.connect(seeded, autocommit=True) as admin:
            admin.execute("ALTER ROLE recovery_controller NOSUPERUSER")  # cluster-wide
    assert report.created == ()
    assert report.migrations.applied == ()
    with psycopg.connect(seeded, autocommit=True) as admin:
        row = admin.execute(
            "SELECT has_table_privilege('recovery_reader', 'operations', 'UPDATE'),"
            " has_table_privilege('recovery_reader', 'audit_records', 'DELETE'),"
            " (SELECT rolsuper FROM pg_roles WHERE rolname = 'recovery_controller')"
        ).fetchone()
    assert row == (False, False, False)


def test_db_roles_keeps_passwords_in_a_private_file_and_prints_them_only_when_asked(
    database_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    postgres_lease: ServiceLease,
) -> None:
    secrets_file = tmp_path / "roles.json"
    argv = ["db", "roles", "--database-url", database_url, "--password-file", str(secrets_file)]
    try:
        assert main(argv) == 0
        out = capsys.readouterr().out
        stored = json.loads(secrets_file.read_text(encoding="utf-8"))
        assert sorted(stored) == sorted(LOGIN_ROLES.values())
        assert secrets_file.stat().st_mode & 0o777 == 0o600
        assert f"stored in {secrets_file} (mode 0600)" in out
        assert not any(password in out for password in stored.values())
        assert main([*argv, "--json", "--show-secrets"]) == 0
        body = json.loads(capsys.readouterr().out)
        assert body["passwords"] == stored  # the file's passwords are kept, not renewed
        assert body["created"] == []
    finally:
        # Roles are cluster-wide: give them back the session's passwords (which the
        # local server's password file holds), or none on an external server.
        with psycopg.connect(database_url, autocommit=True) as admin:
            for role in LOGIN_ROLES.values():
                password = postgres_lease.role_passwords.get(role)
                admin.execute(
                    sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                        sql.Identifier(role),
                        sql.Literal(password) if password else sql.SQL("NULL"),
                    )
                )
