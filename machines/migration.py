"""Moving one operation to another version of its machine: a signed, human decision.

An operation stays on the machine version it opened under (docs/machine-format.md,
"Rollout"). To retire that version while the operation is still in flight, an operator
migrates it (`recoveryctl ops migrate OP --to VERSION`): an approver signs a
`MIGRATION_APPROVED` event whose `HumanDecision` binds the operation, the state it is in,
the state it maps to in the new version (`transition`), the machine digest it leaves
(`machine_digest`), an expiry, a single-use nonce and, as `reviewed_digest`,
`migration_digest` of the whole plan (the position in the ledger, both versions' digests
and both states). The event names the new version as its machine version.

The controller checks it like any human decision (`machines.check_decision`: an
approver of the policy with an approval role, not the affected agent nor anyone in its
lineage, the signature, the state, the machine, the expiry, the nonce, and the plan it
signed), then checks the state mapping against both machines (`mapping_refusal`):

- the target is another version of the same machine (`migration-other-machine`,
  `migration-same-version`);
- each mapped state exists in the machine it is named for (`migration-state-unknown`),
  and the operation's state is mapped;
- a final state maps to a final one and a non-final to a non-final: a migration neither
  completes an operation nor reopens one (`migration-final`; an operation in a final
  state has nothing in flight and is never migrated);
- the target state's entry actions are ones the source state ran: a migration invokes
  nothing, so a state whose entry commands were never issued would wait forever
  (`migration-entry-unrun`);
- while commands are open, the target state accepts every event the source state does:
  their results must still have a route (`migration-results-unrouted`).

`decide_migration` is the decision: on success the operation's view moves to the new
machine's digest and the mapped state (`Decision.migration` records both sides; the
approval's nonce is spent like any other); otherwise it is refused and nothing changes.
Nothing is invoked either way. The invariants of SPEC §7 hold on the new version as on
the old: they are the core's, not the machine's. Approvals and validated checkpoints
bound to the old machine's digest no longer count (`machines.guards.valid_approval`,
`Checkpoint.eligible`): a human decides again under the new version.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from machines.approvals import basis_digest, check_decision
from machines.decision import Decision, Outcome
from machines.event import Event, sha256_digest
from machines.evidence import EvidenceDelta
from machines.invariants import Notice
from machines.model import Machine
from machines.policy import Policy
from machines.view import Approval, OperationView

__all__ = [
    "MIGRATION_APPROVED",
    "MigrationRefusal",
    "decide_migration",
    "mapping_refusal",
    "migration_digest",
    "migration_plan",
]

MIGRATION_APPROVED: Final = "MIGRATION_APPROVED"
MIGRATION_DOMAIN: Final = "agent-recovery/migration/v1"


class MigrationRefusal(StrEnum):
    """Why a migration's plan is refused (the module docstring has each rule)."""

    OTHER_MACHINE = "migration-other-machine"
    SAME_VERSION = "migration-same-version"
    STATE_UNKNOWN = "migration-state-unknown"
    FINAL = "migration-final"
    ENTRY_UNRUN = "migration-entry-unrun"
    RESULTS_UNROUTED = "migration-results-unrouted"


def migration_plan(view: OperationView, target: Machine, to_state: str) -> dict[str, Any]:
    """What an approver signs for moving the operation `view` describes, at its ledger
    position and state, to `to_state` of `target` (docs/wire-protocol.md, section 9)."""
    return {
        "domain": MIGRATION_DOMAIN,
        "operation_id": view.operation_id,
        "position": view.version,
        "from": {
            "name": view.machine_name,
            "version": view.machine_version,
            "digest": view.machine_digest,
        },
        "state": view.state,
        "to": {"name": target.name, "version": target.version, "digest": target.digest},
        "to_state": to_state,
    }


def migration_digest(view: OperationView, target: Machine, to_state: str) -> str:
    """The digest an approver signs as `reviewed_digest`: of `migration_plan`'s canonical
    JSON."""
    return sha256_digest(migration_plan(view, target, to_state))


def mapping_refusal(
    source: Machine, target: Machine, view: OperationView, mapping: Mapping[str, str]
) -> Notice | None:
    """Why `mapping` (source state -> target state) may not move the operation `view`
    describes from `source` to `target`, or None (module docstring)."""
    op = view.operation_id
    if target.name != source.name:
        return Notice(
            MigrationRefusal.OTHER_MACHINE,
            f"operation {op} runs {source.name}; a migration moves it to another version of "
            f"that machine, not to {target.name}",
        )
    if target.digest == source.digest:
        return Notice(
            MigrationRefusal.SAME_VERSION,
            f"operation {op} already runs {source.name}@{source.version} ({source.digest})",
        )
    for old, new in sorted(mapping.items()):
        found = _pair_refusal(source, target, op, old, new)
        if found is not None:
            return found
    state = view.state
    if source.states[state].final if state in source.states else False:
        return Notice(
            MigrationRefusal.FINAL,
            f"operation {op} is in final state {state}: nothing is in flight to migrate",
        )
    if state not in mapping:
        return Notice(
            MigrationRefusal.STATE_UNKNOWN,
            f"operation {op} is in state {state}, which the mapping does not map; map it to "
            f"a state of {target.name}@{target.version} ({_states(target)})",
        )
    return _current_refusal(source, target, view, mapping[state])


def _pair_refusal(source: Machine, target: Machine, op: str, old: str, new: str) -> Notice | None:
    if old not in source.states:
        return Notice(
            MigrationRefusal.STATE_UNKNOWN,
            f"operation {op}: the mapping names state {old}, which "
            f"{source.name}@{source.version} does not define ({_states(source)})",
        )
    if new not in target.states:
        return Notice(
            MigrationRefusal.STATE_UNKNOWN,
            f"operation {op}: the mapping maps {old} to {new}, which "
            f"{target.name}@{target.version} does not define ({_states(target)})",
        )
    if source.states[old].final != target.states[new].final:
        which = "completes" if target.states[new].final else "reopens"
        return Notice(
            MigrationRefusal.FINAL,
            f"operation {op}: mapping {old} to {new} {which} the operation; a migration "
            "maps final states to final states and others to others",
        )
    return None


def _current_refusal(
    source: Machine, target: Machine, view: OperationView, to_state: str
) -> Notice | None:
    """The rules that hold for the operation's own state and open commands."""
    op, state = view.operation_id, view.state
    ran = {a.capability for a in source.states[state].entry}
    unrun = sorted({a.capability for a in target.states[to_state].entry} - ran)
    if unrun:
        return Notice(
            MigrationRefusal.ENTRY_UNRUN,
            f"operation {op}: state {to_state} of {target.name}@{target.version} enters with "
            f"{', '.join(unrun)}, which state {state} never invoked, and a migration invokes "
            "nothing; map to a state whose entry actions already ran",
        )
    if view.open_commands:
        missing = sorted(set(source.states[state].on) - set(target.states[to_state].on))
        if missing:
            return Notice(
                MigrationRefusal.RESULTS_UNROUTED,
                f"operation {op} waits for commands {', '.join(sorted(view.open_commands))}; "
                f"state {to_state} of {target.name}@{target.version} does not accept "
                f"{', '.join(missing)}, which state {state} does, so a result could find no "
                "route; map to a state that accepts them, or migrate once they are answered",
            )
    return None


def _states(machine: Machine) -> str:
    return ", ".join(sorted(machine.states))


def decide_migration(
    source: Machine,
    target: Machine,
    view: OperationView,
    event: Event,
    policy: Policy,
    now: datetime,
) -> Decision:
    """Decide the `MIGRATION_APPROVED` `event` on the operation `view` describes, which
    `source` governs, towards `target`, the pinned version the event names (module
    docstring). Pure; never raises for a bad event: a refusal is recorded instead."""
    seen = view.seen_events.get(event.event_id)
    if seen is not None:
        outcome = Outcome.DUPLICATE if seen == event.payload_digest else Outcome.CONFLICT
        return _decision(source, view, event, policy, now, outcome, view.version)
    signed = event.human_decision
    refusal = _envelope_refusal(view, event)
    if refusal is None:
        to_state = signed.transition if signed is not None else ""
        rejection = check_decision(
            signed,
            event_type=event.event_type,
            view=view,
            policy=policy,
            now=now,
            reviewed=migration_digest(view, target, to_state),
        )
        if rejection is not None:
            refusal = Notice(
                str(rejection),
                f"{event.event_type} {event.event_id} from approver "
                f"{signed.approver if signed else '<none>'} refused for operation "
                f"{view.operation_id} in state {view.state}: {rejection}",
            )
    if refusal is None and signed is not None:
        refusal = mapping_refusal(source, target, view, {view.state: signed.transition})
    if refusal is not None or signed is None:
        return _decision(
            source, view, event, policy, now, Outcome.REFUSED, view.version + 1, (refusal,)
        )
    approval = Approval(
        approver=signed.approver,
        state=signed.state,
        transition=signed.transition,
        machine_digest=signed.machine_digest,
        expires_at=signed.expires_at,
        nonce=signed.nonce,
        decision=signed.decision,
        event_id=event.event_id,
        basis=basis_digest(view, now, for_resume=False),
    )
    moved: dict[str, Any] = {
        "from": {"version": view.machine_version or source.version, "digest": source.digest},
        "to": {"version": target.version, "digest": target.digest},
        "states": {view.state: signed.transition},
    }
    return Decision(
        **_identity(target, view, event, policy, now),
        sequence=view.version + 1,
        outcome=Outcome.TRANSITIONED,
        state_before=view.state,
        state_after=signed.transition,
        evidence=EvidenceDelta(approval=approval),
        approval_used=event.event_id,
        approval_consumed=True,
        migration=moved,
    )


def _envelope_refusal(view: OperationView, event: Event) -> Notice | None:
    if event.operation_id != view.operation_id:
        return Notice(
            "wrong-operation",
            f"event {event.event_id} is for operation {event.operation_id}, not "
            f"{view.operation_id}",
        )
    if view.correlation_id and event.correlation_id != view.correlation_id:
        return Notice(
            "correlation-mismatch",
            f"event {event.event_id} carries correlation id {event.correlation_id}; "
            f"operation {view.operation_id} was opened with {view.correlation_id}",
        )
    return None


def _decision(
    machine: Machine,
    view: OperationView,
    event: Event,
    policy: Policy,
    now: datetime,
    outcome: Outcome,
    sequence: int,
    refusals: tuple[Notice | None, ...] = (),
) -> Decision:
    return Decision(
        **_identity(machine, view, event, policy, now),
        sequence=sequence,
        outcome=outcome,
        state_before=view.state,
        state_after=view.state,
        refusals=tuple(n for n in refusals if n is not None),
    )


def _identity(
    machine: Machine, view: OperationView, event: Event, policy: Policy, now: datetime
) -> dict[str, Any]:
    """The fields every decision names: the operation, machine, policy and event."""
    return {
        "operation_id": view.operation_id,
        "machine_name": machine.name,
        "machine_version": machine.version,
        "machine_digest": machine.digest,
        "policy_digest": policy.digest,
        "decided_at": now,
        "event_id": event.event_id,
        "event_type": event.event_type,
        "correlation_id": event.correlation_id,
        "event_time": event.event_time,
        "evidence_ref": event.evidence_ref,
        "producer": event.producer,
        "payload_digest": event.payload_digest,
        "causation": event.causation,
        "named_version": None
        if event.machine_version == machine.version
        else event.machine_version,
    }
