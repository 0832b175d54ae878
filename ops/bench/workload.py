"""The benchmark's workload: realistic recovery traffic over the pinned catalogue.

Each operation is a short story of 3-8 records, as tools, capability workers and a
human approver would publish them: a failure report (timeout, tool failure, duplicate,
authorization denial), the result of every verification, containment, retry or
compensation command the controller issues (causation = the command id, event id
`result:<command id>`, as `RecoveryClient.report_action_result` builds it), Ed25519-signed
approvals or rejections when the operation waits for a human, resume requests, and now
and then a redelivered duplicate, a forged approval or a record the controller must
dead-letter (undecodable bytes, a key that is not the operation id, an unknown machine).

The stories are not scripted: each operation is played through the decision core the
controller runs (`machines.Simulation`, which opens operations exactly as the
controller does), under the policy the controller is given, so every result event
answers a command the controller will really issue, and every record knows the ids of
the commands it will cause. Those ids (`<operation>:<sequence>:<index>`, deterministic
in the core) are how the runner matches a command on `recovery.commands` to the event
that caused it.

Records are encoded with the project's Avro codec and headers, keyed by operation id;
the producer's partitioner spreads the keys over the topic's partitions.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import (
    ANY,
    DEFAULT_REGISTRY,
    Decision,
    Event,
    EvidencePayload,
    Grant,
    HumanDecision,
    Lineage,
    Machine,
    Outcome,
    Policy,
    ProducerEntry,
    ProducerKey,
    Registry,
    Role,
    Roster,
    Simulation,
    insecure_test_key,
    load_locked_machines,
    load_policy,
    load_registry,
    load_trusted_publishers,
    matching_scope,
    public_key_text,
    review_digest,
    sign_decision,
)
from schemas import (
    CONTENT_TYPE,
    EVENT_ENVELOPE,
    HEADER_RECORD_ID,
    HEADER_SCHEMA,
    AvroSingleObjectCodec,
    RecordSigner,
    event_to_record,
    record_id,
)

__all__ = [
    "APPROVER",
    "BENCH_POLICY",
    "BenchRecord",
    "WorkloadSpec",
    "WorkloadStats",
    "bench_roster",
    "bench_roster_names",
    "bench_signer",
    "generate",
    "pinned_machines",
]

# The demo policy's trust (the catalogue's verifying workers, the test key of
# `approver-dana`, derived from a public name: test use only), with retries commanded
# at once: the pre-played stream cannot wait for a paced retry's timer.
BENCH_POLICY: Final = Path(__file__).resolve().parent / "bench_policy.yaml"
APPROVER: Final = "approver-dana"
_FORGER: Final = "mallory"
_WORKER: Final = "bench-worker"
_TOOL: Final = "bench-tool"
_BENCH_PRODUCERS: Final = (APPROVER, _FORGER, _WORKER, _TOOL)

# An agent each catalogue machine applies to (the demo's agents).
_AGENTS: Final[Mapping[str, str]] = {
    "procurement-request": "procurement-agent",
    "email-send": "mail-agent",
    "payment-refund": "billing-agent",
    "multistep-deployment": "deploy-agent",
    "delegated-research": "research-orchestrator",
}
# Failure reports that open an operation (ANCESTOR_CONTAINED needs an ancestor).
_OPENING: Final = frozenset(
    {"TOOL_TIMEOUT", "TOOL_FAILED", "STEP_FAILED", "DUPLICATE_DETECTED", "AUTHORIZATION_DENIED"}
)
# What a capability worker reports for a command of each kind: (success, failure).
_RESULTS: Final[Mapping[str, tuple[str, str]]] = {
    "stop": ("CONTAINMENT_SUCCEEDED", "CONTAINMENT_FAILED"),
    "retry": ("RETRY_SUCCEEDED", "RETRY_FAILED"),
    "compensate": ("COMPENSATION_SUCCEEDED", "COMPENSATION_FAILED"),
}
_MIN_EVENTS: Final = 3
_MAX_EVENTS: Final = 8


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """How much traffic and how dirty. Rates are per operation (duplicates, forged
    approvals) or per record (bad records)."""

    run_id: str
    phase: str
    events: int
    seed: int = 7
    duplicate_rate: float = 0.05
    forged_rate: float = 0.02
    bad_rate: float = 0.01
    # Operations whose records are interleaved round-robin in the stream, so one
    # operation's events are spread out as they would be in real traffic.
    interleave: int = 64


@dataclass(frozen=True, slots=True)
class BenchRecord:
    """One record to produce, already encoded. `commands` are the ids of the commands
    the controller will issue when it decides it (empty for most records)."""

    key: str
    value: bytes
    record_id: str
    content_type: str
    fingerprint: str | None
    kind: str  # event, duplicate, forged, bad-bytes, bad-key, bad-machine
    commands: tuple[str, ...] = ()
    producer: str = _TOOL

    def headers(self, topic: str | None = None) -> list[tuple[str, bytes | None]]:
        """The headers `producers.EventPublisher.send` gives the record (without a
        trace context), signed by its producer's bench key for `topic` when given, for
        benchmarks that hand records to the controller's intake without a broker."""
        found: list[tuple[str, bytes | None]] = [
            (CONTENT_TYPE, self.content_type.encode()),
            (HEADER_RECORD_ID, self.record_id.encode()),
        ]
        if self.fingerprint is not None:
            found.append((HEADER_SCHEMA, self.fingerprint.encode()))
        if topic is not None:
            found = bench_signer(self.producer).sign(topic, self.key.encode(), self.value, found)
        return found


_SIGNERS: dict[str, RecordSigner] = {}


def bench_signer(producer: str) -> RecordSigner:
    """The signer of bench producer `producer`, with a key generated for this process
    (never stored: the bench's controller gets the roster of `bench_roster`)."""
    found = _SIGNERS.get(producer)
    if found is None:
        found = _SIGNERS[producer] = RecordSigner(producer, Ed25519PrivateKey.generate())
    return found


def bench_roster_names() -> tuple[str, ...]:
    """Every producer the bench workload publishes as."""
    return _BENCH_PRODUCERS


def bench_roster(producers: tuple[str, ...] = ()) -> Roster:
    """Every bench producer (those signed for so far, and `producers`) with every role
    for any scope: the bench measures the checks, not a narrow grant table."""
    for name in (*_BENCH_PRODUCERS, *producers):
        bench_signer(name)
    grants = tuple(
        Grant(role=r, capabilities=(ANY,), tools=(ANY,), environments=(ANY,), agents=(ANY,))
        for r in Role
    )
    return Roster(
        producers=tuple(
            ProducerEntry(
                id=name,
                keys=(ProducerKey(public_key=public_key_text(s.private_key.public_key())),),
                grants=grants,
            )
            for name, s in sorted(_SIGNERS.items())
        )
    )


@dataclass(slots=True)
class WorkloadStats:
    """What a generated workload holds, by kind, machine and event type."""

    operations: int = 0
    records: int = 0
    commands: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    machines: Counter[str] = field(default_factory=Counter)
    event_types: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)

    @property
    def dead_letters(self) -> int:
        """Records the controller must dead-letter (bad records and forged approvals)."""
        return sum(n for k, n in self.kinds.items() if k.startswith("bad-") or k == "forged")


def pinned_machines() -> tuple[dict[str, Machine], Registry]:
    """The machines the controller pins (lock file, digests, publisher signatures) and
    the registry, loaded exactly as the controller loads them at start-up."""
    registry = load_registry(DEFAULT_REGISTRY)
    folder = Path(DEFAULT_REGISTRY).parent
    pinned = load_locked_machines(
        folder / "machines.lock",
        registry,
        load_trusted_publishers(folder / "trusted-publishers.yaml"),
    )
    return {m.name: m for m in pinned.values()}, registry


class _Story:
    """One operation being played through the core: its events so far, in order."""

    def __init__(self, op: str, machine: Machine, lineage: Lineage, correlation: str) -> None:
        self.op = op
        self.machine = machine
        self.lineage = lineage
        self.correlation = correlation
        self.records: list[BenchRecord] = []
        self.events = 0


class _Generator:
    def __init__(self, spec: WorkloadSpec, now: datetime) -> None:
        self.spec = spec
        self.now = now
        self.rng = random.Random(f"{spec.seed}:{spec.run_id}:{spec.phase}")
        self.machines, registry = pinned_machines()
        self.policy: Policy = load_policy(BENCH_POLICY)
        self.sims = {
            name: Simulation(m, registry, self.policy) for name, m in self.machines.items()
        }
        self.codec = AvroSingleObjectCodec()
        self.fingerprint = self.codec.fingerprint(EVENT_ENVELOPE)
        self.key = insecure_test_key(APPROVER)
        self.forger = insecure_test_key(_FORGER)
        self.stats = WorkloadStats()
        self.serial = 0

    # -- one operation -------------------------------------------------------------

    def story(self, index: int) -> _Story:
        name = sorted(self.machines)[index % len(self.machines)]
        machine = self.machines[name]
        op = f"bench-{self.spec.run_id}-{self.spec.phase}-{index}"
        lineage = Lineage(
            agent=_AGENTS.get(name, "bench-agent"),
            task=f"task-{op}",
            initiating_principal="oncall-bench",
        )
        story = _Story(op, machine, lineage, f"corr-{self.spec.run_id}-{index // 8}")
        self.stats.operations += 1
        self.stats.machines[name] += 1
        opening = sorted(_OPENING & set(machine.states[machine.initial].on))
        decision = self.emit(story, self.event(story, self.rng.choice(opening), _TOOL))
        while decision is not None and story.events < _MAX_EVENTS:
            follow = self.follow_up(story, decision)
            if follow is None:
                break
            decision = self.emit(story, follow)
        while story.events < _MIN_EVENTS:
            # A late report after the operation settled: decided `final`, no command.
            self.emit(story, self.event(story, "TOOL_FAILED", _TOOL))
        if self.rng.random() < self.spec.duplicate_rate:
            original = self.rng.choice([r for r in story.records if r.kind == "event"])
            self.add(story, _replace_kind(original, "duplicate"))
        return story

    def follow_up(self, story: _Story, decision: Decision) -> Event | None:
        """What the outside world publishes next, given the last decision."""
        by_kind = {i.kind: i for i in reversed(decision.invocations)}
        verify = by_kind.get("verify")
        if verify is not None:
            found = self.rng.random() < 0.5
            return self.event(
                story,
                "VERIFICATION_FOUND" if found else "VERIFICATION_NOT_FOUND",
                _WORKER,
                event_id=f"result:{verify.command_id}",
                causation=verify.command_id,
                evidence=EvidencePayload(
                    outcome="applied" if found else "not_applied",
                    verifier=_WORKER,
                    reference=f"bench-verifier:{verify.command_id}",
                ),
            )
        for kind, (ok, failed) in _RESULTS.items():
            command = by_kind.get(kind)
            if command is not None:
                succeeded = self.rng.random() < 0.9
                return self.event(
                    story,
                    ok if succeeded else failed,
                    _WORKER,
                    event_id=f"result:{command.command_id}",
                    causation=command.command_id,
                )
        return self.from_state(story, decision.state_after)

    def from_state(self, story: _Story, state: str) -> Event | None:
        accepted = story.machine.states[state].on
        if "RESUME_REQUESTED" in accepted and self.rng.random() < 0.7:
            return self.event(story, "RESUME_REQUESTED", _TOOL)
        if "HUMAN_APPROVED" in accepted or "HUMAN_REJECTED" in accepted:
            approve = "HUMAN_APPROVED" in accepted and (
                "HUMAN_REJECTED" not in accepted or self.rng.random() < 0.7
            )
            verdict = "HUMAN_APPROVED" if approve else "HUMAN_REJECTED"
            forged = self.rng.random() < self.spec.forged_rate
            return self.approval(story, state, verdict, accepted[verdict][0].target, forged)
        if "RESUME_REQUESTED" in accepted:
            return self.event(story, "RESUME_REQUESTED", _TOOL)
        if "STEP_COMPLETED" in accepted:
            return self.event(story, "STEP_COMPLETED", _TOOL)
        return None

    def approval(self, story: _Story, state: str, verdict: str, target: str, forged: bool) -> Event:
        nonce = f"{self.rng.getrandbits(128):032x}"
        # Reviewed on the operation as the controller will hold it (the simulation's).
        seen = self.sims[story.machine.name].views.get(story.op)
        reviewed = "" if seen is None else review_digest(seen, target, self.now)
        decision = sign_decision(
            HumanDecision(
                approver=APPROVER,
                operation_id=story.op,
                state=state,
                transition=target,
                machine_digest=story.machine.digest,
                expires_at=self.now + timedelta(days=1),
                nonce=nonce,
                decision="approved" if verdict == "HUMAN_APPROVED" else "rejected",
                reviewed_digest=reviewed,
            ),
            self.forger if forged else self.key,
        )
        return self.event(
            story,
            verdict,
            APPROVER,
            event_id=f"decision:{nonce}",
            human_decision=decision,
            evidence_ref=f"approval:{APPROVER}:{nonce}",
        )

    def event(
        self,
        story: _Story,
        event_type: str,
        producer: str,
        *,
        event_id: str | None = None,
        causation: str | None = None,
        evidence: EvidencePayload | None = None,
        human_decision: HumanDecision | None = None,
        evidence_ref: str | None = None,
    ) -> Event:
        self.serial += 1
        return Event(
            event_type=event_type,
            event_id=event_id or f"{story.op}-e{story.events}",
            operation_id=story.op,
            correlation_id=story.correlation,
            machine_name=story.machine.name,
            machine_version=story.machine.version,
            event_time=self.now,
            evidence_ref=evidence_ref or f"{producer}:{story.op}:{story.events}",
            producer=producer,
            lineage=story.lineage,
            evidence=evidence,
            human_decision=human_decision,
            causation=causation,
            scope=matching_scope(story.machine.applies_to),
        )

    def emit(self, story: _Story, event: Event) -> Decision | None:
        """Decide `event` as the controller will, record it; the decision, or None when
        the operation can take nothing more."""
        decision = self.sims[story.machine.name].feed(event, self.now)
        forged = event.human_decision is not None and any(
            n.code == "approval-bad-signature" for n in decision.refusals
        )
        commands = tuple(i.command_id for i in decision.invocations)
        record = self.encode(event, "forged" if forged else "event", commands)
        self.add(story, record)
        story.events += 1
        self.stats.event_types[event.event_type] += 1
        self.stats.outcomes[decision.outcome.value] += 1
        if decision.outcome is Outcome.FINAL or story.machine.states[decision.state_after].final:
            return None
        return decision

    def encode(self, event: Event, kind: str, commands: tuple[str, ...] = ()) -> BenchRecord:
        value = self.codec.encode(event_to_record(event), EVENT_ENVELOPE)
        return BenchRecord(
            key=event.operation_id,
            value=value,
            record_id=record_id("event", event.operation_id, event.event_id),
            content_type=self.codec.content_type,
            fingerprint=self.fingerprint,
            producer=event.producer,
            kind=kind,
            commands=commands,
        )

    def add(self, story: _Story, record: BenchRecord) -> None:
        story.records.append(record)
        self.stats.records += 1
        self.stats.kinds[record.kind] += 1
        self.stats.commands += len(record.commands)

    # -- records the controller must refuse -----------------------------------------

    def bad(self, index: int) -> BenchRecord:
        """A record the controller dead-letters at intake; never reaches the core."""
        kind = ("bad-bytes", "bad-key", "bad-machine")[index % 3]
        op = f"bench-{self.spec.run_id}-{self.spec.phase}-bad-{index}"
        if kind == "bad-bytes":
            record = BenchRecord(
                key=op,
                value=b"\x00\x01 not an avro single object",
                record_id=record_id("bench-bad", op),
                content_type=self.codec.content_type,
                fingerprint=self.fingerprint,
                kind=kind,
            )
        else:
            machine = self.machines[sorted(self.machines)[0]]
            story = _Story(
                op,
                machine,
                Lineage(agent="procurement-agent", task=op, initiating_principal="x"),
                op,
            )
            event = self.event(story, "TOOL_TIMEOUT", _TOOL)
            if kind == "bad-machine":
                event = _with_machine(event, "no-such-machine")
            record = _replace_kind(self.encode(event, kind), kind)
            if kind == "bad-key":
                record = BenchRecord(
                    f"{op}-other-key",
                    record.value,
                    record.record_id,
                    record.content_type,
                    record.fingerprint,
                    kind,
                )
        self.stats.records += 1
        self.stats.kinds[kind] += 1
        return record


def _replace_kind(record: BenchRecord, kind: str) -> BenchRecord:
    # A redelivery causes no command: the controller recognises the event id.
    return BenchRecord(
        record.key,
        record.value,
        record.record_id,
        record.content_type,
        record.fingerprint,
        kind,
        producer=record.producer,
    )


def _with_machine(event: Event, machine: str) -> Event:
    return Event(
        event_type=event.event_type,
        event_id=event.event_id,
        operation_id=event.operation_id,
        correlation_id=event.correlation_id,
        machine_name=machine,
        machine_version=event.machine_version,
        event_time=event.event_time,
        evidence_ref=event.evidence_ref,
        producer=event.producer,
        lineage=event.lineage,
    )


def generate(spec: WorkloadSpec, stats: WorkloadStats | None = None) -> Iterator[BenchRecord]:
    """About `spec.events` records (rounded up to whole groups of operations) in stream
    order, generated lazily (a 200,000-record backlog is never held in memory at once).
    Pass `stats` to have it filled as records are generated. Each group of
    `spec.interleave` operations is interleaved round-robin; one bad record follows
    every `1 / spec.bad_rate` records, the first at a seeded offset within that spacing,
    so any stretch of that many records holds one (a drawn rate left a 150-record phase
    without any about one time in eight)."""
    gen = _Generator(spec, datetime.now(UTC))
    if stats is not None:
        gen.stats = stats
    spacing = round(1 / spec.bad_rate) if spec.bad_rate > 0 else 0
    next_bad = gen.rng.randrange(spacing) + 1 if spacing else 0
    index = 0
    good = 0
    bad = 0
    while gen.stats.records < spec.events:
        group = [gen.story(index + i) for i in range(spec.interleave)]
        index += spec.interleave
        for record in _interleave([s.records for s in group]):
            yield record
            good += 1
            if good == next_bad:
                bad += 1
                next_bad += spacing
                yield gen.bad(bad)


def _interleave(lists: Sequence[list[BenchRecord]]) -> Iterator[BenchRecord]:
    longest = max((len(x) for x in lists), default=0)
    for position in range(longest):
        for records in lists:
            if position < len(records):
                yield records[position]
