"""Acting on `applies_to`: which machine governs an operation (SPEC §8 step 2). What the
audit trail keeps of an event (`audit.redact`, `audit.record`) is `machines.minimization`.

Matching rule (docs/machine-format.md): an operation matches a machine when its
capability is listed in `applies_to.capabilities` and, for each of `tools`, `agents`,
`environments` that is non-empty, the operation's value is listed. Selection is strict:
no match and more than one match are both refusals, never a guess.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import combinations

from machines.errors import Code, Location, MachineError, Problem, Severity
from machines.event import Event, Scope
from machines.model import AppliesTo, Machine

SCOPE_MISSING = "scope-missing"
MACHINE_NOT_APPLICABLE = "machine-not-applicable"


class MachineSelectionError(MachineError):
    """No pinned machine, or more than one, governs this operation."""


@dataclass(frozen=True, slots=True)
class OperationScope:
    """What the controller knows about an operation when choosing its machine."""

    capability: str
    tool: str | None = None
    agent: str | None = None
    environment: str | None = None


def _dimension(allowed: tuple[str, ...], value: str | None) -> bool:
    # An empty list means "any"; a non-empty list needs a known, listed value.
    return not allowed or (value is not None and value in allowed)


def applies(applies_to: AppliesTo, scope: OperationScope) -> bool:
    """True when a machine with this `applies_to` governs the operation `scope`."""
    return (
        scope.capability in applies_to.capabilities
        and _dimension(applies_to.tools, scope.tool)
        and _dimension(applies_to.agents, scope.agent)
        and _dimension(applies_to.environments, scope.environment)
    )


def scope_refusal(machine: Machine, event: Event, *, opening: bool) -> tuple[str, str] | None:
    """Why `machine` may not govern the operation `event` is about, as `(code, reason)`,
    or None (SPEC §8 step 2: applies_to is matched for every operation). The event that
    opens an operation must carry its `scope` (capability, tool, environment), since
    without it nothing can be matched (`scope-missing`); a scope that is present, on any
    event, must match the machine's `applies_to` with `lineage.agent` as the agent
    (`machine-not-applicable`). Later events may leave the scope out: the operation was
    matched when it opened."""
    where = f"event {event.event_id} (operation {event.operation_id})"
    scope = event.scope
    if scope is None:
        if not opening:
            return None
        return SCOPE_MISSING, (
            f"{where} opens the operation without a scope block; applies_to of "
            f"{machine.name}@{machine.version} is matched for every operation, so send "
            "the capability, tool and environment on the opening event"
        )
    operation = OperationScope(
        capability=scope.capability,
        tool=scope.tool,
        agent=event.lineage.agent,
        environment=scope.environment,
    )
    if applies(machine.applies_to, operation):
        return None
    allowed = machine.applies_to
    return MACHINE_NOT_APPLICABLE, (
        f"{where}: machine {machine.name}@{machine.version} does not apply to capability "
        f"{scope.capability}, tool {scope.tool}, agent {event.lineage.agent}, environment "
        f"{scope.environment} (it applies to capabilities {_listed(allowed.capabilities)}, "
        f"tools {_listed(allowed.tools)}, agents {_listed(allowed.agents)}, environments "
        f"{_listed(allowed.environments)}); send the event for the machine that governs "
        "this operation, or correct the scope"
    )


def matching_scope(applies_to: AppliesTo) -> Scope:
    """A scope `applies_to` admits: its first capability, tool and environment (None
    where it admits any). For examples, demos and tests that stand for a tool."""
    return Scope(
        capability=applies_to.capabilities[0],
        tool=applies_to.tools[0] if applies_to.tools else None,
        environment=applies_to.environments[0] if applies_to.environments else None,
    )


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(values) if values else "any"


def select_machine(machines: Iterable[Machine], scope: OperationScope) -> Machine:
    """The one machine that governs `scope`; raises `MachineSelectionError` otherwise."""
    pool = list(machines)
    found = [m for m in pool if applies(m.applies_to, scope)]
    if len(found) == 1:
        return found[0]
    what = (
        f"capability {scope.capability}, tool {scope.tool}, agent {scope.agent}, "
        f"environment {scope.environment}"
    )
    if not found:
        problem = Problem(
            Code.NO_MACHINE_APPLIES,
            f"no pinned machine applies to {what} (checked {len(pool)})",
            Location(),
            "pin a machine whose applies_to covers this operation, or refuse the operation",
        )
    else:
        names = ", ".join(f"{m.name}@{m.version}" for m in found)
        problem = Problem(
            Code.APPLIES_TO_OVERLAP,
            f"machines {names} all apply to {what}",
            Location(),
            "narrow applies_to so that exactly one pinned machine governs each operation",
        )
    raise MachineSelectionError([problem])


def _meet(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    return not a or not b or bool(set(a) & set(b))


def overlaps(a: AppliesTo, b: AppliesTo) -> bool:
    """True when some operation would match both `a` and `b`."""
    return (
        bool(set(a.capabilities) & set(b.capabilities))
        and _meet(a.tools, b.tools)
        and _meet(a.agents, b.agents)
        and _meet(a.environments, b.environments)
    )


def overlapping_pairs(machines: Iterable[Machine]) -> list[tuple[Machine, Machine]]:
    """Every pair of machines that could both match one operation."""
    return [(a, b) for a, b in combinations(machines, 2) if overlaps(a.applies_to, b.applies_to)]


def overlap_warning(machine: Machine, other: Machine, file: str = "") -> Problem:
    """The warning attached to `machine` because `other` could govern the same operations."""
    return Problem(
        Code.APPLIES_TO_OVERLAP,
        f"machine {machine.name}@{machine.version} and {other.name}@{other.version} could "
        "both govern one operation; the controller would refuse such an operation",
        Location(file=file, path="applies_to"),
        "narrow applies_to (tools, agents, environments) so the machines are disjoint",
        Severity.WARNING,
    )
