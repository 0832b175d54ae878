"""`recoveryctl demo`: the whole system on one incident, end to end.

`run_demo` provisions the database (`db migrate`) and the topics, starts the controller,
the outbox relay and the example capability worker as threads, plays the incident of
`ops.demo_scenarios` as the tools, the orchestrator and a human approver would (the
approver signs with the demo policy's test key), and waits, with a progress line per
state change, until every operation reaches its expected final state or the timeout
passes. It then reads back what happened: each operation's decisions from the ledger,
the commands the relay published on the commands topic, and the verified audit chain.
`DemoReport.ok` is true only if every path, every command list and every chain matched.

Nothing here reaches into the controller: the demo talks to it only through Kafka, as
any tool would, and reads the ledger through the `Ledger` interface.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, TextIO

from consumer import redact_url
from ledger import (
    LOGIN_ROLES,
    Ledger,
    PostgresLedger,
    UnknownOperation,
    ensure_roles,
    with_database,
    with_user,
)
from machines import (
    ANY,
    DEFAULT_REGISTRY,
    DeclaredFacts,
    EvidencePayload,
    Grant,
    Lineage,
    Machine,
    ProducerEntry,
    ProducerKey,
    Role,
    Roster,
    insecure_test_key,
    is_timer_event,
    load_locked_machines,
    load_policy,
    load_private_key,
    load_registry,
    load_trusted_publishers,
    public_key_b64,
    public_key_text,
    review_digest,
)
from ops.demo_scenarios import (
    APPROVER,
    DEMO_HANDLERS,
    DEMO_POLICY,
    SCENARIOS,
    Scenario,
    operation_id_for,
)
from ops.errors import OpsError
from ops.keys import controller_roster, stack_key
from ops.paths import stack_dir
from ops.postgres import ensure_database
from ops.runtime import Runtime, Services, run_roles
from producers import (
    CapabilityWorker,
    EventPublisher,
    ExecutionStore,
    RecoveryClient,
    WorkerSettings,
    provision,
    provision_acls,
    read_commands,
)
from schemas import DEFAULT_TOPICS, IdentitySettings, RecordSigner, TopicNames

__all__ = [
    "DEMO_DATABASE",
    "DEMO_TOPICS",
    "DemoError",
    "DemoReport",
    "OperationReport",
    "demo_sandbox",
    "run_demo",
]

_TOOL = "demo-tool"
_WORKER = "demo-worker"

# The demo's sandbox on the local stack: a database and topics of its own, so that a
# real controller (on recovery.events, with the real roster) never reads the demo's
# events, which it would dead-letter (producer-unknown), and `replay --verify` under the
# real policy never meets the demo's operations (decided under the demo policy).
DEMO_DATABASE: Final = "recovery_demo"
DEMO_TOPICS: Final = TopicNames(
    events="recovery-demo.events",
    commands="recovery-demo.commands",
    evidence="recovery-demo.evidence",
    audit="recovery-demo.audit",
    dlq="recovery-demo.dlq",
)


def demo_sandbox(services: Services, admin_url: str) -> tuple[Services, TopicNames]:
    """`services` moved into the demo's sandbox on the local stack: database
    `DEMO_DATABASE` on the same server (created through `admin_url` when missing; every
    login role's password file entry holds for any database) and topics `DEMO_TOPICS`,
    unless the environment names topics (`RECOVERY_TOPIC_*`), which the demo then uses."""
    ensure_database(admin_url, DEMO_DATABASE)

    def moved(url: str | None) -> str | None:
        return None if url is None else with_database(url, DEMO_DATABASE)

    sandbox = replace(
        services,
        database_url=with_database(services.database_url, DEMO_DATABASE),
        controller_url=moved(services.controller_url),
        relay_url=moved(services.relay_url),
    )
    named = TopicNames.from_env()
    return sandbox, (DEMO_TOPICS if named == DEFAULT_TOPICS else named)


class DemoError(OpsError):
    """The demo could not run (services, schema, topics or a runtime role failed)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One decision of an operation, as the ledger recorded it; `timer` when its event
    was a timer's, fired by the controller (`machines.timers`)."""

    event_type: str
    state_before: str
    state_after: str
    outcome: str
    timer: bool = False


@dataclass(slots=True)
class OperationReport:
    """What happened to one operation, next to what had to."""

    scenario: str
    story: str
    operation_id: str
    machine: str
    expected_path: tuple[str, ...]
    expected_commands: tuple[str, ...]
    state: str | None = None
    steps: list[Step] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    audit_records: int = 0
    audit_intact: bool = False
    # What the audit chain records, in order: each record's kind, or its decision's
    # event type (a timer's marked), as the demo prints it.
    audit_chain: list[str] = field(default_factory=list)

    @property
    def path(self) -> tuple[str, ...]:
        """The states the operation went through, starting with its initial one."""
        moved = [s for s in self.steps if s.state_after != s.state_before]
        if not self.steps:
            return ()
        return (self.steps[0].state_before, *(s.state_after for s in moved))

    @property
    def ok(self) -> bool:
        """Whether the path, the commands and the audit chain are as expected."""
        return (
            self.path == self.expected_path
            and Counter(self.commands) == Counter(self.expected_commands)
            and self.audit_intact
            and self.audit_records > 0
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "scenario": self.scenario,
            "story": self.story,
            "operation_id": self.operation_id,
            "machine": self.machine,
            "state": self.state,
            "path": list(self.path),
            "expected_path": list(self.expected_path),
            "decisions": [
                {
                    "event": s.event_type,
                    "from": s.state_before,
                    "to": s.state_after,
                    "outcome": s.outcome,
                    "timer": s.timer,
                }
                for s in self.steps
            ],
            "commands": sorted(self.commands),
            "expected_commands": sorted(self.expected_commands),
            "audit": {
                "records": self.audit_records,
                "intact": self.audit_intact,
                "chain": self.audit_chain,
            },
            "ok": self.ok,
        }


@dataclass(slots=True)
class DemoReport:
    """The demo's outcome; `ok` only if every operation matched and nothing failed."""

    run_id: str
    operations: list[OperationReport]
    elapsed_seconds: float = 0.0
    timed_out: bool = False
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Everything matched."""
        return not self.timed_out and not self.failures and all(o.ok for o in self.operations)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok,
            "run_id": self.run_id,
            "elapsed_seconds": round(self.elapsed_seconds, 2),
            "timed_out": self.timed_out,
            "failures": self.failures,
            "operations": [o.to_dict() for o in self.operations],
        }


@dataclass(frozen=True, slots=True)
class _Live:
    scenario: Scenario
    operation_id: str
    machine: Machine
    lineage: Lineage


def run_demo(
    services: Services,
    progress: TextIO,
    *,
    topics: TopicNames | None = None,
    timeout: float = 120.0,
    partitions: int = 3,
) -> DemoReport:
    """Provision, start the runtime and the worker, play the incident, wait (at most
    `timeout` seconds), stop everything and report. Raises `DemoError` when the demo
    cannot start."""
    names = topics or TopicNames.from_env()
    run_id = uuid.uuid4().hex[:6]
    _check_policy_key()
    say = _Progress(progress)
    say.line(f"ledger: roles and migrations on {redact_url(services.database_url)}")
    report_m = ensure_roles(services.database_url).migrations
    say.line(f"ledger: {len(report_m.applied)} migration(s) applied, now at {report_m.current}")
    # The controller and the relay connect as their login roles (docs/ledger.md, Roles);
    # the demo itself keeps the administrative URL to read back what happened.
    services = replace(
        services,
        controller_url=services.controller_url
        or with_user(services.database_url, LOGIN_ROLES["controller"]),
        relay_url=services.relay_url or with_user(services.database_url, LOGIN_ROLES["relay"]),
    )
    # Each component connects as its own Kafka principal (docs/operations.md, "Kafka
    # security"): admin provisions, tools and the approver publish as `tool`, the worker
    # as `worker`, the controller and the relay as themselves.
    admin = services.kafka_for("admin")
    say.line(f"kafka: {services.bootstrap} ({admin.describe()})")
    for result in provision(services.bootstrap, partitions, names=names, security=admin):
        say.line(f"topic {result.name}: {'created' if result.created else 'exists'}")
    acls = provision_acls(services.bootstrap, names, security=admin)
    say.line(
        f"kafka ACLs: {len(acls.entries)} bindings, one principal per component"
        if acls.enabled
        else "kafka ACLs: none, the broker has no authorizer (plaintext)"
    )
    machines = _machines()
    stop = threading.Event()
    # The stack's own controller key (generated once, 0600), unless one is set; the
    # demo's worker verifies every command against its public key.
    key_file = IdentitySettings.load().controller_key_file or stack_key("controller")
    signers = demo_signers()
    runtime = run_roles(
        ("controller", "relay"),
        services,
        stop,
        topics=names,
        controller_overrides={
            "policy_path": DEMO_POLICY,
            # Demo mode: the demo's approver key is derived from a public name, which
            # the controller refuses anywhere else (docs/controller.md).
            "demo_mode": True,
            # Stable groups: a demo run on a reused stack resumes where the last one
            # stopped instead of replaying every earlier run's events and commands.
            "group_id": "recovery-controller-demo",
            "instance_id": f"controller-demo-{run_id}",
            "signing_key_file": key_file,
            # The demo's producers, with keys the stack generated (0600, never
            # public-name keys): the controller authenticates every event they sign.
            "roster_path": demo_roster(signers),
        },
    )
    worker = _start_worker(runtime, services, names, controller_roster(key_file), signers[_WORKER])
    say.line("controller, relay and capability worker started")
    ledger = PostgresLedger(services.database_url, max_size=2)
    started = time.monotonic()
    try:
        # Playing before the worker has its partitions would let its `latest` start
        # skip this run's first commands.
        if not worker.assigned.wait(timeout=60):
            raise DemoError("the demo's capability worker got no partitions within 60 s")
        live = [_live(s, run_id, machines) for s in SCENARIOS]
        report = DemoReport(run_id, [_blank(item) for item in live])
        tools = services.kafka_for("tool")
        tool_and_approver = {n: signers[n] for n in (_TOOL, APPROVER)}
        # The demo's producers are in its own roster, never a shell's RECOVERY_ROSTER_FILE.
        with EventPublisher(
            services.bootstrap,
            signer=tool_and_approver,
            topics=names,
            security=tools,
            roster=None,
        ) as publisher:
            _play(live, ledger, publisher, runtime, say, started + timeout, report)
        report.elapsed_seconds = time.monotonic() - started
        _read_back(ledger, services, names, live, report)
    finally:
        stop.set()
        runtime.join(timeout=60.0)
        ledger.close()
    report.failures.extend(f"runtime role {name} failed" for name in runtime.failures)
    return report


# What each demo producer may report: the tool reports the demo's operations, the worker
# executes and verifies their commands, the approver publishes signed decisions.
_DEMO_GRANTS: Final[Mapping[str, tuple[Grant, ...]]] = {
    _TOOL: (
        Grant(
            role=Role.TOOL, capabilities=(ANY,), tools=(ANY,), environments=(ANY,), agents=(ANY,)
        ),
        # It also plays the research orchestrator, reporting the sub-task's contained
        # ancestor.
        Grant(role=Role.ORCHESTRATOR, agents=(ANY,)),
    ),
    _WORKER: (
        Grant(role=Role.WORKER, capabilities=(ANY,)),
        Grant(role=Role.VERIFIER, capabilities=(ANY,)),
    ),
    APPROVER: (Grant(role=Role.APPROVER),),
}


def demo_signers(directory: Path | None = None) -> dict[str, RecordSigner]:
    """The demo producers' record signers, with the stack's keys (`ops.keys.stack_key`:
    generated once, mode 0600). The approver's *decision* key is a separate, public-name
    test key (`machines.insecure_test_key`), as the demo policy says."""
    return {
        name: RecordSigner(name, load_private_key(stack_key(name, directory)))
        for name in _DEMO_GRANTS
    }


def demo_roster(signers: Mapping[str, RecordSigner], directory: Path | None = None) -> Path:
    """`<stack dir>/keys/demo-roster.json`: the demo producers with their public keys
    and grants, the roster file the demo's controller adds to the demo policy."""
    roster = Roster(
        producers=tuple(
            ProducerEntry(
                id=name,
                keys=(ProducerKey(public_key=public_key_text(s.private_key.public_key())),),
                grants=_DEMO_GRANTS[name],
            )
            for name, s in signers.items()
        )
    )
    path = stack_key(_TOOL, directory).parent / "demo-roster.json"
    path.write_text(roster.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return path


def _check_policy_key() -> None:
    policy = load_policy(DEMO_POLICY)
    entry = policy.approver(APPROVER)
    expected = public_key_b64(insecure_test_key(APPROVER))
    if entry is None or entry.public_key != expected:
        raise DemoError(
            f"{DEMO_POLICY}: approver {APPROVER} must have the test key {expected}; "
            "restore the file"
        )


def _machines() -> dict[str, Machine]:
    registry = load_registry(DEFAULT_REGISTRY)
    folder = DEFAULT_REGISTRY.parent
    pinned = load_locked_machines(
        folder / "machines.lock",
        registry,
        load_trusted_publishers(folder / "trusted-publishers.yaml"),
    )
    return {m.name: m for m in pinned.values()}


def _live(scenario: Scenario, run_id: str, machines: Mapping[str, Machine]) -> _Live:
    op = operation_id_for(scenario, run_id)
    parent = (
        None
        if scenario.parent is None
        else operation_id_for(next(s for s in SCENARIOS if s.name == scenario.parent), run_id)
    )
    lineage = Lineage(
        agent=scenario.agent,
        task=f"incident-{run_id}:{scenario.name}",
        initiating_principal="oncall-sam",
        origin_operation=parent,
        parent_operation=parent,
    )
    return _Live(scenario, op, machines[scenario.machine], lineage)


def _blank(item: _Live) -> OperationReport:
    s = item.scenario
    return OperationReport(
        s.name, s.story, item.operation_id, item.machine.name, s.path, s.commands
    )


def _start_worker(
    runtime: Runtime, services: Services, names: TopicNames, roster: Roster, signer: RecordSigner
) -> CapabilityWorker:
    security = services.kafka_for("worker")
    publisher = EventPublisher(
        services.bootstrap, signer=signer, topics=names, security=security, roster=None
    )
    runtime.closers.append(publisher.close)
    # The demo worker's own execution record, kept with the stack's state, so a demo on
    # a reused stack never runs a command of an earlier run again.
    store = ExecutionStore(WorkerSettings.load().store or stack_dir() / "worker" / "demo.sqlite")
    runtime.closers.append(store.close)
    worker = CapabilityWorker(
        services.bootstrap,
        "recovery-worker-demo",  # its principal may use groups recovery-worker*
        RecoveryClient(publisher, _WORKER),
        DEMO_HANDLERS,
        topics=names,
        security=security,
        roster=roster,
        store=store,
        start="latest",  # a new group ignores earlier runs' commands
    )
    runtime.start("capability-worker", worker.run)
    return worker


class _Progress:
    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._start = time.monotonic()

    def line(self, text: str) -> None:
        self._out.write(f"[{time.monotonic() - self._start:6.1f}s] {text}\n")
        self._out.flush()


def _play(
    live: list[_Live],
    ledger: Ledger,
    publisher: EventPublisher,
    runtime: Runtime,
    say: _Progress,
    deadline: float,
    report: DemoReport,
) -> None:
    """Publish first events, react to states, until all are final or the deadline."""
    tool = RecoveryClient(publisher, _TOOL)
    approver = RecoveryClient(publisher, APPROVER)
    states: dict[str, str | None] = {item.scenario.name: None for item in live}
    done: set[tuple[str, str]] = set()
    for item in live:
        if item.scenario.parent is None:
            _tool_event(tool, item, item.scenario.first_event, facts=item.scenario.facts)
            say.line(f"{item.scenario.name}: tool reports {item.scenario.first_event}")
    publisher.flush()
    while time.monotonic() < deadline:
        if runtime.failures:
            report.failures.append(f"roles failed: {', '.join(runtime.failures)}")
            return
        for item in live:
            name = item.scenario.name
            state = _state(ledger, item.operation_id)
            if state != states[name]:
                say.line(f"{name}: {states[name] or '-'} -> {state}")
                states[name] = state
            _react(item, state, states, tool, approver, ledger, done, say)
        publisher.flush()
        if all(states[i.scenario.name] == i.scenario.final_state for i in live):
            return
        time.sleep(0.2)
    report.timed_out = True
    waiting = [f"{n} ({s})" for n, s in states.items()]
    say.line(f"timed out waiting; states: {', '.join(waiting)}")


def _react(
    item: _Live,
    state: str | None,
    states: Mapping[str, str | None],
    tool: RecoveryClient,
    approver: RecoveryClient,
    ledger: Ledger,
    done: set[tuple[str, str]],
    say: _Progress,
) -> None:
    scenario = item.scenario
    if state is None and scenario.parent is not None:
        parent = next(s for s in SCENARIOS if s.name == scenario.parent)
        if states.get(parent.name) == parent.final_state and (scenario.name, "") not in done:
            done.add((scenario.name, ""))
            _tool_event(
                tool,
                item,
                scenario.first_event,
                EvidencePayload(ancestor_operation=item.lineage.parent_operation),
            )
            say.line(f"{scenario.name}: orchestrator reports {scenario.first_event}")
        return
    for reaction in scenario.reactions:
        key = (scenario.name, reaction.when)
        if reaction.when != state or key in done:
            continue
        done.add(key)
        if reaction.kind == "report":
            _tool_event(tool, item, reaction.event_type)
            say.line(f"{scenario.name}: tool reports {reaction.event_type}")
            continue
        info = ledger.operation(item.operation_id)
        # What the approver reviewed: the operation as the ledger holds it now (the
        # review packet shows this digest; the controller recomputes it on arrival).
        reviewed = ledger.load_views([item.operation_id])[item.operation_id]
        approver.publish_human_decision(
            reviewed_digest=review_digest(reviewed, reaction.target, datetime.now(UTC)),
            private_key=insecure_test_key(APPROVER),
            verdict="approved" if reaction.kind == "approve" else "rejected",
            operation_id=item.operation_id,
            correlation_id=info.correlation_id,
            machine_name=item.machine.name,
            machine_version=item.machine.version,
            machine_digest=info.machine_digest,
            state=state,
            transition=reaction.target,
            lineage=item.lineage,
            expires_at=datetime.now(UTC) + timedelta(minutes=30),
        )
        say.line(f"{scenario.name}: {APPROVER} signs '{reaction.kind}' toward {reaction.target}")


def _tool_event(
    tool: RecoveryClient,
    item: _Live,
    event_type: str,
    evidence: EvidencePayload | None = None,
    *,
    facts: DeclaredFacts | None = None,
) -> None:
    tool.publish_event(
        event_type,
        operation_id=item.operation_id,
        correlation_id=f"incident-{item.lineage.task.split(':')[0]}",
        machine_name=item.machine.name,
        machine_version=item.machine.version,
        lineage=item.lineage,
        evidence_ref=f"{_TOOL}:{item.operation_id}:{event_type.lower()}",
        evidence=evidence,
        facts=facts,
        scope=item.scenario.scope,
    )


def _state(ledger: Ledger, operation_id: str) -> str | None:
    try:
        return ledger.operation(operation_id).state
    except UnknownOperation:
        return None


def _read_back(
    ledger: Ledger, services: Services, names: TopicNames, live: list[_Live], report: DemoReport
) -> None:
    """Fill each operation's report from the ledger and the commands topic."""
    by_op = {o.operation_id: o for o in report.operations}
    expected = sum(len(o.expected_commands) for o in report.operations)
    commands = read_commands(
        services.bootstrap,
        names.commands,
        keep=lambda c: c.operation_id in by_op,
        expected=expected,
        security=services.kafka_for("admin"),  # an operator's check, in a throwaway group
    )
    for command in commands:
        by_op[command.operation_id].commands.append(command.capability)
    for item in live:
        entry = by_op[item.operation_id]
        entry.state = _state(ledger, item.operation_id)
        entry.steps = [
            Step(
                str(d.get("event_type") or (d.get("event") or {}).get("type")),
                str(d["state_before"]),
                str(d["state_after"]),
                str(d["outcome"]),
                is_timer_event(str((d.get("event") or {}).get("id", ""))),
            )
            for d in ledger.decisions(item.operation_id)
        ]
        records, _head = ledger.audit_chain(item.operation_id)
        entry.audit_records = len(records)
        entry.audit_chain = [_audited(r.kind, r.record) for r in records]
        entry.audit_intact = not ledger.verify_audit(item.operation_id)


def _audited(kind: str, body: Mapping[str, Any]) -> str:
    """An audit record as the demo names it: a decision by its event type (a timer's
    marked), anything else by its kind."""
    event = body.get("event") if kind == "decision" else None
    if not isinstance(event, Mapping):
        return kind
    timer = " (timer)" if is_timer_event(str(event.get("id", ""))) else ""
    return f"{event.get('type')}{timer}"
