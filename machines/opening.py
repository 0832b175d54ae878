"""A second opening of an operation id is a security incident, not a dead letter.

Operation ids are global, not scoped by the producer that opens them: commands,
evidence, human decisions, the Kafka key and every ledger row name an operation by its
id alone, and a worker or an approver cannot know who opened it. So the first opening
that is authenticated and authorized (`machines.producer_roles.check_opening`) governs
the operation: its machine, its scope (capability, tool, environment), its affected
agent, its correlation id and its producer are kept in the view.

Two tools may report on one operation (the tool that made the call and, say, the
identity provider that denied it), so another producer alone is no conflict. A report
that describes *another operation* under the same id is: two tools collide on an id, or
one squats another's to strand its reports.

- `opening_conflict`: a tool report (an event type only the `tool` role sends, from a
  producer that holds `tool` and no other role that may send it, answering no command
  of the operation) that names another machine, carries another scope or names another
  affected agent than the opening. It is not decided: the controller dead-letters it as
  `opening-conflict`.
- `correlation_conflict`: an event from another producer than the opener that carries
  another correlation id. The decision core refuses it as `correlation-mismatch` (SPEC
  §6.2; recorded and audited on the operation, as before); the refusal also carries
  the incident.

Either way the incident, with both openings and what differs, is in the dead letter's
audit record on the intake chain; the controller counts it
(`recovery_controller_security_incidents_total`) and `recoveryctl incidents` lists it. A
machine *version* other than the pinned one is not a conflict (the same machine,
upgraded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from machines.event import Event
from machines.model import Machine
from machines.producer_roles import DEFAULT_EVENT_ROLES, EventRoles
from machines.roster import ProducerEntry, Role
from machines.view import OperationView

__all__ = [
    "OPENING_CONFLICT",
    "Opening",
    "OpeningConflict",
    "correlation_conflict",
    "opening_conflict",
]

OPENING_CONFLICT: Final = "opening-conflict"


@dataclass(frozen=True, slots=True)
class Opening:
    """What an opening says about its operation (None where a report leaves it out)."""

    producer: str | None
    machine: str
    capability: str | None
    tool: str | None
    environment: str | None
    agent: str
    correlation_id: str

    @classmethod
    def of_view(cls, view: OperationView) -> Opening:
        """What the operation was opened with."""
        return cls(
            producer=view.opened_by or None,
            machine=view.machine_name,
            capability=view.capability,
            tool=view.tool,
            environment=view.environment,
            agent=view.lineage.agent,
            correlation_id=view.correlation_id,
        )

    @classmethod
    def of_event(cls, event: Event, machine: str) -> Opening:
        """What `event`, naming `machine`, says about its operation."""
        scope = event.scope
        return cls(
            producer=event.producer,
            machine=machine,
            capability=None if scope is None else scope.capability,
            tool=None if scope is None else scope.tool,
            environment=None if scope is None else scope.environment,
            agent=event.lineage.agent,
            correlation_id=event.correlation_id,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "producer": self.producer,
            "machine": self.machine,
            "capability": self.capability,
            "tool": self.tool,
            "environment": self.environment,
            "agent": self.agent,
            "correlation_id": self.correlation_id,
        }

    def describe(self) -> str:
        scope = "/".join(str(v) for v in (self.capability, self.tool, self.environment))
        return (
            f"producer {self.producer or '<not kept>'}, machine {self.machine}, "
            f"scope {scope}, agent {self.agent}, correlation {self.correlation_id or '-'}"
        )


@dataclass(frozen=True, slots=True)
class OpeningConflict:
    """A report that disagrees with its operation's opening on `differs`."""

    operation_id: str
    differs: tuple[str, ...]
    opened: Opening
    claimed: Opening
    event_id: str
    event_type: str

    def to_json(self) -> dict[str, Any]:
        """The incident as its audit record holds it."""
        return {
            "kind": OPENING_CONFLICT,
            "severity": "high",
            "operation_id": self.operation_id,
            "differs": list(self.differs),
            "opened": self.opened.to_json(),
            "claimed": {
                **self.claimed.to_json(),
                "event_id": self.event_id,
                "event_type": self.event_type,
            },
        }

    def describe(self) -> str:
        return (
            f"{self.event_type} {self.event_id} reports operation {self.operation_id} with "
            f"another {', '.join(self.differs)} than its opening: opened with "
            f"{self.opened.describe()}; this report claims {self.claimed.describe()}. The "
            "first opening governs the operation; this report is a security incident "
            "(`recoveryctl incidents`)"
        )


def opening_conflict(
    view: OperationView,
    event: Event,
    machine: Machine,
    producer: ProducerEntry,
    roles: EventRoles = DEFAULT_EVENT_ROLES,
) -> OpeningConflict | None:
    """The conflict of `event`, a report on the operation `view` governs, with that
    operation's opening; None when it is no tool report or agrees (module docstring)."""
    allowed, held = roles.roles_for(event.event_type), producer.roles()
    if Role.TOOL not in allowed or Role.TOOL not in held:
        return None
    if any(role in held for role in allowed if role is not Role.TOOL):
        return None  # it may send this in another role it holds (RESUME_REQUESTED, say)
    if event.causation is not None and view.command_capability(event.causation) is not None:
        return None  # an answer to a command the operation issued, not a report of it
    opened, claimed = Opening.of_view(view), Opening.of_event(event, machine.name)
    differs = []
    if claimed.machine != opened.machine:
        differs.append("machine")
    if event.scope is not None and (claimed.capability, claimed.tool, claimed.environment) != (
        opened.capability,
        opened.tool,
        opened.environment,
    ):
        differs.append("scope")
    if claimed.agent != opened.agent:
        differs.append("agent")
    if not differs:
        return None
    return OpeningConflict(
        event.operation_id, tuple(differs), opened, claimed, event.event_id, event.event_type
    )


def correlation_conflict(view: OperationView, event: Event) -> OpeningConflict | None:
    """The incident of `event` when another producer than the opener sends it with
    another correlation id than the operation's (module docstring); None otherwise, and
    for a view that kept neither."""
    if not view.opened_by or not view.correlation_id:
        return None
    if event.producer == view.opened_by or event.correlation_id == view.correlation_id:
        return None
    return OpeningConflict(
        event.operation_id,
        ("producer", "correlation"),
        Opening.of_view(view),
        Opening.of_event(event, view.machine_name),
        event.event_id,
        event.event_type,
    )
