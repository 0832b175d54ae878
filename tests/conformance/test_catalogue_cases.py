"""Every catalogue case end to end (CONFORMANCE's thirteen scenarios through the real
broker and server): each case's events go on Kafka, a real controller decides them into
PostgreSQL, the relay publishes the outbox, and every step's expectation is checked
against the decision the ledger stored; every command asked for is read back from the
commands topic, every decision's audit record from the audit topic, and the audit chain
verifies. A failing test is named by its case and lists the case's scenarios."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer import ControllerSettings, load_rules
from ledger import PostgresLedger
from machines import DEFAULT_REGISTRY, Event, Machine, load_machine, load_registry
from machines.casefile import SCENARIOS, CaseSpec, case_policy, discover, load_case
from schemas import (
    CAPABILITY_COMMAND,
    HEADER_COMMAND_ID,
    AvroSingleObjectCodec,
    CapabilityCommand,
    TopicNames,
)
from tests.conformance.live import (
    actual_of,
    command_ids,
    live_roster,
    mismatches,
    read_until,
    run_live,
)
from tests.support.kafka import TopicFactory
from tests.support.producers import lacks_role

pytestmark = pytest.mark.integration

CATALOGUE = Path(__file__).resolve().parents[2] / "machines" / "catalogue"
CASES: list[tuple[Path, Path]] = discover([CATALOGUE])


def _case_id(pair: tuple[Path, Path]) -> str:
    return f"{pair[0].name}/{pair[1].stem}"


@pytest.fixture(scope="module")
def locked() -> dict[str, Machine]:
    """The machines the controller runs: pinned by the lock file, signatures checked."""
    settings = ControllerSettings(
        bootstrap="unused:9092", database_url="postgresql:///unused", demo_mode=True
    )
    machines, _ = load_rules(settings)
    return machines


@pytest.fixture
def ledger(database_url: str) -> Iterator[PostgresLedger]:
    ledger = PostgresLedger(database_url, max_size=4)
    yield ledger
    ledger.close()


def test_the_cases_cover_every_conformance_scenario() -> None:
    named = {s for _, path in CASES for s in load_case(path).scenario}
    assert sorted(set(SCENARIOS) - named) == []
    assert len(SCENARIOS) == 13


def claims_another_identity(event: Event) -> bool:
    """Whether `event` names a verifier, approver or checkpoint validator other than its
    producer: the live controller refuses it at intake (`identity-mismatch`) before the
    core, which refuses it too, ever sees it."""
    evidence, decision = event.evidence, event.human_decision
    checkpoint = evidence.checkpoint if evidence is not None else None
    return (
        (evidence is not None and evidence.verifier not in (None, event.producer))
        or (decision is not None and decision.approver != event.producer)
        or (
            checkpoint is not None
            and checkpoint.validated
            and checkpoint.validator not in (None, event.producer)
        )
    )


def _unrecorded(
    label: str,
    expected: str | None,
    simulated: str,
    event: Event | None = None,
    trusted: tuple[str, ...] = (),
) -> list[str]:
    """The ledger stores no decision for a redelivered event (recorded once: SPEC §7
    idempotency), for an event id reused with another payload (dead-lettered with a
    `conflict` audit record, checked below), nor for an event refused at intake because
    it claims another producer's identity or its producer lacks the role, where the case
    expects it refused. Any other
    unrecorded step is a failure."""
    if simulated in ("duplicate", "conflict") and expected in (None, simulated):
        return []
    if (
        event is not None
        and expected in ("refused", "rejected")
        and (
            claims_another_identity(event)
            or lacks_role(event.producer, event.event_type, live_roster(trusted))
        )
    ):
        return []
    return [f"{label}: the controller stored no decision (case expects {expected})"]


def _describe(case: CaseSpec) -> str:
    return f"case {case.name} ({'; '.join(case.scenario)})"


@pytest.mark.parametrize("pair", CASES, ids=_case_id)
def test_case_runs_end_to_end_through_controller_and_relay(
    pair: tuple[Path, Path],
    locked: dict[str, Machine],
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: PostgresLedger,
) -> None:
    package, path = pair
    registry = load_registry(DEFAULT_REGISTRY)
    machine = load_machine(package, registry)
    assert locked[f"{machine.name}@{machine.version}"].digest == machine.digest, (
        f"{machine.name} is not the pinned one"
    )
    case = load_case(path)
    what = _describe(case)
    topics = TopicNames(
        events=topic_factory(),
        commands=topic_factory(),
        evidence=topic_factory(),
        audit=topic_factory(),
        dlq=topic_factory(),
    )
    run = run_live(
        case,
        machine,
        registry,
        locked,
        bootstrap=kafka_bootstrap,
        database_url=database_url,
        topics=topics,
        ledger=ledger,
    )

    problems: list[str] = []
    trusted = case_policy(case, registry).trusted_verifiers
    for step in run.steps:
        label = f"step {step.index} {step.event.event_type} {step.event.event_id}"
        if step.stored is None:
            problems.extend(
                _unrecorded(
                    label,
                    step.expect.outcome,
                    step.simulated_outcome,
                    step.event,
                    trusted,
                )
            )
            continue
        live = actual_of(step.stored)
        problems.extend(f"{label}: {m}" for m in mismatches(step.expect, live))
        if step.expect.fired is not None and list(step.expect.fired) != list(step.fired):
            problems.append(
                f"{label}: timers fired {list(step.fired)}, expected {step.expect.fired}"
            )
        # Beyond what the case states: the live decision is the pure core's decision.
        problems.extend(
            f"{label}: live {key} {live[key]!r} differs from the in-memory run's "
            f"{step.simulated[key]!r}"
            for key in ("outcome", "state", "invocations", "refusals", "errors", "guards")
            if live[key] != step.simulated[key]
        )
    assert not problems, f"{what}:\n" + "\n".join(problems)

    wanted = command_ids(run.decisions)
    commands = read_until(kafka_bootstrap, topics.commands, wanted)
    codec = AvroSingleObjectCodec()
    seen: set[str] = set()
    for record in commands:
        name, body = codec.decode(record.value)
        command = CapabilityCommand.from_record(body)
        assert name == CAPABILITY_COMMAND
        assert record.record_id == command.command_id == record.headers[HEADER_COMMAND_ID]
        seen.add(command.command_id)
    assert wanted <= seen, f"{what}: commands missing from the topic: {sorted(wanted - seen)}"

    chain = [r for o in (case.operation, *case.operations) for r in ledger.audit_chain(o.id)[0]]
    conflicts = sum(s.stored is None and s.simulated_outcome == "conflict" for s in run.steps)
    assert sum(r.kind == "event-conflict" for r in chain) == conflicts, f"{what}: conflict audit"
    if conflicts:
        dead = read_until(kafka_bootstrap, topics.dlq, set(), at_least=conflicts)
        assert len(dead) >= conflicts, f"{what}: the reused event id was not dead-lettered"
    # SPEC 10: every record of an operation's chain names its runtime (envelope v6).
    runtimes = {o.id: o.runtime for o in (case.operation, *case.operations)}
    opened = [r for r in chain if r.kind == "operation-opened"]
    assert [r.record["runtime"] for r in opened] == [runtimes[r.operation_id] for r in opened], what
    unnamed = [
        f"{r.operation_id}:{r.sequence}"
        for r in chain
        if r.kind != "operation-opened"
        and r.record["identity"]["runtime"] != runtimes[r.operation_id]
    ]
    assert not unnamed, f"{what}: audit records {unnamed} do not name the runtime"
    decision_hashes = {r.hash for r in chain if r.kind == "decision"}
    assert len(decision_hashes) == len(run.decisions), f"{what}: a decision has no audit record"
    audit_ids = {f"audit:{r.operation_id}:{r.sequence}" for r in chain}
    audit = read_until(kafka_bootstrap, topics.audit, audit_ids)
    published: set[str] = set()
    for record in audit:
        if record.headers.get("recovery-kind") == "chain-heads":
            continue  # the batch's signed heads (docs/ledger.md), not an audit record
        event = json.loads(record.value)
        if event.get("kind") == "chain-heads":
            continue  # the controller's signed chain heads, not an OCSF record
        assert event["class_uid"] == 6003, f"{what}: audit record is not OCSF API Activity"
        chain_hash = event["unmapped"]["recovery"]["chain"]["hash"]
        assert chain_hash == event["metadata"]["uid"]
        published.add(chain_hash)
    missing = decision_hashes - published
    assert not missing, f"{what}: {len(missing)} decision audit records not on the audit topic"
    assert ledger.verify_audit() == ()
