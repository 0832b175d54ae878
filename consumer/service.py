"""Starting a controller from settings: load what it decides under, open the ledger,
build telemetry, run until stopped, close everything it opened.

`run_controller(settings, stop)` is what `python -m consumer`, `recoveryctl run` and the
fault tests call; it returns when `stop` is set (after leaving the group) and raises
`ControllerError` when the controller cannot start or fails fatally.
"""

from __future__ import annotations

import logging
import threading
from urllib.parse import urlsplit, urlunsplit

from consumer.controller import Controller
from consumer.errors import ControllerError
from consumer.health import controller_probes
from consumer.health_server import HealthServer
from consumer.settings import ControllerSettings
from consumer.telemetry import CONTROLLER_SERVICE, Telemetry, build_telemetry
from ledger import LedgerError, PostgresLedger, current_role, require_current_schema
from machines import (
    Machine,
    MachineError,
    Policy,
    PolicyError,
    Rules,
    check_policy_against_registry,
    load_locked_machines,
    load_policy,
    load_registry,
    load_roster,
    load_trusted_publishers,
    parse_policy,
)

__all__ = ["check_database_role", "load_rules", "redact_url", "run_controller"]

log = logging.getLogger("consumer")


def load_rules(settings: ControllerSettings) -> tuple[dict[str, Machine], Rules]:
    """The pinned machines (each checked against the lock file and its publisher's
    signature) and the registry and policy every decision is made under. Raises
    `ControllerError` naming the file that was refused."""
    try:
        registry = load_registry(settings.registry_path)
        trust = load_trusted_publishers(settings.trusted_publishers_path)
        machines = load_locked_machines(settings.lock_path, registry, trust)
        policy = (
            load_policy(settings.policy_path)
            if settings.policy_path is not None
            else Policy(id="default")
        )
        if settings.roster_path is not None:
            # Validated again as a whole: a producer listed in both is refused.
            extra = load_roster(settings.roster_path)
            data = policy.model_dump(mode="json")
            data["producers"] = data.get("producers", []) + [
                p.model_dump(mode="json") for p in extra.producers
            ]
            policy = parse_policy(data, source=f"{settings.roster_path} with the policy")
        check_policy_against_registry(policy, registry)
    except (MachineError, PolicyError, OSError) as exc:
        raise ControllerError(f"controller cannot load its machines or policy: {exc}") from exc
    if not machines:
        raise ControllerError(
            f"lock file {settings.lock_path} pins no machine; pin at least one with "
            "`recoveryctl machines lock`"
        )
    return machines, Rules(policy=policy, registry=registry)


def check_database_role(settings: ControllerSettings) -> None:
    """Refuse (`ControllerError`, reason `controller-superuser-refused`) a ledger URL that
    connects as a superuser, unless `allow_superuser` says to run anyway; then log a
    warning. A superuser bypasses every grant, so nothing would stop this process from
    rewriting history. Raises `LedgerError` when the server cannot be asked."""
    role = current_role(settings.database_url)
    if not role.superuser:
        return
    if not settings.allow_superuser:
        raise ControllerError(
            f"controller-superuser-refused: controller {settings.instance_id} connects to the "
            f"ledger as {role.name}, a PostgreSQL superuser, which may rewrite history; connect "
            "as recovery_controller (create it with `recoveryctl db roles`), or set "
            "RECOVERY_CONTROLLER_ALLOW_SUPERUSER=1 (`recoveryctl run --allow-superuser`) to "
            "run anyway"
        )
    log.warning(
        "controller %s RUNS AS POSTGRESQL SUPERUSER %s (allowed by "
        "RECOVERY_CONTROLLER_ALLOW_SUPERUSER): no grant or trigger protects the ledger's "
        "history from this process; connect as recovery_controller instead",
        settings.instance_id,
        role.name,
    )


def redact_url(url: str) -> str:
    """`url` with its password replaced by `***`, for logs; a URL without a password
    is returned as it is, one that does not parse as a placeholder."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparseable URL>"
    if password is None:
        return url
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def run_controller(
    settings: ControllerSettings,
    stop: threading.Event,
    *,
    telemetry: Telemetry | None = None,
    health: HealthServer | None = None,
) -> None:
    """Run one controller group member until `stop` is set (see the module docstring).
    `telemetry` overrides the configured exporter (tests pass in-memory providers);
    `health`, when given, serves this controller's metrics and probes."""
    machines, rules = load_rules(settings)
    log.info(
        "controller %s starting: policy %s (%s) from %s, broker %s, database %s",
        settings.instance_id,
        rules.policy.id,
        rules.policy.digest,
        settings.policy_path or "<built-in default>",
        settings.bootstrap,
        redact_url(settings.database_url),
    )
    try:
        require_current_schema(settings.database_url)
        check_database_role(settings)
    except LedgerError as exc:
        raise ControllerError(f"controller cannot start: {exc}") from exc
    owned_telemetry = telemetry is None
    telemetry = telemetry or build_telemetry(
        settings.exporter,
        instance=settings.instance_id,
        service=CONTROLLER_SERVICE,
        endpoint=settings.otlp_endpoint,
        readers=() if health is None else (health.metric_reader(),),
    )
    try:
        ledger = PostgresLedger(settings.database_url)
    except LedgerError as exc:
        raise ControllerError(f"controller cannot open the ledger: {exc}") from exc
    try:
        controller = Controller(
            settings, ledger, machines=machines, rules=rules, telemetry=telemetry
        )
        if health is not None:
            live, ready = controller_probes(controller)
            health.add("controller", live=live, ready=ready)
        controller.run(stop)
    finally:
        if health is not None:
            health.remove("controller")
        ledger.close()
        if owned_telemetry:
            telemetry.shutdown()
