"""What an operator does with an operation, whatever the face: `recoveryctl` and the
reviewer console call these same functions, so they cannot drift apart.

- `timeline`: one operation's history (events with their decisions, commands with
  publication and answers, signed decisions, audit status) and what it waits for now
  (`awaited`: its timers, when each fires, whether one is overdue);
- `waiting_for_human`: whether an operation's state waits for a human decision;
- `review`: the review packet (SPEC §9) as the ledger holds the operation now, and,
  for a decision, the check that the packet the reviewer saw is still the one the
  operation has and that its state accepts that decision (`Review.proposal`);
- `proposed_decision`: the unsigned decision a reviewer signs on a proposal;
- `submit_decision`: a signed decision checked as the controller will check it
  (`machines.check_decision`), then published through the client library;
- `await_decision`: the controller's decision on a published event, waited for with a
  bound;
- `plan_migration` and `submit_migration`: moving one operation to another pinned version
  of its machine (`recoveryctl ops migrate`, docs/operations.md "Upgrading a machine"):
  the state mapping checked as the controller will check it (`machines.mapping_refusal`),
  the approver's signed decision checked, then published as `MIGRATION_APPROVED`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import LedgerInspector, OperationRecord
from machines import (
    MIGRATION_APPROVED,
    Event,
    HumanDecision,
    Machine,
    OperationView,
    Policy,
    Registry,
    ReviewPacket,
    Verdict,
    awaited_actions,
    awaits_human,
    check_decision,
    mapping_refusal,
    migration_digest,
    public_key_b64,
    waiting_on,
)
from machines import review_packet as build_packet
from ops.context import LoadedRules, PinnedMachines
from ops.errors import Refused, UsageError
from producers import RecoveryClient

__all__ = [
    "VERDICT_EVENTS",
    "DecisionRefused",
    "MigrationPlan",
    "Review",
    "approver_for",
    "await_decision",
    "awaited",
    "plan_migration",
    "proposed_decision",
    "review",
    "submit_decision",
    "submit_migration",
    "timeline",
    "waiting_for_human",
]

VERDICT_EVENTS: Final[Mapping[Verdict, str]] = {
    "approved": "HUMAN_APPROVED",
    "rejected": "HUMAN_REJECTED",
}


class DecisionRefused(Refused):
    """The controller would refuse this signed decision (bad signature, stale binding,
    an approver in the affected agent's lineage); nothing was published."""


def waiting_for_human(
    pinned: PinnedMachines | LoadedRules, name: str, version: str, digest: str, state: str
) -> bool | None:
    """Whether an operation of machine `name@version` (`digest`) in `state` waits for a
    human; None when that machine is not pinned here."""
    machine = pinned.machine_for(name, version, digest)
    if machine is None:
        return None
    registry = pinned.registry if isinstance(pinned, PinnedMachines) else pinned.rules.registry
    return awaits_human(machine, state, registry)


def timeline(
    inspector: LedgerInspector, record: OperationRecord, pinned: PinnedMachines | LoadedRules
) -> dict[str, Any]:
    """The operation's timeline as JSON-ready data: identity, events with their
    decisions, commands with publication and answers, approvals and audit status."""
    by_event = {d["event"]["id"]: d for d in record.decisions}
    published = {o.record_id: o for o in record.outbox}
    # A refused event answered nothing: its command stays open (the view agrees).
    answers = {
        d["event"]["causation"]: d["event"]["id"]
        for d in record.decisions
        if d["event"]["causation"] and d["outcome"] != "refused"
    }
    events = []
    for event in record.events:
        decision = by_event.get(event.event_id)
        events.append(
            {
                "event_id": event.event_id,
                "event_type": event.event_type,
                "producer": event.envelope.get("producer"),
                "event_time": event.envelope.get("event_time"),
                "recorded_at": event.recorded_at.isoformat(),
                "source": {
                    "topic": event.source_topic,
                    "partition": event.source_partition,
                    "offset": event.source_offset,
                },
                "decision": None if decision is None else _decision_json(decision),
            }
        )
    commands = []
    for decision in record.decisions:
        for invocation in decision["invocations"]:
            sent = published.get(invocation["command_id"])
            commands.append(
                {
                    "command_id": invocation["command_id"],
                    "capability": invocation["capability"],
                    "kind": invocation["kind"],
                    "params": invocation["params"],
                    "decision_sequence": decision["sequence"],
                    "published_at": None
                    if sent is None or sent.published_at is None
                    else sent.published_at.isoformat(),
                    "held": None if sent is None else sent.held_reason,
                    "answered_by": answers.get(invocation["command_id"]),
                }
            )
    breaks = inspector.verify_audit(record.view.operation_id)
    row = dict(record.row)
    waiting = waiting_for_human(
        pinned, row["machine_name"], row["machine_version"], row["machine_digest"], row["state"]
    )
    return {
        "operation": {
            **{k: v for k, v in row.items() if k not in {"created_at", "updated_at"}},
            "delegated_credentials": list(row["delegated_credentials"]),
            "ancestors": list(row["ancestors"]),
            "created_at": row["created_at"].isoformat(),
            "updated_at": row["updated_at"].isoformat(),
            "waiting_for_human": waiting,
            "awaiting": awaited_actions(record.view, _registry(pinned)),
        },
        "events": events,
        "commands": commands,
        "approvals": list(record.approvals),
        "descendants": list(record.descendants),
        "audit": {
            "intact": not breaks,
            "records": sum(1 for o in record.outbox if o.record_id.startswith("audit:")),
            "breaks": [b.describe() for b in breaks],
        },
        "waiting": awaited(inspector, record, datetime.now(UTC)),
    }


def _registry(pinned: PinnedMachines | LoadedRules) -> Registry:
    return pinned.registry if isinstance(pinned, PinnedMachines) else pinned.rules.registry


def awaited(inspector: LedgerInspector, record: OperationRecord, now: datetime) -> dict[str, Any]:
    """What the operation waits for at `now` (`machines.waiting_on`): each timer with
    when it fires (`due_in_seconds`, negative once due), whether its firing was
    written (`fired_at`) and whether it is overdue (due and not decided yet)."""
    found = waiting_on(record.view)
    fired = inspector.timers_fired(record.view.operation_id) if found["timers"] else {}
    for timer in found["timers"]:
        due = datetime.fromisoformat(timer["due_at"])
        at = fired.get(timer["id"])
        timer["due_in_seconds"] = round((due - now).total_seconds(), 1)
        timer["fired_at"] = None if at is None else at.isoformat()
        timer["overdue"] = not timer["spent"] and due <= now
    return found


def _decision_json(decision: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "sequence": decision["sequence"],
        "machine": decision["machine"],
        "migration": decision.get("migration"),
        "decided_at": decision["decided_at"],
        "outcome": decision["outcome"],
        "state_before": decision["state_before"],
        "state_after": decision["state_after"],
        "guards": decision["guards"],
        "refusals": decision["refusals"],
        "errors": decision["errors"],
        "evidence": decision["evidence"],
        "approval": decision["approval"],
        "commands": [i["command_id"] for i in decision["invocations"]],
    }


@dataclass(frozen=True, slots=True)
class Review:
    """An operation as a reviewer sees it now: its record and review packet."""

    record: OperationRecord
    packet: ReviewPacket

    def proposal(self, verdict: Verdict, shown_digest: str) -> Mapping[str, Any]:
        """The transition `verdict` would take, once the packet the reviewer saw
        (`shown_digest`) is checked to be the one the operation has now. Raises
        `Refused` when the packet changed or the state accepts no such decision."""
        op, packet = self.packet.operation_id, self.packet
        if packet.digest != shown_digest:
            raise Refused(
                f"operation {op}: the review packet changed since it was shown (shown "
                f"{shown_digest}, now {packet.digest}; state {self.record.view.state}, "
                f"{len(self.record.decisions)} decision(s)); nothing was signed and "
                "nothing was published: review it again"
            )
        event_type = VERDICT_EVENTS[verdict]
        found = packet.proposal(event_type)
        if found is None:
            raise Refused(
                f"operation {op} is in state {self.record.view.state}, which does not "
                f"accept {event_type}; nothing was signed and nothing was published"
            )
        return found


def review(
    inspector: LedgerInspector, rules: LoadedRules, operation_id: str, now: datetime
) -> Review:
    """The operation's record and review packet, read in one snapshot, under the
    controller's machines and policy. Raises `ledger.UnknownOperation`, and
    `UsageError` when the operation's machine is not pinned by those rules."""
    record = inspector.operation_record(operation_id)
    row = record.row
    machine = rules.machine_for(row["machine_name"], row["machine_version"], row["machine_digest"])
    if machine is None:
        raise UsageError(
            f"operation {operation_id} runs machine {row['machine_name']}@"
            f"{row['machine_version']} ({row['machine_digest']}), which the lock file does not "
            "pin with that digest; pass the controller's --lock"
        )
    packet = build_packet(
        machine=machine,
        policy=rules.rules.policy,
        registry=rules.rules.registry,
        view=record.view,
        operation=row,
        events=[e.envelope for e in record.events],
        decisions=record.decisions,
        descendants=record.descendants,
        now=now,
    )
    return Review(record, packet)


def proposed_decision(
    proposal: Mapping[str, Any],
    *,
    verdict: Verdict,
    approver: str,
    view: OperationView,
    expires_at: datetime,
    nonce: str,
) -> HumanDecision:
    """The unsigned decision `approver` signs to take `proposal` on the operation whose
    view is `view`."""
    return HumanDecision(
        approver=approver,
        operation_id=view.operation_id,
        state=str(proposal["state"]),
        transition=str(proposal["transition"]),
        machine_digest=view.machine_digest,
        expires_at=expires_at,
        nonce=nonce,
        decision=verdict,
        reviewed_digest=str(proposal.get("reviewed_digest", "")),
    )


def submit_decision(
    found: Review,
    decision: HumanDecision,
    *,
    client: RecoveryClient,
    rules: LoadedRules,
    now: datetime,
) -> Event:
    """Check the signed `decision` as the controller will (the signature under the
    approver's roster key, the binding to the operation as it is now) and publish it.
    Raises `Refused` when the controller would refuse it: nothing is published."""
    event_type = VERDICT_EVENTS[decision.decision]
    refused = check_decision(
        decision,
        event_type=event_type,
        view=found.record.view,
        policy=rules.rules.policy,
        now=now,
    )
    if refused is not None:
        raise DecisionRefused(
            f"operation {decision.operation_id}: the controller would refuse this "
            f"{event_type}: {refused}; nothing was published"
        )
    row = found.record.row
    event = client.publish_signed_decision(
        decision,
        correlation_id=row["correlation_id"],
        machine_name=row["machine_name"],
        machine_version=row["machine_version"],
        lineage=found.record.lineage,
    )
    client.flush(10.0)
    return event


def await_decision(
    inspector: LedgerInspector, operation_id: str, event_id: str, wait: float
) -> dict[str, Any] | None:
    """The controller's decision on event `event_id` of the operation, waiting up to
    `wait` seconds for it; None when there is none by then."""
    deadline = time.monotonic() + wait
    while True:
        for decision in inspector.operation_record(operation_id).decisions:
            if decision["event"]["id"] == event_id:
                return {
                    "sequence": decision["sequence"],
                    "outcome": decision["outcome"],
                    "state_before": decision["state_before"],
                    "state_after": decision["state_after"],
                    "refusals": [r["code"] for r in decision["refusals"]],
                }
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def approver_for(policy: Policy, key: Ed25519PrivateKey, wanted: str | None) -> str:
    """The approver of `policy` whose roster key is `key`'s public half (`wanted`, when
    given, must be one). Raises `Refused` when none is, naming what to add."""
    public = public_key_b64(key)
    holders = [a.id for a in policy.approvers if a.public_key == public]
    if not holders:
        raise Refused(
            f"the key's public half {public} is not in policy {policy.id}'s approver roster; "
            "add it (`recoveryctl keys show FILE` prints the entry) and reload the controller"
        )
    if wanted is not None and wanted not in holders:
        raise Refused(f"the key belongs to approver {holders[0]} in the roster, not {wanted}")
    return wanted or holders[0]


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    """One operation's move from `source` to `target`, another pinned version of its
    machine, its current state mapped to `to_state`; `reviewed` is the digest of the
    plan an approver signs (`machines.migration_digest`)."""

    record: OperationRecord
    source: Machine
    target: Machine
    to_state: str
    reviewed: str

    def decision(self, approver: str, expires_at: datetime, nonce: str) -> HumanDecision:
        """The unsigned decision `approver` signs for this plan."""
        view = self.record.view
        return HumanDecision(
            approver=approver,
            operation_id=view.operation_id,
            state=view.state,
            transition=self.to_state,
            machine_digest=view.machine_digest,
            expires_at=expires_at,
            nonce=nonce,
            decision="approved",
            reviewed_digest=self.reviewed,
        )

    def to_dict(self) -> dict[str, Any]:
        """The plan as an operator reads it."""
        view = self.record.view
        return {
            "operation_id": view.operation_id,
            "position": view.version,
            "from": {
                "name": self.source.name,
                "version": self.source.version,
                "digest": self.source.digest,
                "state": view.state,
            },
            "to": {
                "name": self.target.name,
                "version": self.target.version,
                "digest": self.target.digest,
                "state": self.to_state,
            },
            "plan_digest": self.reviewed,
        }


def plan_migration(
    record: OperationRecord,
    pinned: LoadedRules,
    to_version: str,
    mapping: Mapping[str, str],
) -> MigrationPlan:
    """The plan that moves the operation `record` holds to `to_version` of its machine,
    its states mapped by `mapping` (default: each to the state of the same name). Raises
    `UsageError` when either version is not pinned here, and `Refused` when the new
    version does not allow the mapping (`machines.mapping_refusal`), naming the rule."""
    row, view = record.row, record.view
    op = view.operation_id
    source = pinned.machines.by_digest(view.machine_digest)
    if source is None:
        raise UsageError(
            f"operation {op} runs {row['machine_name']}@{row['machine_version']} "
            f"({view.machine_digest}), which this lock does not pin; pass the controller's "
            "--lock"
        )
    target = pinned.machines.get(f"{source.name}@{to_version}")
    if target is None:
        known = ", ".join(pinned.machines.refs(source.name))
        raise UsageError(
            f"operation {op}: {source.name}@{to_version} is not pinned (pinned: {known}); "
            "lock the new version first (`recoveryctl machines lock`)"
        )
    states = dict(mapping) or {view.state: view.state}
    states.setdefault(view.state, view.state)
    refused = mapping_refusal(source, target, view, states)
    if refused is not None:
        raise Refused(f"{refused.code}: {refused.message}; nothing was signed or published")
    to_state = states[view.state]
    return MigrationPlan(record, source, target, to_state, migration_digest(view, target, to_state))


def submit_migration(
    plan: MigrationPlan,
    decision: HumanDecision,
    *,
    client: RecoveryClient,
    rules: LoadedRules,
    now: datetime,
) -> Event:
    """Check the signed `decision` for `plan` as the controller will and publish it as
    `MIGRATION_APPROVED`. Raises `DecisionRefused` when the controller would refuse it:
    nothing is published."""
    refused = check_decision(
        decision,
        event_type=MIGRATION_APPROVED,
        view=plan.record.view,
        policy=rules.rules.policy,
        now=now,
        reviewed=plan.reviewed,
    )
    if refused is not None:
        raise DecisionRefused(
            f"operation {decision.operation_id}: the controller would refuse this "
            f"{MIGRATION_APPROVED}: {refused}; nothing was published"
        )
    row = plan.record.row
    event = client.publish_migration(
        decision,
        correlation_id=row["correlation_id"],
        machine_name=plan.target.name,
        target_version=plan.target.version,
        lineage=plan.record.lineage,
    )
    client.flush(10.0)
    return event
