"""The ledger's database roles: one owner, one login role per component, and retention.

`ensure_roles(admin, database, passwords)` creates or updates, idempotently, on an
existing server (over an administrative connection, a superuser or a role with
CREATEROLE that may grant on the database):

- `recovery_owner` owns the schema and its tables and runs the migrations;
- `recovery_retention` (NOLOGIN) owns `purge_operation_history`, the only way past the
  append-only trigger of migration 0010;
- `recovery_controller`, `recovery_relay`, `recovery_reader`, `recovery_auditor` log in
  and get only what their component needs (`sql/roles.sql` says what and why).

It then migrates the database as the owner (`SET ROLE`) and applies the grants. The
statements are the named blocks of `sql/roles.sql`; only role names, passwords and the
database name are filled in, quoted by `psycopg.sql`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Final

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from ledger.driver import driver_errors
from ledger.errors import LedgerError
from ledger.migrations import MigrationReport, migrate
from ledger.queries import parse_queries

__all__ = [
    "LOGIN_ROLES",
    "OWNER_ROLE",
    "RETENTION_ROLE",
    "DatabaseRole",
    "RolesReport",
    "apply_grants",
    "current_role",
    "ensure_roles",
    "migrate_as_owner",
]

OWNER_ROLE: Final = "recovery_owner"
RETENTION_ROLE: Final = "recovery_retention"
# Component -> login role.
LOGIN_ROLES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "owner": OWNER_ROLE,
        "controller": "recovery_controller",
        "relay": "recovery_relay",
        "reader": "recovery_reader",
        "auditor": "recovery_auditor",
    }
)

_LOST: Final = "cannot reach the server: check that PostgreSQL is running and the URL is right"


def _load() -> MappingProxyType[str, str]:
    text = resources.files("ledger").joinpath("sql/roles.sql").read_text(encoding="utf-8")
    return MappingProxyType(parse_queries(text))


ROLE_SQL: Final = _load()


@dataclass(frozen=True, slots=True)
class DatabaseRole:
    """Who a connection runs as: the role name and whether it is a superuser."""

    name: str
    superuser: bool


@dataclass(frozen=True, slots=True)
class RolesReport:
    """What `ensure_roles` did: roles created now, roles that existed (and were brought
    to the expected attributes), whose password was set, and the migrations applied."""

    created: tuple[str, ...]
    updated: tuple[str, ...]
    passwords_set: tuple[str, ...]
    migrations: MigrationReport


def current_role(conninfo: str) -> DatabaseRole:
    """The role a connection to `conninfo` runs as. Raises `LedgerUnavailable` when the
    server cannot be reached."""
    with (
        driver_errors("checking the ledger connection's role", lost=_LOST),
        psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn,
    ):
        row = conn.execute(ROLE_SQL["current_role"]).fetchone()
    if row is None:  # a role always sees itself in pg_roles
        raise LedgerError("the ledger connection's role is not in pg_roles")
    return DatabaseRole(str(row[0]), bool(row[1]))


def ensure_roles(admin_conninfo: str, passwords: Mapping[str, str] | None = None) -> RolesReport:
    """Create or update the roles, make the owner own the database's schema, migrate it
    as the owner and apply the grants (see the module docstring). `admin_conninfo` names
    the ledger database itself; `passwords` maps role names to the passwords to set
    (roles not in it keep theirs). Raises `LedgerError` naming the step that failed."""
    passwords = passwords or {}
    with (
        driver_errors("connecting to set up the ledger roles", lost=_LOST),
        psycopg.connect(admin_conninfo, autocommit=True, connect_timeout=10) as conn,
    ):
        with driver_errors("creating the ledger roles", lost=_LOST):
            created, updated = _create_roles(conn)
            for role, password in sorted(passwords.items()):
                _run(conn, "set_password", role=role, password=password)
        database = str(conn.info.dbname)
        with driver_errors(f"giving database {database} to {OWNER_ROLE}", lost=_LOST):
            with conn.transaction():
                _run(conn, "own_schema")
                _run(conn, "connect_database", database=database)
                conn.execute(ROLE_SQL["reassign_objects"])
        with driver_errors(f"migrating database {database} as {OWNER_ROLE}", lost=_LOST):
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(OWNER_ROLE)))
        report = migrate(conn)
        apply_grants(conn)
    return RolesReport(created, updated, tuple(sorted(passwords)), report)


def migrate_as_owner(conninfo: str) -> MigrationReport:
    """Apply pending migrations as `recovery_owner` (`recoveryctl db migrate`): a
    connection that is not the owner but may become it (a superuser, a member) runs
    `SET ROLE` first; when the login roles exist, their grants are applied afterwards,
    so a new migration's tables get them. On a server without the roles this is
    `migrate_database`. Raises `LedgerUnavailable` or `MigrationError`."""
    with driver_errors(
        "cannot connect to the ledger database to migrate it",
        lost="check that PostgreSQL is running and the URL is right",
    ):
        conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=10)
    with conn:
        with driver_errors(f"becoming {OWNER_ROLE} to migrate", lost=_LOST):
            row = conn.execute(ROLE_SQL["owner_status"]).fetchone()
            owner_exists, may_become, roles_exist = row if row is not None else (False,) * 3
            if owner_exists and may_become:
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(OWNER_ROLE)))
        report = migrate(conn)
        if roles_exist and owner_exists and may_become:
            apply_grants(conn)
        return report


def apply_grants(conn: psycopg.Connection[TupleRow]) -> None:
    """Take back every privilege of the login roles on the schema's objects and grant
    exactly what `sql/roles.sql` lists, in one transaction. The caller is the owner."""
    with driver_errors("granting the login roles their privileges", lost=_LOST):
        with conn.transaction():
            conn.execute(ROLE_SQL["revoke_login_roles"])
            conn.execute(ROLE_SQL["grant_login_roles"])


def _create_roles(conn: psycopg.Connection[TupleRow]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    created: list[str] = []
    updated: list[str] = []
    for role, login in ((RETENTION_ROLE, False), *((r, True) for r in LOGIN_ROLES.values())):
        exists = conn.execute(ROLE_SQL["role_attributes"], {"name": role}).fetchone()
        if exists is None:
            _run(conn, "create_login_role" if login else "create_nologin_role", role=role)
            created.append(role)
        else:
            updated.append(role)
        _run(conn, "restrict_role", role=role)
        if login:
            _run(conn, "set_login", role=role)
    _run(conn, "owner_may_assign_retention")
    return tuple(created), tuple(updated)


def _run(conn: psycopg.Connection[TupleRow], name: str, **values: str) -> None:
    parts: dict[str, sql.Composable] = {}
    for key, value in values.items():
        parts[key] = sql.Literal(value) if key == "password" else sql.Identifier(value)
    conn.execute(sql.SQL(ROLE_SQL[name]).format(**parts) if parts else ROLE_SQL[name])
