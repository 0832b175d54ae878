"""Administering the ledger's server: whether it answers, and creating and dropping
whole ledger databases (provisioning the local stack, test and scratch databases).

Kept in `ledger/` because only this package talks to PostgreSQL; `conninfo` is an
administrative connection that may create databases.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from ledger.driver import driver_errors

__all__ = [
    "create_database",
    "drop_database",
    "ensure_database",
    "ping_database",
    "with_database",
    "with_user",
]


def create_database(conninfo: str, name: str) -> None:
    """Create the empty database `name`; raises `LedgerError` if it cannot."""
    _admin(conninfo, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)), name)


def drop_database(conninfo: str, name: str) -> None:
    """Drop `name` if it exists, ending any sessions still on it."""
    statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    _admin(conninfo, statement, name)


def ensure_database(conninfo: str, name: str) -> None:
    """Create the empty database `name` unless it exists; raises `LedgerError` if it
    cannot."""
    lost = "cannot reach the server: check that PostgreSQL is running and the URL is right"
    with (
        driver_errors(f"database {name}", lost=lost),
        psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn,
    ):
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def ping_database(conninfo: str, *, connect_timeout: int = 2) -> None:
    """Return once a client connected to `conninfo` and ran `SELECT 1`; raises
    `LedgerUnavailable` when the server does not answer (not yet started, or gone). A
    new connection each time, not one of the ledger's pool: a readiness probe must see
    what a new batch would see, and never wait behind a batch for a pooled connection."""
    with (
        driver_errors("ping", lost="the server does not answer"),
        psycopg.connect(conninfo, connect_timeout=connect_timeout, autocommit=True) as conn,
    ):
        conn.execute("SELECT 1")


def _admin(conninfo: str, statement: sql.Composed, name: str) -> None:
    lost = "cannot reach the server: check that PostgreSQL is running and the URL is right"
    with (
        driver_errors(f"database {name}", lost=lost),
        psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn,
    ):
        conn.execute(statement)


def with_database(conninfo: str, database: str) -> str:
    """`conninfo` pointing at `database` instead; a URL stays a URL, a key=value string
    stays a key=value string."""
    if conninfo.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(conninfo)
        return urlunsplit(parts._replace(path=f"/{database}"))
    return make_conninfo(conninfo, dbname=database)


def with_user(conninfo: str, user: str) -> str:
    """`conninfo` connecting as role `user`, without the original role's password (the
    login roles' passwords live in their own file or a `.pgpass`); a URL stays a URL."""
    if conninfo.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(conninfo)
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{user}@{host}"))
    return make_conninfo(conninfo, user=user, password="")
