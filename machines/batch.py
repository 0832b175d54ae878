"""The decisions of a sequence of events, folded per operation, without I/O.

One path opens an operation and folds the decisions made on it: `BatchFold`. The
controller runs one per consumed batch (`consumer.batch.decide_batch`), on the views the
ledger stores and the lineage it gives the operations the batch opens;
`machines.Simulation` runs one over a whole stream (`recoveryctl simulate`/`test`, the
property tests, the replay checks). Per event, in order:

- the operation's view as folded so far; an operation not seen yet is opened
  (`open_view`: the event's lineage agent is the affected agent, the policy's budget,
  the deadline from the controller's clock, never the event's time) with the lineage it
  arrives with: what the ledger gives it (`arrivals`), extended below a parent, and
  above children, opened earlier in the same fold (`machines.containment.arrival_of`,
  the rule the ledger links with);
- `decide`, then `apply` unless the event was a duplicate or a conflict;
- whether an operation opened in the fold is containing after the decision, so a child
  opened below it later is decided as contained from its first event (L5.5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from machines.claims import ClaimKey, KeyClaim, claim_key_of, claimed_by
from machines.containment import (
    Arrival,
    Change,
    LineageRow,
    arrival_of,
    containment_of,
    may_link,
)
from machines.decision import Decision, Outcome, apply, decide
from machines.event import Event
from machines.guards import STANDARD_GUARDS, GuardFn
from machines.migration import decide_migration
from machines.model import Machine, Registry
from machines.policy import Policy
from machines.producer_roles import DEFAULT_EVENT_ROLES, EventRoles
from machines.view import LineageStatus, OperationView, ToolFacts, new_view

__all__ = ["BatchFold", "OperationSetup", "Rules", "open_view"]


@dataclass(frozen=True, slots=True)
class Rules:
    """What every decision of a controller (or a simulation) is made under."""

    policy: Policy
    registry: Registry
    guard_table: Mapping[str, GuardFn] = field(default_factory=lambda: dict(STANDARD_GUARDS))
    # Which roles may send which event types (`machines.producer_roles`); the one place
    # a deployment (or a machine's own table) overrides the default.
    event_roles: EventRoles = DEFAULT_EVENT_ROLES


@dataclass(frozen=True, slots=True)
class OperationSetup:
    """What the controller knows about an operation when it starts governing it."""

    operation_id: str
    agent: str
    lineage_agents: frozenset[str] = frozenset()
    facts: ToolFacts = field(default_factory=ToolFacts)
    budget: int | None = None
    deadline: datetime | None = None
    state: str | None = None
    correlation_id: str = ""
    capability: str | None = None
    tool: str | None = None
    environment: str | None = None
    principal: str | None = None
    task: str | None = None
    runtime: str | None = None
    credentials: tuple[str, ...] = ()
    opened_by: str | None = None
    agent_proof: str = ""


def open_view(
    machine: Machine, policy: Policy, setup: OperationSetup, start: datetime
) -> OperationView:
    """The view of an operation `machine` starts governing at `start`: in `setup.state`
    (default: the machine's initial state; the caller checks that it exists), with a
    deadline of `start` plus the policy's `deadline_seconds` that never extends past
    that, and the policy's retry budget unless `setup` names one."""
    deadline = setup.deadline
    if policy.deadline_seconds is not None:
        limit = start + timedelta(seconds=policy.deadline_seconds)
        deadline = limit if deadline is None else min(deadline, limit)
    budget = policy.retry_budget if setup.budget is None else setup.budget
    return new_view(
        operation_id=setup.operation_id,
        machine_name=machine.name,
        machine_digest=machine.digest,
        machine_version=machine.version,
        policy_digest=policy.digest,
        initial_state=setup.state or machine.initial,
        lineage=LineageStatus(agent=setup.agent, lineage_agents=setup.lineage_agents),
        facts=setup.facts,
        budget_limit=budget,
        deadline=deadline,
        correlation_id=setup.correlation_id,
        capability=setup.capability,
        tool=setup.tool,
        environment=setup.environment,
        principal=setup.principal,
        task=setup.task,
        runtime=setup.runtime,
        credentials=setup.credentials,
        opened_by=setup.opened_by,
        agent_proof=setup.agent_proof,
    )


class BatchFold:
    """The views of the operations a sequence of events touches, folded as its events are
    decided (see the module docstring). `stored` are the views known before the first
    event; `arrivals` the lineage known for operations not in `stored` (none: opened
    with no lineage). `base` holds each operation's view before its first event of the
    fold, `current` its view after the last."""

    def __init__(
        self,
        stored: Mapping[str, OperationView],
        rules: Rules,
        arrivals: Mapping[str, Arrival] | None = None,
        claims: Mapping[ClaimKey, KeyClaim] | None = None,
    ) -> None:
        self.rules = rules
        self.stored = stored
        self.arrivals: Mapping[str, Arrival] = arrivals or {}
        # The owners of idempotency keys: those the ledger stores for the keys this
        # fold's new operations declare, and those of operations folded here since
        # (`machines.claims`), so a second claimant is decided on the first one.
        self.claims: dict[ClaimKey, KeyClaim] = dict(claims or {})
        # The operations this fold opens, with their first event and the lineage each
        # was opened with, and whether it is containing as folded so far: a child
        # opened below one of them later is decided below it (no ledger knows it yet).
        self.opened: dict[str, tuple[Event, Arrival]] = {}
        self.containing: dict[str, bool] = {}
        # Per operation opened here, the children reported before it that are not
        # linked below it: their openers may not speak for its agents (`may_link`).
        self.unlinked: dict[str, frozenset[str]] = {}
        self.base: dict[str, OperationView] = {}
        self.current: dict[str, OperationView] = {}

    def admit(self, view: OperationView) -> None:
        """Take `view` as its operation's view from now on, as if it had been stored
        (an operation opened with an explicit `OperationSetup`), with the idempotency
        key it declares claimed."""
        self.base.setdefault(view.operation_id, view)
        self.current[view.operation_id] = view
        self._claim(view)

    def restore(self, operation_id: str, before: OperationView | None) -> None:
        """Put an operation back as it was folded before one event (`before`: its
        `current` view then, None if the fold had not opened it), for an event the
        caller refuses after `view_of` opened it or after a fold."""
        if before is not None:
            self.current[operation_id] = before
            return
        for table in (self.base, self.current, self.opened, self.containing, self.unlinked):
            table.pop(operation_id, None)
        for key in [k for k, c in self.claims.items() if c.operation_id == operation_id]:
            del self.claims[key]

    def known(self, operation_id: str) -> OperationView | None:
        """The operation's view as folded so far, or as stored; None if neither."""
        return self.current.get(operation_id) or self.stored.get(operation_id)

    def view_of(
        self, event: Event, machine: Machine, now: datetime, agent_proof: str = ""
    ) -> OperationView:
        """The view `event` is decided on at `now`; opens its operation if it is new,
        with `agent_proof` (how its opening proved the agent, `check_opening`) and its
        deadline counted from `now`: time is the controller's clock, never an event's
        `event_time` (a far-future one would put the deadline out of reach)."""
        op = event.operation_id
        if op not in self.current:
            view = self.stored.get(op)
            if view is None:
                # The lineage it is linked into on commit: a new child of a contained
                # parent is decided as contained from its first event (L5.5). Nothing
                # is recorded until the view is built, so an event that fails to open
                # its operation leaves the fold as it was.
                arrival = self.arrival_in_batch(event)
                refused = frozenset(
                    c.operation_id
                    for c in arrival.children
                    if not may_link(
                        self.rules.policy.roster, c, (event.lineage.agent, *arrival.lineage_agents)
                    )
                )
                if refused:
                    arrival = arrival.without(refused)
                    self.unlinked[op] = refused
                scope, lineage = event.scope, event.lineage
                setup = OperationSetup(
                    operation_id=op,
                    agent=lineage.agent,
                    correlation_id=event.correlation_id,
                    capability=None if scope is None else scope.capability,
                    tool=None if scope is None else scope.tool,
                    environment=None if scope is None else scope.environment,
                    principal=lineage.initiating_principal,
                    task=lineage.task,
                    runtime=lineage.runtime,
                    credentials=lineage.delegated_credentials,
                    opened_by=event.producer,
                    agent_proof=agent_proof,
                )
                opened = open_view(machine, self.rules.policy, setup, now)
                view = self._owned_elsewhere(arrival.applied_to(opened), event)
                self.opened[op] = (event, arrival)
            self.base[op] = view
            self.current[op] = view
        return self.current[op]

    def decider(
        self,
        event: Event,
        machine: Machine,
        now: datetime,
        agent_proof: str = "",
        target: Machine | None = None,
    ) -> Callable[[], Decision]:
        """Open `event`'s operation if needed (`view_of`), and return the call that
        decides `event` on its view at `now`; `fold` takes the decision in (a caller may
        wrap the call in a span or a timer). With `target`, the event is a signed
        migration of the operation from `machine` to that version
        (`machines.migration.decide_migration`)."""
        view = self.view_of(event, machine, now, agent_proof)
        rules = self.rules
        if target is not None:
            return lambda: decide_migration(machine, target, view, event, rules.policy, now)

        def run() -> Decision:
            return decide(
                machine,
                view,
                event,
                rules.policy,
                rules.registry,
                now,
                guard_table=rules.guard_table,
            )

        return run

    def fold(self, event: Event, decision: Decision) -> None:
        """Fold `decision` (made on `event` by the call `decider` returned) into its
        operation's view; a duplicate or a conflict changes nothing, and neither does a
        fold that raises."""
        if decision.outcome in (Outcome.DUPLICATE, Outcome.CONFLICT):
            return
        op = event.operation_id
        # Everything is computed before anything is recorded: a fold that raises leaves
        # the views as they were, so the caller can refuse this one event and go on.
        view = apply(self.current[op], decision)
        change = containment_of(event, decision) if op in self.opened else None
        self.current[op] = view
        if change is not None:
            self.containing[op] = change.change is Change.CONTAIN
        if decision.evidence.facts is not None:
            self._claim(view)

    def _claim(self, view: OperationView) -> None:
        """Record the idempotency key `view`'s operation claims, unless another holds it."""
        claimed = claimed_by(view)
        if claimed is not None:
            self.claims.setdefault(*claimed)

    def _owned_elsewhere(self, view: OperationView, event: Event) -> OperationView:
        """`view` (of the operation `event` opens) with the owner of the idempotency key
        the event declares, when another operation holds it: the core then decides the
        event as a duplicate or a conflicting reuse (`machines.claims`)."""
        key = claim_key_of(event)
        owner = self.claims.get(key) if key is not None else None
        if owner is None or owner.operation_id == view.operation_id:
            return view
        return replace(view, key_owner=owner)

    def arrival_in_batch(self, event: Event) -> Arrival:
        """The lineage a new operation is opened with: the ledger's (`arrivals`), extended
        by what the ledger cannot know yet because this fold opens it too, with the same
        `arrival_of` derivation the commit's linking makes: when its parent was opened
        earlier in the fold, the parent's own arrival, its agent, and the parent itself
        as a contained ancestor if it is containing as folded so far; and the agents of
        children opened earlier in the fold that name it as parent, with theirs."""
        op = event.operation_id
        stored = self.arrivals.get(op) or Arrival(op)
        parent_id = event.lineage.parent_operation
        parent = (
            self.row_of(parent_id) if parent_id is not None and parent_id in self.opened else None
        )
        children = [
            self.row_of(c)
            for c, (first, _) in self.opened.items()
            if first.lineage.parent_operation == op
        ]
        if parent is None and not children:
            return stored
        below = arrival_of(op, parent, children)
        descendants = stored.descendant_agents + tuple(
            a for a in below.descendant_agents if a not in stored.descendant_agents
        )
        kids = stored.children + below.children
        if parent is None:
            return replace(stored, descendant_agents=descendants, children=kids)
        return Arrival(
            op,
            below.ancestors,
            below.lineage_agents,
            below.contained_ancestors,
            descendants,
            kids,
        )

    def row_of(self, op: str) -> LineageRow:
        """The lineage row an operation opened earlier in this fold will be linked with
        (its first event's lineage, the arrival it was opened with, containing as folded
        so far): what `arrival_of` needs, since no ledger stores it yet."""
        ev, arrival = self.opened[op]
        lineage = ev.lineage
        return LineageRow(
            operation_id=op,
            correlation_id=ev.correlation_id,
            machine_name=ev.machine_name,
            machine_version=ev.machine_version,
            state=self.current[op].state,
            agent=lineage.agent,
            task=lineage.task,
            initiating_principal=lineage.initiating_principal,
            origin_operation=lineage.origin_operation,
            parent_operation=lineage.parent_operation,
            delegated_credentials=lineage.delegated_credentials,
            ancestors=arrival.ancestors,
            lineage_agents=arrival.lineage_agents,
            contained_ancestors=arrival.contained_ancestors,
            containing=self.containing.get(op, False),
            descendant_agents=arrival.descendant_agents,
            opened_by=ev.producer,
        )
