"""Numbered migrations from `sql/migrations/NNNN_name.sql`, applied once each, in order.

`migrate(conn)` takes a transaction-scoped advisory lock (two `db migrate` runs at once
apply each migration once), records every applied migration with a checksum in
`ledger_migrations`, and applies each pending one in its own transaction, so a failing
migration leaves the database at the last good one. Running it again does nothing. A
migration whose file changed after it was applied is refused: migrations are append-only.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg.rows import TupleRow

from ledger.driver import driver_errors
from ledger.errors import MigrationError
from ledger.queries import QUERIES

__all__ = ["Migration", "MigrationReport", "available_migrations", "migrate", "migrate_database"]

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file: its number, name, SQL and checksum."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """SHA-256 of the file's text, to detect a migration edited after it ran."""
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What `migrate` did: the migrations it applied and those already present."""

    applied: tuple[str, ...]
    already: tuple[str, ...]

    @property
    def current(self) -> str | None:
        """The newest migration the database now has."""
        both = sorted((*self.applied, *self.already))
        return both[-1] if both else None


def available_migrations() -> tuple[Migration, ...]:
    """Every migration shipped with the package, in order. Raises `MigrationError` on a
    misnamed file or a gap in the numbering (which would mean a lost migration)."""
    folder = resources.files("ledger").joinpath("sql/migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE.match(entry.name)
        if match is None:
            raise MigrationError(
                f"migration file {entry.name} is not named NNNN_name.sql; rename it"
            )
        found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise MigrationError(
                f"migration {migration.version:04d}_{migration.name} follows a gap: expected "
                f"number {expected:04d}; migrations must be numbered without gaps"
            )
    return tuple(found)


def migrate(conn: psycopg.Connection[TupleRow]) -> MigrationReport:
    """Apply every pending migration over `conn` (which must not be in a transaction).
    Idempotent; raises `MigrationError` naming the migration that failed or changed."""
    applied: list[str] = []
    already: list[str] = []
    for migration in available_migrations():
        label = f"{migration.version:04d}_{migration.name}"
        with driver_errors(
            f"migration {label} failed", lost="nothing of it was applied", every=MigrationError
        ):
            with conn.transaction():
                conn.execute(QUERIES["create_migrations_table"])
                conn.execute(QUERIES["lock_migrations"])
                done = {
                    row[0]: row[2] for row in conn.execute(QUERIES["applied_migrations"]).fetchall()
                }
                if migration.version in done:
                    if done[migration.version] != migration.checksum:
                        raise MigrationError(
                            f"migration {label} changed after it was applied; migrations are "
                            "append-only: restore the file and add a new migration instead"
                        )
                    already.append(label)
                    continue
                conn.execute(migration.sql.encode("utf-8"))
                conn.execute(
                    QUERIES["record_migration"],
                    {
                        "version": migration.version,
                        "name": migration.name,
                        "checksum": migration.checksum,
                    },
                )
                applied.append(label)
    return MigrationReport(tuple(applied), tuple(already))


def migrate_database(conninfo: str) -> MigrationReport:
    """Connect to `conninfo` and apply every pending migration (`recoveryctl db migrate`).
    Raises `LedgerUnavailable` when the server cannot be reached."""
    with driver_errors(
        "cannot connect to the ledger database to migrate it",
        lost="check that PostgreSQL is running and the URL is right",
    ):
        conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=10)
    with conn:
        return migrate(conn)
