"""`recoveryctl db migrate|roles|worker-store [--database-url URL] [--json]`: the ledger
database, and the capability workers' shared execution store.

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

`db worker-store` (an administrative URL of the database to hold it: the ledger's, or
another) creates or updates the workers' shared execution store: schema
`recovery_worker`, its table, and login role `recovery_worker`, which may claim and
record executions and nothing else (docs/capability-worker.md, "A shared execution
store"). Its password is the one in the password file, else generated, and kept there.

Exit status: 0 done (or nothing to do), 1 a migration or role change failed or was
refused, 2 no database known or reachable.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ledger import (
    LOGIN_ROLES,
    WORKER_ROLE,
    WORKER_SCHEMA,
    RolesReport,
    ensure_roles,
    ensure_worker_store,
    migrate_as_owner,
)
from ops.context import Context, register_command
from ops.db_passwords import (
    default_password_file,
    resolve_passwords,
    store_passwords,
    stored_passwords,
)
from ops.errors import CheckFailed

__all__ = ["add_ledger_options", "register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `db` subcommand and its `migrate` and `roles` actions."""
    parser = subparsers.add_parser(
        "db",
        help="manage the ledger database (migrations, roles)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True)
    migrate = actions.add_parser("migrate", help="apply pending ledger migrations")
    add_ledger_options(migrate)
    register_command(migrate, _migrate)
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
    register_command(roles, _roles)
    store = actions.add_parser(
        "worker-store",
        help="create or update the capability workers' shared execution store and its role",
    )
    add_ledger_options(store)
    store.add_argument(
        "--password-file",
        type=Path,
        metavar="PATH",
        help="where the role's password is kept (default <stack dir>/db-roles.json)",
    )
    store.add_argument(
        "--show-secrets", action="store_true", help="also print the password on stdout"
    )
    register_command(store, _worker_store)


def add_ledger_options(
    parser: argparse.ArgumentParser, json_help: str = "print a JSON report"
) -> None:
    """Add `--database-url` and `--json`, the options every ledger command takes."""
    parser.add_argument("--database-url", metavar="URL", help="ledger database URL")
    parser.add_argument("--json", action="store_true", help=json_help)


def _migrate(ctx: Context) -> int:
    """Apply every pending migration; print what was applied. A refused migration (a
    changed file, a failed statement) is exit 1; an unreachable database exit 2."""
    url = ctx.database_url()
    report = ctx.database_wait().run("migrate the ledger", lambda: migrate_as_owner(url))
    if ctx.json:
        ctx.print_json(
            {
                "applied": list(report.applied),
                "already": list(report.already),
                "current": report.current,
            }
        )
        return 0
    for label in report.applied:
        ctx.say(f"applied {label}")
    state = "up to date" if not report.applied else "migrated"
    ctx.say(f"ledger database {state} at {report.current or 'no migrations'}")
    return 0


def _roles(ctx: Context) -> int:
    """Create or update the roles, migrate as the owner, grant; say where the
    passwords are (see the module docstring)."""
    args = ctx.args
    url = ctx.database_url()
    path: Path = args.password_file or default_password_file()
    passwords = {} if args.no_passwords else resolve_passwords(LOGIN_ROLES, path)
    try:
        report = ensure_roles(url, passwords)
        if passwords:
            store_passwords(path, passwords)
    except OSError as exc:
        raise CheckFailed(f"cannot store the passwords in {path}: {exc}") from exc
    stored = None if not passwords else str(path)
    if ctx.json:
        ctx.print_json(_roles_body(report, stored, passwords, args.show_secrets))
        return 0
    if report.created:
        ctx.say(f"created roles {', '.join(report.created)}")
    if report.updated:
        ctx.say(f"updated roles {', '.join(report.updated)}")
    if stored:
        ctx.say(f"passwords of {', '.join(sorted(passwords))} stored in {stored} (mode 0600)")
    for role, password in sorted(passwords.items()) if args.show_secrets else ():
        ctx.say(f"{role} {password}")
    migrated = report.migrations.current or "no migrations"
    ctx.say(f"ledger database at {migrated}, owned by recovery_owner, grants applied")
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


def _worker_store(ctx: Context) -> int:
    """Create or update the workers' shared store and its role; say where the password
    is (see the module docstring)."""
    args = ctx.args
    path: Path = args.password_file or default_password_file()
    # The file keeps the ledger roles' passwords too: add this one, keep theirs.
    passwords = {**stored_passwords(path), **resolve_passwords({"worker": WORKER_ROLE}, path, {})}
    ensure_worker_store(ctx.database_url(), passwords[WORKER_ROLE])
    try:
        store_passwords(path, passwords)
    except OSError as exc:
        raise CheckFailed(f"cannot store the password in {path}: {exc}") from exc
    if ctx.json:
        body: dict[str, object] = {
            "schema": WORKER_SCHEMA,
            "role": WORKER_ROLE,
            "password_file": str(path),
        }
        if args.show_secrets:
            body["password"] = passwords[WORKER_ROLE]
        ctx.print_json(body)
        return 0
    ctx.say(f"execution store {WORKER_SCHEMA} ready; role {WORKER_ROLE} may claim and record")
    ctx.say(f"password of {WORKER_ROLE} stored in {path} (mode 0600)")
    if args.show_secrets:
        ctx.say(f"{WORKER_ROLE} {passwords[WORKER_ROLE]}")
    return 0
