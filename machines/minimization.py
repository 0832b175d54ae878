"""What of an event's payload the controller keeps: `audit.redact` and `audit.record`.

SPEC §10 asks that "sensitive prompt and context content should be referenced or
minimized rather than copied indiscriminately". An event may carry a free-form `payload`
(what the tool's call was about, the status API's answer, a worker's result); the
decision core never reads it, it is kept for auditors only. Before anything derived from
an accepted event is stored or published, intake replaces the event by
`minimize_event(machine.audit, event)`:

1. every `audit.redact` path (`payload.<field>...`, through lists of objects too) is
   replaced by the marker `{"redacted": true}`; no digest of the value is kept, because
   a digest of a small value (a card's last four digits, an address from a customer
   list) gives it back to anyone who tries the candidates;
2. the redacted payload is kept only when the machine's `audit.record` lists the
   payload's category (`payload_category`); otherwise it is replaced by the reference
   `{"omitted": true, "category": ..., "digest": "sha256:..."}`, the digest of the
   redacted payload, so a copy kept elsewhere can still be matched.

One field is protocol, not content: a failure report's top-level `retry_after_seconds`
(`machines.timers`, the delay a rate-limited API asked for, which can only postpone a
retry) stays beside the reference, unless `audit.redact` names it.

The event's `payload_digest` is then computed over the minimized content, so the ledger
holds no digest of a redacted value either. Redelivery of the same record minimizes to
the same event and is a duplicate, as before; a reuse of an event id that changes only a
redacted or omitted value is indistinguishable by design, and harmless: nothing the core
decides on is in the payload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

from machines.event import Event, sha256_digest
from machines.model import AuditSpec
from machines.timers import RETRY_AFTER_FIELD, retry_after_seconds

__all__ = [
    "OMITTED",
    "REDACTED",
    "minimize_event",
    "minimize_payload",
    "payload_category",
    "redact",
]

REDACTED: Final[Mapping[str, bool]] = {"redacted": True}
OMITTED: Final = "omitted"


def payload_category(event: Event) -> str:
    """The `audit.record` option that keeps `event`'s payload: `approval_context` for a
    human decision (the context the approver saw), `evidence_payloads` for an event that
    offers evidence (a verification's answer, a checkpoint), `action_results` for the
    result of a command (its causation is the command id), `classifier_outputs` for a
    classifier's proposal, and `downstream_references` for any other report (what the
    tool or the external system returned)."""
    if event.human_decision is not None:
        return "approval_context"
    if event.evidence is not None:
        return "evidence_payloads"
    if event.causation is not None:
        return "action_results"
    if event.classifier is not None:
        return "classifier_outputs"
    return "downstream_references"


def redact(audit: AuditSpec, payload: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `payload` with every `audit.redact` path (written `payload.<field>...`,
    relative to the payload) replaced by `REDACTED`. A path through a list applies to
    each object in it; a path the payload does not have changes nothing."""
    copy: dict[str, Any] = dict(payload)
    for dotted in audit.redact:
        parts = dotted.split(".")
        if parts[0] == "payload":
            parts = parts[1:]
        if parts:
            _redact_path(copy, parts)
    return copy


def _redact_path(node: dict[str, Any], parts: list[str]) -> None:
    head, rest = parts[0], parts[1:]
    if head not in node:
        return
    if not rest:
        node[head] = dict(REDACTED)
        return
    node[head] = _redact_below(node[head], rest)


def _redact_below(child: Any, rest: list[str]) -> Any:
    if isinstance(child, Mapping):
        copy = dict(child)
        _redact_path(copy, rest)
        return copy
    if isinstance(child, (list, tuple)):
        return [_redact_below(item, rest) for item in child]
    return child


def minimize_payload(audit: AuditSpec, event: Event) -> Mapping[str, Any] | None:
    """What the ledger keeps of `event.payload` under `audit` (see the module docstring):
    the redacted payload when `audit.record` lists its category, else a reference to it."""
    payload = event.payload
    if payload is None or _is_reference(payload):
        return payload
    redacted = redact(audit, payload)
    category = payload_category(event)
    if category in audit.record:
        return redacted
    reference: dict[str, Any] = {
        OMITTED: True,
        "category": category,
        "digest": sha256_digest(redacted),
    }
    kept = redacted.get(RETRY_AFTER_FIELD)
    if retry_after_seconds(redacted) is not None:
        reference[RETRY_AFTER_FIELD] = kept
    return reference


def minimize_event(audit: AuditSpec, event: Event) -> Event:
    """`event` as the controller stores and publishes it: its payload minimized
    (`minimize_payload`) and its digest recomputed over that content. An event without a
    payload is returned as it is; minimizing twice changes nothing more."""
    if event.payload is None:
        return event
    kept = minimize_payload(audit, event)
    if kept == event.payload:
        return event
    return replace(event, payload=kept, payload_digest="")


def _is_reference(payload: Mapping[str, Any]) -> bool:
    keys = set(payload) - {RETRY_AFTER_FIELD}
    return payload.get(OMITTED) is True and keys == {OMITTED, "category", "digest"}
