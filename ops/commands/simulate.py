"""`recoveryctl simulate PATH --events FILE`: decide a JSON-lines event file offline.

Each line of FILE is one event envelope (the fields of `machines.event.Event`), an
operation declaration `{"operation": {...}}` giving an operation's affected agent,
lineage and declared tool facts before its first event, or a clock move:
`{"advance": "10m"}` (from the latest time so far) or `{"advance_to": "<ISO time>"}`.
Events are decided in file order by `machines.Simulation`, the fold the controller runs
over each batch, at their own `event_time`, and one decision record is printed per line
as JSON. Time only moves forward: before each event, and at each clock move, every timer
due by then fires as the controller fires it (`machines.timers`), and its decision is
printed too. A line that is not a valid event is reported on stderr as a dead-letter and
skipped; the exit code is then 1.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from machines import (
    DEFAULT_REGISTRY,
    EventError,
    MachineError,
    OperationSetup,
    Policy,
    PolicyError,
    Simulation,
    SimulationError,
    ToolFacts,
    check_policy_against_machines,
    check_policy_against_registry,
    load_machine,
    load_policy,
    load_registry,
    parse_duration,
    parse_event,
)
from ops.context import Context, register_command
from ops.errors import UsageError

__all__ = ["register"]


class _Facts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    idempotency_key: str | None = None
    side_effect_possible: bool = True
    side_effect_confirmed: bool = False
    compensation_supported: bool = False
    status_api: bool = False


class _Operation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    agent: str
    lineage_agents: list[str] = []
    facts: _Facts = _Facts()
    budget: int | None = None
    deadline: datetime | None = None
    state: str | None = None
    start: datetime


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `simulate` subcommand."""
    parser = subparsers.add_parser(
        "simulate",
        help="decide a JSON-lines event file against a machine; one decision per line",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", type=Path, metavar="PATH", help="machine package or RECOVERY.yaml")
    parser.add_argument("--events", type=Path, required=True, metavar="FILE")
    parser.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="operator policy file (default: a strict policy trusting no verifier)",
    )
    parser.add_argument("--registry", type=Path, default=DEFAULT_REGISTRY)
    register_command(parser, _run)


def _run(ctx: Context) -> int:
    args = ctx.args
    try:
        registry = load_registry(args.registry)
        machine = load_machine(args.path, registry)
        policy = load_policy(args.policy) if args.policy else Policy(id="simulate-default")
        check_policy_against_registry(policy, registry)
        check_policy_against_machines(policy, (machine,), registry)
        lines = args.events.read_text(encoding="utf-8").splitlines()
    except (MachineError, PolicyError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    sim = Simulation(machine, registry, policy)
    clock = _Clock()
    failed = False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            _feed(ctx, sim, json.loads(line), clock)
        except (ValueError, EventError, SimulationError, ValidationError) as exc:
            failed = True
            print(f"{args.events}:{number}: dead-letter: {exc}", file=ctx.err)
    return 1 if failed else 0


class _Clock:
    """The simulation's clock: the latest time an event or a clock move brought."""

    def __init__(self) -> None:
        self.now: datetime | None = None

    def move(self, ctx: Context, sim: Simulation, to: datetime) -> None:
        """Move to `to` (never back) and print the decisions of the timers due by then."""
        if self.now is not None and to <= self.now:
            return
        self.now = to
        for decision in sim.advance(to):
            print(json.dumps(decision.to_dict(), sort_keys=True), file=ctx.out, flush=True)


def _feed(ctx: Context, sim: Simulation, data: Any, clock: _Clock) -> None:
    if not isinstance(data, dict):
        raise ValueError("each line must be a JSON object")
    if "advance" in data or "advance_to" in data:
        if "advance_to" in data:
            to = datetime.fromisoformat(str(data["advance_to"]))
        elif clock.now is None:
            raise ValueError("advance: no time yet to advance from; use advance_to")
        else:
            to = clock.now + timedelta(seconds=parse_duration(data["advance"]))
        if to.tzinfo is None:
            raise ValueError("advance_to must carry a timezone")
        clock.move(ctx, sim, to)
        return
    if "operation" in data:
        op = _Operation.model_validate(data["operation"])
        setup = OperationSetup(
            operation_id=op.id,
            agent=op.agent,
            lineage_agents=frozenset(op.lineage_agents),
            facts=ToolFacts(**op.facts.model_dump()),
            budget=op.budget,
            deadline=op.deadline,
            state=op.state,
        )
        sim.open(setup, op.start)
        return
    event = parse_event(data)
    clock.move(ctx, sim, event.event_time)
    decision = sim.feed(event, event.event_time)
    print(json.dumps(decision.to_dict(), sort_keys=True), file=ctx.out, flush=True)
