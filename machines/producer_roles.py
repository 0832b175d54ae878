"""Who may write which event, for which operation: roles and scope from the roster
(SPEC §1, §7.7, §12: an affected agent never forges evidence, approves itself, or gets
an effect retried on its own word).

The controller's intake proves who signed a record (`machines.Roster.authenticate`);
this module says whether that producer may say what the event says about the
operation it names, once the operation's stored scope is known (`consumer.batch`
calls it before anything is decided). Every refusal is an `AuthenticationError` with
code `role-not-permitted`, `identity-mismatch` or `agent-unproven`.

- **Opening.** An operation's machine, scope and lineage come only from the first
  report of a `tool` holding the capability, tool and environment of the event's
  `scope` block; a first event without a `scope` block is admitted only from a tool
  granted every capability (`"*"`). The agent it names (`lineage.agent`) must be
  proven: by a tool grant naming it, or by the call context the agent's runtime
  signed (`machines.call_context`), else `agent-unproven`. When the ledger knows the
  operation's ancestors (`parent_operation`), the opener (or the runtime that vouched)
  must hold `tool` or `orchestrator` for each of their agents as well, so nobody hangs
  an operation below another agent's work, or names a bystander as its agent, to aim a
  containment or a cascade at it; when the parent arrives only later, the child is
  linked below it only if its opener holds those grants then (`machines.may_link`,
  checked by the fold). Credentials reported as delegated to the operation's agent
  (`lineage.delegated_credentials`, which its revocation commands name) need
  `orchestrator` for that agent, of the opener or of the runtime that vouched. The
  proof is kept (`OperationView.agent_proof`); an operation whose agent a runtime
  proved takes its opener's later tool reports without a grant naming the agent.
- **Every event.** `EventRoles` maps event types to the roles that may send them,
  each checked for the operation's stored scope (`DEFAULT_EVENT_ROLES`; a deployment,
  or a machine, may override it in `machines.Rules.event_roles`):
  `TOOL_*`, `STEP_*` and unlisted types: `tool` for the operation's capability, tool,
  environment and agent; `VERIFICATION_*`: `verifier` for the operation's capability,
  and `evidence.verifier` must be the producer; `RETRY_*`, `COMPENSATION_*`,
  `CONTAINMENT_*`: `worker` for the capability of the command they answer (the
  causation); `ANCESTOR_CONTAINED` and `LINEAGE_*`: `controller`, or `orchestrator`
  for the agent; a timer's event (an id `timer:...`, and the types `STATE_STALLED`,
  `DEADLINE_PASSED`, `RETRY_DUE` of `machines.timers`): `controller` only, whatever its
  type, so nobody else fires or forges a timer; `HUMAN_*`: `approver`, held by the
  approver or by the service that forwards decisions signed elsewhere (the reviewer
  console, `recoveryctl approve` as a deployment's approval service): the decision's
  own signature proves the human and is checked against the policy's approvers by the
  core, so the record's signer need not be the approver; `MIGRATION_APPROVED`
  (`machines.migration`): `approver`, on the same terms; `RESUME_REQUESTED`:
  `approver`, `orchestrator` (agent) or `tool`. An event with a `classifier` block needs
  `classifier` whatever its type; `AUTHORIZATION_DENIED`, `VALIDATION_DENIED` and
  `POLICY_DENIED`: `tool`, or `worker` for the capability of the command they answer
  (a retry the worker found denied); and a validated checkpoint needs `validator` for
  the agent, its `validator` being the producer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from machines.event import Event
from machines.invariants import DENIAL_EVENTS
from machines.roster import AuthenticationError, AuthRefusal, ProducerEntry, Role
from machines.timers import TIMER_EVENTS, is_timer_event
from machines.view import OperationView

__all__ = [
    "DEFAULT_EVENT_ROLES",
    "EventRoles",
    "check_event_role",
    "check_opening",
]

_TOOL: Final = (Role.TOOL,)
# `OperationView.agent_proof` of an operation whose agent a call context proved.
VOUCHED: Final = "call-context:"
_WORKER: Final = (Role.WORKER,)
_LINEAGE: Final = (Role.CONTROLLER, Role.ORCHESTRATOR)
_TIMER: Final = (Role.CONTROLLER,)


@dataclass(frozen=True, slots=True)
class EventRoles:
    """Event type -> the roles that may send it: `exact` types first, then the longest
    matching prefix in `prefixes`, else `default`."""

    exact: Mapping[str, tuple[Role, ...]] = field(default_factory=dict)
    prefixes: Mapping[str, tuple[Role, ...]] = field(default_factory=dict)
    default: tuple[Role, ...] = _TOOL

    def roles_for(self, event_type: str) -> tuple[Role, ...]:
        """The roles permitted to send `event_type`."""
        found = self.exact.get(event_type)
        if found is not None:
            return found
        best = ""
        for prefix in self.prefixes:
            if event_type.startswith(prefix) and len(prefix) > len(best):
                best = prefix
        return self.prefixes[best] if best else self.default

    def overridden(
        self,
        exact: Mapping[str, tuple[Role, ...]] | None = None,
        prefixes: Mapping[str, tuple[Role, ...]] | None = None,
    ) -> EventRoles:
        """This table with some entries replaced (per machine or per deployment)."""
        return EventRoles(
            MappingProxyType({**self.exact, **(exact or {})}),
            MappingProxyType({**self.prefixes, **(prefixes or {})}),
            self.default,
        )


DEFAULT_EVENT_ROLES: Final = EventRoles(
    exact=MappingProxyType(
        {
            "ANCESTOR_CONTAINED": _LINEAGE,
            "RESUME_REQUESTED": (Role.APPROVER, Role.ORCHESTRATOR, Role.TOOL),
            # A signed migration to another machine version (`machines.migration`).
            "MIGRATION_APPROVED": (Role.APPROVER,),
            **dict.fromkeys(TIMER_EVENTS, _TIMER),
            # A denial of the call comes from the tool; a denial of a retry from the
            # worker that executed it (scoped by the command it names).
            **{denial: (Role.TOOL, Role.WORKER) for denial in sorted(DENIAL_EVENTS)},
        }
    ),
    prefixes=MappingProxyType(
        {
            "TOOL_": _TOOL,
            "STEP_": _TOOL,
            "VERIFICATION_": (Role.VERIFIER,),
            "RETRY_": _WORKER,
            "COMPENSATION_": _WORKER,
            "CONTAINMENT_": _WORKER,
            "LINEAGE_": _LINEAGE,
            "HUMAN_": (Role.APPROVER,),
        }
    ),
)


def _scopes_of(role: Role, event: Event, view: OperationView) -> list[dict[str, str | None]]:
    """The scopes, any one of which a grant of `role` must permit."""
    agent = view.lineage.agent
    if role is Role.TOOL:
        scope: dict[str, str | None] = {
            "capability": view.capability,
            "tool": view.tool,
            "environment": view.environment,
            "agent": agent,
        }
        if event.producer == view.opened_by and view.agent_proof.startswith(VOUCHED):
            # The agent's runtime vouched for this tool's call: its reports on the
            # operation need no grant naming the agent (`check_opening`).
            del scope["agent"]
        return [scope]
    if role is Role.VERIFIER:
        scopes: list[dict[str, str | None]] = [{"capability": view.capability}]
        answered = view.command_capability(event.causation)
        if answered is not None:
            scopes.append({"capability": answered})
        return scopes
    if role is Role.WORKER:
        return [{"capability": view.command_capability(event.causation)}]
    if role in (Role.ORCHESTRATOR, Role.VALIDATOR):
        return [{"agent": agent}]
    return [{}]


def _describe(scope: Mapping[str, str | None]) -> str:
    if not scope:
        return ""
    return " for " + ", ".join(f"{k} {v if v is not None else '<none>'}" for k, v in scope.items())


def _refuse(producer: ProducerEntry, event: Event, what: str) -> AuthenticationError:
    return AuthenticationError(
        AuthRefusal.ROLE_NOT_PERMITTED,
        f"producer {producer.id} may not send {event.event_type} {event.event_id} "
        f"(operation {event.operation_id}): {what}; grant it in the roster if it should",
    )


def _mismatch(producer: ProducerEntry, event: Event, field_name: str, claimed: str) -> Exception:
    return AuthenticationError(
        AuthRefusal.IDENTITY_MISMATCH,
        f"{event.event_type} {event.event_id} (operation {event.operation_id}) claims "
        f"{field_name} {claimed!r} but is signed by producer {producer.id}; an identity in "
        "an event is always its signer's",
    )


def check_opening(
    event: Event,
    producer: ProducerEntry,
    ancestor_agents: tuple[str, ...] = (),
    vouched_by: ProducerEntry | None = None,
) -> str:
    """Raise `AuthenticationError` unless `producer` may open `event`'s operation, and
    return how the affected agent is proven: `producer` holds `tool` for the event's
    scope, and either that grant names the agent (`"grant"`) or `vouched_by`, the
    runtime whose call context proved the event's lineage (`machines.prove_lineage`),
    holds `orchestrator` for it (`"call-context:<runtime>"`); neither is
    `agent-unproven`. Credentials the lineage reports as delegated to the agent need
    `orchestrator` for it, and every agent of the ancestors the ledger knows
    (`ancestor_agents`; ancestors it learns of later are checked when they arrive,
    `machines.may_link`) `tool` or `orchestrator`, of the producer or of `vouched_by`."""
    scope = event.scope
    wanted: dict[str, str | None] = {
        "capability": None if scope is None else scope.capability,
        "tool": None if scope is None else scope.tool,
        "environment": None if scope is None else scope.environment,
    }
    agent = event.lineage.agent
    if not producer.permits(Role.TOOL, **wanted):
        hint = (
            "the first event carries no scope block, so only a tool granted every "
            "capability may open it; send the scope"
            if scope is None
            else "it does not hold role tool"
        )
        raise _refuse(producer, event, f"opening the operation: {hint}{_describe(wanted)}")
    if producer.permits(Role.TOOL, **wanted, agent=agent):
        proof = "grant"
    elif vouched_by is not None and vouched_by.permits(Role.ORCHESTRATOR, agent=agent):
        proof = f"{VOUCHED}{vouched_by.id}"
    else:
        raise AuthenticationError(
            AuthRefusal.AGENT_UNPROVEN,
            f"producer {producer.id} may not open operation {event.operation_id} "
            f"({event.event_type} {event.event_id}) for agent {agent}: no tool grant of it "
            f"names that agent{_describe(wanted)}, and no call context signed by the "
            "agent's runtime proves it; forward the runtime's call context (header "
            "recovery-call-context) or grant the tool `agents: [" + agent + "]`",
        )
    vouching = [entry for entry in (producer, vouched_by) if entry is not None]
    credentials = event.lineage.delegated_credentials
    if credentials and not any(e.permits(Role.ORCHESTRATOR, agent=agent) for e in vouching):
        # A revocation command names these credentials: a producer that could name any
        # would aim a containment's revocation at a bystander's authority.
        raise _refuse(
            producer,
            event,
            f"its lineage reports credentials {', '.join(credentials)} delegated to agent "
            f"{agent}, for which neither it nor the runtime that vouched holds orchestrator "
            "(the role that reports an agent's lineage and delegations)",
        )
    for ancestor in ancestor_agents:
        if ancestor == agent:
            continue
        if not any(
            entry.permits(Role.TOOL, agent=ancestor)
            or entry.permits(Role.ORCHESTRATOR, agent=ancestor)
            for entry in vouching
        ):
            raise _refuse(
                producer,
                event,
                f"its lineage names an ancestor of agent {ancestor} "
                f"(parent {event.lineage.parent_operation}), for which neither it nor the "
                "runtime that vouched for the call holds tool or orchestrator",
            )
    return proof


def check_event_role(
    event: Event,
    producer: ProducerEntry,
    view: OperationView,
    table: EventRoles = DEFAULT_EVENT_ROLES,
) -> None:
    """Raise `AuthenticationError` unless `producer` holds a role `table` permits for
    `event` on `view`'s scope, and every identity the event claims is the producer's."""
    if event.classifier is not None:
        roles: tuple[Role, ...] = (Role.CLASSIFIER,)
    elif is_timer_event(event.event_id):
        # A timer's event delivers a state's timeout event (a verifier's type, say) in
        # the controller's name: only the controller fires timers.
        roles = _TIMER
    else:
        roles = table.roles_for(event.event_type)
    tried = []
    for role in roles:
        scopes = _scopes_of(role, event, view)
        if any(producer.permits(role, **scope) for scope in scopes):
            break
        tried.append(" or ".join(f"{role}{_describe(scope)}" for scope in scopes))
    else:
        raise _refuse(producer, event, "it holds none of " + "; ".join(tried))
    evidence = event.evidence
    if Role.VERIFIER in roles and evidence is not None and evidence.verifier is not None:
        if evidence.verifier != producer.id:
            raise _mismatch(producer, event, "evidence.verifier", evidence.verifier)
    checkpoint = evidence.checkpoint if evidence is not None else None
    if checkpoint is not None and checkpoint.validated:
        validator = checkpoint.validator
        if validator is not None and validator != producer.id:
            raise _mismatch(producer, event, "checkpoint.validator", validator)
        if not producer.permits(Role.VALIDATOR, agent=view.lineage.agent):
            raise _refuse(
                producer,
                event,
                f"it reports a validated checkpoint but does not hold validator for agent "
                f"{view.lineage.agent}",
            )
