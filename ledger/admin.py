"""Creating and dropping whole ledger databases (benchmarks, provisioning).

Kept in `ledger/` because only this package talks to PostgreSQL; `conninfo` is an
administrative connection that may create databases.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from ledger.driver import driver_errors

__all__ = ["create_database", "drop_database", "with_database"]


def create_database(conninfo: str, name: str) -> None:
    """Create the empty database `name`; raises `LedgerError` if it cannot."""
    _admin(conninfo, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)), name)


def drop_database(conninfo: str, name: str) -> None:
    """Drop `name` if it exists, ending any sessions still on it."""
    statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    _admin(conninfo, statement, name)


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
