"""Passwords of the ledger's login roles for `recoveryctl db roles`: where they come
from and where they are kept.

Each login role's password is, in order: the environment variable
`RECOVERY_DB_PASSWORD_<COMPONENT>` (`..._OWNER`, `..._CONTROLLER`, `..._RELAY`,
`..._READER`, `..._AUDITOR`), else the one already in the password file, else a new
random one (`secrets.token_urlsafe(24)`). The file (JSON, role name -> password, mode
0600) is then rewritten with all of them, so running the command again keeps them.
Nothing here prints a password; `--show-secrets` is the command's decision.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from ledger import LOGIN_ROLES
from ops.errors import StackError
from ops.paths import stack_dir
from ops.settings import DATABASE_USER, DatabasePasswordSettings

__all__ = [
    "default_password_file",
    "resolve_passwords",
    "store_passwords",
    "stored_passwords",
    "write_compose_database_material",
]


def default_password_file() -> Path:
    """`<stack dir>/db-roles.json` (RECOVERY_STACK_DIR, default `.stack/`)."""
    return stack_dir() / "db-roles.json"


def resolve_passwords(
    roles: Mapping[str, str], path: Path, configured: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Role name -> password for every `roles` entry (component -> role name), from
    `configured` (component -> password; default the `RECOVERY_DB_PASSWORD_*` settings),
    the file at `path`, or generated (see the module docstring). Raises `StackError` when
    the file exists but is not a JSON object of strings. The Kafka principals use it
    too, with their own settings and file (`ops.kafka_security`)."""
    given = DatabasePasswordSettings.load().chosen() if configured is None else configured
    stored = _read(path)
    chosen: dict[str, str] = {}
    for component, role in roles.items():
        chosen[role] = given.get(component) or stored.get(role) or secrets.token_urlsafe(24)
    return chosen


def store_passwords(path: Path, passwords: Mapping[str, str]) -> None:
    """Write `passwords` to `path` readable by its owner only (created 0600, never
    world-readable in between)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(dict(sorted(passwords.items())), handle, indent=2)
        handle.write("\n")
    path.chmod(0o600)


def stored_passwords(path: Path) -> dict[str, str]:
    """Role name -> password as the file at `path` keeps them ({} when it does not
    exist); raises `StackError` when it is not a JSON object of strings."""
    return _read(path)


def _read(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StackError(f"password file {path} is unreadable ({exc}); fix or remove it") from exc
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise StackError(f"password file {path} is not a JSON object of role -> password")
    return data


def write_compose_database_material(directory: Path, owner: int | None = None) -> dict[str, str]:
    """The database passwords of `compose.yaml`, kept in `directory/postgres` (0700,
    made once): `superuser.password` (the image's POSTGRES_PASSWORD_FILE) and `pgpass`
    (a libpq password file of every role, which the runtime's URLs name), owned by
    `owner` when given (the runtime image's user). Returns the env lines to add to
    `compose.env`: `RECOVERY_DB_PASSWORD_<COMPONENT>=...`, which `recoveryctl db roles`
    sets on the login roles."""
    folder = directory / "postgres"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    stored = folder / "db-roles.json"
    passwords = resolve_passwords({**LOGIN_ROLES, "superuser": DATABASE_USER}, stored, {})
    store_passwords(stored, passwords)
    _write_private(folder / "superuser.password", passwords[DATABASE_USER] + "\n", owner=None)
    pgpass = "".join(f"*:*:*:{role}:{password}\n" for role, password in sorted(passwords.items()))
    _write_private(folder / "pgpass", pgpass, owner=owner)
    prefix = str(DatabasePasswordSettings.model_config.get("env_prefix"))
    return {
        f"{prefix}{component.upper()}": passwords[role] for component, role in LOGIN_ROLES.items()
    }


def _write_private(path: Path, text: str, *, owner: int | None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    path.chmod(0o600)
    if owner is not None and os.geteuid() == 0:
        os.chown(path, owner, owner)
