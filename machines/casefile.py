"""Machine test cases: the YAML format of a package's `tests/` folder, and its runner.

A case states an operation's declared facts, policy overrides, approvers (signed with
deterministic test keys), optional guard fault injection, and a sequence of steps. Each
step builds one event (verification evidence, a signed human decision, a checkpoint, a
classifier proposal, or an exact replay of an earlier step), or only moves the clock
(`advance`), and states what must hold after it: outcome, state, capabilities invoked,
guard results, refusal and error codes, the timers that fired. Time passes between
steps: before each step, every timer due by its time fires (`Simulation.advance`).
`run_case` feeds the steps through `Simulation`, the fold the controller runs too, and
returns every expected-vs-actual mismatch. docs/decision-core.md documents the format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from machines.applicability import matching_scope
from machines.approvals import insecure_test_key, public_key_b64, review_digest, sign_decision
from machines.batch import OperationSetup
from machines.decision import Decision
from machines.event import (
    CheckpointReport,
    ClassifierOutput,
    DeclaredFacts,
    EffectOutcome,
    Event,
    EvidencePayload,
    HumanDecision,
    Lineage,
)
from machines.facts import declare
from machines.guards import STANDARD_GUARDS, GuardContext, GuardFn, GuardResult
from machines.model import GuardSpec, Machine, Registry
from machines.policy import (
    Policy,
    PolicyError,
    check_policy_against_machines,
    check_policy_against_registry,
    parse_duration,
    parse_policy,
)
from machines.simulation import Simulation
from machines.view import ToolFacts

SCENARIOS: tuple[str, ...] = (
    "timeout before a side effect",
    "timeout after a side effect",
    "duplicate event delivery",
    "duplicate business operation detection",
    "verification unavailable or conflicting",
    "partial multi-step completion",
    "guard resolution failure",
    "rejected invalid transition",
    "failed compensation",
    "containment action failure",
    "authorization conflict",
    "descendant-task cancellation",
    "resume-gate rejection",
)
"""CONFORMANCE's thirteen required scenarios, spelled as cases name them."""

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
OTHER_DIGEST = "sha256:" + "0" * 64
DEFAULT_VERIFIER = "verifier-1"
DEFAULT_PRODUCER = "tool-integration"

_STRICT = ConfigDict(extra="forbid", frozen=True)


class CaseError(ValueError):
    """A case file is malformed; the message names the file and the problem."""


class FactsSpec(BaseModel):
    model_config = _STRICT
    idempotency_key: str | None = None
    side_effect_possible: bool = True
    side_effect_confirmed: bool = False
    compensation_supported: bool = False
    status_api: bool = False
    arguments_digest: str | None = None


class OperationSpec(BaseModel):
    model_config = _STRICT
    id: str = "op-1"
    agent: str = "agent-1"
    lineage_agents: tuple[str, ...] = ()
    task: str = "task-1"
    principal: str = "principal-1"
    runtime: str | None = "runtime-1"
    credentials: tuple[str, ...] = ()  # delegated to the agent for the task
    correlation_id: str = "corr-1"
    parent_operation: str | None = None
    origin_operation: str | None = None
    facts: FactsSpec = FactsSpec()
    budget: int | None = None
    deadline_seconds: int | None = None
    state: str | None = None


class ApproverSpec(BaseModel):
    model_config = _STRICT
    id: str
    roles: tuple[str, ...] = ("recovery-approver",)


class VerificationSpec(BaseModel):
    model_config = _STRICT
    verifier: str = DEFAULT_VERIFIER
    outcome: EffectOutcome | None = None
    reference: str | None = None


class ApprovalSpec(BaseModel):
    model_config = _STRICT
    approver: str
    transition: str
    state: str | None = None  # default: the operation's state when the step runs
    operation: str | None = None
    machine_digest: Literal["current", "other"] = "current"
    expires_in: int = 600
    nonce: str | None = None
    decision: Literal["approved", "rejected"] | None = None
    signed_by: str | None = None  # test key name; default the approver's own key
    tamper: bool = False  # change a bound field after signing
    for_resume: bool = False  # given for the resume itself (binds the checkpoint)
    reviewed: Literal["current", "other"] = "current"  # digest of the view, or another


class CheckpointSpec(BaseModel):
    model_config = _STRICT
    id: str
    saved_at: int = 0  # seconds after the case start
    validated: bool = True
    validator: str = DEFAULT_VERIFIER
    machine: Literal["current", "other"] = "current"
    policy: Literal["current", "other"] = "current"
    valid_for: int | None = None


class ClassifierSpec(BaseModel):
    model_config = _STRICT
    identity: str = "failure-classifier"
    version: str = "1"
    question: str = "Which recovery event does this failure signal describe?"
    probabilities: dict[str, float] = Field(default_factory=dict)
    candidate: str | None = None


class ExpectSpec(BaseModel):
    model_config = _STRICT
    outcome: str | None = None
    state: str | None = None
    invocations: tuple[str, ...] | None = None
    guards: dict[str, bool] | None = None
    refusals: tuple[str, ...] | None = None
    errors: tuple[str, ...] | None = None
    approval_consumed: bool | None = None
    # The event types of the timers that fired at this step (before its event), in order.
    fired: tuple[str, ...] | None = None


class StepSpec(BaseModel):
    model_config = _STRICT
    event: str | None = None
    # Only move the clock this long (`30s`, `10m`, or seconds): the timers due by then
    # fire, and `expect` is checked against the last of their decisions.
    advance: int | None = None
    id: str | None = None
    at: int | None = None  # seconds after the case start; default previous + 1
    producer: str | None = None
    verification: VerificationSpec | None = None
    approval: ApprovalSpec | None = None
    checkpoint: CheckpointSpec | None = None
    classifier: ClassifierSpec | None = None
    ancestor: str | None = None
    causation: str | None = None
    correlation_id: str | None = None  # default: the operation's
    facts: FactsSpec | None = None  # a `facts` block on this step's envelope
    payload: dict[str, Any] | None = None  # the envelope's free-form payload
    operation: str | None = None  # one of `operations` (default: the case's operation)
    replay: str | None = None  # resend the exact event of this earlier step id
    expect: ExpectSpec = ExpectSpec()

    @field_validator("advance", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value)


class CaseSpec(BaseModel):
    model_config = _STRICT
    name: str
    scenario: tuple[str, ...]
    description: str = ""
    operation: OperationSpec = OperationSpec()
    # More operations, each opened by its first step (`operation: <id>`) as on the wire,
    # with its `facts` on that step's envelope: no start `state`, `budget`, deadline or
    # lineage agents.
    operations: tuple[OperationSpec, ...] = ()
    policy: dict[str, Any] = Field(default_factory=dict)
    approvers: tuple[ApproverSpec, ...] = (ApproverSpec(id="approver-1"),)
    guard_faults: dict[str, Literal["raise", "unavailable"]] = Field(default_factory=dict)
    steps: tuple[StepSpec, ...] = Field(min_length=1)

    @field_validator("scenario", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @field_validator("operations")
    @classmethod
    def _opened_by_events(cls, value: tuple[OperationSpec, ...]) -> tuple[OperationSpec, ...]:
        for op in value:
            fixed = {"state", "budget", "deadline_seconds", "lineage_agents"}
            if fixed & op.model_fields_set:
                raise ValueError(
                    f"operation {op.id} is opened by its first event: leave out "
                    f"{', '.join(sorted(fixed & op.model_fields_set))}"
                )
        return value

    @field_validator("scenario")
    @classmethod
    def _known_scenarios(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [s for s in value if s not in SCENARIOS]
        if unknown:
            raise ValueError(f"unknown scenario {unknown}; use one of: {'; '.join(SCENARIOS)}")
        return value


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One expected-vs-actual difference at one step."""

    step: int
    label: str
    field: str
    expected: Any
    actual: Any

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form."""
        return {
            "step": self.step,
            "label": self.label,
            "field": self.field,
            "expected": self.expected,
            "actual": self.actual,
        }


@dataclass(frozen=True, slots=True)
class CaseResult:
    """The outcome of one case: its mismatches and the decisions each step produced (the
    timers that fired before it, then its event's)."""

    path: str
    name: str
    scenarios: tuple[str, ...]
    mismatches: tuple[Mismatch, ...]
    steps: tuple[tuple[Decision, ...], ...]

    @property
    def decisions(self) -> tuple[Decision, ...]:
        """Every decision of the case, in order."""
        return tuple(d for step in self.steps for d in step)

    @property
    def passed(self) -> bool:
        """True when every step met its expectations."""
        return not self.mismatches


def load_case(path: Path) -> CaseSpec:
    """Parse and validate one case file; raises `CaseError` naming the file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return CaseSpec.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise CaseError(f"case file {path}: {exc}") from exc


def case_policy(case: CaseSpec, registry: Registry) -> Policy:
    """The default test policy, the case's approvers with their test keys, and the
    case's overrides on top. Overrides go through the same validation as a policy file."""
    escalation = next(
        (c.id for c in registry.capabilities.values() if c.kind == "escalate"), "operator.escalate"
    )
    data: dict[str, Any] = {
        "id": f"case:{case.name}",
        "trusted_verifiers": [DEFAULT_VERIFIER],
        "escalation_capability": escalation,
        "approvers": [
            {"id": a.id, "public_key": public_key_b64(insecure_test_key(a.id)), "roles": a.roles}
            for a in case.approvers
        ],
    }
    data.update(case.policy)
    return parse_policy(data, source=f"case {case.name}")


def _raising_guard(ctx: GuardContext) -> GuardResult:
    raise RuntimeError(f"injected fault in guard for {ctx.transition.guard}")


def faulted(registry: Registry, faults: Mapping[str, str]) -> tuple[Registry, dict[str, GuardFn]]:
    """A registry and guard table with the named guard ids broken: `raise` makes the
    implementation throw, `unavailable` points the id at an implementation nobody
    provides. Used for the "guard resolution failure" scenario."""
    table: dict[str, GuardFn] = dict(STANDARD_GUARDS)
    table["fault.raise"] = _raising_guard
    guards = dict(registry.guards)
    for guard_id, fault in faults.items():
        spec = guards.get(guard_id) or GuardSpec(id=guard_id, implementation="")
        guards[guard_id] = replace(spec, implementation=f"fault.{fault}")
    return replace(registry, guards=MappingProxyType(guards)), table


class _Runner:
    """Builds each step's event from the case and the live view, then checks it."""

    def __init__(self, case: CaseSpec, machine: Machine, registry: Registry) -> None:
        self.case = case
        self.machine = machine
        registry_used, table = faulted(registry, case.guard_faults)
        self.policy = case_policy(case, registry)
        check_policy_against_registry(self.policy, registry)
        check_policy_against_machines(self.policy, (machine,), registry)
        self.sim = Simulation(machine, registry_used, self.policy, guard_table=table)
        op = case.operation
        self.operations = {o.id: o for o in (op, *case.operations)}
        if len(self.operations) != 1 + len(case.operations):
            raise CaseError(f"case {case.name}: operation ids must be distinct")
        # The scope every event of the case carries (the opening one needs it on the
        # wire, SPEC §8 step 2): the one the machine's `applies_to` admits.
        self.scope = matching_scope(machine.applies_to)
        self.sim.open(
            OperationSetup(
                operation_id=op.id,
                agent=op.agent,
                lineage_agents=frozenset(op.lineage_agents),
                facts=self._opening_facts(op),
                budget=op.budget,
                deadline=None
                if op.deadline_seconds is None
                else EPOCH + timedelta(seconds=op.deadline_seconds),
                state=op.state,
                correlation_id=op.correlation_id,
                capability=self.scope.capability,
                tool=self.scope.tool,
                environment=self.scope.environment,
                principal=op.principal,
                task=op.task,
                runtime=op.runtime,
                credentials=op.credentials,
            ),
            # The operation opens at its first step's time, as the controller opens it
            # when its first event is decided: the policy's deadline counts from there.
            EPOCH + timedelta(seconds=_seconds_of(case.steps[0], 0)),
        )
        self.sent: dict[str, Event] = {}
        self.clock = 0

    def tick(self, step: StepSpec) -> datetime:
        """Move the case clock to `step`'s time and return it."""
        self.clock = _seconds_of(step, self.clock)
        return EPOCH + timedelta(seconds=self.clock)

    def event_for(self, index: int, step: StepSpec) -> Event:
        if step.replay is not None:
            if step.replay not in self.sent:
                raise CaseError(f"case {self.case.name} step {index}: no step {step.replay}")
            return self.sent[step.replay]
        if step.event is None:
            raise CaseError(f"case {self.case.name} step {index}: needs `event` or `replay`")
        op = self.operations.get(step.operation or self.case.operation.id)
        if op is None:
            raise CaseError(f"case {self.case.name} step {index}: no operation {step.operation}")
        facts = step.facts
        if facts is None and op is not self.case.operation and op.id not in self.sim.views:
            # Another operation is opened by its first event, which carries its facts.
            facts = op.facts if "facts" in op.model_fields_set else None
        event_id = step.id or f"e{index}"
        now = EPOCH + timedelta(seconds=self.clock)
        event = Event(
            event_type=step.event,
            event_id=event_id,
            operation_id=op.id,
            correlation_id=step.correlation_id or op.correlation_id,
            machine_name=self.machine.name,
            machine_version=self.machine.version,
            event_time=now,
            evidence_ref=f"evidence://{op.id}/{event_id}",
            producer=self._producer(step),
            lineage=Lineage(
                agent=op.agent,
                task=op.task,
                initiating_principal=op.principal,
                origin_operation=op.origin_operation,
                parent_operation=op.parent_operation,
                runtime=op.runtime,
                delegated_credentials=op.credentials,
            ),
            evidence=self._evidence(step),
            human_decision=self._decision(step, op.id, now),
            classifier=self._classifier(step),
            causation=step.causation,
            facts=None if facts is None else DeclaredFacts(**facts.model_dump()),
            payload=step.payload,
            scope=self.scope,
        )
        self.sent[event_id] = event
        return event

    @staticmethod
    def _opening_facts(op: OperationSpec) -> ToolFacts:
        # A case that states `operation.facts` declares them as the tool integration
        # would on the opening event, through the same function the core applies to an
        # envelope's `facts` block; a case that states none opens with nothing declared.
        if "facts" not in op.model_fields_set:
            return ToolFacts()
        return declare(DeclaredFacts(**op.facts.model_dump()), DEFAULT_PRODUCER)

    def _producer(self, step: StepSpec) -> str:
        if step.producer is not None:
            return step.producer
        if step.verification is not None:
            return step.verification.verifier
        if step.approval is not None:
            return step.approval.approver
        if step.checkpoint is not None and step.checkpoint.validated and step.checkpoint.validator:
            # A validated checkpoint is reported by its validator (the signer).
            return step.checkpoint.validator
        return DEFAULT_PRODUCER

    def _evidence(self, step: StepSpec) -> EvidencePayload | None:
        if step.verification is None and step.checkpoint is None and step.ancestor is None:
            return None
        v = step.verification
        return EvidencePayload(
            outcome=v.outcome if v else None,
            verifier=v.verifier if v else None,
            reference=v.reference if v else None,
            checkpoint=self._checkpoint(step.checkpoint) if step.checkpoint else None,
            ancestor_operation=step.ancestor,
        )

    def _checkpoint(self, spec: CheckpointSpec) -> CheckpointReport:
        saved = EPOCH + timedelta(seconds=spec.saved_at)
        return CheckpointReport(
            checkpoint_id=spec.id,
            saved_at=saved,
            reference=f"checkpoint://{spec.id}",
            validated=spec.validated,
            validator=spec.validator,
            validated_machine_digest=self.machine.digest
            if spec.machine == "current"
            else OTHER_DIGEST,
            validated_policy_digest=self.policy.digest
            if spec.policy == "current"
            else OTHER_DIGEST,
            valid_until=None
            if spec.valid_for is None
            else saved + timedelta(seconds=spec.valid_for),
        )

    def _decision(self, step: StepSpec, operation: str, now: datetime) -> HumanDecision | None:
        spec = step.approval
        if spec is None:
            return None
        view = self.sim.views[operation]
        verdict = spec.decision or ("rejected" if step.event == "HUMAN_REJECTED" else "approved")
        unsigned = HumanDecision(
            approver=spec.approver,
            operation_id=spec.operation or view.operation_id,
            state=spec.state or view.state,
            transition=spec.transition,
            machine_digest=self.machine.digest
            if spec.machine_digest == "current"
            else OTHER_DIGEST,
            expires_at=now + timedelta(seconds=spec.expires_in),
            nonce=spec.nonce or f"nonce-{step.id or self.clock}",
            decision=verdict,
            reviewed_digest=review_digest(view, spec.transition, now, for_resume=spec.for_resume)
            if spec.reviewed == "current"
            else OTHER_DIGEST,
            for_resume=spec.for_resume,
        )
        signed = sign_decision(unsigned, insecure_test_key(spec.signed_by or spec.approver))
        if spec.tamper:
            signed = replace(signed, transition=signed.transition + "-tampered")
        return signed

    def _classifier(self, step: StepSpec) -> ClassifierOutput | None:
        spec = step.classifier
        if spec is None:
            return None
        return ClassifierOutput(
            identity=spec.identity,
            version=spec.version,
            question=spec.question,
            probabilities=MappingProxyType(dict(spec.probabilities)),
            candidate_event=spec.candidate,
        )


def _seconds_of(step: StepSpec, clock: int) -> int:
    """The case time of `step` after `clock`: its `at`, else `clock` plus its `advance`,
    else a second on."""
    if step.at is not None:
        return step.at
    return clock + (step.advance if step.advance is not None else 1)


def compare(
    index: int,
    label: str,
    expect: ExpectSpec,
    decision: Decision | None,
    fired: tuple[Decision, ...] = (),
) -> list[Mismatch]:
    """Every way `decision` differs from `expect` (fields left out are not checked), and
    the timers `fired` at the step from `expect.fired`; None: the step decided nothing."""
    out: list[Mismatch] = []
    if expect.fired is not None and list(expect.fired) != [d.event_type for d in fired]:
        out.append(
            Mismatch(index, label, "fired", list(expect.fired), [d.event_type for d in fired])
        )
    if decision is None:
        checked = {k for k, v in expect.model_dump().items() if v is not None and k != "fired"}
        if checked:
            out.append(Mismatch(index, label, "fired", "a timer due by now", []))
        return out
    actual: dict[str, Any] = {
        "outcome": str(decision.outcome),
        "state": decision.state_after,
        "invocations": list(decision.capabilities),
        "refusals": [n.code for n in decision.refusals],
        "errors": [n.code for n in decision.errors],
        "approval_consumed": decision.approval_consumed,
    }
    for field, got in actual.items():
        want = getattr(expect, field)
        if want is None:
            continue
        want = list(want) if isinstance(want, tuple) else want
        if want != got:
            out.append(Mismatch(index, label, field, want, got))
    if expect.guards is not None:
        got_guards = {g.guard: g.value for g in decision.guards}
        for guard, value in expect.guards.items():
            if got_guards.get(guard) != value:
                out.append(Mismatch(index, label, f"guards.{guard}", value, got_guards.get(guard)))
    return out


def run_case(path: Path, case: CaseSpec, machine: Machine, registry: Registry) -> CaseResult:
    """Run every step of `case` against `machine`; never raises for a failing step."""
    try:
        runner = _Runner(case, machine, registry)
    except PolicyError as exc:
        raise CaseError(f"case file {path}: {exc}") from exc
    mismatches: list[Mismatch] = []
    steps: list[tuple[Decision, ...]] = []
    for index, step in enumerate(case.steps, start=1):
        now = runner.tick(step)
        fired = tuple(runner.sim.advance(now))
        if step.advance is not None and step.event is None and step.replay is None:
            label = f"advance {step.advance}s"
            last = fired[-1] if fired else None
            mismatches.extend(compare(index, label, step.expect, last, fired))
            steps.append(fired)
            continue
        event = runner.event_for(index, step)
        decision = runner.sim.feed(event, now)
        steps.append((*fired, decision))
        label = f"{event.event_type} {event.event_id}"
        mismatches.extend(compare(index, label, step.expect, decision, fired))
    return CaseResult(str(path), case.name, case.scenario, tuple(mismatches), tuple(steps))


@dataclass(frozen=True, slots=True)
class SuiteResult:
    """Every case run by `recoveryctl test`, and the scenarios they cover."""

    results: tuple[CaseResult, ...]

    @property
    def passed(self) -> bool:
        """True when every case passed (and there was at least one)."""
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def scenarios_covered(self) -> tuple[str, ...]:
        """The CONFORMANCE scenarios named by at least one case, in CONFORMANCE order."""
        named = {s for r in self.results for s in r.scenarios}
        return tuple(s for s in SCENARIOS if s in named)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of `recoveryctl test --json`."""
        covered = self.scenarios_covered
        return {
            "passed": self.passed,
            "cases": [
                {
                    "path": r.path,
                    "name": r.name,
                    "scenarios": list(r.scenarios),
                    "passed": r.passed,
                    "mismatches": [m.to_dict() for m in r.mismatches],
                }
                for r in self.results
            ],
            "counts": {
                "cases": len(self.results),
                "passed": sum(r.passed for r in self.results),
                "failed": sum(not r.passed for r in self.results),
            },
            "scenarios_covered": list(covered),
            "scenarios_missing": [s for s in SCENARIOS if s not in covered],
        }


def discover(paths: list[Path]) -> list[tuple[Path, Path]]:
    """(package folder, case file) pairs under `paths`. A path may be a case file inside a
    package's `tests/`, a package folder, or a folder of packages (a catalogue)."""
    found: list[tuple[Path, Path]] = []
    for path in paths:
        if path.is_file():
            found.append((path.parent.parent, path))
        elif (path / "RECOVERY.yaml").is_file():
            found.extend((path, case) for case in _cases_of(path))
        elif path.is_dir():
            for package in sorted(p for p in path.iterdir() if (p / "RECOVERY.yaml").is_file()):
                found.extend((package, case) for case in _cases_of(package))
        else:
            raise CaseError(f"{path}: no such file or folder")
    return found


def _cases_of(package: Path) -> list[Path]:
    tests = package / "tests"
    if not tests.is_dir():
        return []
    return sorted([*tests.glob("*.yaml"), *tests.glob("*.yml")])
