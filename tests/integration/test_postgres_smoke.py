"""The local PostgreSQL server is a real one: SQL runs, transactions roll back, each test
has its own database cloned from the template, and data survives a server restart."""

from __future__ import annotations

import shutil
import socket

import psycopg
import pytest

from ops.ports import LOOPBACK
from ops.postgres import PostgresServer, PostgresServiceError, start_postgres
from tests.support.db import with_database
from tests.support.services import service_root

pytestmark = pytest.mark.integration


def test_sql_runs_against_the_real_server(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE TABLE operation (id text PRIMARY KEY, state text NOT NULL)")
        conn.execute(
            "INSERT INTO operation VALUES (%s, %s), (%s, %s)",
            ("op-1", "detected", "op-2", "contained"),
        )
        conn.commit()
        rows = conn.execute("SELECT id, state FROM operation ORDER BY id").fetchall()
    assert rows == [("op-1", "detected"), ("op-2", "contained")]


def test_rolled_back_transaction_leaves_no_rows(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE TABLE audit (seq bigint PRIMARY KEY)")
        conn.commit()
        conn.execute("INSERT INTO audit VALUES (1), (2)")
        inside = conn.execute("SELECT count(*) FROM audit").fetchone()
        conn.rollback()
        after = conn.execute("SELECT count(*) FROM audit").fetchone()
    assert inside == (2,)
    assert after == (0,)


def test_unique_violation_aborts_only_its_own_transaction(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE event (id text PRIMARY KEY)")
        conn.execute("INSERT INTO event VALUES ('ev-1')")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO event VALUES ('ev-1')")
        conn.execute("INSERT INTO event VALUES ('ev-2')")
        rows = conn.execute("SELECT id FROM event ORDER BY id").fetchall()
    assert rows == [("ev-1",), ("ev-2",)]


def test_each_test_gets_its_own_database_cloned_from_the_template(
    database_url: str, database_template: str, postgres_server: str
) -> None:
    public_tables = (
        "SELECT table_name FROM information_schema.tables"
        " WHERE table_schema = 'public' ORDER BY table_name"
    )
    with psycopg.connect(database_url) as conn:
        current = conn.execute("SELECT current_database()").fetchone()
        tables = conn.execute(public_tables).fetchall()
    assert current is not None
    assert current[0] not in (database_template, "postgres")
    with psycopg.connect(with_database(postgres_server, database_template)) as template:
        template_tables = template.execute(public_tables).fetchall()
    # The clone holds exactly the template's (migrated) schema: nothing leaked from other
    # tests' databases, such as the `audit` or `event` tables the tests above create.
    assert tables == template_tables
    assert ("audit",) not in tables
    assert ("event",) not in tables


@pytest.mark.slow
def test_local_server_keeps_fsync_on_and_keeps_data_across_a_restart() -> None:
    root = service_root("postgres-restart")
    server: PostgresServer | None = None
    try:
        server = start_postgres(root / "pg")
        with psycopg.connect(server.url, autocommit=True) as conn:
            settings = {
                name: conn.execute(f"SHOW {name}").fetchone()
                for name in ("fsync", "listen_addresses", "max_connections", "shared_buffers")
            }
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('before restart')")
        assert settings == {
            "fsync": ("on",),
            "listen_addresses": ("127.0.0.1",),
            "max_connections": ("200",),
            "shared_buffers": ("256MB",),
        }
        server.stop()
        assert not server.is_running()
        server = start_postgres(root / "pg")
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT v FROM kept").fetchall() == [("before restart",)]
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_server_that_cannot_bind_its_port_fails_with_its_log_tail() -> None:
    root = service_root("postgres-busy")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
            squatter.bind((LOOPBACK, 0))
            squatter.listen()
            busy = int(squatter.getsockname()[1])
            with pytest.raises(PostgresServiceError, match="failed to start") as failure:
                start_postgres(root / "pg", port=busy, ready_timeout=30)
        assert f":{busy}" in str(failure.value)
        assert "postgres.log (tail)" in str(failure.value)
        # start_postgres retries on a fresh port when it chose the port; this is the trigger.
        assert "Address already in use" in str(failure.value)
    finally:
        shutil.rmtree(root, ignore_errors=True)
