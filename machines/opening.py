"""A second opening of an operation id is a security incident, not a dead letter.

Operation ids are global, not scoped by the producer that opens them: commands,
evidence, human decisions, the Kafka key and every ledger row name an operation by its
id alone, and a worker or an approver cannot know who opened it. So the first opening
that is authenticated and authorized (`machines.producer_roles.check_opening`) governs
the operation: its machine, its scope (capability, tool, environment), its affected
agent and its producer, the operation's one reporting tool, are kept in the view.

A later tool report (an event type the `tool` role sends, from a producer that holds
`tool`) that disagrees with the opening on any of them describes another operation
under the same id: two tools collide on an id, or one squats another's to strand its
reports. Neither is decided. `opening_conflict` names what differs and holds both
openings; the controller dead-letters the report as `opening-conflict` with the
incident in its audit record, counts it, and lists it (`recoveryctl incidents`). A
report that agrees with the opening goes on to the role check and the decision core
as before (a wrong correlation id there is `correlation-mismatch`).

Events of other roles (verifiers, workers, approvers, orchestrators, the controller's
own), and any event that answers a command the operation issued (its causation), answer
what the operation asked and are not openings; a machine *version* other than the
pinned one is not a conflict either (the same machine, upgraded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from machines.event import Event
from machines.model import Machine
from machines.producer_roles import DEFAULT_EVENT_ROLES, EventRoles
from machines.roster import ProducerEntry, Role
from machines.view import OperationView

__all__ = ["OPENING_CONFLICT", "Opening", "OpeningConflict", "opening_conflict"]

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

    def to_json(self) -> dict[str, Any]:
        return {
            "producer": self.producer,
            "machine": self.machine,
            "capability": self.capability,
            "tool": self.tool,
            "environment": self.environment,
            "agent": self.agent,
        }

    def describe(self) -> str:
        scope = "/".join(str(v) for v in (self.capability, self.tool, self.environment))
        return (
            f"producer {self.producer or '<not kept>'}, machine {self.machine}, "
            f"scope {scope}, agent {self.agent}"
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
            "first opening governs the operation; this report is an incident, not decided "
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
    if Role.TOOL not in roles.roles_for(event.event_type) or Role.TOOL not in producer.roles():
        return None
    if event.causation is not None and view.command_capability(event.causation) is not None:
        return None  # an answer to a command the operation issued, not a report of it
    scope = event.scope
    claimed = Opening(
        producer=event.producer,
        machine=machine.name,
        capability=None if scope is None else scope.capability,
        tool=None if scope is None else scope.tool,
        environment=None if scope is None else scope.environment,
        agent=event.lineage.agent,
    )
    opened = Opening(
        producer=view.opened_by or None,
        machine=view.machine_name,
        capability=view.capability,
        tool=view.tool,
        environment=view.environment,
        agent=view.lineage.agent,
    )
    differs = []
    if opened.producer is not None and claimed.producer != opened.producer:
        differs.append("producer")
    if claimed.machine != opened.machine:
        differs.append("machine")
    if scope is not None and (claimed.capability, claimed.tool, claimed.environment) != (
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
