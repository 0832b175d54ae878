"""Declared tool facts: who may declare them, when, and that they never change afterwards.

A tool integration declares facts about its operation (CONFORMANCE Level 2): the
idempotency key, whether a side effect was possible and whether it was confirmed,
whether compensation is supported, whether a status API exists. `retry.permitted`,
`compensation.supported` and the evidence guards read them, so believing a false
declaration could retry a payment. The rule (docs/decision-core.md, "Declared tool
facts"), applied by `admit_facts` to every event that carries a `facts` block:

1. Never from the affected agent or its lineage (SPEC §7.7): the agent's word about its
   own effect is not evidence, whenever it is offered. The event is refused.
2. Once an operation's facts are declared they are fixed. A later block that repeats
   them exactly is accepted and changes nothing (a tool that stamps every event with
   its declaration is not punished); a block that differs is refused (`facts-immutable`)
   and the declared facts stay as they were.
3. Otherwise the declaration is accepted when the event opens the operation (the view
   has decided nothing yet) or when its producer is one the policy trusts as an
   authority about effects (`trusted_verifiers`). Anyone else is refused
   (`facts-untrusted`).

4. An idempotency key counts for retry only when it was declared at or before the
   failure report, that is on the event that opened the operation (or by the case file
   that opened it): a key declared later, by a trusted producer, is recorded with
   `key_declared_late` and never authorises a retry (agent-failure-recovery practice
   §4: never mint a new key after a timeout). The retry command carries exactly the
   declared key (`machines.invariants`).

A refusal refuses the whole event, as an untrusted verification does: acting on an
event whose declaration we refused would let its type speak for facts we did not accept.
Case files declare facts through `declare` too, so a case and a live envelope with the
same declaration open the same view.
"""

from __future__ import annotations

from dataclasses import replace

from machines.event import DeclaredFacts, Event
from machines.invariants import Notice
from machines.policy import Policy
from machines.view import OperationView, ToolFacts

__all__ = ["FACTS_IMMUTABLE", "FACTS_UNTRUSTED", "admit_facts", "declare", "same_declaration"]

FACTS_UNTRUSTED = "facts-untrusted"
FACTS_IMMUTABLE = "facts-immutable"


def declare(block: DeclaredFacts, declared_by: str) -> ToolFacts:
    """The `ToolFacts` a declaration `block` states, attributed to `declared_by` (the
    producer of the event that carried it, or the case file that stated it)."""
    return ToolFacts(
        idempotency_key=block.idempotency_key,
        side_effect_possible=block.side_effect_possible,
        side_effect_confirmed=block.side_effect_confirmed,
        compensation_supported=block.compensation_supported,
        status_api=block.status_api,
        declared_by=declared_by,
        arguments_digest=block.arguments_digest,
    )


def same_declaration(a: ToolFacts, b: ToolFacts) -> bool:
    """Whether `a` and `b` state the same facts, whoever declared them."""
    return (
        a.idempotency_key,
        a.side_effect_possible,
        a.side_effect_confirmed,
        a.compensation_supported,
        a.status_api,
        a.arguments_digest,
    ) == (
        b.idempotency_key,
        b.side_effect_possible,
        b.side_effect_confirmed,
        b.compensation_supported,
        b.status_api,
        b.arguments_digest,
    )


def admit_facts(
    event: Event, view: OperationView, policy: Policy
) -> tuple[ToolFacts | None, Notice | None]:
    """The facts `event` newly declares for the operation `view` describes, or the notice
    refusing the event (see the module docstring for the rule). `(None, None)` when the
    event declares nothing new: no block, or a repetition of the facts already set."""
    block = event.facts
    if block is None:
        return None, None
    producer = event.producer
    where = f"event {event.event_id} (operation {view.operation_id})"
    if view.lineage.includes(producer):
        return None, Notice(
            FACTS_UNTRUSTED,
            f"{where}: producer {producer} is the affected agent or in its lineage and may "
            "not declare tool facts about its own effect (SPEC 7.7); let the tool "
            "integration declare them when it opens the operation",
        )
    offered = declare(block, producer)
    current = view.facts
    if current.declared_by is not None:
        if same_declaration(current, offered):
            return None, None
        return None, Notice(
            FACTS_IMMUTABLE,
            f"{where}: producer {producer} offers tool facts that differ from those "
            f"{current.declared_by} declared; declared facts never change, so the event "
            "is refused; open a new operation if the facts really changed",
        )
    opens = view.version == 0 and not view.seen_events
    if opens:
        return offered, None
    if producer in policy.trusted_verifiers:
        # Accepted, but a key declared after the failure report is not the original
        # call's: the facts stand, and retry.permitted stays false (rule 4).
        late = offered.idempotency_key is not None
        return replace(offered, key_declared_late=late), None
    return None, Notice(
        FACTS_UNTRUSTED,
        f"{where}: producer {producer} declares tool facts after the operation opened "
        f"and is not trusted by policy {policy.id}; declare facts on the first event, "
        "or add the tool integration to trusted_verifiers",
    )
