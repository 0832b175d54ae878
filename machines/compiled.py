"""A machine precompiled for the decision core: guards resolved, actions planned.

Resolving a guard id through the registry to an implementation, and concatenating a
transition's actions with its target's entry actions, gives the same answer for every
event, so it is done once per (machine, registry, guard table) and cached. Resolution
failures are not raised here: a guard that cannot be resolved stays in the plan as one
that evaluates false with a controller error, which is what SPEC §6.3 requires at
decision time (the loader should already have refused such a machine).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from machines.guards import GuardContext, GuardFn, GuardResult
from machines.model import ActionRef, Machine, Registry, Transition

# Guards whose truth rests on an approval; the decision records which approval it used.
APPROVAL_IMPLEMENTATIONS = frozenset({"standard.approval_granted", "standard.resume_permitted"})


@dataclass(frozen=True, slots=True)
class GuardEvaluation:
    """One guard evaluated for one candidate transition, with what it read."""

    transition_index: int
    guard: str
    implementation: str | None
    value: bool
    evidence: tuple[str, ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form."""
        return {
            "transition_index": self.transition_index,
            "guard": self.guard,
            "implementation": self.implementation,
            "value": self.value,
            "evidence": list(self.evidence),
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class CompiledTransition:
    """A transition with its guard resolved and its invocation plan fixed."""

    transition: Transition
    implementation: str | None
    guard_fn: GuardFn | None
    resolve_error: str | None
    planned: tuple[tuple[str, ActionRef], ...]
    uses_approval: bool

    def evaluate(self, ctx: GuardContext) -> GuardEvaluation:
        """Evaluate the guard; unresolved, raising or ill-typed guards are false with an
        error code (SPEC §6.3: they never broaden authority or make a retry safe)."""
        guard = self.transition.guard or ""
        index = self.transition.index
        if self.guard_fn is None:
            return GuardEvaluation(index, guard, self.implementation, False, (), self.resolve_error)
        try:
            result = self.guard_fn(ctx)
        except Exception as exc:  # a guard bug must fail closed, not stop the controller
            error = f"guard-failed: {type(exc).__name__}: {exc}"
            return GuardEvaluation(index, guard, self.implementation, False, (), error)
        if not isinstance(result, GuardResult) or not isinstance(result.value, bool):
            error = "guard-failed: implementation did not return a boolean GuardResult"
            return GuardEvaluation(index, guard, self.implementation, False, (), error)
        return GuardEvaluation(index, guard, self.implementation, result.value, result.evidence)


Plan = Mapping[tuple[str, str], tuple[CompiledTransition, ...]]

_CACHE: dict[tuple[str, int, int], tuple[Machine, Registry, Mapping[str, GuardFn], Plan]] = {}


def compile_machine(machine: Machine, registry: Registry, guards: Mapping[str, GuardFn]) -> Plan:
    """The plan for `machine`: (state, event) -> ordered compiled transitions. Final
    states have no entries. Cached by identity of the three inputs."""
    key = (machine.digest, id(registry), id(guards))
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is machine and hit[1] is registry and hit[2] is guards:
        return hit[3]
    plan = _build(machine, registry, guards)
    if len(_CACHE) > 128:
        _CACHE.clear()
    _CACHE[key] = (machine, registry, guards, plan)
    return plan


def _build(machine: Machine, registry: Registry, guards: Mapping[str, GuardFn]) -> Plan:
    plan: dict[tuple[str, str], tuple[CompiledTransition, ...]] = {}
    for state in machine.states.values():
        if state.final:
            continue
        for event, transitions in state.on.items():
            plan[(state.name, event)] = tuple(
                _compile(t, machine, registry, guards) for t in transitions
            )
    return plan


def _compile(
    transition: Transition, machine: Machine, registry: Registry, guards: Mapping[str, GuardFn]
) -> CompiledTransition:
    implementation: str | None = None
    fn: GuardFn | None = None
    error: str | None = None
    if transition.guard is not None:
        spec = registry.guards.get(transition.guard)
        if spec is None:
            error = f"guard-unknown: {transition.guard} is not in the administrator registry"
        else:
            implementation = spec.implementation
            fn = guards.get(implementation)
            if fn is None:
                error = f"guard-unavailable: implementation {implementation} is not provided"
    target = machine.states.get(transition.target)
    entry = target.entry if target is not None else ()
    # A transition enters its target (SCXML external semantics, self-transitions
    # included), so the target's entry actions follow the transition's own actions.
    planned = tuple(("transition", a) for a in transition.actions) + tuple(
        ("entry", a) for a in entry
    )
    return CompiledTransition(
        transition=transition,
        implementation=implementation,
        guard_fn=fn,
        resolve_error=error,
        planned=planned,
        uses_approval=implementation in APPROVAL_IMPLEMENTATIONS,
    )
