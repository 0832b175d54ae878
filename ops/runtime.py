"""The runtime roles of one process: the controller and outbox relays as threads sharing
one stop event, against resolved services.

`recoveryctl run` and `recoveryctl demo` start them through `run_roles`; each role gets
its own clients and, where the services came from the local stack, its own Kafka
principal and database login role (`Services`, resolved by `ops.context.Context`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from consumer import (
    RELAY_SERVICE,
    HealthServer,
    Telemetry,
    build_telemetry,
    reload_requests,
)
from ledger import DatabaseWait, PostgresLedger, migrate_database, require_current_schema
from producers import OutboxRelay, RelaySettings, relay_probes
from schemas import KafkaSecurity, TopicNames

__all__ = ["Runtime", "Services", "check_schema", "run_roles", "stop_on_signals"]

_log = logging.getLogger("recoveryctl.run")


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
    # How long the roles wait for a read-write database at start (ledger.DatabaseWait).
    database_wait_s: float = 300.0

    def kafka_for(self, component: str) -> KafkaSecurity:
        """The Kafka client settings `component` connects with."""
        found = self.kafka.get(component)
        return found if found is not None else KafkaSecurity.from_env()


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
        ledger = _open_relay_ledger(services, relay_url, relays, stop, health)
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


def _open_relay_ledger(
    services: Services,
    url: str,
    relays: int,
    stop: threading.Event,
    health: HealthServer | None,
) -> PostgresLedger:
    """The relays' ledger, opened once a read-write database answers (bounded backoff,
    `ledger.DatabaseWait`; `/readyz` says so meanwhile)."""
    waiting = DatabaseWait(f"relay {os.getpid()}", timeout=services.database_wait_s)
    if health is not None:
        health.add(
            "relay",
            live=lambda: {"loop": None},
            ready=lambda: {"ledger": waiting.problem() or "opening the ledger"},
        )
    return waiting.run(
        "start the relay", lambda: PostgresLedger(url, max_size=max(2, relays + 1)), stop
    )


def _relay_telemetry(health: HealthServer | None) -> Telemetry:
    # Configured by the OTEL_* variables as the controller is, as service recovery-relay;
    # the deprecated RECOVERY_CONTROLLER_* aliases apply to it too.
    return build_telemetry(
        instance=f"relay-{os.getpid()}",
        service=RELAY_SERVICE,
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
    """Set `stop` on SIGTERM and SIGINT, and ask the controllers to reload their rules
    on SIGHUP (`consumer.reload`), while inside (main thread only); the previous
    handlers come back afterwards."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        _log.info("received %s: stopping after the current batches", signal.Signals(signum).name)
        stop.set()

    def reload(_signum: int, _frame: FrameType | None) -> None:
        reload_requests.request(f"SIGHUP to pid {os.getpid()}")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, reload)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def check_schema(
    database_url: str,
    migrate: bool,
    waiting: DatabaseWait | None = None,
    stop: threading.Event | None = None,
) -> tuple[str, ...]:
    """Apply (with `migrate`) or check the ledger migrations, as the controller checks
    them (`ledger.require_current_schema`); returns the migrations applied. With
    `waiting`, a database with no read-write server yet is waited for (bounded; `stop`
    ends the wait). Raises
    `ledger.LedgerError` when the schema is not current or the database unreachable."""

    def check() -> tuple[str, ...]:
        applied: tuple[str, ...] = ()
        if migrate:
            applied = tuple(migrate_database(database_url).applied)
        require_current_schema(database_url)
        return applied

    if waiting is None:
        return check()
    return waiting.run("check the ledger's migrations", check, stop)
