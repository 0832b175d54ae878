"""`recoveryctl run [--role controller|relay|all]`: run the runtime against configured
services.

Services come from `--bootstrap` / `--database-url`, else RECOVERY_KAFKA_BOOTSTRAP /
RECOVERY_DATABASE_URL, else the running local stack (`recoveryctl stack up`). Kafka
clients authenticate with the RECOVERY_KAFKA_* security settings of the environment
(`schemas.KafkaSecurity`); on the local stack with none set, each role connects as its
own principal (`controller`, `relay`) and database login role, and the controller signs
with the stack's key (keys/controller.key) and reads the stack's roster
(keys/roster.json, where `recoveryctl keys generate` adds producers) unless
RECOVERY_CONTROLLER_SIGNING_KEY_FILE / RECOVERY_CONTROLLER_ROSTER_PATH say otherwise.
Before
anything starts, the ledger schema is checked: pending migrations stop the run (exit 2)
unless `--migrate` applies them; `--create-topics` creates missing topics (as
`recoveryctl topics create` with its defaults). The roles then run as threads of this process, each
with its own clients: the controller (`consumer.service.run_controller`) and `--relays N`
outbox relay instances. SIGTERM or SIGINT sets one stop event: every role finishes or
abandons its current batch without loss and the process exits 0. A role that dies
stops the others and the process exits 1, so a supervisor (compose, systemd,
Kubernetes) restarts it. Exit 2: no services known, the schema is not current, or the
controller has no policy or a refused one.

The controller needs an operator policy: `--policy FILE` (or
RECOVERY_CONTROLLER_POLICY_PATH). Start from the commented template
ops/policy.production.yaml (trusted verifiers, approvers' Ed25519 public keys, budgets).
Without one, or with a policy whose keys are derived from public names, it refuses to
start unless `--demo` (or RECOVERY_DEMO_MODE=1) runs it in demo mode, which logs a
WARNING for each thing it lets through. `recoveryctl demo` runs in demo mode with
ops/demo_policy.yaml. See docs/controller.md, "Policy and demo mode".

`--metrics-address HOST:PORT` (or RECOVERY_METRICS_ADDRESS; off when neither is set)
serves /metrics (Prometheus), /healthz and /readyz for every role of the process from
one port; the series and checks are listed in docs/operations.md.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any, Final

from consumer import (
    ENV_DEMO_MODE,
    ENV_METRICS_ADDRESS,
    HealthServer,
    ProcessSettings,
    RulesSettings,
)
from ledger import LedgerError
from ops.context import Context, register_command
from ops.errors import UsageError
from ops.keys import STACK_ROSTER
from ops.runtime import Services, check_schema, run_roles, stop_on_signals
from ops.settings import RUNTIME_ROLES
from producers import RelaySettings, provision, provision_acls
from schemas import IdentitySettings

__all__ = ["register"]

ROLE_CHOICES: Final = (*RUNTIME_ROLES, "all")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `run` subcommand."""
    parser = subparsers.add_parser(
        "run",
        help="run the controller and/or the outbox relay against configured services",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--role", choices=ROLE_CHOICES, default="all", help="default: all")
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    parser.add_argument("--database-url", metavar="URL", help="ledger database URL")
    parser.add_argument(
        "--migrate", action="store_true", help="apply pending ledger migrations first"
    )
    parser.add_argument(
        "--create-topics",
        action="store_true",
        help="create the recovery topics that do not exist yet (as `recoveryctl topics create`)",
    )
    parser.add_argument(
        "--relays", type=int, default=1, metavar="N", help="relay instances (default 1)"
    )
    parser.add_argument(
        "--relay-wake",
        choices=("notify", "poll"),
        default=None,
        help="how an idle relay learns of new rows (default: RECOVERY_RELAY_WAKE, else "
        "notify; see docs/relay.md)",
    )
    parser.add_argument(
        "--policy",
        metavar="FILE",
        help="the controller's operator policy (default: $RECOVERY_CONTROLLER_POLICY_PATH); "
        "required unless --demo; start from ops/policy.production.yaml",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help=f"demo mode (also ${ENV_DEMO_MODE}=1): run without a policy or with "
        "public-name keys, with a WARNING; never in production",
    )
    parser.add_argument(
        "--allow-superuser",
        action="store_true",
        help="let the controller run as a PostgreSQL superuser (logs a warning; see "
        "docs/ledger.md, Roles)",
    )
    parser.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help=f"serve /metrics, /healthz and /readyz here (default: ${ENV_METRICS_ADDRESS}, "
        "else off)",
    )
    parser.add_argument(
        "--log-level",
        metavar="LEVEL",
        help="logging level (default: $RECOVERY_LOG_LEVEL, else INFO)",
    )
    register_command(parser, _run)


def _run(ctx: Context) -> int:
    process = ProcessSettings.load(
        metrics_address=ctx.args.metrics_address, log_level=ctx.args.log_level
    )
    logging.basicConfig(
        level=process.log_level.upper(),
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    stop = threading.Event()
    # Handlers first: a SIGTERM during the checks below is a clean stop, not a kill.
    with stop_on_signals(stop):
        return _serve(ctx, process, stop)


def _prepare(ctx: Context, health: HealthServer | None, stop: threading.Event) -> Services:
    args = ctx.args
    if args.relays < 1:
        raise UsageError("--relays must be at least 1")
    services = ctx.runtime_services()
    # A failover pair between primaries, or a server still starting, is waited for with
    # bounded backoff, and /readyz says so meanwhile (docs/ledger.md, "Failover").
    waiting = ctx.database_wait()
    if health is not None:
        health.add(
            "run",
            live=lambda: {"loop": None},
            ready=lambda: {"ledger": waiting.problem() or "checking the ledger"},
        )
    try:
        applied = check_schema(services.database_url, args.migrate, waiting, stop)
    finally:
        if health is not None:
            health.remove("run")
    for label in applied:
        ctx.note(f"applied {label}")
    if args.create_topics:
        admin = services.kafka_for("admin")
        provision(services.bootstrap, security=admin)
        provision_acls(services.bootstrap, security=admin)
    return services


def _controller_flags(ctx: Context) -> dict[str, Any]:
    """The controller settings the flags set (the environment's stand otherwise), and on
    the local stack its own signing key and roster, unless the environment names them."""
    args = ctx.args
    flags: dict[str, Any] = {}
    home = ctx.stack_home()
    if home is not None:
        keys = home / "keys"
        if IdentitySettings.load().controller_key_file is None:
            flags["signing_key_file"] = keys / "controller.key"
        if RulesSettings.load().roster_path is None:
            flags["roster_path"] = keys / STACK_ROSTER
        if flags:
            ctx.note(
                "on the local stack: "
                + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in flags.items())
            )
    if args.allow_superuser:
        flags["allow_superuser"] = True
    if args.policy:
        flags["policy_path"] = args.policy
    if args.demo:
        flags["demo_mode"] = True
    return flags


def _serve(ctx: Context, process: ProcessSettings, stop: threading.Event) -> int:
    args = ctx.args
    health = HealthServer(process.metrics_address).start() if process.metrics_address else None
    try:
        try:
            services = _prepare(ctx, health, stop)
        except LedgerError:
            if not stop.is_set():
                raise
            # SIGTERM while it waited for the database: a clean stop, not a failure.
        if stop.is_set():
            ctx.note("stopped before starting")
            if health is not None:
                health.close()
            return 0
        roles = RUNTIME_ROLES if args.role == "all" else (args.role,)
        runtime = run_roles(
            roles,
            services,
            stop,
            relays=args.relays,
            relay_settings=RelaySettings.load(wake=args.relay_wake),
            controller_overrides=_controller_flags(ctx),
            health=health,
        )
    except BaseException:
        if health is not None:
            health.close()
        raise
    if health is not None:
        runtime.closers.insert(0, health.close)
    ctx.note(f"{', '.join(roles)} running; SIGTERM stops")
    # Wake up now and then: signal handlers run only between bytecodes of the main
    # thread, which a plain wait() without a timeout would never reach.
    while not stop.wait(0.5):
        pass
    runtime.join(timeout=60.0)
    if runtime.failures:
        ctx.note(f"role(s) failed: {', '.join(runtime.failures)}")
        return 1
    ctx.note("stopped cleanly")
    return 0
