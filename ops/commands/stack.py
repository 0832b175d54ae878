"""`recoveryctl stack up|down|status|env`: the local Kafka broker (or three-node cluster)
and PostgreSQL server."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ops.context import Context, register_command
from ops.db_passwords import write_compose_database_material
from ops.errors import NotConfigured, UsageError
from ops.kafka_security import write_compose_material, write_java_client_files
from ops.keys import STACK_ROSTER, stack_roster
from ops.paths import stack_dir
from ops.settings import ENV_KAFKA_PLAINTEXT
from ops.stack import ServiceStatus, StackState, stack_down, stack_status, stack_up
from ops.stack_env import ROLES, role_environment, shell_lines, write_role_files
from schemas import ENV_DATABASE_URL, ENV_KAFKA_BOOTSTRAP

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `stack` and its `up`, `down` and `status` subcommands."""
    parser = subparsers.add_parser(
        "stack",
        help="start, stop or inspect the local Kafka broker and PostgreSQL server",
        description=(
            "The local stack for development and tests: one Kafka broker (KRaft; or a "
            "three-node cluster with `up --brokers 3`) and one "
            f"PostgreSQL server on 127.0.0.1. When {ENV_KAFKA_BOOTSTRAP} or "
            f"{ENV_DATABASE_URL} is set, that existing service is used instead. The broker "
            "takes TLS + SASL/SCRAM-SHA-512 clients with ACLs (one principal per component, "
            "docs/operations.md) unless --plaintext is given."
        ),
    )
    actions = parser.add_subparsers(dest="stack_command", metavar="ACTION", required=True)

    up = actions.add_parser("up", help="start the stack in the background (idempotent)")
    up.add_argument("--json", action="store_true", help="print the stack state as JSON")
    up.add_argument(
        "--plaintext",
        action="store_true",
        default=None,
        help="run the broker's plaintext listener: no TLS, no authentication, no ACLs "
        f"(also {ENV_KAFKA_PLAINTEXT}=1)",
    )
    up.add_argument(
        "--brokers",
        type=int,
        choices=(1, 3),
        default=None,
        help="1: one broker; 3: a KRaft cluster of three nodes, every topic with three "
        "replicas and min.insync.replicas 2 (default: as the recorded stack, else 1)",
    )
    up.add_argument(
        "--ha",
        action="store_true",
        default=None,
        help="run the ledger on a local PostgreSQL failover pair: pg_auto_failover's "
        "monitor, a primary and a synchronous standby, URLs listing both nodes with "
        "target_session_attrs=read-write (docs/ledger.md, Failover)",
    )
    register_command(up, _up)

    down = actions.add_parser("down", help="stop the local services of the stack")
    down.add_argument("--purge", action="store_true", help="also delete their data")
    down.add_argument("--json", action="store_true", help="print what was stopped as JSON")
    register_command(down, _down)

    compose = actions.add_parser(
        "compose-env",
        help="write the TLS material and Kafka passwords compose.yaml needs (kept once made)",
    )
    compose.add_argument(
        "--dir", type=Path, default=None, help="where (default: <stack dir>/compose)"
    )
    register_command(compose, _compose_env)

    env = actions.add_parser(
        "env",
        help='print one role\'s ready set of variables, for eval "$(recoveryctl stack env ROLE)"',
        description=(
            "Print `export` (and `unset`) lines that make a shell one role of the running "
            "local stack: its Kafka principal, database role, keys and roster, and none of "
            "another role's. Roles: " + ", ".join(ROLES) + " (what each is: "
            'docs/operations.md, "The local stack\'s roles"). `stack up` writes the same to '
            "<stack dir>/env/ROLE.env."
        ),
    )
    env.add_argument("role", choices=list(ROLES), metavar="ROLE", help=", ".join(ROLES))
    env.add_argument(
        "--producer",
        metavar="ID",
        help="tool, worker, approver: sign as this roster producer (its key: keys/ID.pem)",
    )
    env.add_argument("--json", action="store_true", help="print the variables as JSON")
    register_command(env, _env)

    status = actions.add_parser("status", help="say whether each service answers now")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    register_command(status, _status)


def _up(ctx: Context) -> int:
    stack = stack_up(plaintext=ctx.args.plaintext, brokers=ctx.args.brokers, ha=ctx.args.ha)
    state = stack.state
    write_role_files(state)
    write_java_client_files(state.kafka.client_files)
    if ctx.json:
        ctx.print_json(
            {
                "reused": stack.reused,
                "restarted": list(stack.restarted),
                **state.model_dump(mode="json"),
            }
        )
        return 0
    if stack.restarted:
        kept = [n for n in ("kafka", "postgres") if n not in stack.restarted]
        whose = "their processes" if len(stack.restarted) > 1 else "its process"
        ctx.say(
            f"restarted {' and '.join(stack.restarted)}: {whose} had died or did not answer; "
            "same data and port" + (f"; {kept[0]} kept running" if kept else "")
        )
    elif stack.reused:
        ctx.say(f"already running since {state.started_at:%Y-%m-%d %H:%M:%S} UTC")
    _print_state(ctx, state)
    return 0


_RUNTIME_UID = 10001  # the `recovery` user of ops/Dockerfile


def _compose_env(ctx: Context) -> int:
    directory = ctx.args.dir or stack_dir() / "compose"
    # The database's passwords: its superuser's and every login role's, with a password
    # file the runtime image's user reads (no connection to the compose server is trusted).
    database = write_compose_database_material(
        directory, owner=_RUNTIME_UID if os.geteuid() == 0 else None
    )
    env_file = write_compose_material(directory, database)
    # The controller's key (0600, made once) and a roster naming it, for the runtime
    # image's user (uid 10001, ops/Dockerfile) to read.
    roster = stack_roster(directory)
    key = roster.parent / "controller.key"
    if os.geteuid() == 0:
        os.chown(key, _RUNTIME_UID, _RUNTIME_UID)
    ctx.say(f"wrote {directory / 'kafka'} (broker TLS material and SCRAM users)")
    ctx.say(f"wrote {directory / 'secrets'} (each Kafka client's password, 0600)")
    ctx.say(f"wrote {env_file} (the database roles' passwords, 0600)")
    ctx.say(f"wrote {directory / 'postgres'} (the database's passwords, 0600)")
    ctx.say(f"wrote {key} (the controller's signing key, 0600) and {roster}")
    ctx.say(f"  docker compose --env-file {env_file} up -d")
    return 0


def _down(ctx: Context) -> int:
    args = ctx.args
    state = stack_down(purge=args.purge)
    if ctx.json:
        payload: dict[str, Any] = {
            "stopped": state is not None,
            "purged": args.purge,
            "state": state.model_dump(mode="json") if state is not None else None,
        }
        ctx.print_json(payload)
    elif state is None:
        ctx.say("no local stack recorded; nothing to stop" + (" (data purged)" * args.purge))
    else:
        stopped = [
            name
            for name, external in (
                ("kafka", state.kafka.external),
                ("postgres", state.postgres.external),
            )
            if not external
        ]
        ctx.say(f"stopped: {', '.join(stopped) or 'nothing (both services are external)'}")
        if args.purge:
            ctx.say(f"deleted their data under {state.stack_dir}")
    return 0


def _status(ctx: Context) -> int:
    statuses = stack_status()
    healthy = bool(statuses) and all(s.running for s in statuses)
    if ctx.json:
        ctx.print_json(
            {"running": healthy, "services": [s.model_dump(mode="json") for s in statuses]}
        )
    elif not statuses:
        ctx.say("no local stack recorded; start one with `recoveryctl stack up`")
    else:
        for status in statuses:
            ctx.say(_status_line(status))
    return 0 if healthy else 1


def _print_state(ctx: Context, state: StackState) -> None:
    kafka, postgres = state.kafka, state.postgres
    kafka_origin = "external" if kafka.external else f"pid {kafka.pid}, data {kafka.data_dir}"
    pg_origin = "external" if postgres.external else f"pid {postgres.pid}, data {postgres.root}"
    if kafka.node_pids:
        cluster = f"{kafka.brokers}-node cluster ({kafka.security_protocol})"
        ctx.say(f"kafka     {cluster}, data {kafka.data_dir}")
        for node_id, (address, pid) in enumerate(
            zip(kafka.bootstrap.split(","), kafka.node_pids, strict=True), start=1
        ):
            ctx.say(f"  node {node_id}  {address}  (pid {pid})")
    else:
        ctx.say(f"kafka     {kafka.bootstrap}  ({kafka_origin}; {kafka.security_protocol})")
    ctx.say(f"postgres  {postgres.url}  ({pg_origin})")
    if postgres.ha and postgres.node_ports is not None:
        nodes = ", ".join(f"127.0.0.1:{port}" for port in postgres.node_ports)
        ctx.say(f"  failover pair: nodes {nodes}, monitor 127.0.0.1:{postgres.port}")
    if kafka.external or postgres.external:
        ctx.say(f"using existing services named by {ENV_KAFKA_BOOTSTRAP} / {ENV_DATABASE_URL}")
    ctx.say(f"ready in {state.startup_seconds:.1f} s (started {state.started_at:%H:%M:%S} UTC)")
    ctx.say(f"roster    {Path(state.stack_dir) / 'keys' / STACK_ROSTER}")
    command = _this_command()
    ctx.say("each role's variables, for a shell or a process (docs/operations.md, \"The local")
    ctx.say("stack's roles\"); `recoveryctl run` takes the stack's own without any:")
    ctx.say(f'  eval "$({command} stack env ROLE)"   ROLE: {", ".join(ROLES)}')
    ctx.say(f"  or: . {Path(state.stack_dir) / 'env'}/ROLE.env")


def _this_command() -> str:
    """How this shell runs recoveryctl: relative to the working folder when inside it."""
    path = Path(sys.argv[0])
    if path.name != "recoveryctl":
        return "recoveryctl"
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _env(ctx: Context) -> int:
    state = ctx.stack
    if state is None:
        raise NotConfigured(
            "no local stack runs: start it with `ops/dev up` (recoveryctl stack up)"
        )
    try:
        env = role_environment(state, ctx.args.role, ctx.args.producer)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if ctx.json:
        ctx.print_json(env)
    else:
        ctx.say("\n".join(shell_lines(env)))
    return 0


def _status_line(status: ServiceStatus) -> str:
    mark = "up  " if status.running else "DOWN"
    origin = "external, " if status.external else ""
    return f"{mark}  {status.name:<9} {status.address}  ({origin}{status.detail})"
