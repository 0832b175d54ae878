"""Per-test databases cloned from one template database prepared once per session.

Cloning (`CREATE DATABASE ... TEMPLATE`) is much faster than building a schema per test
and gives every test an empty, isolated, fully migrated database.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from ledger import LOGIN_ROLES, RolesReport, ensure_roles, with_user
from ops.postgres import PostgresServer
from ops.postgres_ha import HaPostgres

__all__ = [
    "clone_database",
    "create_empty_database",
    "drop_database",
    "ensure_login_roles",
    "prepare_template",
    "with_database",
    "with_user",
]


def prepare_template(conninfo: str, passwords: Mapping[str, str] | None = None) -> str:
    """Create the session's template database on the server of `conninfo` (an admin
    connection that may create databases and roles) and return its name.

    The ledger's roles are created (or brought up to date) on the server, and the
    template is migrated as `recovery_owner` with the login roles' grants
    (`ledger.ensure_roles`), so each test's clone starts fully migrated, owned and
    granted as a deployment would be. `passwords` (role -> password) are set: the local
    server trusts nobody, and its URLs' password file holds them; an external server's
    roles keep the passwords they have.
    """
    name = f"recovery_template_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    ensure_roles(with_database(conninfo, name), passwords)
    return name


def clone_database(conninfo: str, template: str, hint: str) -> str:
    """Create a new database from `template` and return its name. The template must
    have no open connections (PostgreSQL refuses to copy a database in use)."""
    name = f"t_{_slug(hint)}_{uuid.uuid4().hex[:10]}"
    statement = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
        sql.Identifier(name), sql.Identifier(template)
    )
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(statement)
    return name


def create_empty_database(conninfo: str, hint: str) -> str:
    """Create a new database with no ledger migrations applied (for tests of migrating
    and of refusing an unmigrated ledger) and return its name."""
    name = f"e_{_slug(hint)}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name


def drop_database(conninfo: str, name: str) -> None:
    """Drop `name`, ending any sessions a test left open on it."""
    statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(statement)


def with_database(conninfo: str, database: str) -> str:
    """`conninfo` pointing at `database` instead: a URL stays a URL (the form of
    RECOVERY_DATABASE_URL), a key=value string stays a key=value string."""
    if conninfo.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(conninfo)
        return urlunsplit(parts._replace(path=f"/{database}"))
    return make_conninfo(conninfo, dbname=database)


def _slug(hint: str) -> str:
    cleaned = "".join(c if c.isalnum() else "_" for c in hint.lower()).strip("_")
    return cleaned[:30] or "db"


def ensure_login_roles(server: PostgresServer | HaPostgres, conninfo: str) -> RolesReport:
    """`ledger.ensure_roles` on a test's own local server: each login role gets a fresh
    password, which the server's password file (named by its URLs) keeps, so that the
    runtime connects as its roles there as on the session server."""
    passwords = {role: secrets.token_urlsafe(18) for role in LOGIN_ROLES.values()}
    server.remember(passwords)
    return ensure_roles(conninfo, passwords)
