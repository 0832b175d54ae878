"""The operator context: what one `recoveryctl` command runs with, resolved once.

`recoveryctl` builds one `Context` per invocation from the parsed flags and hands it to
the command (procrastinate's `execute_command` opens its app the same way). Services and
rules are resolved the same way for every command, the first time one asks:

- the ledger database: `--database-url`, else `RECOVERY_DATABASE_URL`, else the running
  local stack's (`ops.stack.live_state`);
- the broker: `--bootstrap`, else `RECOVERY_KAFKA_BOOTSTRAP`, else the local stack's;
  each component's Kafka client settings are the environment's `RECOVERY_KAFKA_*` ones,
  except on the local stack's broker with none of them set, where each component
  connects as its own principal (the stack's client files);
- the pinned machines and registry (`--lock`, `--trust`, `--registry`, else the
  controller's `RECOVERY_CONTROLLER_*` files, else the shipped ones): every command that
  reads operations;
- the policy (`--policy`, else `RECOVERY_CONTROLLER_POLICY_PATH`): only commands that
  decide or show what a decision would do (review, approve, reject, replay, drill,
  console). Read-only commands never load one.

What a command opens (a ledger inspector) is closed when it returns. A missing service
or setting raises `NotConfigured` (exit 2) saying the three ways to name it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any, TextIO, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumer import (
    RulesSettings,
    checked_rules,
    load_machines,
    operator_policy,
)
from ledger import DatabaseWait, LedgerInspector, PostgresLedger
from machines import Machine, Pins, Policy, Registry, Rules, load_private_key
from ops.errors import NotConfigured, Refused, StackError, UsageError
from ops.keys import STACK_ROSTER
from ops.runtime import Services
from ops.stack import StackState, live_state
from producers import DeliveryFailed, EventPublisher, ProducersError, RecoveryClient
from schemas import (
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    KAFKA_PRINCIPALS,
    IdentitySettings,
    KafkaClientSettings,
    KafkaSecurity,
    RecordSigner,
    ServiceSettings,
    TopicNames,
    WireError,
)

__all__ = [
    "Context",
    "LoadedRules",
    "PinnedMachines",
    "add_rules_options",
    "parse_duration",
    "register_command",
    "table",
]

T = TypeVar("T")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
Handler = Callable[["Context"], int]
_RULE_FLAGS = (
    ("lock", "lock_path"),
    ("trust", "trusted_publishers_path"),
    ("registry", "registry_path"),
    ("policy", "policy_path"),
)


@dataclass(frozen=True, slots=True)
class LoadedRules:
    """The pinned machines by `name@version` and the rules (policy, registry)."""

    machines: Pins
    rules: Rules

    def machine_for(self, name: str, version: str, digest: str) -> Machine | None:
        """The pinned machine `name@version`, if its digest is `digest`."""
        return _pinned(self.machines, name, version, digest)


@dataclass(frozen=True, slots=True)
class PinnedMachines:
    """The pinned machines by `name@version` and the registry, without a policy."""

    machines: Pins
    registry: Registry

    def machine_for(self, name: str, version: str, digest: str) -> Machine | None:
        """The pinned machine `name@version`, if its digest is `digest`."""
        return _pinned(self.machines, name, version, digest)


def _pinned(machines: Pins, name: str, version: str, digest: str) -> Machine | None:
    machine = machines.by_digest(digest)
    if machine is None or (machine.name, machine.version) != (name, version):
        return None
    return machine


def parse_duration(text: str) -> timedelta:
    """`90s`, `15m`, `2h` or `7d` as a timedelta; raises `argparse.ArgumentTypeError`."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"duration {text!r} is not a number with a unit s, m, h or d (e.g. 15m)"
        )
    amount, unit = int(match.group(1)), match.group(2)
    if amount <= 0:
        raise argparse.ArgumentTypeError(f"duration {text!r} must be positive")
    return timedelta(**{_UNITS[unit]: amount})


def register_command(parser: argparse.ArgumentParser, handler: Handler) -> None:
    """Make `handler` the command `parser` runs, named as its `prog` in messages."""
    parser.set_defaults(handler=handler, command=parser.prog)


def add_rules_options(parser: argparse.ArgumentParser) -> None:
    """Add `--lock`, `--trust`, `--registry` and `--policy` (module docstring)."""
    group = parser.add_argument_group("rules (default: the controller's settings)")
    group.add_argument("--lock", type=Path, metavar="FILE", help="machines lock file")
    group.add_argument("--trust", type=Path, metavar="FILE", help="trusted publishers file")
    group.add_argument("--registry", type=Path, metavar="FILE", help="guard/action registry")
    group.add_argument("--policy", type=Path, metavar="FILE", help="operator policy file")


@dataclass
class Context:
    """One command's flags, output streams and lazily resolved services (module
    docstring). Use it as a context manager, or call `close`."""

    args: argparse.Namespace
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    _closers: list[Callable[[], object]] = field(default_factory=list)
    _inspector: LedgerInspector | None = None
    _ledger: PostgresLedger | None = None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close what the command opened, newest first."""
        while self._closers:
            self._closers.pop()()

    def flag(self, name: str) -> Any:
        """The parsed flag `name`, or None when this command has no such flag."""
        return getattr(self.args, name, None)

    @property
    def command(self) -> str:
        """`recoveryctl audit verify`: how messages name the command."""
        return str(self.flag("command") or "recoveryctl")

    @property
    def json(self) -> bool:
        """Whether the operator asked for JSON (`--json`)."""
        return bool(self.flag("json"))

    # --- output ---------------------------------------------------------------

    def say(self, text: str) -> None:
        """A line for the operator on standard output."""
        print(text, file=self.out)

    def note(self, text: str) -> None:
        """A line on standard error, prefixed with the command (progress, warnings)."""
        print(f"{self.command}: {text}", file=self.err)

    def print_json(self, payload: Any) -> None:
        """`payload` as indented JSON with sorted keys (datetimes as ISO-8601)."""
        print(json.dumps(payload, indent=2, sort_keys=True, default=_iso), file=self.out)

    # --- services -------------------------------------------------------------

    @cached_property
    def services(self) -> ServiceSettings:
        """The environment's services with the flags on top."""
        return ServiceSettings.load(
            kafka_bootstrap=self.flag("bootstrap"), database_url=self.flag("database_url")
        )

    @cached_property
    def stack(self) -> StackState | None:
        """The running local stack, if any (a stopped or killed one does not count)."""
        try:
            return live_state()
        except StackError:
            return None

    def stack_home(self) -> Path | None:
        """The running local stack's folder when this command's services are the
        stack's (neither named by flag nor environment), else None."""
        if self.stack is None:
            return None
        services = self.services
        if services.database_url or services.kafka_bootstrap:
            return None
        return Path(self.stack.stack_dir)

    def role_url(self, role: str) -> str | None:
        """The local stack's URL for login role `role` (a key of `ledger.LOGIN_ROLES`)
        when the database is the stack's and it has one; None otherwise (a database named
        by flag or environment is used as it is named)."""
        if self.services.database_url is None and self.stack is not None:
            return self.stack.postgres.role_urls.get(role)
        return None

    def database_url(self) -> str:
        """The ledger database (module docstring)."""
        if self.services.database_url is not None:
            return self.services.database_url
        if self.stack is not None:
            return self.stack.postgres.url
        raise NotConfigured(
            f"no database: pass --database-url, set {ENV_DATABASE_URL}, or run "
            "`recoveryctl stack up`"
        )

    def bootstrap(self) -> str:
        """The broker's bootstrap servers (module docstring)."""
        if self.services.kafka_bootstrap is not None:
            return self.services.kafka_bootstrap
        if self.stack is not None:
            return self.stack.kafka.bootstrap
        raise NotConfigured(
            f"no broker: pass --bootstrap, set {ENV_KAFKA_BOOTSTRAP}, or run `recoveryctl stack up`"
        )

    @contextmanager
    def approver_client(
        self, approver: str, key: Ed25519PrivateKey, subject: str
    ) -> Iterator[RecoveryClient]:
        """A client publishing as `approver`: the roster lists approvers with role
        `approver`, so the approver signs each record as its producer with `key`, the
        key that signs the decision inside. Failing to publish is `Refused`, naming
        `subject`."""
        try:
            with EventPublisher(
                self.bootstrap(),
                signer=RecordSigner(approver, key),
                topics=self.topics,
                security=self.kafka("tool"),
            ) as publisher:
                yield RecoveryClient(publisher, approver)
        except (DeliveryFailed, ProducersError, WireError) as exc:
            raise Refused(f"{subject}: could not publish: {exc}") from exc

    def kafka(self, component: str) -> KafkaSecurity:
        """How `component` (a key of `schemas.KAFKA_PRINCIPALS`) authenticates to the
        broker `bootstrap()` names (module docstring)."""
        on_stack = self.services.kafka_bootstrap is None and self.stack is not None
        configured = KafkaClientSettings.load().model_dump(exclude_none=True)
        if on_stack and not configured and self.stack is not None:
            return self.stack.kafka.client(component)
        return KafkaSecurity.from_env()

    def runtime_services(self) -> Services:
        """The services the runtime roles connect to, each role as itself where the
        local stack knows its login role and Kafka principal."""
        return Services(
            bootstrap=self.bootstrap(),
            database_url=self.database_url(),
            controller_url=self.role_url("controller"),
            relay_url=self.role_url("relay"),
            kafka={component: self.kafka(component) for component in KAFKA_PRINCIPALS},
            database_wait_s=self.database_wait().timeout,
        )

    def database_wait(self) -> DatabaseWait:
        """How this command waits for a read-write ledger database before it gives up
        (`RECOVERY_DATABASE_WAIT_S`; docs/ledger.md, "Failover")."""
        return DatabaseWait(f"recoveryctl {self.command}", timeout=self.services.database_wait_s)

    @cached_property
    def topics(self) -> TopicNames:
        """The deployment's topic names, with `--events-topic` when the command has it."""
        topics = TopicNames.from_env()
        events = self.flag("events_topic")
        return topics if events is None else topics.model_copy(update={"events": events})

    def inspector(self) -> LedgerInspector:
        """A one-connection inspector of the ledger (read-only snapshots), opened once."""
        if self._inspector is None:
            url = self.database_url()
            self._inspector = self.database_wait().run(
                "read the ledger", lambda: LedgerInspector(url, max_size=1, retries=1)
            )
            self._closers.append(self._inspector.close)
        return self._inspector

    def ledger(self) -> PostgresLedger:
        """A one-connection ledger on the database, opened once."""
        if self._ledger is None:
            url = self.database_url()
            self._ledger = self.database_wait().run(
                "open the ledger", lambda: PostgresLedger(url, max_size=1, retries=1)
            )
            self._closers.append(self._ledger.close)
        return self._ledger

    def controller_key(self, why: str) -> Ed25519PrivateKey:
        """The controller's signing key: `--key-file`, else
        `RECOVERY_CONTROLLER_SIGNING_KEY_FILE`; `NotConfigured` saying `why` it is
        needed when neither names one."""
        path = self.flag("key_file") or IdentitySettings.load().controller_key_file
        if not path:
            raise NotConfigured(f"{why}: pass --key-file or set {ENV_CONTROLLER_SIGNING_KEY_FILE}")
        return load_private_key(path, setting=ENV_CONTROLLER_SIGNING_KEY_FILE)

    # --- rules ----------------------------------------------------------------

    @cached_property
    def rules_settings(self) -> RulesSettings:
        """The controller's rules settings with `--lock`, `--trust`, `--registry` and
        `--policy` on top. On the local stack the roster is the stack's, as `recoveryctl
        run` gives its controller, unless the environment names one: a command that
        decides again (`replay --verify`, `review`) must trust whom the controller
        trusted (a verifier's roster grant, say)."""
        flags = {setting: self.flag(option) for option, setting in _RULE_FLAGS}
        settings = RulesSettings.load(**flags)
        home = self.stack_home()
        if settings.roster_path is None and home is not None:
            settings = RulesSettings.load(**flags, roster_path=home / "keys" / STACK_ROSTER)
        return settings

    @cached_property
    def machines(self) -> PinnedMachines:
        """The pinned machines and the registry: no policy is read."""
        machines, registry = load_machines(self.rules_settings)
        return PinnedMachines(machines, registry)

    @cached_property
    def rules(self) -> LoadedRules:
        """The pinned machines with the registry and the operator policy, for commands
        that decide or show a decision's consequences. Raises `NotConfigured` when no
        policy is named (outside demo mode)."""
        settings = self.rules_settings
        policy = operator_policy(settings)
        if policy is None:
            if not settings.demo_mode:
                raise NotConfigured(
                    "this command shows what the controller would decide, so it needs the "
                    "controller's policy: pass --policy FILE or set "
                    f"{RulesSettings.variable('policy_path')} to the file the controller runs "
                    f"with (demo: ops/demo_policy.yaml)"
                )
            policy = Policy(id="default")
        pinned = self.machines
        return LoadedRules(pinned.machines, checked_rules(pinned.machines, pinned.registry, policy))

    def require(self, value: T | None, what: str) -> T:
        """`value`, or `UsageError(what)` when it is None."""
        if value is None:
            raise UsageError(what)
        return value


def _iso(value: Any) -> Any:
    iso = getattr(value, "isoformat", None)
    if iso is not None:
        return iso()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """`rows` under `headers`, each column as wide as its widest cell; `None` shows as
    `-`. A table without rows is the header line alone."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)
