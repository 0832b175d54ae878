"""Containment and lineage semantics, without I/O (CONFORMANCE Level 5, docs/lineage.md).

- An operation is **containing** from the decision that takes a transition invoking a
  capability of kind `stop` or `isolate` (SPEC §7.3) until a later decision takes a
  transition invoking a `resume`-kind capability, which the core allows only with
  verified state and an independent approval (SPEC §7.6). `containment_of` reads this
  off one decision, whatever the machine calls its states.
- An operation's **contained ancestors** are the known ancestors that are containing.
  While there is one, the view's lineage is not clear (`lineage.clear`, and so the
  resume gate, is false); `with_lineage` lays them over a view.
- **Arrival**: an operation not yet stored is linked below its parent's chain (the
  parent first, contained if the parent is containing) and above the operations that
  named it as parent first (`arrival_of`, built on `lineage_below`). The ledger's
  linking (`ledger.cascade.plan_lineage`) and the batch fold (`machines.batch`) both use
  this rule, so the lineage a batch is decided with and the one its commit links agree.

What is the ledger's own (the cascade events it writes to the outbox, their record ids,
the rows it reads and writes) is in `ledger.cascade`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from machines.decision import Decision, Outcome
from machines.event import Event, Lineage
from machines.model import CapabilityKind
from machines.roster import Role, Roster
from machines.view import LineageStatus, OperationView

__all__ = [
    "MAX_LINEAGE_DEPTH",
    "Arrival",
    "Change",
    "Containment",
    "LineageRow",
    "arrival_of",
    "containment_of",
    "lineage_below",
    "may_link",
    "with_lineage",
]

_CONTAINING_KINDS: Final = frozenset({str(CapabilityKind.STOP), str(CapabilityKind.ISOLATE)})
_RELEASING_KINDS: Final = frozenset({str(CapabilityKind.RESUME)})
# Ancestor chains longer than this are cut (a cycle in reported parents, or abuse).
MAX_LINEAGE_DEPTH: Final = 64


class Change(StrEnum):
    """What a decision does to its operation's containment."""

    CONTAIN = "contain"
    RELEASE = "release"


@dataclass(frozen=True, slots=True)
class Containment:
    """A decision that starts or ends containment of `operation_id`, and its cause:
    `chain` is this decision (`<operation>#<sequence>/<event id>`), followed by the chain
    of the cascade event that caused it, if it was one (`<-` separated)."""

    operation_id: str
    change: Change
    sequence: int
    event_id: str
    event_type: str
    decided_at: datetime
    chain: str


def containment_of(event: Event, decision: Decision) -> Containment | None:
    """The containment change `decision` makes, or None (see the module docstring)."""
    if decision.outcome is not Outcome.TRANSITIONED:
        return None
    kinds = {i.kind for i in decision.invocations}
    if kinds & _CONTAINING_KINDS:
        change = Change.CONTAIN
    elif kinds & _RELEASING_KINDS:
        change = Change.RELEASE
    else:
        return None
    link = f"{decision.operation_id}#{decision.sequence}/{decision.event_id}"
    prior = event.evidence_ref
    chain = f"{link} <- {prior[len('cascade:') :]}" if prior.startswith("cascade:") else link
    return Containment(
        operation_id=decision.operation_id,
        change=change,
        sequence=decision.sequence,
        event_id=decision.event_id,
        event_type=decision.event_type,
        decided_at=decision.decided_at,
        chain=chain,
    )


@dataclass(frozen=True, slots=True)
class LineageRow:
    """The identity and lineage columns of one operation row (migration 0005).
    `ancestors` is the known chain, parent first; `lineage_agents` their agents;
    `contained_ancestors` those of them that are containing; `containment_cause` the
    chain of the decision that made this operation containing; `descendant_agents` the
    agents of every known operation below it."""

    operation_id: str
    correlation_id: str
    machine_name: str
    machine_version: str
    state: str
    agent: str
    task: str
    initiating_principal: str
    origin_operation: str | None
    parent_operation: str | None
    delegated_credentials: tuple[str, ...] = ()
    ancestors: tuple[str, ...] = ()
    lineage_agents: tuple[str, ...] = ()
    contained_ancestors: tuple[str, ...] = ()
    containing: bool = False
    containment_cause: str | None = None
    descendant_agents: tuple[str, ...] = ()
    # The authenticated producer of the event that opened it (None: not known to this
    # read): whose grants a link below a parent reported later is checked against.
    opened_by: str | None = None

    def lineage(self) -> Lineage:
        """The envelope lineage of events about this operation."""
        return Lineage(
            agent=self.agent,
            task=self.task,
            initiating_principal=self.initiating_principal,
            origin_operation=self.origin_operation,
            parent_operation=self.parent_operation,
            delegated_credentials=self.delegated_credentials,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form (the lineage CLI, audit bodies)."""
        return {
            "operation_id": self.operation_id,
            "correlation_id": self.correlation_id,
            "machine": {"name": self.machine_name, "version": self.machine_version},
            "state": self.state,
            **self.lineage().to_dict(),
            "ancestors": list(self.ancestors),
            "lineage_agents": list(self.lineage_agents),
            "contained_ancestors": list(self.contained_ancestors),
            "containing": self.containing,
            "containment_cause": self.containment_cause,
            "descendant_agents": list(self.descendant_agents),
        }


def lineage_below(parent: LineageRow) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The ancestors, their agents and the contained ancestors of a child of `parent`."""
    ancestors = (parent.operation_id, *parent.ancestors)[:MAX_LINEAGE_DEPTH]
    agents = (parent.agent, *parent.lineage_agents)[:MAX_LINEAGE_DEPTH]
    contained = (
        (parent.operation_id, *parent.contained_ancestors)
        if parent.containing
        else parent.contained_ancestors
    )
    return ancestors, agents, contained


@dataclass(frozen=True, slots=True)
class Arrival:
    """The lineage an operation not yet stored gets when a batch opens it, from what the
    ledger stores now (`Ledger.arrival_lineage`): its parent's chain (the parent first,
    contained if the parent is containing) and the agents of the stored operations that
    named it as parent, with theirs below (children reported first). Empty when the
    ledger knows neither."""

    operation_id: str
    ancestors: tuple[str, ...] = ()
    lineage_agents: tuple[str, ...] = ()
    contained_ancestors: tuple[str, ...] = ()
    descendant_agents: tuple[str, ...] = ()
    # The stored rows naming it as parent (children reported first) the descendant
    # agents come from: what `without` recomputes them from. Not part of the lineage.
    children: tuple[LineageRow, ...] = field(default=(), compare=False)

    def without(self, refused: frozenset[str]) -> Arrival:
        """This arrival with the children in `refused` left out: not linked below it
        (`may_link`), so their agents are not its descendants'."""
        if not refused:
            return self
        kept = tuple(c for c in self.children if c.operation_id not in refused)
        return replace(self, descendant_agents=_agents_below(kept), children=kept)

    def applied_to(self, view: OperationView) -> OperationView:
        """`view` (a freshly opened one) with this lineage laid over it."""
        return with_lineage(
            view,
            self.ancestors,
            self.lineage_agents,
            self.contained_ancestors,
            self.descendant_agents,
        )


def arrival_of(
    operation_id: str, parent: LineageRow | None, children: Iterable[LineageRow]
) -> Arrival:
    """The `Arrival` of `operation_id` below the stored `parent` (None: not stored or
    not named) above the stored `children` (rows naming it as parent). The same rule
    as the linking in `plan_lineage`, so the lineage a batch is decided with and the one
    its commit links agree unless a concurrent batch moved it in between."""
    kids = tuple(sorted(children, key=lambda r: r.operation_id))
    below = _agents_below(kids)
    if parent is None or operation_id in parent.ancestors:
        return Arrival(operation_id, descendant_agents=below, children=kids)
    ancestors, agents, contained = lineage_below(parent)
    return Arrival(operation_id, ancestors, agents, contained, below, kids)


def _agents_below(children: Iterable[LineageRow]) -> tuple[str, ...]:
    below: list[str] = []
    for child in children:
        for agent in (child.agent, *child.descendant_agents):
            if agent not in below:
                below.append(agent)
    return tuple(below)


def may_link(roster: Roster, child: LineageRow, agents: Iterable[str]) -> bool:
    """Whether `child`, reported before the operation it names as parent, may be linked
    below it now that the parent arrived (CONFORMANCE L5, DESIGN "The affected agent is
    proven, not named"): its opener holds `tool` or `orchestrator` for every agent it
    would be linked below (`agents`: the parent's and its ancestors'), the rule
    `machines.check_opening` applies when the ancestors are known at the child's own
    opening. Without a roster (a simulation) every link stands, and so does one of a
    child whose opener is not known (stored before openers were kept)."""
    if not roster.producers or child.opened_by is None:
        return True
    entry = roster.producer(child.opened_by)
    if entry is None:
        return False
    return all(
        entry.permits(Role.TOOL, agent=agent) or entry.permits(Role.ORCHESTRATOR, agent=agent)
        for agent in agents
        if agent != child.agent
    )


def with_lineage(
    view: OperationView,
    ancestors: Sequence[str],
    lineage_agents: Sequence[str],
    contained_ancestors: Sequence[str],
    descendant_agents: Sequence[str] = (),
) -> OperationView:
    """`view` with its lineage status as the ledger knows it now: the agents of every
    known ancestor and descendant (no approval from them counts, SPEC §7.7, CONFORMANCE
    L5.5) and the ancestors containing it. The ledger is authoritative for ancestors it
    knows; an ancestor the view recorded from an `ANCESTOR_CONTAINED` event that the
    ledger does not know (another deployment's operation) stays contained, as nothing
    here can tell it was released."""
    status = view.lineage
    known = set(ancestors)
    contained = tuple(contained_ancestors) + tuple(
        a for a in status.contained_ancestors if a not in known and a not in contained_ancestors
    )
    agents = status.lineage_agents | frozenset(lineage_agents) | frozenset(descendant_agents)
    if agents == status.lineage_agents and contained == status.contained_ancestors:
        return view
    return replace(
        view,
        lineage=LineageStatus(
            agent=status.agent, lineage_agents=agents, contained_ancestors=contained
        ),
    )
