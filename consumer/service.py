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
from consumer.heap import settle_heap
from consumer.settings import ControllerSettings
from consumer.telemetry import Telemetry, build_telemetry
from ledger import LedgerError, PostgresLedger, require_current_schema
from machines import (
    Machine,
    MachineError,
    Policy,
    PolicyError,
    Rules,
    check_policy_against_registry,
    load_policy,
    load_registry,
)
from machines.provenance import load_locked_machines, load_trusted_publishers

__all__ = ["load_rules", "redact_url", "run_controller"]

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
        check_policy_against_registry(policy, registry)
    except (MachineError, PolicyError, OSError) as exc:
        raise ControllerError(f"controller cannot load its machines or policy: {exc}") from exc
    if not machines:
        raise ControllerError(
            f"lock file {settings.lock_path} pins no machine; pin at least one with "
            "`recoveryctl machines lock`"
        )
    return machines, Rules(policy=policy, registry=registry)


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
) -> None:
    """Run one controller group member until `stop` is set (see the module docstring).
    `telemetry` overrides the configured exporter (tests pass in-memory providers)."""
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
    except LedgerError as exc:
        raise ControllerError(f"controller cannot start: {exc}") from exc
    owned_telemetry = telemetry is None
    telemetry = telemetry or build_telemetry(
        settings.exporter, instance=settings.instance_id, endpoint=settings.otlp_endpoint
    )
    try:
        ledger = PostgresLedger(settings.database_url)
    except LedgerError as exc:
        raise ControllerError(f"controller cannot open the ledger: {exc}") from exc
    try:
        controller = Controller(
            settings, ledger, machines=machines, rules=rules, telemetry=telemetry
        )
        settle_heap("controller")
        controller.run(stop)
    finally:
        ledger.close()
        if owned_telemetry:
            telemetry.shutdown()
