"""Call contexts: the affected agent proven by its runtime, not named by a tool.

A tool reports what happened to a call; it does not know, and cannot prove, which agent
made the call, for which task, on whose behalf. The agent's runtime (or its
orchestrator) does. Before the call it signs a **call context** that binds one operation
id to the lineage the tool will report (agent, task, initiating principal, origin and
parent operations, delegated credentials) and hands it to the tool with the call; the
tool forwards it unchanged in the `recovery-call-context` header of the event that opens
the operation (`producers.RecoveryClient.publish_event(call_context=...)` does both:
the header, and the lineage taken from the context). The controller then believes the
lineage because the runtime signed it (`prove_lineage`):

- the context's `issuer` is a roster producer whose key `key_id`, valid at the
  controller's clock, signed the canonical JSON of the context under
  `CALL_CONTEXT_DOMAIN`, and which holds `orchestrator` for the context's agent;
- it is for this operation id and its lineage is exactly the event's;
- it is unexpired: `issued_at` at most `CLOCK_SKEW` ahead of the controller's clock,
  `expires_at` after it, and at most `MAX_LIFETIME` after `issued_at`;
- the header is at most `MAX_CALL_CONTEXT_BYTES`.

A context that fails any check refuses the opening (`call-context-invalid`), even when
the tool's grant alone would have proven the agent: a forged or stale context is an
attack, not noise. Without a context, the opener proves the agent only with a `tool`
grant that names it (`agents: [billing-agent]`); a grant for any agent (`"*"`) is
refused outside demo mode (`machines.wildcard_agent_grants`), so a tool cannot aim a
containment at a bystander by naming it (`machines.producer_roles.check_opening`).

The format is JSON, written as canonical JSON: `{"context": {...}, "signature":
"<base64>"}`, the context holding `format` (`call-context/1`), `operation_id`, `lineage`
(the shape of `machines.Lineage.to_dict`), `issuer`, `key_id`, `issued_at` and
`expires_at` (RFC 3339, UTC). `issue_call_context` writes it; docs/tool-integration.md
shows both sides, docs/wire-protocol.md specifies it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import ed25519
from machines.digest import canonical_json
from machines.event import Event, Lineage
from machines.keys import key_id
from machines.roster import AuthenticationError, AuthRefusal, ProducerEntry, Role, Roster

__all__ = [
    "CALL_CONTEXT_DOMAIN",
    "CALL_CONTEXT_FORMAT",
    "CLOCK_SKEW",
    "MAX_CALL_CONTEXT_BYTES",
    "MAX_LIFETIME",
    "call_context_claims",
    "issue_call_context",
    "prove_lineage",
]

CALL_CONTEXT_FORMAT: Final = "call-context/1"
CALL_CONTEXT_DOMAIN: Final = b"agent-recovery call-context/1\n"
MAX_CALL_CONTEXT_BYTES: Final = 8 * 1024
MAX_LIFETIME: Final = timedelta(hours=24)
CLOCK_SKEW: Final = timedelta(minutes=5)
_FIELDS: Final = frozenset(
    {"format", "operation_id", "lineage", "issuer", "key_id", "issued_at", "expires_at"}
)


def _message(context: Mapping[str, Any]) -> bytes:
    return CALL_CONTEXT_DOMAIN + canonical_json(dict(context))


def _time(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def issue_call_context(
    issuer: str,
    private_key: Ed25519PrivateKey,
    operation_id: str,
    lineage: Lineage,
    *,
    now: datetime,
    lifetime: timedelta = timedelta(minutes=15),
) -> str:
    """The call context `issuer` (an orchestrator or agent runtime in the roster) signs
    with `private_key` for the call that becomes `operation_id`, valid from `now` for
    `lifetime` (at most `MAX_LIFETIME`): the header value a tool forwards."""
    if not timedelta(0) < lifetime <= MAX_LIFETIME:
        raise ValueError(f"a call context lives more than 0 and at most {MAX_LIFETIME}")
    context = {
        "format": CALL_CONTEXT_FORMAT,
        "operation_id": operation_id,
        "lineage": lineage.to_dict(),
        "issuer": issuer,
        "key_id": key_id(private_key.public_key()),
        "issued_at": _time(now),
        "expires_at": _time(now + lifetime),
    }
    signature = ed25519.sign(private_key, _message(context))
    # Canonical JSON, so one context is the same header bytes in every implementation
    # (docs/wire-protocol.md, "Call contexts"); the verifier reads any JSON object.
    document = {"context": context, "signature": base64.b64encode(signature).decode("ascii")}
    return canonical_json(document).decode("utf-8")


def _invalid(event: Event, why: str) -> AuthenticationError:
    return AuthenticationError(
        AuthRefusal.CALL_CONTEXT_INVALID,
        f"{event.event_type} {event.event_id} (operation {event.operation_id}) forwards a "
        f"call context that proves nothing: {why}; forward the context the agent's runtime "
        "signed for this call, unchanged",
    )


def _parse(text: str, event: Event) -> tuple[dict[str, Any], str]:
    if len(text.encode("utf-8")) > MAX_CALL_CONTEXT_BYTES:
        raise _invalid(event, f"it is larger than {MAX_CALL_CONTEXT_BYTES} bytes")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise _invalid(event, f"it is not JSON ({exc})") from exc
    if not isinstance(document, dict) or set(document) != {"context", "signature"}:
        raise _invalid(event, "it is not an object of `context` and `signature`")
    context, signature = document["context"], document["signature"]
    if not isinstance(context, dict) or set(context) != _FIELDS:
        raise _invalid(event, f"its context must hold exactly {', '.join(sorted(_FIELDS))}")
    if not isinstance(signature, str):
        raise _invalid(event, "its signature is not base64 text")
    if context["format"] != CALL_CONTEXT_FORMAT:
        raise _invalid(event, f"format {context['format']!r} is not {CALL_CONTEXT_FORMAT}")
    return context, signature


def _moment(context: Mapping[str, Any], name: str, event: Event) -> datetime:
    value = context[name]
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError as exc:
        raise _invalid(event, f"{name} {value!r} is no RFC 3339 time") from exc
    if moment.tzinfo is None:
        raise _invalid(event, f"{name} {value!r} has no time zone")
    return moment


def call_context_claims(text: str) -> tuple[str, Lineage]:
    """The operation id and lineage call context `text` claims, unverified: what the
    tool that forwards it reports (the controller verifies, `prove_lineage`). Raises
    `ValueError` for a text that is no call context."""
    try:
        context = json.loads(text)["context"]
        lineage = context["lineage"]
        return str(context["operation_id"]), Lineage(
            agent=lineage["agent"],
            task=lineage["task"],
            initiating_principal=lineage["initiating_principal"],
            origin_operation=lineage.get("origin_operation"),
            parent_operation=lineage.get("parent_operation"),
            delegated_credentials=tuple(lineage.get("delegated_credentials") or ()),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a call context: {exc!r}") from exc


def prove_lineage(text: str, event: Event, roster: Roster, *, at: datetime) -> ProducerEntry:
    """The roster entry of the runtime whose call context `text` proves `event`'s
    lineage at `at` (the controller's clock); raises `AuthenticationError`
    (`call-context-invalid`, or the roster's code for a bad signature) naming the first
    check that fails (module docstring)."""
    context, signature = _parse(text, event)
    if context["operation_id"] != event.operation_id:
        raise _invalid(event, f"it was issued for operation {context['operation_id']!r}")
    if context["lineage"] != event.lineage.to_dict():
        raise _invalid(
            event,
            f"its lineage {json.dumps(context['lineage'], sort_keys=True)[:400]} is not the "
            "event's",
        )
    issued, expires = _moment(context, "issued_at", event), _moment(context, "expires_at", event)
    if expires - issued > MAX_LIFETIME or expires <= issued:
        raise _invalid(
            event, f"it claims a lifetime of {expires - issued} (at most {MAX_LIFETIME})"
        )
    if issued > at + CLOCK_SKEW:
        raise _invalid(event, f"it was issued at {_time(issued)}, after now ({_time(at)})")
    if expires <= at:
        raise _invalid(event, f"it expired at {_time(expires)} (now {_time(at)})")
    try:
        base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _invalid(event, "its signature is not base64") from exc
    issuer = roster.authenticate(
        str(context["issuer"]), str(context["key_id"]), _message(context), signature, at=at
    )
    agent = event.lineage.agent
    if not issuer.permits(Role.ORCHESTRATOR, agent=agent):
        raise _invalid(
            event,
            f"its issuer {issuer.id} does not hold orchestrator for agent {agent}, so it "
            "cannot vouch for that agent's calls",
        )
    return issuer
