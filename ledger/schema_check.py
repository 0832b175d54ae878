"""Checking, without changing anything, that a database has every ledger migration.

The controller and `recoveryctl run` call `require_current_schema` before they start:
running against a schema that is behind (or was migrated by a newer release) would fail
every batch later and less clearly, the group stuck behind it. Applying migrations stays
an explicit operator step (`recoveryctl db migrate`, or `recoveryctl run --migrate`).
"""

from __future__ import annotations

import psycopg

from ledger.errors import LedgerUnavailable, MigrationError
from ledger.migrations import available_migrations
from ledger.queries import QUERIES

__all__ = ["pending_migrations", "ping_database", "require_current_schema"]


def pending_migrations(conninfo: str) -> tuple[str, ...]:
    """The shipped migrations the database at `conninfo` lacks (`NNNN_name`), in order;
    empty when it is current. Raises `MigrationError` when an applied migration's
    checksum differs from the shipped file or the database has migrations this release
    does not know, and `LedgerUnavailable` when the server cannot be reached."""
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT to_regclass('ledger_migrations')").fetchone()
            rows = (
                conn.execute(QUERIES["applied_migrations"]).fetchall()
                if exists is not None and exists[0] is not None
                else []
            )
    except psycopg.OperationalError as exc:
        raise LedgerUnavailable(
            f"cannot reach the ledger database to check its migrations: {exc}; check that "
            "PostgreSQL is running and the URL is right"
        ) from exc
    applied = {int(r[0]): str(r[2]) for r in rows}
    shipped = {m.version: m for m in available_migrations()}
    unknown = sorted(set(applied) - set(shipped))
    if unknown:
        raise MigrationError(
            f"the database has migrations {unknown} that this release does not ship; run "
            "the release that migrated it"
        )
    pending: list[str] = []
    for version, migration in sorted(shipped.items()):
        label = f"{version:04d}_{migration.name}"
        if version not in applied:
            pending.append(label)
        elif applied[version] != migration.checksum:
            raise MigrationError(
                f"migration {label} in the database differs from the shipped file; "
                "migrations are append-only: restore the file"
            )
    return tuple(pending)


def require_current_schema(conninfo: str) -> None:
    """Raise `MigrationError` saying what to run when the database lacks shipped
    migrations (and whatever `pending_migrations` raises); return when it is current."""
    pending = pending_migrations(conninfo)
    if pending:
        raise MigrationError(
            f"the ledger database lacks migrations {', '.join(pending)}; run "
            "`recoveryctl db migrate` first (or start with `recoveryctl run --migrate`)"
        )


def ping_database(conninfo: str, timeout: float = 2.0) -> None:
    """Return when the server at `conninfo` answers a query within about `timeout`
    seconds; raise `LedgerUnavailable` saying why otherwise. A new connection each time,
    not one of the ledger's pool: a readiness probe must see what a new batch would see,
    and must never wait behind a batch for a pooled connection."""
    try:
        with psycopg.connect(
            conninfo, autocommit=True, connect_timeout=max(1, round(timeout))
        ) as conn:
            conn.execute("SELECT 1").fetchone()
    except psycopg.Error as exc:
        raise LedgerUnavailable(f"the ledger database does not answer: {exc}") from exc
