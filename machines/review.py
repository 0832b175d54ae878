"""The review packet (SPEC §9): what a human reviewer receives, and its digest.

`review_packet(...)` assembles, from what the ledger holds about one operation, the
identities (principal, agent, runtime, task, lineage), the operation and correlation
ids, the initiating request, the triggering event, the current state, the ledger
history, the downstream references, the verification evidence, the proposed action,
and the consequences of approving and of rejecting, and what the operation waits for (its
timers: when a timeout, the stall bound or the deadline fires, and a retry scheduled for
later). Both consequences are computed by
deciding a hypothetical HUMAN_APPROVED and HUMAN_REJECTED through the core
(`machines.decision.decide`) on the current view: the state each leads to and the
commands each would produce. Nothing is written and no clock is read.

The hypothetical decisions are signed by an approver the packet invents for the
purpose (`HYPOTHETICAL_APPROVER`, given the policy's first approval role and a key that
exists only here), so the consequences show what an authorised approver's signature
would do; a real approver's own standing (roster, roles, lineage) is checked by the
controller when the signed decision arrives.

`guidance` (`_guidance`) says the same for a person who has never seen a RECOVERY.yaml:
what the machine says the current state means, why and to whom it was escalated (the
escalation's queue, severity and reason), what the tool declared about the call (its
idempotency key, whether a side effect was possible or confirmed), which commands no
event has answered yet, and, for approving and for rejecting, the state it leads to in
the machine's own words, the commands it sends, and what that state waits for next (an
approval that sends no command leaves the operation waiting for someone).

`ReviewPacket.digest` is `sha256:` over the canonical JSON (`machines.digest`) of the
packet's content, which excludes only the moment it was assembled: the same ledger
state gives the same digest, and any new decision, event or command changes it. That
is what `recoveryctl approve --packet-digest` compares, and what a signed decision can
bind (`packet_digest`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from machines.approvals import insecure_test_key, public_key_b64, review_digest, sign_decision
from machines.decision import Decision, decide
from machines.digest import digest_of
from machines.event import Event, HumanDecision, Lineage, Verdict
from machines.model import CapabilityKind, Machine, Registry
from machines.policy import Approver, Policy
from machines.timers import waiting_on
from machines.view import OperationView

__all__ = [
    "HUMAN_DECISION_EVENTS",
    "HYPOTHETICAL_APPROVER",
    "PACKET_FORM",
    "ReviewPacket",
    "awaited_actions",
    "awaits_human",
    "human_targets",
    "packet_digest",
    "review_packet",
]

PACKET_FORM: Final = "review-packet/1"
HYPOTHETICAL_APPROVER: Final = "review-packet:hypothetical-approver"
HUMAN_DECISION_EVENTS: Final = ("HUMAN_APPROVED", "HUMAN_REJECTED")
_VERDICTS: Final[Mapping[str, Verdict]] = {
    "HUMAN_APPROVED": "approved",
    "HUMAN_REJECTED": "rejected",
}
# The hypothetical decisions' expiry, after the packet's `now`: long enough that no
# guard sees an expired approval, and not part of the digest.
_HYPOTHETICAL_VALIDITY: Final = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class ReviewPacket:
    """One assembled packet. `content` is everything the digest covers; `assembled_at`
    is when it was assembled (shown, not digested)."""

    content: Mapping[str, Any]
    assembled_at: datetime

    @property
    def digest(self) -> str:
        """`sha256:<hex>` of the canonical JSON of `content`."""
        return packet_digest(self.content)

    @property
    def operation_id(self) -> str:
        """The operation the packet is about."""
        return str(self.content["operation"]["operation_id"])

    def proposal(self, event_type: str) -> Mapping[str, Any] | None:
        """The signed-decision fields a reviewer's HUMAN_APPROVED or HUMAN_REJECTED would
        carry (`state`, `transition`), or None when the current state accepts no such
        event."""
        found: Mapping[str, Any] | None = self.content["proposed_action"].get(event_type)
        return found

    def to_dict(self) -> dict[str, Any]:
        """The packet as JSON-ready data, with its digest and assembly time."""
        return {
            **self.content,
            "digest": self.digest,
            "assembled_at": self.assembled_at.isoformat(),
        }


def packet_digest(content: Mapping[str, Any]) -> str:
    """The digest of a packet's content (`ReviewPacket.digest`), for a caller holding
    the JSON form: drop `digest` and `assembled_at` first."""
    return digest_of(dict(content))


def human_targets(machine: Machine, state: str, event_type: str) -> tuple[str, ...]:
    """The target states `event_type` may lead to from `state`, in candidate order."""
    return tuple(t.target for t in machine.transitions_for(state, event_type))


def awaits_human(machine: Machine, state: str, registry: Registry) -> bool:
    """Whether an operation in `state` waits for a human: the state is not final and
    either accepts HUMAN_APPROVED (an approval is what moves it on) or accepts
    HUMAN_REJECTED and is entered by a transition that escalates to a human (a
    capability of kind `escalate`). A resume gate a human *may* still reject, entered
    without escalating, does not wait for anyone."""
    found = machine.states.get(state)
    if found is None or found.final:
        return False
    if "HUMAN_APPROVED" in found.on:
        return True
    if "HUMAN_REJECTED" not in found.on:
        return False
    return any(
        transition.target == state
        and any(_escalates(action.capability, registry) for action in transition.actions)
        for source in machine.states.values()
        for transitions in source.on.values()
        for transition in transitions
    )


def _escalates(capability: str, registry: Registry) -> bool:
    spec = registry.capabilities.get(capability)
    return spec is not None and spec.kind == CapabilityKind.ESCALATE


@dataclass(frozen=True, slots=True)
class _Rules:
    machine: Machine
    policy: Policy
    registry: Registry
    view: OperationView
    lineage: Lineage
    correlation_id: str
    now: datetime


def review_packet(
    *,
    machine: Machine,
    policy: Policy,
    registry: Registry,
    view: OperationView,
    operation: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]],
    decisions: Sequence[Mapping[str, Any]],
    descendants: Sequence[str] = (),
    now: datetime,
) -> ReviewPacket:
    """Assemble the packet for the operation `view` describes (SPEC §9).

    `operation` is its stored identity row (operation and correlation ids, machine,
    policy digest, principal, agent, runtime, task, lineage columns), `events` its
    stored envelopes and `decisions` its decision records, both in ledger order, and
    `descendants` the operations below it. `machine`, `policy` and `registry` are what
    the controller decides under; `now` is the time the consequences are decided at."""
    lineage = Lineage(
        agent=str(operation["agent"]),
        task=str(operation["task"]),
        initiating_principal=str(operation["initiating_principal"]),
        origin_operation=operation.get("origin_operation"),
        parent_operation=operation.get("parent_operation"),
        delegated_credentials=tuple(operation.get("delegated_credentials", ())),
    )
    rules = _Rules(machine, policy, registry, view, lineage, str(operation["correlation_id"]), now)
    content: dict[str, Any] = {
        "packet": PACKET_FORM,
        "operation": {
            "operation_id": view.operation_id,
            "correlation_id": rules.correlation_id,
            "machine": {
                "name": machine.name,
                "version": machine.version,
                "digest": view.machine_digest,
            },
            "policy": {
                "id": policy.id,
                "digest": policy.digest,
                "operation_policy_digest": operation.get("policy_digest", view.policy_digest),
            },
        },
        "identities": _identities(operation),
        "initiating_request": _request(machine, events),
        "triggering_event": _trigger(view.state, decisions, events),
        "current_state": _current_state(machine, view, decisions, registry),
        "history": [_history_entry(d) for d in decisions],
        "downstream": _downstream(decisions, descendants),
        "verification": _verification(view),
        # What the operation waits for (its timers: a timeout, the stall bound, the
        # deadline, a scheduled retry and when it fires), `machines.timers.waiting_on`.
        "waiting": waiting_on(view),
        "proposed_action": _proposals(rules),
        "consequences": {
            "approve": _consequence(rules, "HUMAN_APPROVED"),
            "reject": _consequence(rules, "HUMAN_REJECTED"),
        },
    }
    content["guidance"] = _guidance(rules, decisions, content)
    return ReviewPacket(content=content, assembled_at=now)


def _identities(operation: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "initiating_principal": operation["initiating_principal"],
        "agent": operation["agent"],
        "runtime": operation.get("runtime"),
        "task": operation["task"],
        "lineage": {
            "origin_operation": operation.get("origin_operation"),
            "parent_operation": operation.get("parent_operation"),
            "depth": operation.get("depth", 0),
            "ancestors": list(operation.get("ancestors", ())),
            "delegated_credentials": list(operation.get("delegated_credentials", ())),
        },
    }


def _event_summary(envelope: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "event_id": envelope["event_id"],
        "event_type": envelope["event_type"],
        "event_time": envelope["event_time"],
        "producer": envelope["producer"],
        "evidence_ref": envelope["evidence_ref"],
        "causation": envelope.get("causation"),
        "payload_digest": envelope.get("payload_digest"),
        "evidence": envelope.get("evidence"),
    }


def _request(machine: Machine, events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The event that opened the operation, as a summary: what was called (scope), what
    the tool declared (facts), and which fields the machine's audit section records or
    redacts (the packet carries references, never the call's content)."""
    if not events:
        return None
    first = events[0]
    return {
        **_event_summary(first),
        "scope": first.get("scope"),
        "facts": first.get("facts"),
        "audit_record": list(machine.audit.record),
        "audit_redact": list(machine.audit.redact),
    }


def _trigger(
    state: str, decisions: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The event whose decision moved the operation into its current state."""
    by_id = {e["event_id"]: e for e in events}
    for decision in reversed(decisions):
        if decision["outcome"] == "transitioned" and decision["state_after"] == state:
            event_id = decision["event"]["id"]
            envelope = by_id.get(event_id)
            if envelope is not None:
                return {**_event_summary(envelope), "decision_sequence": decision["sequence"]}
            return {
                "event_id": event_id,
                "event_type": decision["event"]["type"],
                "decision_sequence": decision["sequence"],
            }
    return None


def awaited_actions(view: OperationView, registry: Registry) -> list[dict[str, Any]]:
    """The commands the operation's current state waits for that have not answered yet
    (`OperationView.awaiting`: a containment waits for its stop and its revocation),
    each with its capability and kind, in command order: what a reviewer and the
    console show as still unanswered (SPEC §7.3)."""
    out = []
    for command_id in sorted(view.awaiting & view.open_commands):
        capability = view.command_capability(command_id)
        spec = registry.capabilities.get(capability) if capability is not None else None
        out.append(
            {
                "command_id": command_id,
                "capability": capability,
                "kind": None if spec is None else str(spec.kind),
            }
        )
    return out


def _current_state(
    machine: Machine,
    view: OperationView,
    decisions: Sequence[Mapping[str, Any]],
    registry: Registry,
) -> dict[str, Any]:
    since = next(
        (d["decided_at"] for d in reversed(decisions) if d["state_after"] != d["state_before"]),
        None,
    )
    state = machine.states.get(view.state)
    return {
        "name": view.state,
        "final": bool(state and state.final),
        "since": since,
        "ledger_version": view.version,
        "accepts": sorted(state.on) if state is not None else [],
        "open_commands": sorted(view.open_commands),
        "awaiting": awaited_actions(view, registry),
    }


def _history_entry(decision: Mapping[str, Any]) -> dict[str, Any]:
    event = decision["event"]
    return {
        "sequence": decision["sequence"],
        "decided_at": decision["decided_at"],
        "event_id": event["id"],
        "event_type": event["type"],
        "producer": event["producer"],
        "evidence_ref": event["evidence_ref"],
        "outcome": decision["outcome"],
        "state_before": decision["state_before"],
        "state_after": decision["state_after"],
        "guards": [
            {"guard": g["guard"], "value": g["value"], "evidence": g["evidence"]}
            for g in decision["guards"]
        ],
        "commands": [i["command_id"] for i in decision["invocations"]],
        "refusals": [r["code"] for r in decision["refusals"]],
    }


def _downstream(
    decisions: Sequence[Mapping[str, Any]], descendants: Sequence[str]
) -> dict[str, Any]:
    """Every command issued (and the event that answered it, if any), the evidence
    references the ledger holds, and the operations below this one."""
    # A refused event answered nothing (a result for the wrong command, from an
    # untrusted producer): its command stays open, as in the view.
    answers = {
        d["event"]["causation"]: d["event"]
        for d in decisions
        if d["event"]["causation"] and d["outcome"] != "refused"
    }
    commands = [
        {
            "command_id": i["command_id"],
            "capability": i["capability"],
            "kind": i["kind"],
            "params": i["params"],
            "issued_at_sequence": d["sequence"],
            "answered_by": _answer(answers, i["command_id"], "id"),
            "result": _answer(answers, i["command_id"], "type"),
        }
        for d in decisions
        for i in d["invocations"]
    ]
    references = sorted({d["event"]["evidence_ref"] for d in decisions})
    return {
        "commands": commands,
        "evidence_refs": references,
        "descendant_operations": list(descendants),
    }


def _answer(answers: Mapping[str, Mapping[str, Any]], command_id: str, field: str) -> Any:
    event = answers.get(command_id)
    return None if event is None else event[field]


def _verification(view: OperationView) -> dict[str, Any]:
    return {
        "current_outcomes": sorted(view.current_outcomes()),
        "effect_epoch": view.epoch,
        "verifications": [
            {
                "verifier": v.verifier,
                "outcome": v.outcome,
                "reference": v.reference,
                "event_id": v.event_id,
                "epoch": v.epoch,
            }
            for v in view.verifications
        ],
        "checkpoints": [
            {
                "checkpoint_id": c.checkpoint_id,
                "reference": c.reference,
                "validated": c.validated,
                "validator": c.validator,
                "saved_at": c.saved_at.isoformat(),
            }
            for c in view.checkpoints
        ],
        "approvals": [
            {
                "approver": a.approver,
                "decision": a.decision,
                "state": a.state,
                "transition": a.transition,
                "consumed": a.consumed,
                "event_id": a.event_id,
            }
            for a in view.approvals
        ],
        "facts": {
            "idempotency_key": view.facts.idempotency_key is not None,
            "side_effect_possible": view.facts.side_effect_possible,
            "side_effect_confirmed": view.facts.side_effect_confirmed,
            "compensation_supported": view.facts.compensation_supported,
            "status_api": view.facts.status_api,
            "declared_by": view.facts.declared_by,
        },
    }


def _proposals(rules: _Rules) -> dict[str, Any]:
    """Per human event the current state accepts: the state and target a signed
    decision must name, the guard it must pass and the actions it would invoke."""
    proposals: dict[str, Any] = {}
    for event_type in HUMAN_DECISION_EVENTS:
        decision = _hypothetical(rules, event_type)
        if decision is None:
            continue
        state = rules.machine.states[rules.view.state]
        chosen = (
            decision.transition_target
            or human_targets(rules.machine, rules.view.state, event_type)[0]
        )
        candidate = next(t for t in state.on[event_type] if t.target == chosen)
        proposals[event_type] = {
            "state": rules.view.state,
            "transition": chosen,
            # What an approver signs as `reviewed_digest` (SPEC §9): the controller
            # recomputes it from its view when the decision arrives.
            "reviewed_digest": review_digest(rules.view, chosen, rules.now),
            "guard": candidate.guard,
            "actions": [a.capability for a in candidate.actions],
        }
    return proposals


def _consequence(rules: _Rules, event_type: str) -> dict[str, Any] | None:
    """What deciding a valid `event_type` now would do, or None when the current state
    does not accept it (the controller would reject it, state unchanged)."""
    decision = _hypothetical(rules, event_type)
    if decision is None:
        return None
    return {
        "event_type": event_type,
        "outcome": str(decision.outcome),
        "state_before": decision.state_before,
        "state_after": decision.state_after,
        "transition": decision.transition_target,
        "guards": [
            {"guard": g.guard, "value": g.value, "evidence": list(g.evidence), "error": g.error}
            for g in decision.guards
        ],
        "commands": [
            {
                "command_id": i.command_id,
                "capability": i.capability,
                "kind": i.kind,
                "material": i.material,
                "params": dict(i.params),
            }
            for i in decision.invocations
        ],
        "refusals": [n.to_dict() for n in decision.refusals],
        "errors": [n.to_dict() for n in decision.errors],
    }


def _hypothetical(rules: _Rules, event_type: str) -> Decision | None:
    """Decide `event_type` signed by the hypothetical approver, trying each candidate
    target in order: the first one the core takes is the proposal; when none is taken,
    the first candidate's decision says why."""
    targets = human_targets(rules.machine, rules.view.state, event_type)
    if not targets:
        return None
    key = insecure_test_key(HYPOTHETICAL_APPROVER)
    roles = rules.policy.approval_roles[:1]
    approver = Approver(id=HYPOTHETICAL_APPROVER, public_key=public_key_b64(key), roles=roles)
    policy = rules.policy.model_copy(update={"approvers": (*rules.policy.approvers, approver)})
    first: Decision | None = None
    for target in targets:
        decision = sign_decision(
            HumanDecision(
                approver=HYPOTHETICAL_APPROVER,
                operation_id=rules.view.operation_id,
                state=rules.view.state,
                transition=target,
                machine_digest=rules.view.machine_digest,
                expires_at=rules.now + _HYPOTHETICAL_VALIDITY,
                nonce=f"review-packet:{event_type}:{target}",
                decision=_VERDICTS[event_type],
                reviewed_digest=review_digest(rules.view, target, rules.now),
            ),
            key,
        )
        event = Event(
            event_type=event_type,
            event_id=f"review-packet:{event_type}",
            operation_id=rules.view.operation_id,
            correlation_id=rules.correlation_id,
            machine_name=rules.machine.name,
            machine_version=rules.machine.version,
            event_time=rules.now,
            evidence_ref=f"review-packet:{event_type}",
            producer=HYPOTHETICAL_APPROVER,
            lineage=rules.lineage,
            human_decision=decision,
        )
        decided = decide(rules.machine, rules.view, event, policy, rules.registry, rules.now)
        if decided.transition_target == target:
            return decided
        first = first or decided
    return first


# --- guidance: the packet in plain words for a reviewer ------------------------------


def _guidance(
    rules: _Rules, decisions: Sequence[Mapping[str, Any]], content: Mapping[str, Any]
) -> dict[str, Any]:
    """What a person needs who has never seen the machine (module docstring), from the
    packet's other sections and the machine's own descriptions."""
    machine, view = rules.machine, rules.view
    commands = content["downstream"]["commands"]
    return {
        "state": _state_words(machine, view.state),
        "escalation": _escalation(decisions),
        "facts": {
            "idempotency_key": view.facts.idempotency_key,
            "side_effect_possible": view.facts.side_effect_possible,
            "side_effect_confirmed": view.facts.side_effect_confirmed,
            "compensation_supported": view.facts.compensation_supported,
            "status_api": view.facts.status_api,
            "declared_by": view.facts.declared_by,
        },
        "unanswered_commands": [c for c in commands if c["answered_by"] is None],
        "after": {
            verb: _after(machine, content["consequences"][verb]) for verb in ("approve", "reject")
        },
    }


def _state_words(machine: Machine, name: str) -> dict[str, Any]:
    """A state as the machine describes it: its text, final or not, what it waits for."""
    state = machine.states.get(name)
    return {
        "name": name,
        "description": state.description if state is not None else "",
        "final": bool(state and state.final),
        "waits_for": sorted(state.on) if state is not None else [],
    }


def _escalation(decisions: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The latest escalation to a human (an invocation of kind `escalate`): the queue,
    severity and reason its parameters name, and the decision that made it."""
    for decision in reversed(decisions):
        for invocation in decision["invocations"]:
            if invocation["kind"] == CapabilityKind.ESCALATE:
                params = invocation["params"]
                return {
                    "capability": invocation["capability"],
                    "queue": params.get("queue"),
                    "severity": params.get("severity"),
                    "reason": params.get("reason"),
                    "decision_sequence": decision["sequence"],
                    "event_type": decision["event"]["type"],
                }
    return None


def _after(machine: Machine, consequence: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Where a decision leads: the target state in the machine's words, the commands it
    sends, and whether nothing is sent (the operation then waits for what the state
    accepts). None when the current state accepts no such decision."""
    if consequence is None:
        return None
    return {
        "outcome": consequence["outcome"],
        "state": _state_words(machine, str(consequence["state_after"])),
        "commands": [f"{c['capability']} ({c['kind']})" for c in consequence["commands"]],
        "refused": [r["code"] for r in consequence["refusals"]],
    }
