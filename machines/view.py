"""The read-only ledger view of one operation: the only facts a guard may read.

Everything in an `OperationView` is trusted by construction: the tool integration's
declared facts (CONFORMANCE Level 2), verification results accepted from verifiers the
policy trusts, counters the controller itself keeps, approvals whose signatures the core
verified, checkpoints, and lineage status set by the controller. Classifier output and
evidence offered by the affected agent about itself never enter it (SPEC §7.7, §11):
there is no field to put them in. The view changes only through `machines.decision.apply`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import PlainSerializer, TypeAdapter

from machines.event import EffectOutcome, Verdict, sha256_digest

_NO_EVENTS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ToolFacts:
    """What the tool integration declared about this operation (CONFORMANCE L2).

    `declared_by` names who declared them (the producer, or the case file); `None` means
    nothing was declared and these are the conservative defaults. Once declared, the
    facts never change (`machines.facts.admit_facts`)."""

    idempotency_key: str | None = None
    side_effect_possible: bool = True
    side_effect_confirmed: bool = False
    compensation_supported: bool = False
    status_api: bool = False
    declared_by: str | None = None
    # True when the idempotency key was declared after the event that opened the
    # operation (its failure report): not the key of the original call, so it never
    # makes a retry safe (agent-failure-recovery practice §4).
    key_declared_late: bool = False
    # The digest of the call's canonical arguments, declared with the key (practice §4).
    arguments_digest: str | None = None


@dataclass(frozen=True, slots=True)
class Verification:
    """One verification result from a trusted verifier. `epoch` is the effect epoch it
    describes: a retry or compensation starts a new epoch, so older results go stale."""

    verifier: str
    outcome: EffectOutcome
    reference: str
    event_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Approval:
    """A human decision whose signature, binding and approver the core verified."""

    approver: str
    state: str
    transition: str
    machine_digest: str
    expires_at: datetime
    nonce: str
    decision: Verdict
    event_id: str
    consumed: bool = False
    # Given for the resume itself (the reviewed digest bound the checkpoint), the digest
    # of the evidence it was given on (`machines.approvals.evidence_basis`: new evidence
    # or another eligible checkpoint voids it), and whether a later rejection by an
    # accountable approver withdrew it.
    for_resume: bool = False
    basis: str = ""
    withdrawn: bool = False


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A saved checkpoint and the conditions its validation was bound to."""

    checkpoint_id: str
    saved_at: datetime
    reference: str
    validated: bool
    validator: str | None
    machine_digest: str | None
    policy_digest: str | None
    valid_until: datetime | None
    event_id: str

    def eligible(self, machine_digest: str, policy_digest: str, now: datetime) -> bool:
        """Whether this checkpoint may be resumed from now: validated by a trusted
        validator (only those are marked validated), for this machine and this policy, and
        not past its validity. Saved is not eligible (paper notes §3.2)."""
        return (
            self.validated
            and self.machine_digest == machine_digest
            and self.policy_digest == policy_digest
            and (self.valid_until is None or now < self.valid_until)
        )


def checkpoint_digest(checkpoint: Checkpoint) -> str:
    """`sha256:<hex>` over the checkpoint as the ledger knows it (id, save time,
    reference, validation and the digests it was bound to, validity, the event that
    reported it): what a resume command and a reviewed approval name it by, so the
    worker and the approver can tell it from another checkpoint with the same id."""
    return sha256_digest(
        {
            "checkpoint_id": checkpoint.checkpoint_id,
            "saved_at": checkpoint.saved_at.isoformat(),
            "reference": checkpoint.reference,
            "validated": checkpoint.validated,
            "validator": checkpoint.validator,
            "machine_digest": checkpoint.machine_digest,
            "policy_digest": checkpoint.policy_digest,
            "valid_until": None
            if checkpoint.valid_until is None
            else checkpoint.valid_until.isoformat(),
            "event_id": checkpoint.event_id,
        }
    )


@dataclass(frozen=True, slots=True)
class HeldAction:
    """An invocation a paced retry holds back until its timer fires: the capability, the
    machine's params for it and where it came from (`transition` or `entry`)."""

    capability: str
    params: Mapping[str, Any] = field(default_factory=dict)
    origin: str = "transition"


@dataclass(frozen=True, slots=True)
class Timer:
    """A timer armed by a decision (`machines.timers`): `timer_id` is the id of the
    event its firing emits, a function of the operation, the view version it was armed
    at and its `kind` (`state`, `stalled`, `deadline`, `retry`); `state` the state it
    was armed in; `event_type` what its event is; `held` the commands a retry timer
    releases. It stays in the view until the state it was armed in is left (a deadline:
    until the operation ends); deciding its event `spent` it."""

    timer_id: str
    kind: str
    state: str
    armed_version: int
    armed_at: datetime
    due_at: datetime
    event_type: str
    held: tuple[HeldAction, ...] = ()
    spent: bool = False


@dataclass(frozen=True, slots=True)
class KeyClaim:
    """The operation that owns an idempotency key (`machines.claims`), with the digest
    of the arguments it declared with it (None: it declared none)."""

    operation_id: str
    arguments_digest: str | None = None


# A set of strings, written sorted: a set iterates in an order that follows the
# process's hash seed, and the stored view (and the audit commitment's digest of it) must
# be the same bytes whichever process wrote it.
StringSet = Annotated[
    frozenset[str], PlainSerializer(sorted, return_type=list[str], when_used="json")
]


@dataclass(frozen=True, slots=True)
class LineageStatus:
    """The affected agent, every agent in its delegation lineage, and contained ancestors."""

    agent: str
    lineage_agents: StringSet = frozenset()
    contained_ancestors: tuple[str, ...] = ()

    def includes(self, identity: str) -> bool:
        """Whether `identity` is the affected agent or any agent in its lineage."""
        return identity == self.agent or identity in self.lineage_agents


@dataclass(frozen=True, slots=True)
class OperationView:
    """The trusted ledger view of one operation at ledger `version` (a decision count).

    `entry_approval` is the event id of the approval that authorised the transition into
    the current state, if one did: a human who approves "escalated -> resume-pending"
    approves the route, so the resume gate in resume-pending may rely on that approval
    while it is unexpired and unused. Leaving the state forgets it. `open_commands` are
    the command ids issued whose result event has not come back yet, and
    `command_capabilities` each one's capability. `capability`, `tool` and
    `environment` are the scope the operation was opened with, from the authenticated
    tool report that opened it (None for an operation opened without a `scope` block):
    which producers may report on it is checked against them (`machines.producer_roles`)."""

    operation_id: str
    machine_name: str
    machine_digest: str
    policy_digest: str
    state: str
    lineage: LineageStatus
    facts: ToolFacts = field(default_factory=ToolFacts)
    version: int = 0
    epoch: int = 0
    verifications: tuple[Verification, ...] = ()
    retry_attempts: int = 0
    recovery_attempts: int = 0
    budget_limit: int = 0
    budget_spent: int = 0
    deadline: datetime | None = None
    approvals: tuple[Approval, ...] = ()
    used_nonces: StringSet = frozenset()
    checkpoints: tuple[Checkpoint, ...] = ()
    entry_approval: str | None = None
    open_commands: StringSet = frozenset()
    seen_events: Mapping[str, str] = field(default_factory=lambda: _NO_EVENTS)
    # The correlation id of the event that opened the operation (SPEC §6.2, §8 step 3):
    # every later event must carry the same one. Empty for a view stored before it was
    # kept, which then checks nothing.
    correlation_id: str = ""
    # The effect epoch each open command was issued in: its answer is evidence about
    # that attempt only (SPEC 7.1-7.2). A command missing here (a view stored before)
    # answers for the current epoch.
    command_epochs: tuple[tuple[str, int], ...] = ()
    # The conditions escalated in the current state (a refusal or rejection code) and how
    # many events have met each since: one escalation per open condition, the repeats
    # counted, not paged again. Leaving the state closes them.
    escalations: tuple[tuple[str, int], ...] = ()
    capability: str | None = None
    tool: str | None = None
    environment: str | None = None
    command_capabilities: tuple[tuple[str, str], ...] = ()
    # The events that reported a permanent denial of the operation's call or of a retry
    # of it (authorization, validation or policy): an unchanged retry is never commanded
    # after one (agent-failure-recovery practice §1-2).
    denials: tuple[str, ...] = ()
    # The commands the current state waits for: those of a kind whose result comes back
    # as an event, issued by the decision that entered it, and still open ones of the
    # state it came from when that decision was the result of one of them (a failed
    # stop's revocation stays awaited through the failure path). A success result moves
    # the operation only once every awaited command of its family has answered
    # (SPEC §7.3: a containment is complete when all of its actions are).
    awaiting: StringSet = frozenset()
    # Who the operation is about besides its agent (`lineage.agent`), from the event
    # that opened it (SPEC §10: principal, agent, runtime and task are named in every
    # audit record). None for a view stored before they were kept.
    principal: str | None = None
    task: str | None = None
    runtime: str | None = None
    # The operation that already owned the idempotency key this one's opening event
    # declared (`machines.claims`): this operation is its duplicate or a conflicting
    # reuse of the key, and never retries with it (practice §4).
    key_owner: KeyClaim | None = None
    # The credentials delegated to the operation's agent for its task, as its opening
    # event reported them (`lineage.delegated_credentials`), and whether a revocation has
    # been commanded since it last resumed: a finished descendant that still holds them
    # gets the revocation when an ancestor is contained (CONFORMANCE L5.3).
    credentials: tuple[str, ...] = ()
    revoked: bool = False
    # Whether a stop has been commanded since it last resumed: an ancestor's containment
    # does not stop a task its own containment already stopped.
    stopped: bool = False
    # The authenticated producer of the event that opened the operation: another
    # producer's event in another conversation is an incident (`machines.opening`), and a
    # link of it below a parent reported later is checked against its grants
    # (`may_link`). None for a view stored before it was kept.
    opened_by: str | None = None
    # How the affected agent (`lineage.agent`) was proven when the operation opened:
    # `grant` (the opener's tool grant names the agent) or `call-context:<runtime>` (a
    # call context the agent's runtime signed, `machines.call_context`). Empty for a view
    # stored before it was kept.
    agent_proof: str = ""
    # The version of the machine whose digest `machine_digest` is: the one the operation
    # opened under, or the one a signed migration moved it to (`machines.migration`).
    # Empty for a view stored before it was kept (the operation row's version then).
    machine_version: str = ""
    # The timers armed for this operation (`machines.timers`), in arming order, and the
    # earliest time a retry may be commanded that a failure report asked for
    # (`retry_after_seconds`, bounded by the policy).
    timers: tuple[Timer, ...] = ()
    retry_not_before: datetime | None = None

    def timer(self, timer_id: str) -> Timer | None:
        """The timer `timer_id` while it is armed (spent or not), else None."""
        for timer in self.timers:
            if timer.timer_id == timer_id:
                return timer
        return None

    def command_capability(self, command_id: str | None) -> str | None:
        """The capability of the open command `command_id`, if this operation issued it
        and has not had it answered (who may report its result depends on it)."""
        if command_id is None:
            return None
        for issued, capability in self.command_capabilities:
            if issued == command_id:
                return capability
        return None

    def current_outcomes(self) -> frozenset[EffectOutcome]:
        """The outcomes trusted verifiers report for the current effect epoch: each
        verifier's latest result (a verifier re-checking supersedes itself), so a set
        with more than one member means trusted verifiers disagree."""
        epoch = self.epoch
        latest: dict[str, EffectOutcome] = {}
        for v in self.verifications:
            if v.epoch == epoch:
                latest[v.verifier] = v.outcome
        return frozenset(latest.values())

    def command_epoch(self, command_id: str) -> int:
        """The effect epoch `command_id` was issued in (the current one if unknown)."""
        for command, epoch in self.command_epochs:
            if command == command_id:
                return epoch
        return self.epoch

    def escalated(self, condition: str) -> int:
        """How many events have met `condition` in the current state since it was
        escalated (0: it is not open)."""
        for code, count in self.escalations:
            if code == condition:
                return count
        return 0

    def current_verification_refs(self) -> tuple[str, ...]:
        """Evidence references of the current epoch's verifications, for the audit."""
        epoch = self.epoch
        return tuple(v.reference for v in self.verifications if v.epoch == epoch)

    def newest_eligible_checkpoint(self, now: datetime) -> Checkpoint | None:
        """The newest checkpoint eligible now, which may be older than the newest saved."""
        best: Checkpoint | None = None
        for checkpoint in self.checkpoints:
            if checkpoint.eligible(self.machine_digest, self.policy_digest, now) and (
                best is None or checkpoint.saved_at > best.saved_at
            ):
                best = checkpoint
        return best


# Field names in declaration order, which is the order of `OperationView.__init__`'s
# positional parameters (every field is an init field).
_VIEW_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(OperationView))


def evolve(view: OperationView, changes: Mapping[str, Any]) -> OperationView:
    """`dataclasses.replace(view, **changes)`, faster: the decision core and the ledger
    fold every decided event into a new view, and `replace` re-inspects the dataclass
    fields and passes every value by keyword on each call. Unknown names in `changes`
    raise `TypeError`, as `replace` does."""
    unknown = changes.keys() - _VIEW_FIELD_SET
    if unknown:
        raise TypeError(f"OperationView has no field(s) {', '.join(sorted(unknown))}")
    get = changes.get
    return OperationView(*[get(name, getattr(view, name)) for name in _VIEW_FIELDS])


_VIEW_FIELD_SET = frozenset(_VIEW_FIELDS)


def new_view(
    *,
    operation_id: str,
    machine_name: str,
    machine_digest: str,
    policy_digest: str,
    initial_state: str,
    lineage: LineageStatus,
    facts: ToolFacts,
    budget_limit: int,
    deadline: datetime | None,
    correlation_id: str = "",
    capability: str | None = None,
    tool: str | None = None,
    environment: str | None = None,
    principal: str | None = None,
    task: str | None = None,
    runtime: str | None = None,
    credentials: tuple[str, ...] = (),
    opened_by: str | None = None,
    agent_proof: str = "",
    machine_version: str = "",
) -> OperationView:
    """The view of an operation the controller has just started to govern."""
    return OperationView(
        operation_id=operation_id,
        machine_name=machine_name,
        machine_digest=machine_digest,
        policy_digest=policy_digest,
        state=initial_state,
        lineage=lineage,
        facts=facts,
        budget_limit=budget_limit,
        deadline=deadline,
        correlation_id=correlation_id,
        capability=capability,
        tool=tool,
        environment=environment,
        principal=principal,
        task=task,
        runtime=runtime,
        credentials=credentials,
        opened_by=opened_by,
        agent_proof=agent_proof,
        machine_version=machine_version,
    )


def identity_of(view: OperationView) -> dict[str, str | None]:
    """The identities SPEC §10 has every audit record name: initiating principal, agent,
    runtime and task of the operation, as its opening event gave them."""
    return {
        "initiating_principal": view.principal,
        "agent": view.lineage.agent,
        "runtime": view.runtime,
        "task": view.task,
    }


_VIEW_ADAPTER: TypeAdapter[OperationView] | None = None


def _adapter() -> TypeAdapter[OperationView]:
    # Built on first use: the schema walk costs milliseconds that `decide` never needs.
    global _VIEW_ADAPTER
    if _VIEW_ADAPTER is None:
        _VIEW_ADAPTER = TypeAdapter(OperationView)
    return _VIEW_ADAPTER


def view_to_json(view: OperationView) -> dict[str, Any]:
    """The view as JSON-ready data, for a ledger that stores it (or a snapshot of it)."""
    # The serializer knows dicts, not read-only mapping proxies.
    plain = replace(view, seen_events=dict(view.seen_events))
    data: dict[str, Any] = _adapter().dump_python(plain, mode="json")
    return data


def view_from_json(data: Mapping[str, Any]) -> OperationView:
    """The view `view_to_json` produced, validated; equal to the original."""
    view = _adapter().validate_python(data)
    return replace(view, seen_events=MappingProxyType(dict(view.seen_events)))


def view_from_json_text(text: str | bytes) -> OperationView:
    """`view_from_json` of the JSON text of `view_to_json`'s data, parsed and validated
    in one pass by pydantic-core (half the CPU of parsing first, then validating)."""
    view = _adapter().validate_json(text)
    return replace(view, seen_events=MappingProxyType(dict(view.seen_events)))
