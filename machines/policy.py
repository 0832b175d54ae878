"""The operator policy file (CONFORMANCE L3.7): stricter than any machine, never looser.

A policy bounds what the core lets a machine do: attempt limits, deadlines, budgets,
forbidden capabilities, which capabilities need approval, escalation of rejected events,
trusted verifier identities, the approver roster (Ed25519 public keys and roles) and the
classifier thresholds. The SPEC §7 invariants are not policy settings: a file that tries
to switch one off is refused at load time with the offending keys named.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

from jsonschema import Draft202012Validator
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from machines.errors import Problem
from machines.event import sha256_digest
from machines.model import CapabilityKind, Machine, Registry, Transition
from machines.roster import ANY, ProducerEntry, Role, Roster
from machines.testkeys import public_name_key_b64
from machines.yamlsafe import parse_yaml, read_bytes

# Keys an operator might reach for to loosen an invariant. Each is refused by name so
# the message says why, instead of a bare "extra field not permitted".
LOOSENING_KEYS: frozenset[str] = frozenset(
    {
        "allow_retry_without_idempotency_key",
        "allow_retry_from_unknown",
        "allow_retry_without_verification",
        "allow_self_approval",
        "allow_lineage_approval",
        "allow_unapproved_resume",
        "allow_unsigned_approvals",
        "allow_combined_stop_and_revoke",
        "classifier_may_authorize",
        "classifier_as_guard",
        "reset_budgets_on_restart",
        "restore_approvals_on_restart",
        "trust_agent_evidence",
        "unknown_guard_default",
    }
)

# Events a classifier may never propose: evidence, approvals, action results and
# lineage facts are authority, and a probability is not authority (SPEC §11).
CLASSIFIER_FORBIDDEN_EVENTS: frozenset[str] = frozenset(
    {
        "VERIFICATION_FOUND",
        "VERIFICATION_NOT_FOUND",
        "VERIFICATION_UNAVAILABLE",
        "VERIFICATION_CONFLICTING",
        "HUMAN_APPROVED",
        "HUMAN_REJECTED",
        "RETRY_SUCCEEDED",
        "RETRY_FAILED",
        "COMPENSATION_SUCCEEDED",
        "COMPENSATION_FAILED",
        "CONTAINMENT_SUCCEEDED",
        "CONTAINMENT_FAILED",
        "RESUME_REQUESTED",
        "ANCESTOR_CONTAINED",
    }
)

HARD_MAX_RETRY_ATTEMPTS = 10
HARD_MAX_RECOVERY_ATTEMPTS = 10
MIN_CLASSIFIER_CONFIDENCE = 0.5


class PolicyError(ValueError):
    """The policy file is invalid or would loosen an invariant; fix the named keys."""


class Approver(BaseModel):
    """One accountable human who may sign decisions, with their Ed25519 public key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    public_key: str = Field(description="raw 32-byte Ed25519 public key, base64")
    roles: tuple[str, ...] = ()

    @field_validator("public_key")
    @classmethod
    def _key_is_ed25519(cls, value: str) -> str:
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError("public_key must be base64") from exc
        if len(raw) != 32:
            raise ValueError(f"public_key must decode to 32 bytes, got {len(raw)}")
        return value


class ClassifierPolicy(BaseModel):
    """When a classifier's proposal may be treated as a candidate event at all."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_confidence: float = Field(default=0.9, ge=MIN_CLASSIFIER_CONFIDENCE, le=1.0)
    min_margin: float = Field(default=0.2, ge=0.0, le=1.0)
    allowed_events: tuple[str, ...] = ("TOOL_TIMEOUT", "TOOL_FAILED", "STEP_FAILED")

    @field_validator("allowed_events")
    @classmethod
    def _no_authority_events(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = sorted(
            e for e in value if e in CLASSIFIER_FORBIDDEN_EVENTS or e.endswith(_SUCCESS_SUFFIXES)
        )
        if bad:
            raise ValueError(
                f"a classifier may not propose {', '.join(bad)}: these carry evidence or "
                "authority (SPEC §11); remove them from classifier.allowed_events"
            )
        return value


_DURATION = re.compile(r"([0-9]{1,9})(s|m|h|d)")
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The longest duration a policy may name: a timer further out than this is no bound.
MAX_DURATION_SECONDS: Final = 366 * 86400


def parse_duration(value: Any) -> int:
    """Seconds from a policy duration: `30s`, `10m`, `24h`, `7d`, or a whole number of
    seconds. Raises `ValueError` naming the forms accepted."""
    if isinstance(value, bool):
        raise ValueError("a duration is written 30s, 10m, 24h or 7d")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and (found := _DURATION.fullmatch(value.strip())):
        seconds = int(found.group(1)) * _UNIT_SECONDS[found.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration; write 30s, 10m, 24h or 7d")
    if not 0 <= seconds <= MAX_DURATION_SECONDS:
        raise ValueError(f"{value!r} is outside 0s .. {MAX_DURATION_SECONDS // 86400}d")
    return seconds


# A duration in a policy file, held as whole seconds.
Duration = Annotated[int, BeforeValidator(parse_duration)]


class StateTimeout(BaseModel):
    """How long an operation may stay in one state of one machine, and the event its
    timer delivers when it does (decided like any other event of that state)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    after: Duration = Field(gt=0)
    event: str = Field(pattern=r"^[A-Z][A-Z0-9_]{0,127}$")


class Timeouts(BaseModel):
    """The state timeouts (CONFORMANCE L3.7: stricter than the machine). Every non-final
    state of every machine has a timer: its own from `states` (machine name -> state ->
    timeout), else `stalled_after`, whose firing escalates once with reason `stalled`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stalled_after: Duration = Field(default=3600, gt=0)
    states: dict[str, dict[str, StateTimeout]] = Field(default_factory=dict)

    def of(self, machine: str, state: str) -> StateTimeout | None:
        """The timeout of `state` in `machine`, if the policy names one."""
        return self.states.get(machine, {}).get(state)


class RetryPacing(BaseModel):
    """When a permitted retry is commanded (agent-failure-recovery practice §2): after a
    delay drawn with full jitter from 0 .. min(`cap`, `base` * 2**attempt), never past
    the operation's deadline, and not before a `retry_after_seconds` the failure report
    asked for, honoured up to `max_retry_after`. `base` 0s commands retries at once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base: Duration = 1
    cap: Duration = Field(default=300, gt=0)
    max_retry_after: Duration = 900


class Policy(BaseModel):
    """A validated operator policy. Immutable; `digest` binds checkpoints and audits to it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    max_retry_attempts: int = Field(default=3, ge=0, le=HARD_MAX_RETRY_ATTEMPTS)
    max_recovery_attempts: int = Field(default=3, ge=0, le=HARD_MAX_RECOVERY_ATTEMPTS)
    retry_budget: int = Field(default=10, ge=0, description="cost units for retries")
    deadline_seconds: int | None = Field(default=3600, gt=0)
    forbidden_capabilities: tuple[str, ...] = ()
    approval_required_capabilities: tuple[str, ...] = ()
    require_approval_for_material: bool = False
    escalate_rejected_events: bool = True
    escalation_capability: str = "human.escalate"
    escalation_params: dict[str, str] = Field(
        default_factory=lambda: {"queue": "recovery-oncall", "severity": "high"},
        description="static params of every escalation; the core adds `reason`",
    )
    trusted_verifiers: tuple[str, ...] = ()
    approvers: tuple[Approver, ...] = ()
    approval_roles: tuple[str, ...] = ("recovery-approver",)
    classifier: ClassifierPolicy = ClassifierPolicy()
    timeouts: Timeouts = Timeouts()
    retry_pacing: RetryPacing = RetryPacing()
    producers: tuple[ProducerEntry, ...] = Field(
        default=(),
        description="the producer roster (machines.roster): who may write which records",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_loosening(cls, data: Any) -> Any:
        if isinstance(data, dict):
            bad = sorted(set(data) & LOOSENING_KEYS)
            if bad:
                raise ValueError(
                    f"policy keys {', '.join(bad)} would loosen a SPEC §7 invariant; a policy "
                    "may only be stricter than a machine: remove them"
                )
        return data

    @model_validator(mode="after")
    def _unique_approvers(self) -> Policy:
        ids = [a.id for a in self.approvers]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"approver ids listed twice: {', '.join(dupes)}")
        Roster(producers=self.producers)  # refuses producer ids listed twice
        return self

    @property
    def roster(self) -> Roster:
        """The producer roster of this policy (empty: no record is accepted)."""
        return _roster(self)

    @property
    def digest(self) -> str:
        """`sha256:<hex>` over the canonical encoding of the policy."""
        return _policy_digest(self)

    def approver(self, approver_id: str) -> Approver | None:
        """The roster entry for `approver_id`, if any."""
        for entry in self.approvers:
            if entry.id == approver_id:
                return entry
        return None


_DIGESTS: dict[int, tuple[Policy, str]] = {}


def _policy_digest(policy: Policy) -> str:
    # Policies are immutable and few; caching by identity keeps decide() off the encoder.
    cached = _DIGESTS.get(id(policy))
    if cached is not None and cached[0] is policy:
        return cached[1]
    data = policy.model_dump(mode="json")
    # The roster says who may write, not how decisions are made: rotating or revoking a
    # key must not change the digest decisions and validated checkpoints are bound to
    # (a checkpoint would become ineligible). Policies keep the digest they had before
    # the roster existed. Who signed each event is recorded with the event.
    del data["producers"]
    digest = sha256_digest(data)
    if len(_DIGESTS) > 256:
        _DIGESTS.clear()
    _DIGESTS[id(policy)] = (policy, digest)
    return digest


_ROSTERS: dict[int, tuple[Policy, Roster]] = {}


def _roster(policy: Policy) -> Roster:
    cached = _ROSTERS.get(id(policy))
    if cached is not None and cached[0] is policy:
        return cached[1]
    roster = Roster(producers=policy.producers)
    if len(_ROSTERS) > 256:
        _ROSTERS.clear()
    _ROSTERS[id(policy)] = (policy, roster)
    return roster


def parse_policy(
    data: Any, *, source: str = "<policy>", lines: Mapping[str, int] | None = None
) -> Policy:
    """Validate decoded policy data; raises `PolicyError` naming `source` and each
    problem, with its line when `lines` (a path's line, `machines.yamlsafe`) has it."""
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(f"policy {source}: {_problems(exc, lines or {})}") from exc


def _problems(exc: ValidationError, lines: Mapping[str, int]) -> str:
    """One line per validation error: where (the key path and its line), and what."""
    found = []
    for error in exc.errors():
        path = _dotted(error["loc"])
        line = _line_of(path, lines)
        where = f"line {line}, {path}" if line is not None else path or "the file"
        found.append(f"{where}: {error['msg']}")
    return "; ".join(found)


def _dotted(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _line_of(path: str, lines: Mapping[str, int]) -> int | None:
    """The line of `path`, else of the nearest enclosing key the file has."""
    while path:
        if path in lines:
            return lines[path]
        path = path[: max(path.rfind("."), path.rfind("["), 0)]
    return None


def _read_document(path: str | Path, what: str) -> tuple[Any, Mapping[str, int]]:
    """The data of a policy or roster file (YAML, or JSON by its suffix) and the line
    of each key path; raises `PolicyError` naming the file, line and problem."""
    file = str(path)
    raw = read_bytes(Path(path), file)
    if isinstance(raw, Problem):
        raise PolicyError(f"{what} {file}: {raw.message}")
    if file.endswith(".json"):
        try:
            return json.loads(raw), {}
        except (ValueError, UnicodeDecodeError) as exc:
            raise PolicyError(f"{what} {file}: not JSON: {exc}") from exc
    document = parse_yaml(raw, file)
    if isinstance(document, Problem):
        line = f" line {document.location.line}" if document.location.line else ""
        raise PolicyError(f"{what} {file}{line}: {document.message}")
    return document.data, document.lines


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file (YAML or JSON); raises `PolicyError` naming the
    file, and the line of each problem in a YAML file."""
    data, lines = _read_document(path, "policy")
    return parse_policy(data, source=str(path), lines=lines)


def load_roster(path: str | Path) -> Roster:
    """The producer roster in `path`: a policy file's `producers`, or a file holding only
    `producers:` (what a worker needs to verify the controller's commands)."""
    data, lines = _read_document(path, "roster")
    if isinstance(data, dict) and "id" in data:
        return parse_policy(data, source=str(path), lines=lines).roster
    try:
        return Roster.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(f"roster {path}: {_problems(exc, lines)}") from exc


# Event names that report success or confirm an effect: a classifier never proposes one,
# whatever machine would receive it (SPEC §11).
_SUCCESS_SUFFIXES = ("_SUCCEEDED", "_COMPLETED", "_CONFIRMED", "_RESUMED", "_APPLIED")

# What a classifier-proposed event may not cause in any machine: it may start recovery
# or raise urgency, never retry, resume or compensate, nor complete the operation.
_CLASSIFIER_FORBIDDEN_KINDS = frozenset(
    {CapabilityKind.RETRY, CapabilityKind.RESUME, CapabilityKind.COMPENSATE}
)


def check_policy_against_machines(
    policy: Policy, machines: Iterable[Machine], registry: Registry, *, every: bool = False
) -> None:
    """Refuse a policy whose `classifier.allowed_events` would let a classifier's
    proposal complete an operation (a transition into a final state), or retry, resume
    or compensate (a planned action of that kind, the target's entry actions included)
    in any of `machines` (SPEC §11: a classifier may start recovery or raise urgency,
    nothing more), or whose `timeouts` do not fit them (`timeout_problems`; with
    `every`, `machines` are all the controller runs and a timeout naming another
    machine is refused too). Raises `PolicyError` naming each machine, state and event."""
    machines = tuple(machines)
    timeouts = timeout_problems(policy, machines, registry, every=every)
    if timeouts:
        raise PolicyError(f"policy {policy.id}: timeouts: " + "; ".join(timeouts))
    allowed = set(policy.classifier.allowed_events)
    problems: list[str] = []
    for machine in machines:
        for state in machine.states.values():
            for event in sorted(allowed & set(state.on)):
                for transition in state.on[event]:
                    why = _classifier_overreach(machine, transition, registry)
                    if why:
                        problems.append(
                            f"{machine.name}@{machine.version} {state.name} --{event}--> "
                            f"{transition.target} {why}"
                        )
    if problems:
        raise PolicyError(
            f"policy {policy.id}: classifier.allowed_events lets a classifier's proposal "
            "do more than start recovery or raise urgency (SPEC §11): "
            + "; ".join(problems)
            + "; remove those events from classifier.allowed_events"
        )


def timeout_problems(
    policy: Policy, machines: Iterable[Machine], registry: Registry, *, every: bool = False
) -> list[str]:
    """What is wrong with the policy's state timeouts against `machines` (CONFORMANCE
    L3.7): each names a machine (of `machines`, when `every`), a state of it that is not
    final, and an event that state accepts; and that event, delivered by a timer, may
    only escalate or re-verify: no transition it can take completes the operation or
    retries, resumes or compensates (time passing is no evidence of an effect)."""
    by_name = {m.name: m for m in machines}
    problems: list[str] = []
    for name, states in sorted(policy.timeouts.states.items()):
        machine = by_name.get(name)
        if machine is None:
            if every:
                problems.append(
                    f"machine {name} is not one the controller runs "
                    f"({', '.join(sorted(by_name)) or 'none'})"
                )
            continue
        for state_name, timeout in sorted(states.items()):
            problems.extend(_timeout_problems(machine, state_name, timeout, registry))
    return problems


def _timeout_problems(
    machine: Machine, state_name: str, timeout: StateTimeout, registry: Registry
) -> list[str]:
    where = f"{machine.name} {state_name}"
    state = machine.states.get(state_name)
    if state is None:
        return [f"{where}: no such state (states: {', '.join(sorted(machine.states))})"]
    if state.final:
        return [f"{where}: a final state waits for nothing; remove its timeout"]
    transitions = state.on.get(timeout.event)
    if transitions is None:
        return [
            f"{where}: the state does not accept {timeout.event} "
            f"(it accepts {', '.join(sorted(state.on)) or 'nothing'})"
        ]
    return [
        f"{where} --{timeout.event}--> {t.target} {why}; a timeout may only escalate or re-verify"
        for t in transitions
        if (why := _classifier_overreach(machine, t, registry))
    ]


def _classifier_overreach(machine: Machine, transition: Transition, registry: Registry) -> str:
    target = machine.states.get(transition.target)
    if target is not None and target.final:
        return "completes the operation"
    actions = (*transition.actions, *(target.entry if target is not None else ()))
    for action in actions:
        spec = registry.capabilities.get(action.capability)
        if spec is not None and spec.kind in _CLASSIFIER_FORBIDDEN_KINDS:
            return f"invokes {action.capability} ({spec.kind})"
    return ""


def check_policy_against_registry(policy: Policy, registry: Registry) -> None:
    """Refuse a policy that names capabilities the registry does not know, or whose
    escalation capability cannot escalate. Raises `PolicyError` listing what is wrong."""
    problems: list[str] = []
    named = {
        *policy.forbidden_capabilities,
        *policy.approval_required_capabilities,
        policy.escalation_capability,
    }
    unknown = sorted(c for c in named if c not in registry.capabilities)
    if unknown:
        known = ", ".join(sorted(registry.capabilities))
        problems.append(f"unregistered capabilities {', '.join(unknown)} (registered: {known})")
    spec = registry.capabilities.get(policy.escalation_capability)
    if spec is not None and spec.kind not in (CapabilityKind.ESCALATE, CapabilityKind.NOTIFY):
        problems.append(
            f"escalation_capability {spec.id} has kind {spec.kind}, needs escalate or notify"
        )
    if policy.escalation_capability in policy.forbidden_capabilities:
        problems.append(f"escalation_capability {policy.escalation_capability} is forbidden")
    if spec is not None:
        # The core adds `reason` (a refusal code) to the policy's static params; the
        # result must satisfy the capability's registered params schema.
        sample = {**policy.escalation_params, "reason": "retry-not-permitted"}
        errors = list(Draft202012Validator(dict(spec.params_schema)).iter_errors(sample))
        if errors:
            problems.append(
                f"escalation_params {sample} do not fit {spec.id}'s params schema: "
                + "; ".join(e.message for e in errors[:3])
            )
    if problems:
        raise PolicyError(f"policy {policy.id}: " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class PublicNameKey:
    """A public key in a policy that `machines.insecure_test_key(name)` derives from a
    name: whoever knows the name holds the private key. `holder` is the roster entry
    (e.g. `approvers[approver-dana]`), `name` the name it derives from."""

    holder: str
    public_key: str
    name: str

    def describe(self) -> str:
        """One line for logs and refusals."""
        return f"{self.holder} key {self.public_key} = insecure_test_key({self.name!r})"


# The roles whose `agents` list says for which agents a producer speaks: a `tool` opens
# operations for them, an `orchestrator` vouches for their calls and lineage, a
# `validator` validates their checkpoints.
_AGENT_ROLES: Final = frozenset({Role.TOOL, Role.ORCHESTRATOR, Role.VALIDATOR})


def wildcard_agent_grants(policy: Policy) -> tuple[str, ...]:
    """Each grant of the policy's roster that speaks for any agent (`agents: ["*"]`) in a
    role where the agent matters, described for a refusal: such a grant lets its holder
    name any agent, a bystander too, as the one a containment stops. The controller
    refuses them outside demo mode (docs/controller.md); name the agents, or prove them
    with call contexts (`machines.call_context`)."""
    return tuple(
        f"producers[{producer.id}] grant {grant.role} agents [*]"
        for producer in policy.producers
        for grant in producer.grants
        if grant.role in _AGENT_ROLES and ANY in grant.agents
    )


def policy_keys(policy: Policy) -> Iterator[tuple[str, str, str]]:
    """Every public key the policy holds, as (holder, its own id, base64 key). A roster
    added to the policy (producers, verifiers) adds its entries here, and
    `public_name_keys` then checks them too."""
    for approver in policy.approvers:
        yield f"approvers[{approver.id}]", approver.id, approver.public_key
    for producer in policy.producers:
        for key in producer.keys:
            yield f"producers[{producer.id}]", producer.id, key.public_key


def policy_names(policy: Policy) -> set[str]:
    """Every string the policy contains (ids, roles, capabilities, verifier names,
    params): the names a key could be derived from that anyone reading the policy knows."""
    names: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            names.add(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                names.add(str(key))
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(policy.model_dump(mode="json"))
    return names


def public_name_keys(policy: Policy, extra_names: Iterable[str] = ()) -> tuple[PublicNameKey, ...]:
    """The keys of `policy` that are derived from a public name: each listed key compared
    with `insecure_test_key` of its holder's id and of every name in the policy (and of
    `extra_names`). Pure; the controller refuses to start when this is not empty unless
    it runs in demo mode (docs/controller.md). Ordered by holder."""
    keys = list(policy_keys(policy))
    if not keys:
        return ()
    candidates = policy_names(policy) | set(extra_names)
    derived: dict[str, str] = {}
    for name in sorted(candidates):
        derived.setdefault(public_name_key_b64(name), name)
    found: list[PublicNameKey] = []
    for holder, own_id, key in keys:
        if key == public_name_key_b64(own_id):
            found.append(PublicNameKey(holder, key, own_id))
        elif key in derived:
            found.append(PublicNameKey(holder, key, derived[key]))
    return tuple(sorted(found, key=lambda k: k.holder))
