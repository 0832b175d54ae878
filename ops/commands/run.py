"""`recoveryctl run [--role controller|relay|all]`: run the runtime against configured
services.

Services come from `--bootstrap` / `--database-url`, else RECOVERY_KAFKA_BOOTSTRAP /
RECOVERY_DATABASE_URL, else the running local stack (`recoveryctl stack up`). Kafka
clients authenticate with the RECOVERY_KAFKA_* security settings of the environment
(`schemas.KafkaSecurity`); on the local stack with none set, each role connects as its
own principal (`controller`, `relay`). Before
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
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Final, TextIO

from consumer import (
    ENV_DEMO_MODE,
    ENV_METRICS_ADDRESS,
    RELAY_SERVICE,
    ControllerError,
    HealthServer,
    PolicyRefused,
    SettingsError,
    Telemetry,
    build_telemetry,
)
from ledger import LedgerError, PostgresLedger, migrate_database, require_current_schema
from ops.errors import StackError
from ops.settings import RUNTIME_ROLES
from ops.stack import live_state
from producers import (
    OutboxRelay,
    ProvisionError,
    RelaySettings,
    provision,
    provision_acls,
    relay_probes,
)
from schemas import (
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    ENV_KAFKA_CONFIG_FILE,
    ENV_KAFKA_SASL_MECHANISM,
    ENV_KAFKA_SASL_PASSWORD,
    ENV_KAFKA_SASL_PASSWORD_FILE,
    ENV_KAFKA_SASL_USERNAME,
    ENV_KAFKA_SECURITY_PROTOCOL,
    ENV_KAFKA_SSL_CA_LOCATION,
    KafkaSecurity,
    TopicNames,
)

__all__ = ["Runtime", "Services", "register", "resolve_services", "run_roles"]

_log = logging.getLogger("recoveryctl.run")
ROLE_CHOICES: Final = (*RUNTIME_ROLES, "all")
_SECURITY_VARIABLES: Final = (
    ENV_KAFKA_CONFIG_FILE,
    ENV_KAFKA_SECURITY_PROTOCOL,
    ENV_KAFKA_SASL_MECHANISM,
    ENV_KAFKA_SASL_USERNAME,
    ENV_KAFKA_SASL_PASSWORD,
    ENV_KAFKA_SASL_PASSWORD_FILE,
    ENV_KAFKA_SSL_CA_LOCATION,
)


@dataclass(frozen=True, slots=True)
class Services:
    """Where the runtime's services are."""

    bootstrap: str
    database_url: str
    # The URLs the controller and the relay connect with (their login roles); the
    # administrative `database_url` when none is known (docs/ledger.md, "Roles").
    controller_url: str | None = None
    relay_url: str | None = None
    # Component ("admin", "controller", "relay", "tool", "worker", ...) -> its Kafka
    # client settings; a component not named uses the environment's.
    kafka: Mapping[str, KafkaSecurity] = field(default_factory=dict)

    def kafka_for(self, component: str) -> KafkaSecurity:
        """The Kafka client settings `component` connects with."""
        found = self.kafka.get(component)
        return found if found is not None else KafkaSecurity.from_env()


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
        default="notify",
        help="how an idle relay learns of new rows (default notify; see docs/relay.md)",
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
        default=os.environ.get(ENV_METRICS_ADDRESS) or None,
        metavar="HOST:PORT",
        help="serve /metrics, /healthz and /readyz here (default: "
        f"${ENV_METRICS_ADDRESS}, else off)",
    )
    parser.add_argument(
        "--log-level", default=os.environ.get("RECOVERY_LOG_LEVEL", "INFO"), metavar="LEVEL"
    )
    parser.set_defaults(handler=_run)


def resolve_services(bootstrap: str | None, database_url: str | None) -> Services | None:
    """The services named by the flags, else the environment, else the running local
    stack; None when one of the two is known nowhere. The local stack's broker comes
    with its per-component principals unless the environment sets Kafka security."""
    bootstrap = bootstrap or os.environ.get(ENV_KAFKA_BOOTSTRAP) or None
    database_url = database_url or os.environ.get(ENV_DATABASE_URL) or None
    roles: dict[str, str] = {}
    kafka: dict[str, KafkaSecurity] = {}
    if bootstrap is None or database_url is None:
        try:
            state = live_state()
        except StackError:
            state = None
        if state is not None:
            if bootstrap is None and not any(os.environ.get(v) for v in _SECURITY_VARIABLES):
                kafka = {c: state.kafka.client(c) for c in state.kafka.client_files}
            bootstrap = bootstrap or state.kafka.bootstrap
            if database_url is None:  # the stack's database: its roles' URLs too
                database_url = state.postgres.url
                roles = state.postgres.role_urls
    if bootstrap is None or database_url is None:
        return None
    return Services(bootstrap, database_url, roles.get("controller"), roles.get("relay"), kafka)


@dataclass
class Runtime:
    """Role threads sharing one stop event; `failures` names the roles that died."""

    stop: threading.Event
    threads: list[threading.Thread] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)

    def start(self, name: str, target: Callable[[threading.Event], object]) -> None:
        """Run `target(stop)` in a thread named `name`; if it raises, record the failure
        and stop every other role (a half-running runtime hides the outage)."""

        def main() -> None:
            try:
                target(self.stop)
            except Exception:
                _log.exception("role %s failed; stopping the runtime", name)
                self.failures.append(name)
                self.stop.set()

        thread = threading.Thread(target=main, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for every role to return (after `stop` is set), then release clients."""
        for thread in self.threads:
            thread.join(timeout)
        for close in reversed(self.closers):
            close()
        self.closers.clear()


def run_roles(
    roles: Sequence[str],
    services: Services,
    stop: threading.Event,
    *,
    relays: int = 1,
    relay_settings: RelaySettings | None = None,
    topics: TopicNames | None = None,
    controller_overrides: Mapping[str, Any] | None = None,
    health: HealthServer | None = None,
) -> Runtime:
    """Start `roles` (`controller`, `relay`) as threads against `services`; returns the
    running `Runtime`. `controller_overrides` are controller settings on top of the
    environment's (`consumer.settings.ControllerSettings`). Set `stop` and call `join`
    to end them cleanly. Raises `ControllerError` for invalid controller settings and
    `PolicyRefused` for a missing or refused policy, before any role starts.
    `health` serves every role's metrics and probes."""
    runtime = Runtime(stop)
    names = topics or TopicNames.from_env()
    controller: Callable[[threading.Event], object] | None = None
    if "controller" in roles:  # first: a refused policy starts nothing
        overrides = {"topics": names, **(controller_overrides or {})}
        controller = _controller_target(services, overrides, health)
    if "relay" in roles:
        relay_url = services.relay_url or services.database_url
        ledger = PostgresLedger(relay_url, max_size=max(2, relays + 1))
        runtime.closers.append(ledger.close)
        telemetry = _relay_telemetry(health)
        runtime.closers.append(telemetry.shutdown)
        built = [
            OutboxRelay(
                ledger,
                services.bootstrap,
                database_url=relay_url,
                topics=names,
                settings=relay_settings,
                instance=f"relay-{os.getpid()}-{index}",
                tracer_provider=telemetry.tracer_provider,
                meter_provider=telemetry.meter_provider,
                security=services.kafka_for("relay"),
            )
            for index in range(relays)
        ]
        if health is not None:
            live, ready = relay_probes(
                built,
                database_url=services.database_url,
                bootstrap=services.bootstrap,
                security=services.kafka_for("relay"),
            )
            health.add("relay", live=live, ready=ready)
        for relay in built:
            runtime.start(relay.instance, relay.run)
    if controller is not None:
        runtime.start("controller", controller)
    return runtime


def _relay_telemetry(health: HealthServer | None) -> Telemetry:
    # Configured by the OTEL_* variables as the controller is, as service recovery-relay;
    # the deprecated RECOVERY_CONTROLLER_* aliases apply to it too.
    return build_telemetry(
        os.environ.get("RECOVERY_CONTROLLER_EXPORTER") or None,
        instance=f"relay-{os.getpid()}",
        service=RELAY_SERVICE,
        endpoint=os.environ.get("RECOVERY_CONTROLLER_OTLP_ENDPOINT") or None,
        readers=() if health is None else (health.metric_reader(),),
    )


def _controller_target(
    services: Services, overrides: Mapping[str, Any], health: HealthServer | None
) -> Callable[[threading.Event], object]:
    # Imported here: the relay role must run even where the controller's dependencies
    # (the machine catalogue, the lock file) are not deployed.
    from consumer import ControllerSettings, controller_policy, run_controller

    settings = ControllerSettings.from_env(
        bootstrap=services.bootstrap,
        database_url=services.controller_url or services.database_url,
        kafka_security=services.kafka_for("controller"),
        **overrides,
    )
    # Refused before any role starts, so the process exits with the reason, not a
    # traceback from the controller's thread (which checks again, and warns).
    controller_policy(settings, warn=False)

    def target(stop: threading.Event) -> None:
        run_controller(settings, stop, health=health)

    return target


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set `stop` on SIGTERM and SIGINT while inside (main thread only); the previous
    handlers come back afterwards."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        _log.info("received %s: stopping after the current batches", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def check_schema(database_url: str, migrate: bool, err: TextIO) -> bool:
    """Apply (with `migrate`) or check the ledger migrations, as the controller checks
    them (`ledger.require_current_schema`); False (after saying why on `err`) when the
    schema is not current or the database is unreachable."""
    try:
        if migrate:
            report = migrate_database(database_url)
            if report.applied:
                print(f"recoveryctl run: applied {', '.join(report.applied)}", file=err)
        require_current_schema(database_url)
    except LedgerError as exc:
        print(f"recoveryctl run: {exc}", file=err)
        return False
    return True


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    stop = threading.Event()
    # Handlers first: a SIGTERM during the checks below is a clean stop, not a kill.
    with stop_on_signals(stop):
        return _serve(args, stop, sys.stderr)


def _prepare(args: argparse.Namespace, err: TextIO) -> tuple[Services | None, int]:
    services = resolve_services(args.bootstrap, args.database_url)
    if services is None:
        print(
            f"recoveryctl run: no services known; pass --bootstrap and --database-url, set "
            f"{ENV_KAFKA_BOOTSTRAP} and {ENV_DATABASE_URL}, or run `recoveryctl stack up`",
            file=err,
        )
        return None, 2
    if args.relays < 1:
        print("recoveryctl run: --relays must be at least 1", file=err)
        return None, 2
    if not check_schema(services.database_url, args.migrate, err):
        return None, 2
    if args.create_topics:
        try:
            admin = services.kafka_for("admin")
            provision(services.bootstrap, security=admin)
            provision_acls(services.bootstrap, security=admin)
        except ProvisionError as exc:
            print(f"recoveryctl run: {exc}", file=err)
            return None, 1
    return services, 0


def _controller_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The controller settings the flags set (the environment's stand otherwise)."""
    flags: dict[str, Any] = {}
    if args.allow_superuser:
        flags["allow_superuser"] = True
    if args.policy:
        flags["policy_path"] = args.policy
    if args.demo:
        flags["demo_mode"] = True
    return flags


def _serve(args: argparse.Namespace, stop: threading.Event, err: TextIO) -> int:
    services, code = _prepare(args, err)
    if services is None:
        return code
    if stop.is_set():
        print("recoveryctl run: stopped before starting", file=err)
        return 0
    roles = RUNTIME_ROLES if args.role == "all" else (args.role,)
    health: HealthServer | None = None
    try:
        if args.metrics_address:
            health = HealthServer(args.metrics_address).start()
        runtime = run_roles(
            roles,
            services,
            stop,
            relays=args.relays,
            relay_settings=RelaySettings(wake=args.relay_wake),
            controller_overrides=_controller_flags(args),
            health=health,
        )
    except (LedgerError, ControllerError, SettingsError) as exc:
        print(f"recoveryctl run: {exc}", file=err)
        if health is not None:
            health.close()
        return 2 if isinstance(exc, PolicyRefused) else 1
    if health is not None:
        runtime.closers.insert(0, health.close)
    print(f"recoveryctl run: {', '.join(roles)} running; SIGTERM stops", file=err)
    # Wake up now and then: signal handlers run only between bytecodes of the main
    # thread, which a plain wait() without a timeout would never reach.
    while not stop.wait(0.5):
        pass
    runtime.join(timeout=60.0)
    if runtime.failures:
        print(f"recoveryctl run: role(s) failed: {', '.join(runtime.failures)}", file=err)
        return 1
    print("recoveryctl run: stopped cleanly", file=err)
    return 0
