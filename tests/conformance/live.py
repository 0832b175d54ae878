"""Running one catalogue case through the real system: the case's events published on
Kafka with the client library, a real `consumer.Controller` deciding them into
PostgreSQL under the case's own policy and guard faults, and the outbox relay publishing
the commands and audit records. What came out is collected for the tests to compare
with the case file's expectations.

The events are built by the case runner itself (`machines.casefile._Runner`), so the
envelope on the wire is exactly the one `recoveryctl test` decides; the runner's
in-memory simulation is fed alongside only so that an approval signed "in the current
state" binds the state the case means. The controller's clock is set to each step's
case time before its event is published, and the next step waits until the ledger has
stored the consumer offset past it, so the steps are decided one at a time, in order,
at the times the case states. Timers fire as time passes: before each step, the driver
moves the controller's clock to the due time of each timer the in-memory run fired
(in order), and waits until the controller fired it, through the outbox and the events
topic, and decided it; an `advance` step publishes nothing else.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from consumer import Controller, ControllerSettings
from ledger import Ledger
from ledger.outbox_watch import OutboxWatch
from machines import Decision, Machine, Registry, Roster, Rules
from machines.casefile import CaseSpec, ExpectSpec, StepSpec, _Runner, faulted
from machines.event import Event, Lineage
from producers import EventPublisher
from producers.relay import OutboxRelay
from schemas import HEADER_RECORD_ID, TopicNames, header_value, kafka_config
from tests.support.producers import signers, verifiers_only, with_roster

PARTITION = 0


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step: what the case expects, the event published (for an `advance` step, the
    last timer's), the decision the controller stored for it (None when it stored none:
    a redelivered event), and the event types of the timers that fired before it."""

    index: int
    expect: ExpectSpec
    event: Event
    stored: Mapping[str, Any] | None
    simulated_outcome: str
    simulated: Mapping[str, Any]  # `actual_of` the in-memory runner's decision
    fired: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LiveRun:
    """Everything one case produced through the real system."""

    case: CaseSpec
    steps: tuple[StepResult, ...]
    decisions: tuple[Mapping[str, Any], ...]  # every stored decision of the operations


@dataclass
class _Clock:
    """The controller's clock, moved by the driver to each step's case time."""

    now: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self) -> datetime:
        with self.lock:
            return self.now

    def set(self, now: datetime) -> None:
        with self.lock:
            self.now = now


def wire_case(case: CaseSpec) -> CaseSpec:
    """`case` with its declared opening facts carried on its first event's `facts`
    block: the only way a tool declares facts over the wire (the in-memory runner opens
    the operation with them; the controller opens it from its first event, which admits
    the block through the same `machines.facts.declare`)."""
    first = case.steps[0]
    if "facts" not in case.operation.model_fields_set or first.facts is not None:
        return case
    if first.replay is not None:
        return case
    moved: StepSpec = first.model_copy(update={"facts": case.operation.facts})
    return case.model_copy(update={"steps": (moved, *case.steps[1:])})


def with_parent(case: CaseSpec) -> CaseSpec:
    """`case` with its operation below a parent operation when the case states lineage
    agents. On the wire an operation's lineage agents are not declared: the controller
    derives them from the stored parent chain (`Ledger.arrival_lineage`), so the driver
    opens one parent operation, run by the case's nearest lineage agent, before the case.
    A case that names its parent operation is left as it is: that parent is one this
    ledger has not seen (another deployment's, or reported later), which is what its
    steps rely on: an ancestor the ledger does not know stays contained once an
    `ANCESTOR_CONTAINED` event names it (`machines.with_lineage`), where a known,
    uncontained parent would release the resume gate."""
    op = case.operation
    if not op.lineage_agents or op.parent_operation is not None:
        return case
    if len(op.lineage_agents) > 1:
        raise AssertionError(f"case {case.name}: only one lineage level can be driven live")
    parent = f"{op.id}-parent"
    update = {"parent_operation": parent, "origin_operation": op.origin_operation or parent}
    return case.model_copy(update={"operation": op.model_copy(update=update)})


def parent_event(case: CaseSpec, machine: Machine, first: Event) -> Event:
    """The event that opens the case's parent operation, about the lineage agent: an
    event of the machine that its initial state does not accept, bare (no evidence,
    approval, facts or classifier), so the parent is opened, rejected and left in its
    initial state: it neither invokes anything nor cascades into the case."""
    op = case.operation
    assert op.parent_operation is not None
    accepted = set(machine.states[machine.initial].on)
    others = sorted({e for st in machine.states.values() for e in st.on} - accepted)
    assert others, f"machine {machine.name}: every event is accepted in its initial state"
    return replace(
        first,
        event_type=others[0],
        event_id=f"{op.parent_operation}-opening",
        operation_id=op.parent_operation,
        correlation_id=f"{op.correlation_id}-parent",
        evidence_ref=f"evidence://{op.parent_operation}/opening",
        producer="tool-integration",
        lineage=Lineage(
            agent=op.lineage_agents[0], task=f"{op.task}-parent", initiating_principal=op.principal
        ),
        evidence=None,
        human_decision=None,
        classifier=None,
        causation=None,
        facts=None,
    )


def _settings(bootstrap: str, database_url: str, topics: TopicNames) -> ControllerSettings:
    return ControllerSettings(
        bootstrap=bootstrap,
        database_url=database_url,
        group_id=f"conformance-{uuid.uuid4().hex[:8]}",
        instance_id=f"controller-{uuid.uuid4().hex[:6]}",
        topics=topics,
        batch_max_records=50,
        batch_max_wait_ms=20,
        # Timers fire as soon as the driver's clock makes them due.
        timer_poll_ms=20,
        session_timeout_ms=6000,
        backoff_initial_ms=50,
        backoff_max_ms=500,
    )


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def run_live(
    case: CaseSpec,
    machine: Machine,
    registry: Registry,
    locked: Mapping[str, Machine],
    *,
    bootstrap: str,
    database_url: str,
    topics: TopicNames,
    ledger: Ledger,
) -> LiveRun:
    """Drive every step of `case` through a controller of its own (the case's policy,
    registry with its guard faults) on `topics` and `ledger`, with the outbox relay
    running alongside, until the outbox is drained. Raises `AssertionError` when the
    controller fails or stalls."""
    spec = case.operation
    opens_parent = spec.parent_operation is None and bool(spec.lineage_agents)
    case = with_parent(wire_case(case))
    runner = _Runner(case, machine, registry)
    faulty_registry, table = faulted(registry, case.guard_faults)
    # The live controller authenticates the case's producers: the test roster, in which
    # only the case's trusted verifiers hold the verifier role.
    rules = Rules(
        policy=with_roster(runner.policy, live_roster(runner.policy.trusted_verifiers)),
        registry=faulty_registry,
        guard_table=table,
    )
    settings = _settings(bootstrap, database_url, topics)
    clock = _Clock()
    controller = Controller(settings, ledger, machines=locked, rules=rules, clock=clock)
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            controller.run(stop)
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=target, name=settings.instance_id, daemon=True)
    thread.start()
    # The relay runs alongside, as in production: it must keep up with the decisions.
    relay = OutboxRelay(ledger, bootstrap, database_url=database_url, topics=topics)
    relay_thread = threading.Thread(
        target=lambda: relay.run(stop), name=f"relay-{settings.instance_id}", daemon=True
    )
    relay_thread.start()
    publisher = EventPublisher(bootstrap, signer=signers(), topics=topics)
    operations = [case.operation.id, *(o.id for o in case.operations)]
    steps: list[StepResult] = []
    try:
        _wait(lambda: bool(controller.owned) or bool(errors), 30, "partition assignment")
        published = 0

        def decided(n: int, what: str) -> None:
            _wait(
                lambda: (
                    ledger.offsets(settings.group_id, topics.events).get(PARTITION, 0) >= n
                    or bool(errors)
                ),
                30,
                f"case {case.name} {what} to be decided",
            )
            assert not errors, errors

        for index, step in enumerate(case.steps, start=1):
            now = runner.tick(step)
            fired = runner.sim.advance(now)
            earlier = {o: len(ledger.decisions(o)) for o in operations}
            for timer in fired:
                # Each timer at its due time, as the in-memory run decided it.
                clock.set(timer.decided_at)
                published += 1
                decided(published, f"step {index}: timer {timer.event_id}")
            # What the controller decided for them. Their ids may differ from the
            # in-memory run's (a timer's id names the version it was armed at, and the
            # live controller records no decision for an event intake refused).
            timed = sorted(
                (
                    d
                    for o in operations
                    for d in ledger.decisions(o)[earlier[o] :]
                    if d["event"]["id"].startswith("timer:")
                ),
                key=lambda d: str(d["decided_at"]),
            )
            names = tuple(str(d["event"]["type"]) for d in timed)
            if step.advance is not None and step.event is None and step.replay is None:
                if fired:
                    last = fired[-1]
                    stored = timed[-1] if timed else None
                    steps.append(
                        StepResult(
                            index,
                            step.expect,
                            _timer_event(
                                ledger, str(stored["operation_id"]), str(stored["event"]["id"])
                            )
                            if stored
                            else _sim_event(last),
                            stored,
                            str(last.outcome),
                            actual_of(last.to_dict()),
                            names,
                        )
                    )
                continue
            event = runner.event_for(index, step)
            simulated = runner.sim.feed(event, now)
            if index == 1 and opens_parent:
                # Decided and committed before the case's first event, so that the child
                # arrives below a stored parent (a parent in the same batch is not yet
                # stored when the batch reads arrival lineage).
                clock.set(now)
                publisher.publish(parent_event(case, machine, event))
                publisher.flush(30)
                published += 1
                _wait(
                    lambda: (
                        ledger.offsets(settings.group_id, topics.events).get(PARTITION, 0) >= 1
                        or bool(errors)
                    ),
                    30,
                    f"case {case.name}: the parent operation to be opened",
                )
            op = event.operation_id
            before = len(ledger.decisions(op))
            clock.set(now)
            publisher.publish(event)
            publisher.flush(30)
            published += 1
            decided(published, f"step {index}")
            stored = ledger.decisions(op)[before:]
            assert len(stored) <= 1, f"step {index} stored {len(stored)} decisions"
            steps.append(
                StepResult(
                    index,
                    step.expect,
                    event,
                    stored[0] if stored else None,
                    str(simulated.outcome),
                    actual_of(simulated.to_dict()),
                    names,
                )
            )
        with OutboxWatch(database_url) as watch:
            _wait(lambda: watch.backlog() == 0, 30, f"case {case.name}: the outbox to drain")
    finally:
        publisher.close(30)
        stop.set()
        thread.join(30)
        relay_thread.join(30)
    assert not thread.is_alive(), f"the controller of case {case.name} did not stop"
    assert not relay_thread.is_alive(), f"the relay of case {case.name} did not stop"
    assert not errors, errors
    decisions = tuple(d for op in operations for d in ledger.decisions(op))
    return LiveRun(case, tuple(steps), decisions)


def _timer_event(ledger: Ledger, op: str, event_id: str) -> Event:
    """A timer's event as the controller decided it (what an `advance` step reports)."""
    stored = next(d for d in ledger.decisions(op) if d["event"]["id"] == event_id)
    info = ledger.operation(op)
    return Event(
        event_type=stored["event"]["type"],
        event_id=event_id,
        operation_id=op,
        correlation_id=info.correlation_id,
        machine_name=info.machine_name,
        machine_version=info.machine_version,
        event_time=datetime.fromisoformat(stored["event"]["time"]),
        evidence_ref=stored["event"]["evidence_ref"],
        producer=stored["event"]["producer"],
        lineage=info.lineage,
    )


def _sim_event(decision: Decision) -> Event:
    """The in-memory run's timer event, for a step whose timer the controller missed."""
    return Event(
        event_type=decision.event_type,
        event_id=decision.event_id,
        operation_id=decision.operation_id,
        correlation_id=decision.correlation_id,
        machine_name=decision.machine_name,
        machine_version=decision.machine_version,
        event_time=decision.event_time,
        evidence_ref=decision.evidence_ref,
        producer=decision.producer,
        lineage=Lineage(agent="-", task="-", initiating_principal="-"),
    )


def actual_of(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored decision's fields in the shape `ExpectSpec` names them (the same fields
    `machines.casefile.compare` reads from a `Decision`)."""
    return {
        "outcome": stored["outcome"],
        "state": stored["state_after"],
        "invocations": [i["capability"] for i in stored["invocations"]],
        "refusals": [n["code"] for n in stored["refusals"]],
        "errors": [n["code"] for n in stored["errors"]],
        "approval_consumed": stored["approval"]["consumed"],
        "guards": {g["guard"]: g["value"] for g in stored["guards"]},
    }


def mismatches(expect: ExpectSpec, actual: Mapping[str, Any]) -> list[str]:
    """Every way `actual` differs from `expect` (fields the case leaves out are not
    checked), one line each."""
    out: list[str] = []
    for name in ("outcome", "state", "invocations", "refusals", "errors", "approval_consumed"):
        want = getattr(expect, name)
        if want is None:
            continue
        want = list(want) if isinstance(want, tuple) else want
        if want != actual[name]:
            out.append(f"{name}: expected {want!r}, got {actual[name]!r}")
    for guard, value in (expect.guards or {}).items():
        got = actual["guards"].get(guard)
        if got != value:
            out.append(f"guards.{guard}: expected {value!r}, got {got!r}")
    return out


def command_ids(decisions: Sequence[Mapping[str, Any]]) -> set[str]:
    """The command ids every stored decision asked for."""
    return {i["command_id"] for d in decisions for i in d["invocations"]}


@dataclass(frozen=True, slots=True)
class Published:
    """One record read back from an output topic."""

    record_id: str | None
    headers: Mapping[str, str]
    value: bytes


def read_until(
    bootstrap: str, topic: str, wanted: set[str], *, at_least: int = 0, timeout: float = 15.0
) -> list[Published]:
    """Every record of the single-partition `topic` from the start, read until each
    record id in `wanted` and at least `at_least` records have been seen (or `timeout`:
    the caller then names what is missing). Waiting for known ids, not for a quiet
    second, keeps the module fast."""
    consumer = Consumer(
        {
            **kafka_config(bootstrap),
            "group.id": f"conformance-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, PARTITION, 0)])
        seen: list[Published] = []
        ids: set[str] = set()
        deadline = time.monotonic() + timeout
        while not (wanted <= ids and len(seen) >= at_least) and time.monotonic() < deadline:
            for m in consumer.consume(500, 0.1):
                if m.error() is not None:
                    continue
                pairs: list[tuple[str, bytes | None]] = [
                    (str(k), v.encode() if isinstance(v, str) else v)
                    for k, v in list(m.headers() or [])
                ]
                rid = header_value(pairs, HEADER_RECORD_ID)
                if rid is not None:
                    ids.add(rid)
                seen.append(
                    Published(rid, {k: (v or b"").decode() for k, v in pairs}, m.value() or b"")
                )
        return seen
    finally:
        consumer.close()


def live_roster(trusted: tuple[str, ...]) -> Roster:
    """The roster a case's live controller runs with (see `verifiers_only`)."""
    return verifiers_only(trusted)
