"""The validated event value the decision core sees (SPEC §6.2, §9, §11).

An `Event` is built once at the edge, from a decoded envelope, by `parse_event`, which
validates every field with pydantic and computes `payload_digest` over a canonical
encoding. Inside the core it is a frozen value: the core never re-parses, never reads
the raw bytes, and compares digests to tell a duplicate from a conflicting reuse of an
event id (DESIGN "Exactly-once effect on the ledger").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, TypeAdapter, ValidationError

from machines.digest import canonical_json

# What evidence says about an effect (not a decision's `machines.decision.Outcome`).
EffectOutcome = Literal["applied", "not_applied", "unknown"]
Verdict = Literal["approved", "rejected"]

_STRICT: ConfigDict = ConfigDict(extra="forbid")


class EventError(ValueError):
    """The event envelope is invalid; dead-letter it with this reason and the raw bytes.

    `code` is the dead-letter reason: `envelope-invalid` (the shape is wrong),
    `envelope-field-invalid` (a field is empty, too long or malformed) or
    `event-time-out-of-range` (outside `EVENT_TIME_WINDOW`)."""

    def __init__(self, message: str, code: str = "envelope-invalid") -> None:
        super().__init__(message)
        self.code = code


ENVELOPE_INVALID = "envelope-invalid"
ENVELOPE_FIELD_INVALID = "envelope-field-invalid"
EVENT_TIME_OUT_OF_RANGE = "event-time-out-of-range"

# The event times an envelope may carry: generous for clock skew and replays of old
# streams, far enough from `datetime.max` that every deadline and lease computed from an
# event time (days to years ahead) fits, so a far-future time is a refusal, not a crash.
EVENT_TIME_WINDOW: tuple[datetime, datetime] = (
    datetime(2000, 1, 1, tzinfo=UTC),
    datetime(2200, 1, 1, tzinfo=UTC),
)

# SPEC §6.2 names the envelope's identifiers; each is required, non-empty, bounded and
# formatted: no whitespace or control characters, so an id prints, greps and keys the
# same everywhere. An evidence reference is a locator or a note a person reads (a URL,
# "coupa:request:REQ-1 (12 laptops)"): longer, inner spaces allowed, but not blank,
# not padded and without control characters.
MAX_ID_LENGTH = 256
# How deep an event's free-form payload may nest (a mapping or list is one level), and
# how large it may be as canonical JSON: it is stored, audited and may be published, so
# one tool's report must never grow a row past what the topics carry.
MAX_PAYLOAD_DEPTH = 32
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_REFERENCE_LENGTH = 2048
# Credentials delegated to one operation (each an id, `MAX_ID_LENGTH`).
MAX_DELEGATED_CREDENTIALS = 64
_TOKEN = re.compile(r"[^\s\x00-\x1f\x7f]+")
_REFERENCE = re.compile(r"[^\s\x00-\x1f\x7f](?:[^\x00-\x1f\x7f\u2028\u2029]*[^\s\x00-\x1f\x7f])?")
_EVENT_TYPE = re.compile(r"[A-Z][A-Z0-9_]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def canonical_bytes(value: Any) -> bytes:
    """The canonical encoding used for digests and signatures: canonical-json/1
    (`machines.digest.canonical_json`: sorted keys, no insignificant whitespace, UTF-8,
    datetimes as ISO-8601). Two values that mean the same thing encode to the same bytes,
    so their digests and signatures agree."""
    return canonical_json(value)


def sha256_digest(value: Any) -> str:
    """`sha256:<hex>` over `canonical_bytes(value)`."""
    return "sha256:" + hashlib.sha256(canonical_bytes(value)).hexdigest()


@dataclass(frozen=True, slots=True)
class Lineage:
    """Who and what the event is about: the affected agent and its delegation chain."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT

    agent: str
    task: str
    initiating_principal: str
    origin_operation: str | None = None
    parent_operation: str | None = None
    delegated_credentials: tuple[str, ...] = ()
    # The agent runtime that ran the call (envelope v6; SPEC §10 names it among the
    # identities every audit record keeps).
    runtime: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The lineage as plain JSON-ready data, keys in field order (an event's content
        and a command's record carry it in this shape). `runtime` appears only when set,
        so every event without one keeps the digest it had before envelope v6."""
        data: dict[str, Any] = {
            "agent": self.agent,
            "task": self.task,
            "initiating_principal": self.initiating_principal,
            "origin_operation": self.origin_operation,
            "parent_operation": self.parent_operation,
            "delegated_credentials": list(self.delegated_credentials),
        }
        if self.runtime is not None:
            data["runtime"] = self.runtime
        return data


@dataclass(frozen=True, slots=True)
class CheckpointReport:
    """A checkpoint a tool saved, with the evidence that validated it (paper notes §3.2).

    `validated_machine_digest` and `validated_policy_digest` bind the validation to the
    conditions it was checked under; a checkpoint is eligible only while they still match."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT

    checkpoint_id: str
    saved_at: datetime
    reference: str
    validated: bool = False
    validator: str | None = None
    validated_machine_digest: str | None = None
    validated_policy_digest: str | None = None
    valid_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class EvidencePayload:
    """Structured evidence: a verification outcome and/or a checkpoint report."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT

    outcome: EffectOutcome | None = None
    verifier: str | None = None
    reference: str | None = None
    checkpoint: CheckpointReport | None = None
    ancestor_operation: str | None = None


@dataclass(frozen=True, slots=True)
class HumanDecision:
    """A signed HUMAN_APPROVED / HUMAN_REJECTED block (SPEC §9; see `machines.approvals`).

    `transition` is the target state the approver authorises from `state`.
    `reviewed_digest` (signature domain v2) binds an approval to what the approver
    reviewed: `machines.review_digest` of the operation's ledger position, evidence, the
    proposed transition and, when `for_resume` is set (the approval is given for the
    resume itself), the checkpoint the resume would start from."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT

    approver: str
    operation_id: str
    state: str
    transition: str
    machine_digest: str
    expires_at: datetime
    nonce: str
    decision: Verdict
    signature: str = ""
    reviewed_digest: str = ""
    for_resume: bool = False

    def signed_fields(self) -> dict[str, Any]:
        """Every field the signature covers (all but the signature itself)."""
        return {
            "approver": self.approver,
            "operation_id": self.operation_id,
            "state": self.state,
            "transition": self.transition,
            "machine_digest": self.machine_digest,
            "expires_at": self.expires_at.isoformat(),
            "nonce": self.nonce,
            "decision": self.decision,
            "reviewed_digest": self.reviewed_digest,
            "for_resume": self.for_resume,
        }


@dataclass(frozen=True, slots=True)
class ClassifierOutput:
    """A fast classifier's proposal (SPEC §11): untrusted, recorded, never read by a guard."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT

    identity: str
    version: str
    question: str
    probabilities: Mapping[str, float]
    candidate_event: str | None = None


@dataclass(frozen=True, slots=True)
class DeclaredFacts:
    """The tool integration's declaration about its operation (CONFORMANCE Level 2), as
    the envelope carries it. Field names and defaults are `machines.view.ToolFacts`'s;
    whether the core believes the declaration is `machines.facts.admit_facts`'s call."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT

    idempotency_key: str | None = None
    side_effect_possible: bool = True
    side_effect_confirmed: bool = False
    compensation_supported: bool = False
    status_api: bool = False
    # sha256:<hex> of the canonical JSON of the call's arguments (envelope v6): what a
    # second operation claiming the same idempotency key is compared by (practice §4).
    arguments_digest: str | None = None


@dataclass(frozen=True, slots=True)
class Scope:
    """What the operation is, for matching a machine's `applies_to` (SPEC §8 step 2): the
    capability it invoked, the tool and the environment. The agent is `lineage.agent`."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT

    capability: str
    tool: str | None = None
    environment: str | None = None


@dataclass(frozen=True, slots=True)
class Event:
    """One validated recovery event. `event_type` is the opaque uppercase identifier the
    machine's `on:` keys name; `payload_digest` is computed when the value is built."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT

    event_type: str
    event_id: str
    operation_id: str
    correlation_id: str
    machine_name: str
    machine_version: str
    event_time: datetime
    evidence_ref: str
    producer: str
    lineage: Lineage
    evidence: EvidencePayload | None = None
    human_decision: HumanDecision | None = None
    classifier: ClassifierOutput | None = None
    causation: str | None = None
    payload_digest: str = ""
    facts: DeclaredFacts | None = None
    scope: Scope | None = None
    # Free-form context for auditors (what the call was about, a status API's answer, a
    # worker's result): never read by the decision core; intake minimizes it under the
    # machine's `audit.redact` and `audit.record` before anything stores it
    # (`machines.minimization`).
    payload: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        # The digest is a function of the content, so a value built in a test and one
        # parsed from the wire with the same content are the same event.
        if not self.payload_digest:
            object.__setattr__(self, "payload_digest", sha256_digest(self.content()))

    def content(self) -> dict[str, Any]:
        """The event as plain JSON-ready data, without its digest; `facts`, `scope` and
        `payload` appear only when the event carries them. Keys are in field order."""
        # Written out field by field: the generic dataclass walk (`_plain`) cost more
        # than validating the envelope, and every event is built through here. A unit
        # test holds this to `_plain`'s answer for events with every block filled in.
        evidence, decision, classifier = self.evidence, self.human_decision, self.classifier
        data: dict[str, Any] = {
            "event_type": self.event_type,
            "event_id": self.event_id,
            "operation_id": self.operation_id,
            "correlation_id": self.correlation_id,
            "machine_name": self.machine_name,
            "machine_version": self.machine_version,
            "event_time": _time(self.event_time),
            "evidence_ref": self.evidence_ref,
            "producer": self.producer,
            "lineage": self.lineage.to_dict(),
            "evidence": None if evidence is None else _evidence_content(evidence),
            "human_decision": None if decision is None else _decision_content(decision),
            "classifier": None if classifier is None else _classifier_content(classifier),
            "causation": self.causation,
        }
        # `facts`, `scope` and `payload` were added after the first digests were
        # published: they enter the digest only when present, so every event without
        # them keeps the digest (and any signature or test vector) it had before.
        facts, scope = self.facts, self.scope
        if facts is not None:
            data["facts"] = {
                "idempotency_key": facts.idempotency_key,
                "side_effect_possible": facts.side_effect_possible,
                "side_effect_confirmed": facts.side_effect_confirmed,
                "compensation_supported": facts.compensation_supported,
                "status_api": facts.status_api,
            }
            if facts.arguments_digest is not None:
                data["facts"]["arguments_digest"] = facts.arguments_digest
        if scope is not None:
            data["scope"] = {
                "capability": scope.capability,
                "tool": scope.tool,
                "environment": scope.environment,
            }
        if self.payload is not None:
            data["payload"] = _plain(self.payload)
        return data

    def to_dict(self) -> dict[str, Any]:
        """The event as plain JSON-ready data, with its digest."""
        data = self.content()
        data["payload_digest"] = self.payload_digest
        return data


def _time(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _evidence_content(evidence: EvidencePayload) -> dict[str, Any]:
    checkpoint = evidence.checkpoint
    return {
        "outcome": evidence.outcome,
        "verifier": evidence.verifier,
        "reference": evidence.reference,
        "checkpoint": None if checkpoint is None else _plain(checkpoint),
        "ancestor_operation": evidence.ancestor_operation,
    }


def _decision_content(decision: HumanDecision) -> dict[str, Any]:
    return {
        "approver": decision.approver,
        "operation_id": decision.operation_id,
        "state": decision.state,
        "transition": decision.transition,
        "machine_digest": decision.machine_digest,
        "expires_at": _time(decision.expires_at),
        "nonce": decision.nonce,
        "decision": decision.decision,
        "signature": decision.signature,
        "reviewed_digest": decision.reviewed_digest,
        "for_resume": decision.for_resume,
    }


def _classifier_content(classifier: ClassifierOutput) -> dict[str, Any]:
    return {
        "identity": classifier.identity,
        "version": classifier.version,
        "question": classifier.question,
        "probabilities": dict(classifier.probabilities),
        "candidate_event": classifier.candidate_event,
    }


_LEAVES = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any) -> Any:
    # The exact JSON types first (a payload decoded from the wire holds nothing else):
    # each answer is the one the generic tests below give them, at a fraction of the cost
    # (`is_dataclass` and the `Mapping` check cost more than the copy).
    kind = type(value)
    if kind in _LEAVES:
        return value
    if kind is dict:
        return {k: _plain(v) for k, v in value.items()}
    if kind is list:
        return [_plain(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(data: Mapping[str, Any]) -> Event:
    """Validate a decoded envelope into an `Event` (SPEC §6.2). Raises `EventError`, whose
    `code` is the dead-letter reason, naming the event id and every invalid field: the
    shape (`envelope-invalid`), a required identifier that is empty, longer than its
    bound or holds whitespace or control characters (`envelope-field-invalid`), or an
    event time outside `EVENT_TIME_WINDOW` (`event-time-out-of-range`). A caller-supplied
    `payload_digest` is ignored and recomputed, so a sender cannot make two different
    payloads look identical."""
    body = {k: v for k, v in data.items() if k != "payload_digest"}
    too_big = _payload_refusal(body.get("payload"))
    if too_big:
        raise EventError(
            f"event {str(data.get('event_id', '<no event_id>'))[:MAX_ID_LENGTH]!r}: {too_big}; "
            "dead-letter it and send a reference to the context instead",
            ENVELOPE_FIELD_INVALID,
        )
    try:
        event = _ADAPTER.validate_python(body)
    except ValidationError as exc:
        event_id = data.get("event_id", "<no event_id>")
        raise EventError(f"event {event_id!r}: invalid envelope, dead-letter it: {exc}") from exc
    if not _EVENT_TYPE.fullmatch(event.event_type):
        raise EventError(
            f"event {event.event_id[:MAX_ID_LENGTH]!r}: event type "
            f"{event.event_type[:MAX_ID_LENGTH]!r} must be an uppercase id (A-Z, 0-9, _; "
            "at most 128 characters)"
        )
    problems = envelope_problems(event)
    if problems:
        raise EventError(
            f"event {event.event_id[:MAX_ID_LENGTH]!r}: invalid envelope field(s), "
            f"dead-letter it and fix the producer: {'; '.join(problems)}",
            ENVELOPE_FIELD_INVALID,
        )
    if event.event_time.tzinfo is None:
        raise EventError(f"event {event.event_id}: event_time must carry a timezone")
    low, high = EVENT_TIME_WINDOW
    if not low <= event.event_time < high:
        raise EventError(
            f"event {event.event_id} (operation {event.operation_id}) has event_time "
            f"{event.event_time.isoformat()}, outside {low.date()} .. {high.date()}; send "
            "the time the event happened, in UTC",
            EVENT_TIME_OUT_OF_RANGE,
        )
    return event


def _payload_refusal(payload: Any) -> str | None:
    """Why `payload` is refused before it is validated, or None: nested deeper than
    `MAX_PAYLOAD_DEPTH` (walked without recursion, so a hostile nesting cannot exhaust
    the stack) or larger than `MAX_PAYLOAD_BYTES` as canonical JSON."""
    if payload is None:
        return None
    stack: list[tuple[Any, int]] = [(payload, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_PAYLOAD_DEPTH:
            return f"payload is nested deeper than {MAX_PAYLOAD_DEPTH} levels"
        if isinstance(node, Mapping):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node)
    try:
        size = len(canonical_bytes(payload))
    except (TypeError, ValueError):
        return None  # not JSON: the validation that follows names the field
    if size > MAX_PAYLOAD_BYTES:
        return f"payload is {size} bytes of canonical JSON; at most {MAX_PAYLOAD_BYTES}"
    return None


def envelope_problems(event: Event) -> list[str]:
    """What is wrong with the envelope's identifiers (empty for a valid one): each of
    SPEC §6.2's fields and the lineage's, non-empty, bounded and without whitespace or
    control characters."""
    problems: list[str] = []
    lineage = event.lineage
    required = (
        ("event_id", event.event_id),
        ("operation_id", event.operation_id),
        ("correlation_id", event.correlation_id),
        ("machine_name", event.machine_name),
        ("machine_version", event.machine_version),
        ("producer", event.producer),
        ("lineage.agent", lineage.agent),
        ("lineage.task", lineage.task),
        ("lineage.initiating_principal", lineage.initiating_principal),
    )
    optional = (
        ("causation", event.causation),
        ("lineage.origin_operation", lineage.origin_operation),
        ("lineage.parent_operation", lineage.parent_operation),
        ("lineage.runtime", lineage.runtime),
    )
    for name, value in (*required, *((n, v) for n, v in optional if v is not None)):
        problem = _token_problem(name, value, MAX_ID_LENGTH)
        if problem:
            problems.append(problem)
    credentials = lineage.delegated_credentials
    if len(credentials) > MAX_DELEGATED_CREDENTIALS:
        problems.append(
            f"lineage.delegated_credentials lists {len(credentials)}; at most "
            f"{MAX_DELEGATED_CREDENTIALS}"
        )
    longest = max((len(c) for c in credentials), default=0)
    if longest > MAX_ID_LENGTH:
        problems.append(
            f"lineage.delegated_credentials holds one of {longest} characters; at most "
            f"{MAX_ID_LENGTH}"
        )
    problem = _token_problem("evidence_ref", event.evidence_ref, MAX_REFERENCE_LENGTH, _REFERENCE)
    if problem:
        problems.append(problem)
    digest = event.facts.arguments_digest if event.facts is not None else None
    if digest is not None and not _DIGEST.fullmatch(digest):
        problems.append(f"facts.arguments_digest {digest[:80]!r} is not sha256:<64 hex digits>")
    return problems


def _token_problem(name: str, value: str, bound: int, form: re.Pattern[str] = _TOKEN) -> str | None:
    if not value:
        return f"{name} is empty"
    if len(value) > bound:
        return f"{name} is {len(value)} characters long; at most {bound}"
    if not form.fullmatch(value):
        what = "whitespace or control characters" if form is _TOKEN else "control characters"
        return f"{name} {value[:MAX_ID_LENGTH]!r} is blank, padded or holds {what}"
    return None
