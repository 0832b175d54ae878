"""`recoveryctl db migrate|roles [--database-url URL] [--json]`: the ledger database.

The database is the one `--database-url` names, else RECOVERY_DATABASE_URL, else the
running local stack's (`recoveryctl stack up`).

`db migrate` applies the migrations as `recovery_owner` (SET ROLE, when the connection
may become it) and then refreshes the login roles' grants. Applying is idempotent:
migrations already present are skipped, each pending one runs in its own transaction,
and an applied migration whose file changed since is refused.

`db roles` (an administrative URL: a superuser, or a role with CREATEROLE) creates or
updates the roles (`recovery_owner`, `recovery_controller`, `recovery_relay`,
`recovery_reader`, `recovery_auditor`, and the NOLOGIN `recovery_retention`), gives the
schema to the owner, migrates as it and grants each login role only what it needs.
Passwords come from RECOVERY_DB_PASSWORD_<OWNER|CONTROLLER|RELAY|READER|AUDITOR>, else
the password file (`--password-file`, default `<stack dir>/db-roles.json`), else are
generated; the file (mode 0600) is rewritten with them and its path printed. They are
printed only with `--show-secrets`; `--no-passwords` sets none (trust or peer auth).

Exit status: 0 done (or nothing to do), 1 a migration or role change failed or was
refused, 2 no database known or reachable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TextIO

from ledger import (
    LOGIN_ROLES,
    LedgerError,
    LedgerUnavailable,
    MigrationError,
    PostgresLedger,
    RolesReport,
    ensure_roles,
    migrate_as_owner,
)
from ops.db_passwords import default_password_file, resolve_passwords, store_passwords
from ops.errors import StackError
from ops.stack import live_state
from schemas import ENV_DATABASE_URL

__all__ = [
    "add_ledger_options",
    "open_ledger",
    "register",
    "resolve_database_url",
    "resolved_url_or_report",
    "run_migrate",
    "run_roles",
]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `db` subcommand and its `migrate` action."""
    parser = subparsers.add_parser(
        "db",
        help="manage the ledger database (migrations, roles)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True)
    migrate = actions.add_parser("migrate", help="apply pending ledger migrations")
    add_ledger_options(migrate)
    migrate.set_defaults(handler=run_migrate)
    roles = actions.add_parser(
        "roles", help="create or update the ledger's database roles and their grants"
    )
    add_ledger_options(roles)
    roles.add_argument(
        "--password-file",
        type=Path,
        metavar="PATH",
        help="where the login roles' passwords are kept (default <stack dir>/db-roles.json)",
    )
    roles.add_argument(
        "--show-secrets", action="store_true", help="also print the passwords on stdout"
    )
    roles.add_argument(
        "--no-passwords",
        action="store_true",
        help="set no password (servers that trust or peer-authenticate these roles)",
    )
    roles.set_defaults(handler=run_roles)


def resolve_database_url(flag: str | None) -> str | None:
    """The ledger database: the flag, else the environment, else the local stack's."""
    url = flag or os.environ.get(ENV_DATABASE_URL) or None
    if url is not None:
        return url
    try:
        state = live_state()
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
        report = migrate_as_owner(url)
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


def run_roles(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Create or update the roles, migrate as the owner, grant; say where the
    passwords are (see the module docstring)."""
    out = out or sys.stdout
    err = err or sys.stderr
    url = resolved_url_or_report("db roles", args.database_url, err)
    if url is None:
        return 2
    path: Path = args.password_file or default_password_file()
    try:
        passwords = {} if args.no_passwords else resolve_passwords(LOGIN_ROLES, path)
        report = ensure_roles(url, passwords)
        if passwords:
            store_passwords(path, passwords)
    except LedgerUnavailable as exc:
        print(f"recoveryctl db roles: {exc}", file=err)
        return 2
    except (LedgerError, StackError, OSError) as exc:
        print(f"recoveryctl db roles: {exc}", file=err)
        return 1
    stored = None if not passwords else str(path)
    if args.json:
        print(
            json.dumps(_roles_body(report, stored, passwords, args.show_secrets), indent=2),
            file=out,
        )
        return 0
    if report.created:
        print(f"created roles {', '.join(report.created)}", file=out)
    if report.updated:
        print(f"updated roles {', '.join(report.updated)}", file=out)
    if stored:
        print(
            f"passwords of {', '.join(sorted(passwords))} stored in {stored} (mode 0600)", file=out
        )
    for role, password in sorted(passwords.items()) if args.show_secrets else ():
        print(f"{role} {password}", file=out)
    migrated = report.migrations.current or "no migrations"
    print(f"ledger database at {migrated}, owned by recovery_owner, grants applied", file=out)
    return 0


def _roles_body(
    report: RolesReport, stored: str | None, passwords: dict[str, str], show: bool
) -> dict[str, object]:
    body: dict[str, object] = {
        "created": list(report.created),
        "updated": list(report.updated),
        "password_file": stored,
        "passwords_set": sorted(passwords),
        "migrations_applied": list(report.migrations.applied),
        "current": report.migrations.current,
    }
    if show:
        body["passwords"] = dict(sorted(passwords.items()))
    return body
