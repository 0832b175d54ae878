"""The decision core driven over a sequence of events, with no ledger behind it.

`Simulation` is what `recoveryctl test` and `recoveryctl simulate` run on, what the
property tests drive, and what the replay checks compare a ledger with. It is not a
ledger: it stores no events, decisions or audit records, only each operation's view as
folded so far. It runs one `machines.batch.BatchFold` over the whole stream, the fold
the live controller runs over each consumed batch, so an operation is opened and its
decisions folded exactly as in the controller; no clock (each call passes `now`), no
I/O. `advance(now)` moves the clock: every timer due by then fires, earliest first, as
the controller fires it (`machines.timers.timer_event`), each decided at its due time.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Final

from machines.batch import BatchFold, OperationSetup, Rules, open_view
from machines.decision import Decision
from machines.event import Event, Lineage
from machines.guards import STANDARD_GUARDS, GuardFn
from machines.model import Machine, Registry
from machines.policy import Policy
from machines.timers import due_timers, timer_event
from machines.view import OperationView

# Who a simulation's timer events name as their producer (the controller's roster id
# live) and how many timers one `advance` fires at most (a guard against a policy whose
# timers re-arm each other without end; time moves on with each, so none does).
SIMULATED_CONTROLLER: Final = "recovery-controller"
MAX_FIRINGS: Final = 10_000


class SimulationError(ValueError):
    """The simulation was asked to do something inconsistent; the message says what."""


class Simulation:
    """Operations under one pinned machine, policy and registry, decided event by event
    (see the module docstring); `views` holds each one's view as folded so far."""

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
        self._fold = BatchFold({}, Rules(policy, registry, guard_table))
        # The lineage of each operation's first event: what its timer events carry, as
        # the controller takes them from the operation's row.
        self._lineage: dict[str, Lineage] = {}

    @property
    def views(self) -> Mapping[str, OperationView]:
        """Each operation's view after the events fed so far."""
        return self._fold.current

    def open(self, setup: OperationSetup, start: datetime) -> OperationView:
        """Start governing an operation (`machines.batch.open_view`); its deadline
        defaults to `start` plus the policy's `deadline_seconds`, and never extends past
        that."""
        if setup.operation_id in self.views:
            raise SimulationError(f"operation {setup.operation_id} is already open")
        state = setup.state or self.machine.initial
        if state not in self.machine.states:
            raise SimulationError(
                f"operation {setup.operation_id}: start state {state} is not in machine "
                f"{self.machine.name} (states: {', '.join(sorted(self.machine.states))})"
            )
        view = open_view(self.machine, self.policy, setup, start)
        self._fold.admit(view)
        return view

    def feed(self, event: Event, now: datetime) -> Decision:
        """Decide `event` at `now` and fold the decision into the operation's view. An
        event for an operation not yet open opens it as the controller does: the event's
        lineage agent as the affected agent, nothing declared, below a parent opened
        earlier in the stream; a `facts` block on that first event is then admitted by
        the core while it decides the event (`machines.facts.admit_facts`)."""
        decision = self._fold.decider(event, self.machine, now)()
        self._fold.fold(event, decision)
        self._lineage.setdefault(event.operation_id, event.lineage)
        return decision

    def advance(self, now: datetime) -> list[Decision]:
        """Move the clock to `now`: fire every timer due by then, earliest first across
        operations (ties by id), each decided at its due time, including timers those
        decisions arm that fall due by `now`. Returns the decisions, in order."""
        decisions: list[Decision] = []
        for _ in range(MAX_FIRINGS):
            due = [
                (t.due_at, t.timer_id, op)
                for op, v in self.views.items()
                for t in due_timers(v, now)
            ]
            if not due:
                return decisions
            at, tid, op = min(due)
            view = self.views[op]
            timer = view.timer(tid)
            assert timer is not None  # due_timers found it armed
            event = timer_event(
                timer,
                operation_id=op,
                correlation_id=view.correlation_id or op,
                machine_name=self.machine.name,
                machine_version=self.machine.version,
                lineage=self._lineage.get(op) or Lineage(view.lineage.agent, op, op),
                producer=SIMULATED_CONTROLLER,
                at=at,
            )
            decisions.append(self.feed(event, at))
        raise SimulationError(f"more than {MAX_FIRINGS} timers fell due by {now.isoformat()}")
