"""An in-memory ledger that feeds events through `decide` and `apply`.

`Simulation` is what `recoveryctl test` and `recoveryctl simulate` run on, and what the
property tests drive: one dict of operation views, no clock (each call passes `now`),
no I/O. It uses exactly the decision core the live controller uses, so a case that
passes here exercises the same code path the consumer calls inside its transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from machines.decision import Decision, apply, decide
from machines.event import Event
from machines.guards import STANDARD_GUARDS, GuardFn
from machines.model import Machine, Registry
from machines.policy import Policy
from machines.view import LineageStatus, OperationView, ToolFacts, new_view


class SimulationError(ValueError):
    """The simulation was asked to do something inconsistent; the message says what."""


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


class Simulation:
    """Views of many operations under one pinned machine, policy and registry."""

    def __init__(
        self,
        machine: Machine,
        registry: Registry,
        policy: Policy,
        *,
        guard_table: Mapping[str, GuardFn] = STANDARD_GUARDS,
    ) -> None:
        self.machine = machine
        self.registry = registry
        self.policy = policy
        self.guard_table = guard_table
        self.views: dict[str, OperationView] = {}

    def open(self, setup: OperationSetup, start: datetime) -> OperationView:
        """Start governing an operation; its deadline defaults to `start` plus the
        policy's `deadline_seconds`, and never extends past that."""
        if setup.operation_id in self.views:
            raise SimulationError(f"operation {setup.operation_id} is already open")
        state = setup.state or self.machine.initial
        if state not in self.machine.states:
            raise SimulationError(
                f"operation {setup.operation_id}: start state {state} is not in machine "
                f"{self.machine.name} (states: {', '.join(sorted(self.machine.states))})"
            )
        deadline = setup.deadline
        if self.policy.deadline_seconds is not None:
            limit = start + timedelta(seconds=self.policy.deadline_seconds)
            deadline = limit if deadline is None else min(deadline, limit)
        budget = self.policy.retry_budget if setup.budget is None else setup.budget
        view = new_view(
            operation_id=setup.operation_id,
            machine_name=self.machine.name,
            machine_digest=self.machine.digest,
            policy_digest=self.policy.digest,
            initial_state=state,
            lineage=LineageStatus(agent=setup.agent, lineage_agents=setup.lineage_agents),
            facts=setup.facts,
            budget_limit=budget,
            deadline=deadline,
        )
        self.views[setup.operation_id] = view
        return view

    def feed(self, event: Event, now: datetime) -> Decision:
        """Decide `event` at `now` and fold the decision into the operation's view. An
        event for an operation not yet open opens it with conservative defaults: the
        event's lineage agent as the affected agent and nothing declared; a `facts` block
        on that first event is then admitted by the core while it decides the event
        (`machines.facts.admit_facts`), exactly as the live controller does."""
        view = self.views.get(event.operation_id)
        if view is None:
            setup = OperationSetup(operation_id=event.operation_id, agent=event.lineage.agent)
            view = self.open(setup, event.event_time)
        decision = decide(
            self.machine,
            view,
            event,
            self.policy,
            self.registry,
            now,
            guard_table=self.guard_table,
        )
        self.views[event.operation_id] = apply(view, decision)
        return decision
