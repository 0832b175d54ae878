"""`recoveryctl db migrate [--database-url URL] [--json]`: apply the ledger migrations.

The database is the one `--database-url` names, else RECOVERY_DATABASE_URL, else the
running local stack's (`recoveryctl stack up`). Applying is idempotent: migrations
already present are skipped, each pending one runs in its own transaction, and an
applied migration whose file changed since is refused. Exit status: 0 migrated (or
nothing to do), 1 a migration failed or was refused, 2 no database known or reachable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TextIO

from ledger import LedgerUnavailable, MigrationError, PostgresLedger, migrate_database
from ops.errors import StackError
from ops.stack import read_state
from schemas import ENV_DATABASE_URL

__all__ = [
    "add_ledger_options",
    "open_ledger",
    "register",
    "resolve_database_url",
    "resolved_url_or_report",
    "run_migrate",
]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `db` subcommand and its `migrate` action."""
    parser = subparsers.add_parser(
        "db",
        help="manage the ledger database (migrations)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True)
    migrate = actions.add_parser("migrate", help="apply pending ledger migrations")
    add_ledger_options(migrate)
    migrate.set_defaults(handler=run_migrate)


def resolve_database_url(flag: str | None) -> str | None:
    """The ledger database: the flag, else the environment, else the local stack's."""
    url = flag or os.environ.get(ENV_DATABASE_URL) or None
    if url is not None:
        return url
    try:
        state = read_state()
    except StackError:
        return None
    return None if state is None else state.postgres.url


def add_ledger_options(
    parser: argparse.ArgumentParser, json_help: str = "print a JSON report"
) -> None:
    """Add `--database-url` and `--json`, the options every ledger command takes."""
    parser.add_argument("--database-url", metavar="URL", help="ledger database URL")
    parser.add_argument("--json", action="store_true", help=json_help)


def resolved_url_or_report(command: str, flag: str | None, err: TextIO) -> str | None:
    """`resolve_database_url(flag)`, or None after telling the operator on `err` the
    three ways to name a database. `command` ("audit verify") prefixes the message."""
    url = resolve_database_url(flag)
    if url is None:
        print(
            f"recoveryctl {command}: no database: pass --database-url, set {ENV_DATABASE_URL}, "
            "or run `recoveryctl stack up`",
            file=err,
        )
    return url


def open_ledger(command: str, flag: str | None, err: TextIO) -> PostgresLedger | None:
    """A one-connection `PostgresLedger` on the database `flag` names (see
    `resolve_database_url`), or None after reporting on `err` why there is none: no
    database named, or it is unreachable. The caller closes the ledger."""
    url = resolved_url_or_report(command, flag, err)
    if url is None:
        return None
    try:
        return PostgresLedger(url, max_size=1, retries=1)
    except LedgerUnavailable as exc:
        print(f"recoveryctl {command}: {exc}", file=err)
        return None


def run_migrate(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Apply every pending migration; print what was applied."""
    out = out or sys.stdout  # looked up per call, so a redirected stdout is honoured
    err = err or sys.stderr
    url = resolved_url_or_report("db migrate", args.database_url, err)
    if url is None:
        return 2
    try:
        report = migrate_database(url)
    except LedgerUnavailable as exc:
        print(f"recoveryctl db migrate: {exc}", file=err)
        return 2
    except MigrationError as exc:
        print(f"recoveryctl db migrate: {exc}", file=err)
        return 1
    if args.json:
        body = {
            "applied": list(report.applied),
            "already": list(report.already),
            "current": report.current,
        }
        print(json.dumps(body, indent=2), file=out)
    else:
        for label in report.applied:
            print(f"applied {label}", file=out)
        state = "up to date" if not report.applied else "migrated"
        print(f"ledger database {state} at {report.current or 'no migrations'}", file=out)
    return 0
