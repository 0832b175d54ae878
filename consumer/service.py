"""Starting a controller from settings: load what it decides under, open the ledger,
build telemetry, run until stopped, close everything it opened.

`run_controller(settings, stop)` is what `python -m consumer`, `recoveryctl run` and the
fault tests call; it returns when `stop` is set (after leaving the group) and raises
`ControllerError` when the controller cannot start or fails fatally.

The policy is explicit (`controller_policy`): without a policy file, with a key in it
that `machines.insecure_test_key` derives from a public name, or with a grant that
speaks for any agent (`machines.wildcard_agent_grants`), the controller refuses to
start (`PolicyRefused`) unless `demo_mode` is set, and then logs a WARNING for each.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from consumer.controller import Controller
from consumer.errors import ControllerError, PolicyRefused
from consumer.health import controller_probes
from consumer.health_server import HealthServer
from consumer.reload import RulesWatch
from consumer.settings import ENV_DEMO_MODE, ControllerSettings, RulesSettings
from consumer.telemetry import CONTROLLER_SERVICE, Telemetry, build_telemetry
from ledger import (
    DatabaseWait,
    LedgerError,
    PostgresLedger,
    current_role,
    require_current_schema,
)
from machines import (
    Machine,
    MachineError,
    Pins,
    Policy,
    PolicyError,
    Registry,
    Rules,
    check_policy_against_machines,
    check_policy_against_registry,
    load_locked_machines,
    load_policy,
    load_registry,
    load_roster,
    load_trusted_publishers,
    parse_policy,
    public_name_keys,
    wildcard_agent_grants,
)

__all__ = [
    "check_database_role",
    "checked_rules",
    "controller_policy",
    "load_machines",
    "load_rules",
    "operator_policy",
    "redact_url",
    "run_controller",
]

log = logging.getLogger("consumer")

_TEMPLATE = "ops/policy.production.yaml"
_DOCS = 'docs/controller.md, "Policy and demo mode"'


def _with_roster(policy: Policy, path: Path) -> Policy:
    """`policy` with the producers of the roster file `path` added; validated again as a
    whole, so a producer listed in both is refused."""
    try:
        extra = load_roster(path)
        data = policy.model_dump(mode="json")
        data["producers"] = data.get("producers", []) + [
            p.model_dump(mode="json") for p in extra.producers
        ]
        return parse_policy(data, source=f"{path} with the policy {policy.id}")
    except (PolicyError, OSError) as exc:
        raise ControllerError(f"controller cannot load its roster {path}: {exc}") from exc


def operator_policy(settings: RulesSettings) -> Policy | None:
    """The policy file `settings.policy_path` with the roster file beside it, or None
    when no file is named. Raises `ControllerError` naming the file that does not load.
    No gate: whether the controller may run under it is `controller_policy`'s call."""
    if settings.policy_path is None:
        return None
    try:
        policy = load_policy(settings.policy_path)
    except (PolicyError, OSError) as exc:
        raise ControllerError(f"controller cannot load its policy: {exc}") from exc
    if settings.roster_path is not None:
        policy = _with_roster(policy, settings.roster_path)
    return policy


def controller_policy(settings: ControllerSettings, *, warn: bool = True) -> Policy:
    """The policy the controller runs under: the file `settings.policy_path`, checked.
    Raises `PolicyRefused` when no file is given, the policy holds a key derived from
    a public name (`machines.public_name_keys`) or a grant for any agent
    (`machines.wildcard_agent_grants`), unless `settings.demo_mode`; in demo
    mode it logs (with `warn`) a WARNING saying so and naming each such key. Raises
    `ControllerError` when the file cannot be read or is invalid."""
    policy = operator_policy(settings)
    if policy is None:
        if not settings.demo_mode:
            raise PolicyRefused(
                f"controller-policy-missing: controller {settings.instance_id} has no "
                "policy file and will not run under the built-in one, which trusts no "
                "verifier and lists no approver; give it one with "
                "RECOVERY_CONTROLLER_POLICY_PATH=FILE (`recoveryctl run --policy FILE`), "
                f"starting from the commented template {_TEMPLATE} ({_DOCS}), or set "
                f"{ENV_DEMO_MODE}=1 (`recoveryctl run --demo`) to try it out"
            )
        policy = Policy(id="default")
        if settings.roster_path is not None:
            policy = _with_roster(policy, settings.roster_path)
    weak = public_name_keys(policy)
    if weak and not settings.demo_mode:
        raise PolicyRefused(
            f"controller-public-name-key-refused: policy {policy.id} from "
            f"{settings.policy_path} holds {len(weak)} key(s) derived from a public name, "
            "so anyone who knows the name can sign as that holder: "
            + "; ".join(k.describe() for k in weak)
            + "; replace each with the public key of a private key only its holder has "
            f"(see {_TEMPLATE}), or set {ENV_DEMO_MODE}=1 (`recoveryctl run --demo`) for a "
            "demo"
        )
    wildcards = wildcard_agent_grants(policy)
    if wildcards and not settings.demo_mode:
        raise PolicyRefused(
            f"controller-wildcard-agent-refused: policy {policy.id} from "
            f"{settings.policy_path} lets {len(wildcards)} grant(s) speak for any agent, so "
            "their holder may name a bystander as the agent a containment stops: "
            + "; ".join(wildcards[:10])
            + (f"; and {len(wildcards) - 10} more" if len(wildcards) > 10 else "")
            + "; list the agents each producer may speak for (`agents: [billing-agent]`), "
            "or have the agents' runtime sign call contexts that the tool forwards "
            f"(docs/tool-integration.md), or set {ENV_DEMO_MODE}=1 for a demo"
        )
    if warn and settings.demo_mode:
        log.warning(
            "controller %s RUNS IN DEMO MODE (%s): policy %s from %s; never run a "
            "production controller like this (%s)",
            settings.instance_id,
            ENV_DEMO_MODE,
            policy.id,
            settings.policy_path or "<built-in default: no trusted verifier, no approver>",
            _DOCS,
        )
        for grant in wildcards:
            log.warning("DEMO MODE: policy %s speaks for ANY AGENT: %s", policy.id, grant)
        for key in weak:
            log.warning(
                "DEMO MODE: policy %s trusts a PUBLIC-NAME KEY, anyone can sign as its holder: %s",
                policy.id,
                key.describe(),
            )
    return policy


def load_machines(settings: RulesSettings) -> tuple[Pins, Registry]:
    """The pinned machines (each checked against the lock file and its publisher's
    signature) and the registry. Raises `ControllerError` naming the file that was
    refused, or a lock file that pins nothing."""
    try:
        registry = load_registry(settings.registry_path)
        trust = load_trusted_publishers(settings.trusted_publishers_path)
        machines = load_locked_machines(settings.lock_path, registry, trust)
    except (MachineError, PolicyError, OSError) as exc:
        raise ControllerError(f"cannot load the pinned machines: {exc}") from exc
    if not machines:
        raise ControllerError(
            f"lock file {settings.lock_path} pins no machine; pin at least one with "
            "`recoveryctl machines lock`"
        )
    return machines, registry


def checked_rules(machines: Mapping[str, Machine], registry: Registry, policy: Policy) -> Rules:
    """The rules of `policy` over `machines` and `registry`, after checking that every
    guard, action and machine the policy names exists. Raises `ControllerError`."""
    try:
        check_policy_against_registry(policy, registry)
        check_policy_against_machines(policy, machines.values(), registry, every=True)
    except (MachineError, PolicyError) as exc:
        raise ControllerError(f"policy {policy.id} does not fit the machines: {exc}") from exc
    return Rules(policy=policy, registry=registry)


def load_rules(settings: ControllerSettings, *, warn: bool = True) -> tuple[Pins, Rules]:
    """The pinned machines and the registry and policy (`controller_policy`) every
    decision is made under. Raises `ControllerError` naming the file that was refused,
    `PolicyRefused` when the policy is missing or holds a public-name key outside demo
    mode. A reload passes `warn=False`: the demo mode's warnings were logged at start."""
    machines, registry = load_machines(settings)
    return machines, checked_rules(machines, registry, controller_policy(settings, warn=warn))


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


def _open_ledger(
    settings: ControllerSettings, stop: threading.Event, health: HealthServer | None
) -> PostgresLedger:
    """Check the schema and the role, and open the ledger, waiting for a read-write
    database (`ledger.DatabaseWait`: a failover, a server still starting) with bounded
    backoff; meanwhile `/readyz` says what the controller waits for. Raises
    `ControllerError` when the wait runs out or the database refuses."""
    waiting = DatabaseWait(f"controller {settings.instance_id}", timeout=settings.database_wait_s)
    if health is not None:
        health.add(
            "controller",
            live=lambda: {"loop": None},
            ready=lambda: {"ledger": waiting.problem() or "opening the ledger"},
        )

    def start() -> PostgresLedger:
        require_current_schema(settings.database_url)
        check_database_role(settings)
        return PostgresLedger(settings.database_url)

    try:
        return waiting.run("start the controller", start, stop)
    except LedgerError as exc:
        if health is not None:
            health.remove("controller")
        raise ControllerError(f"controller cannot start: {exc}") from exc


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
        "controller %s starting%s: policy %s (%s) from %s, broker %s (%s), database %s",
        settings.instance_id,
        " IN DEMO MODE" if settings.demo_mode else "",
        rules.policy.id,
        rules.policy.digest,
        settings.policy_path or "<built-in default>",
        settings.bootstrap,
        settings.kafka_security.describe(),
        redact_url(settings.database_url),
    )
    ledger = _open_ledger(settings, stop, health)
    owned_telemetry = telemetry is None
    telemetry = telemetry or build_telemetry(
        instance=settings.instance_id,
        service=CONTROLLER_SERVICE,
        readers=() if health is None else (health.metric_reader(),),
    )
    try:
        watched = (
            settings.lock_path,
            settings.trusted_publishers_path,
            settings.registry_path,
            settings.policy_path,
            settings.roster_path,
        )
        controller = Controller(
            settings,
            ledger,
            machines=machines,
            rules=rules,
            telemetry=telemetry,
            reload=lambda: load_rules(settings, warn=False),
            watch=RulesWatch(watched, settings.rules_watch_seconds),
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
