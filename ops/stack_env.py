"""One ready set of variables per role of the local stack: what a shell, a process or a
guide sets to be that role, and nothing of another role's.

`role_environment(state, role)` is pure over the recorded stack: the variables to set
(each role's Kafka principal, database login role, keys and roster) and the ones to
unset, so that a shell which was one role before (an exported admin client file, say)
does not carry it into the next. `recoveryctl stack env ROLE` prints them as `export` and
`unset` lines for `eval "$(recoveryctl stack env ROLE)"`, and `stack up` writes each
role's to `<stack dir>/env/<role>.env` (0600) for `source`.

Roles (Kafka principal / database login role): `controller` (controller /
recovery_controller: `python -m consumer`, `recoveryctl run --role controller`), `relay`
(relay / recovery_relay), `tool` (tool / none: a tool integration), `worker` (worker /
none: a capability worker), `approver` (tool / recovery_reader: `recoveryctl review`,
`approve`, `reject`), `reader` (none / recovery_reader: read-only `recoveryctl`
commands), `auditor` (siem / recovery_auditor: `recoveryctl audit verify`), `siem`
(siem / none), `admin` (admin / the superuser: `db migrate`, `topics create`) and `demo`
(tool / recovery_reader of the demo's sandbox, with its topics and policy: what
`recoveryctl demo` left, for `ops list`, `review`, the console).
docs/operations.md, "The local stack's roles", has the table.

The controller, approvers and readers get `RECOVERY_CONTROLLER_ROSTER_PATH` too (the
controller's roster: `review` and `replay --verify` decide again with it). Every role
gets `RECOVERY_ROSTER_FILE`, the stack's roster (the controller's key and the
producers added to it); tools, workers and approvers get `RECOVERY_PRODUCER_ID` and
`RECOVERY_PRODUCER_KEY_FILE` for `--producer ID` (its key in the stack's keys folder,
`recoveryctl keys generate --id ID` puts it there), and a worker its execution store.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ledger import with_database
from ops.demo import DEMO_DATABASE, DEMO_TOPICS
from ops.demo_scenarios import DEMO_POLICY
from ops.keys import STACK_ROSTER
from ops.paths import ensure_dir
from ops.stack import StackState
from schemas import (
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    ENV_KAFKA_CONFIG_FILE,
    ENV_KAFKA_SASL_MECHANISM,
    ENV_KAFKA_SASL_PASSWORD,
    ENV_KAFKA_SASL_PASSWORD_FILE,
    ENV_KAFKA_SASL_USERNAME,
    ENV_KAFKA_SECURITY_PROTOCOL,
    ENV_KAFKA_SSL_CA_LOCATION,
    ENV_PRODUCER_ID,
    ENV_PRODUCER_KEY_FILE,
    ENV_ROSTER_FILE,
    TopicNames,
)

__all__ = ["ROLES", "StackRole", "role_environment", "shell_lines", "write_role_files"]


@dataclass(frozen=True, slots=True)
class StackRole:
    """What one role connects as: its Kafka principal and database login role (`None`:
    none; `"admin"`: the administrative URL), and whether it signs as a producer."""

    kafka: str | None
    database: str | None
    signs: bool = False


ROLES: Final[Mapping[str, StackRole]] = {
    "controller": StackRole("controller", "controller"),
    "relay": StackRole("relay", "relay"),
    "tool": StackRole("tool", None, signs=True),
    "worker": StackRole("worker", None, signs=True),
    "approver": StackRole("tool", "reader", signs=True),
    "reader": StackRole(None, "reader"),
    "auditor": StackRole("siem", "auditor"),
    "siem": StackRole("siem", None),
    "admin": StackRole("admin", "admin"),
    # The demo's sandbox (`recoveryctl demo` on the stack): read it, review and decide.
    "demo": StackRole("tool", "reader"),
}
# Set by a role that has them, unset by one that has not: a shell is one role at a time.
_KAFKA_SECURITY: Final = (
    ENV_KAFKA_CONFIG_FILE,
    ENV_KAFKA_SECURITY_PROTOCOL,
    ENV_KAFKA_SASL_MECHANISM,
    ENV_KAFKA_SASL_USERNAME,
    ENV_KAFKA_SASL_PASSWORD,
    ENV_KAFKA_SASL_PASSWORD_FILE,
    ENV_KAFKA_SSL_CA_LOCATION,
)
_CONTROLLER_ROSTER: Final = "RECOVERY_CONTROLLER_ROSTER_PATH"
_WORKER_STORE: Final = "RECOVERY_WORKER_STORE"
_STREAMS: Final = tuple(TopicNames.model_fields)
_TOPICS: Final = tuple(f"RECOVERY_TOPIC_{stream.upper()}" for stream in _STREAMS)
_POLICY: Final = "RECOVERY_CONTROLLER_POLICY_PATH"
_ROLE_SPECIFIC: Final = (
    *_TOPICS,
    _POLICY,
    ENV_DATABASE_URL,
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    _CONTROLLER_ROSTER,
    ENV_PRODUCER_ID,
    ENV_PRODUCER_KEY_FILE,
    _WORKER_STORE,
)


def role_environment(
    state: StackState, role: str, producer: str | None = None
) -> dict[str, str | None]:
    """Variable -> value for `role` on the stack `state` records; None means unset it.
    Raises `KeyError` for an unknown role and `ValueError` for a producer given to a
    role that does not sign."""
    spec = ROLES[role]
    home = Path(state.stack_dir)
    keys = home / "keys"
    env: dict[str, str | None] = {
        ENV_KAFKA_BOOTSTRAP: state.kafka.bootstrap,
        ENV_ROSTER_FILE: str(keys / STACK_ROSTER),
    }
    if spec.kafka is not None:
        env[ENV_KAFKA_CONFIG_FILE] = state.kafka.client_files.get(spec.kafka)
    if spec.database is not None:
        env[ENV_DATABASE_URL] = _database_url(state, spec.database)
    if role == "controller":
        env[ENV_CONTROLLER_SIGNING_KEY_FILE] = str(keys / "controller.key")
    if role in ("controller", "approver", "reader"):
        # The controller's roster; `review` and `replay --verify` decide again with it.
        env[_CONTROLLER_ROSTER] = str(keys / STACK_ROSTER)
    if producer is not None:
        if not spec.signs:
            raise ValueError(f"role {role} signs nothing: --producer is for tool, worker, approver")
        env[ENV_PRODUCER_ID] = producer
        env[ENV_PRODUCER_KEY_FILE] = str(keys / f"{producer}.pem")
    if role == "worker":
        env[_WORKER_STORE] = str(home / "worker" / f"{producer or 'worker'}.sqlite")
    if role == "demo":
        _into_demo_sandbox(env)
    for name in (*_KAFKA_SECURITY, *_ROLE_SPECIFIC):
        env.setdefault(name, None)  # another role's: unset
    return env


def _database_url(state: StackState, login: str) -> str:
    """The URL of database login role `login` on the stack (`admin`: the superuser)."""
    if login == "admin":
        return state.postgres.url
    return state.postgres.role_urls.get(login, state.postgres.url)


def _into_demo_sandbox(env: dict[str, str | None]) -> None:
    """The demo's database, topics and policy in place of the stack's."""
    url = env[ENV_DATABASE_URL]
    env[ENV_DATABASE_URL] = None if url is None else with_database(url, DEMO_DATABASE)
    env.update({f"RECOVERY_TOPIC_{s.upper()}": getattr(DEMO_TOPICS, s) for s in _STREAMS})
    env[_POLICY] = str(DEMO_POLICY)


def shell_lines(env: Mapping[str, str | None]) -> list[str]:
    """`export NAME=value` (quoted for any POSIX shell) and `unset NAME` lines."""
    exported = [f"export {k}={shlex.quote(v)}" for k, v in env.items() if v is not None]
    unset = sorted(k for k, v in env.items() if v is None)
    return [*exported, *([f"unset {' '.join(unset)}"] if unset else [])]


def write_role_files(state: StackState) -> Path:
    """`<stack dir>/env/<role>.env` for every role (0600: database URLs name password
    files, client files hold passwords); returns the folder."""
    folder = ensure_dir(Path(state.stack_dir) / "env", 0o700)
    for role in ROLES:
        path = folder / f"{role}.env"
        text = f"# recoveryctl stack env {role}\n" + "\n".join(
            shell_lines(role_environment(state, role))
        )
        path.write_text(text + "\n", encoding="utf-8")
        path.chmod(0o600)
    return folder
