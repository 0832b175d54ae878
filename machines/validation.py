"""Validate a parsed RECOVERY.yaml document and build the frozen `Machine` from it.

The checks run in layers, and every layer reports all it finds:

1. version (SPEC §13): a 0.1 or unknown `spec_version` stops here, so a 0.1 plan is never
   interpreted as a 0.2 machine;
2. reserved features (compound and parallel states) and executable content (`content.py`);
3. the JSON Schema, with each error translated into a code and a location
   (`schema_problems.py`); an error at or under a path already reported by layer 2 is not
   repeated;
4. only on a schema-valid document: structure (initial, targets, final states, default
   transitions, reachability), registry resolution (guards, capabilities, static params) and
   the retry rule of CONFORMANCE L1.5.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from jsonschema import Draft202012Validator

from machines import content
from machines.errors import Code, Location, Problem, Severity
from machines.model import (
    SPEC_VERSION,
    ActionRef,
    AppliesTo,
    AuditSpec,
    CapabilityKind,
    Machine,
    Registry,
    State,
    Transition,
)
from machines.schema_problems import covered, dotted_path, schema_problems

DRAFT_0_1_VERSIONS = frozenset({"0.1", "agent-recovery/0.1", "agent-recovery/v0.1"})
_COMPOUND_KEYS = frozenset({"states", "initial", "parallel", "regions", "history", "children"})
_PATH_SPLIT = re.compile(r"[.\[]")

Lines = Mapping[str, int]


def locate(file: str, path: str, lines: Lines) -> Location:
    """A `Location` for a dotted document path: state, event, transition index and field
    are read from the path, the line from the parser's index of the nearest known path."""
    line = None
    probe = path
    while True:
        if probe in lines:
            line = lines[probe]
            break
        if not probe:
            break
        cut = max(probe.rfind("."), probe.rfind("["))
        probe = probe[: max(cut, 0)]
    state = event = field = None
    index: int | None = None
    if path.startswith("states."):
        rest = path[len("states.") :]
        state = _PATH_SPLIT.split(rest, maxsplit=1)[0]
        rest = rest[len(state) :]
        if rest.startswith(".on."):
            rest = rest[len(".on.") :]
            event = _PATH_SPLIT.split(rest, maxsplit=1)[0]
            rest = rest[len(event) :]
            match = re.match(r"^\[(\d+)\]", rest)
            if match:
                index = int(match.group(1))
                rest = rest[match.end() :]
            elif rest:
                index = 0  # the single-transition form is transition 0
        field = rest.lstrip(".") or None
    elif path:
        field = path
    return Location(
        file=file, path=path, state=state, event=event, transition=index, field=field, line=line
    )


class _Collector:
    """Accumulates problems for one document, with locations resolved from paths."""

    def __init__(self, file: str, lines: Lines) -> None:
        self.file = file
        self.lines = lines
        self.problems: list[Problem] = []

    def add(
        self,
        code: Code,
        path: str,
        message: str,
        hint: str = "",
        severity: Severity = Severity.ERROR,
    ) -> None:
        location = locate(self.file, path, self.lines)
        self.problems.append(Problem(code, message, location, hint, severity))

    @property
    def has_errors(self) -> bool:
        return any(p.severity is Severity.ERROR for p in self.problems)


def check_document(data: Any, file: str, lines: Lines, registry: Registry) -> list[Problem]:
    """Every problem (errors and warnings) of one parsed machine document."""
    out = _Collector(file, lines)
    if _check_version(data, out):
        return out.problems
    _check_reserved(data, out)
    for code, path, message, hint in content.scan(data):
        out.add(code, path, message, hint)
    _check_schema(data, out)
    # Structure and registry checks also run on a document with schema errors, over its
    # well-formed parts, so that the author sees every problem at once; a finding at or
    # around a path already reported is left out (one defect, one report).
    shaped = _well_formed(data)
    if shaped is None:
        return out.problems
    semantic = _Collector(file, lines)
    _check_structure(shaped, semantic)
    _check_producers(data, shaped, semantic)
    _check_registry(shaped, registry, semantic)
    reported = {p.location.path for p in out.problems if p.severity is Severity.ERROR}
    out.problems.extend(p for p in semantic.problems if not covered(p.location.path, reported))
    return out.problems


def _check_producers(data: dict[str, Any], shaped: dict[str, Any], out: _Collector) -> None:
    # Each event the `producers` block names must be one some state accepts: a role
    # rule for an event the machine never receives is a typo that guards nothing.
    declared = data.get("producers")
    if not isinstance(declared, dict):
        return
    accepted = {e for state in shaped["states"].values() for e in state.get("on", {})}
    for event in declared:
        if event not in accepted:
            out.add(
                Code.PRODUCERS_EVENT_UNKNOWN,
                f"producers.{event}",
                f"producers names event {event}, which no state accepts",
                f"name one of: {', '.join(sorted(accepted))}",
            )


def _is_action(raw: Any) -> bool:
    if isinstance(raw, str):
        return True
    return (
        isinstance(raw, dict)
        and isinstance(raw.get("capability"), str)
        and isinstance(raw.get("params", {}), dict)
    )


def _shaped_transition(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("target"), str):
        return None
    shaped: dict[str, Any] = {"target": raw["target"]}
    if "guard" in raw:
        if not isinstance(raw["guard"], str):
            return None
        shaped["guard"] = raw["guard"]
    actions = raw.get("actions", [])
    if isinstance(actions, list) and all(_is_action(a) for a in actions):
        shaped["actions"] = actions
    return shaped


def _shaped_state(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        return {}
    shaped: dict[str, Any] = {}
    if isinstance(raw.get("type"), str):
        shaped["type"] = raw["type"]
    entry = raw.get("entry")
    if isinstance(entry, list) and all(_is_action(a) for a in entry):
        shaped["entry"] = entry
    on = raw.get("on")
    if isinstance(on, dict):
        shaped["on"] = {}
        for event, spec in on.items():
            if isinstance(spec, list) and spec:
                items = [_shaped_transition(t) for t in spec]
                if all(items):
                    shaped["on"][event] = items
            elif (single := _shaped_transition(spec)) is not None:
                shaped["on"][event] = single
    return shaped


def _well_formed(data: dict[str, Any]) -> dict[str, Any] | None:
    """The parts of a document that have the schema's shape, paths unchanged (malformed
    events and action lists are dropped whole, so no list index shifts), or None when
    there are no states to check."""
    states = data.get("states")
    if not isinstance(states, dict) or not states:
        return None
    initial = data.get("initial")
    return {
        "initial": initial if isinstance(initial, str) else None,
        "states": {name: _shaped_state(state) for name, state in states.items()},
    }


def _check_version(data: Any, out: _Collector) -> bool:
    """Report a 0.1 or unknown spec_version; True when nothing else may be checked."""
    if not isinstance(data, dict):
        out.add(
            Code.SCHEMA_TYPE,
            "",
            f"a machine is a mapping, not {type(data).__name__}",
            "start from a catalogue machine",
        )
        return True
    version = data.get("spec_version")
    if isinstance(version, int | float) and not isinstance(version, bool):
        version = str(version)
    if isinstance(version, str) and version.strip().lower() in DRAFT_0_1_VERSIONS:
        out.add(
            Code.SPEC_VERSION_0_1,
            "spec_version",
            f"spec_version {version!r} is draft 0.1; it is refused, never read as 0.2",
            f"port the plan to {SPEC_VERSION} (see docs/machine-format.md) and re-validate",
        )
        return True
    if "spec_version" in data and version != SPEC_VERSION:
        out.add(
            Code.SPEC_VERSION_UNSUPPORTED,
            "spec_version",
            f"spec_version {str(version)[:40]!r} is not supported; this controller reads "
            f"{SPEC_VERSION}",
            f"set spec_version: {SPEC_VERSION} if the machine follows draft 0.2",
        )
        return True
    return False


def _check_reserved(data: dict[str, Any], out: _Collector) -> None:
    states = data.get("states")
    if not isinstance(states, dict):
        return
    for name, state in states.items():
        if not isinstance(state, dict):
            continue
        kind = state.get("type")
        if kind in ("parallel", "compound"):
            out.add(
                Code.STATE_COMPOUND_RESERVED,
                f"states.{name}.type",
                f"state {name!r} is {kind}; {kind} states are reserved for a future profile "
                "(SPEC §6.1, §14)",
                "use atomic states only in agent-recovery/0.2",
            )
        for key in sorted(_COMPOUND_KEYS & state.keys()):
            out.add(
                Code.STATE_COMPOUND_RESERVED,
                f"states.{name}.{key}",
                f"state {name!r} declares {key!r}: compound and parallel states are reserved "
                "for a future profile (SPEC §6.1, §14)",
                "flatten the nested states into atomic states of the machine",
            )


def _check_schema(data: Any, out: _Collector) -> None:
    reported = {p.location.path for p in out.problems}
    for code, path, message, hint in schema_problems(data, reported):
        out.add(code, path, message, hint)


def iter_transitions(data: Mapping[str, Any]) -> Iterator[tuple[str, str, int, str, Any]]:
    """(state, event, index, path, transition) of a schema-shaped document, in order."""
    for name, state in data["states"].items():
        for event, spec in (state.get("on") or {}).items():
            base = f"states.{name}.on.{event}"
            if isinstance(spec, dict):
                yield name, event, 0, base, spec
            else:
                for i, item in enumerate(spec):
                    yield name, event, i, f"{base}[{i}]", item


def _check_structure(data: dict[str, Any], out: _Collector) -> None:
    states: dict[str, Any] = data["states"]
    known = ", ".join(sorted(states))
    if data["initial"] is not None and data["initial"] not in states:
        out.add(
            Code.INITIAL_NOT_A_STATE,
            "initial",
            f"initial state {data['initial']!r} is not a state",
            f"name one of: {known}",
        )
    for state, event, index, path, spec in iter_transitions(data):
        if spec["target"] not in states:
            out.add(
                Code.TARGET_NOT_A_STATE,
                f"{path}.target",
                f"state {state!r}, event {event}, transition {index}: target "
                f"{spec['target']!r} is not a state",
                f"name one of: {known}",
            )
    _check_defaults(data, out)
    _check_finals(states, out)
    _check_reachable(data, out)


def _check_defaults(data: dict[str, Any], out: _Collector) -> None:
    for name, state in data["states"].items():
        for event, spec in (state.get("on") or {}).items():
            if not isinstance(spec, list):
                continue
            unguarded = [i for i, t in enumerate(spec) if "guard" not in t]
            # Two defaults is one defect (`multiple-unguarded`), even though the first of
            # them is then necessarily not last.
            for i in unguarded[1:]:
                out.add(
                    Code.MULTIPLE_UNGUARDED,
                    f"states.{name}.on.{event}[{i}]",
                    f"state {name!r}, event {event}: transition {i} is a second unguarded "
                    f"default (the first is transition {unguarded[0]})",
                    "keep one unguarded default, last; guard the others",
                )
            if len(unguarded) == 1 and unguarded[0] != len(spec) - 1:
                i = unguarded[0]
                out.add(
                    Code.UNGUARDED_NOT_LAST,
                    f"states.{name}.on.{event}[{i}]",
                    f"state {name!r}, event {event}: unguarded transition {i} is not last, "
                    "so the transitions after it can never be selected",
                    "move the unguarded default to the end of the list (SPEC §6.5)",
                )


def _check_finals(states: dict[str, Any], out: _Collector) -> None:
    finals = [n for n, s in states.items() if s.get("type") == "final"]
    if not finals:
        out.add(
            Code.NO_FINAL_STATE,
            "states",
            "the machine declares no final state",
            "add at least one state with type: final (CONFORMANCE L1.2)",
        )
    for name in finals:
        for key in ("on", "entry"):
            if states[name].get(key):
                out.add(
                    Code.FINAL_STATE_ACTS,
                    f"states.{name}.{key}",
                    f"final state {name!r} declares {key!r}; a final state accepts no events "
                    "and invokes nothing",
                    "move the actions to the transition into the final state, or make the "
                    "state non-final",
                )
    for name, state in states.items():
        if state.get("type") != "final" and not state.get("on"):
            out.add(
                Code.DEAD_END_STATE,
                f"states.{name}",
                f"state {name!r} is not final and accepts no events: an operation there is stuck",
                "add transitions (at least an escalation) or make it type: final",
                Severity.WARNING,
            )


def _check_reachable(data: dict[str, Any], out: _Collector) -> None:
    states = data["states"]
    if data["initial"] not in states:
        return
    seen = {data["initial"]}
    frontier = [data["initial"]]
    while frontier:
        current = frontier.pop()
        for spec in (states[current].get("on") or {}).values():
            for transition in spec if isinstance(spec, list) else [spec]:
                target = transition["target"]
                if target in states and target not in seen:
                    seen.add(target)
                    frontier.append(target)
    for name in states:
        if name not in seen:
            out.add(
                Code.UNREACHABLE_STATE,
                f"states.{name}",
                f"state {name!r} cannot be reached from initial state {data['initial']!r}",
                "remove it or add a transition into it",
                Severity.WARNING,
            )


def _action(raw: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, str):
        return raw, {}
    return raw["capability"], raw.get("params") or {}


def _check_registry(data: dict[str, Any], registry: Registry, out: _Collector) -> None:
    guards = ", ".join(sorted(registry.guards))
    for state, event, index, path, spec in iter_transitions(data):
        guard = spec.get("guard")
        if guard is not None and guard not in registry.guards:
            out.add(
                Code.GUARD_UNKNOWN,
                f"{path}.guard",
                f"state {state!r}, event {event}, transition {index}: guard {guard!r} is not "
                "in the administrator registry",
                f"use a registered guard: {guards}",
            )
        kinds = _check_actions(spec.get("actions") or [], f"{path}.actions", registry, out)
        # An unknown guard is already reported as `guard-unknown`; one defect, one code.
        if CapabilityKind.RETRY in kinds and (guard is None or guard in registry.guards):
            guard_spec = registry.guards.get(guard) if guard is not None else None
            if guard_spec is None or not guard_spec.requires_not_applied:
                out.add(
                    Code.RETRY_WITHOUT_NOT_APPLIED_GUARD,
                    f"{path}.guard" if guard else path,
                    f"state {state!r}, event {event}, transition {index} invokes a retry "
                    f"capability guarded by {guard or 'nothing'}, which does not require "
                    "authoritative not-applied evidence (CONFORMANCE L1.5)",
                    "guard the retry with a guard marked requires_not_applied (e.g. "
                    f"{_not_applied_guards(registry)})",
                )
    for name, state_spec in data["states"].items():
        path = f"states.{name}.entry"
        kinds = _check_actions(state_spec.get("entry") or [], path, registry, out)
        if CapabilityKind.RETRY in kinds:
            out.add(
                Code.RETRY_IN_ENTRY,
                path,
                f"state {name!r} invokes a retry capability on entry, where no guard applies "
                "(CONFORMANCE L1.5)",
                f"move the retry to a transition guarded by {_not_applied_guards(registry)}",
            )


def _not_applied_guards(registry: Registry) -> str:
    ids = sorted(g.id for g in registry.guards.values() if g.requires_not_applied)
    return " or ".join(ids) if ids else "a requires_not_applied guard (none registered)"


def _check_actions(
    actions: list[Any], base: str, registry: Registry, out: _Collector
) -> set[CapabilityKind]:
    kinds: set[CapabilityKind] = set()
    for i, raw in enumerate(actions):
        capability, params = _action(raw)
        spec = registry.capabilities.get(capability)
        path = f"{base}[{i}]"
        if spec is None:
            out.add(
                Code.ACTION_UNKNOWN,
                path if isinstance(raw, str) else f"{path}.capability",
                f"capability {capability!r} is not in the administrator registry",
                f"use a registered capability: {', '.join(sorted(registry.capabilities))}",
            )
            continue
        kinds.add(spec.kind)
        validator = Draft202012Validator(dict(spec.params_schema))
        for error in validator.iter_errors(params):
            where = dotted_path([*error.absolute_path]) if error.absolute_path else ""
            out.add(
                Code.ACTION_PARAMS_INVALID,
                f"{path}.params.{where}" if where else f"{path}.params",
                f"params of {capability!r}: {error.message[:200]}",
                "match the params schema the registry declares for this capability",
            )
    return kinds


def _refs(raw: list[Any] | None) -> tuple[ActionRef, ...]:
    refs = []
    for item in raw or []:
        capability, params = _action(item)
        refs.append(ActionRef(capability, MappingProxyType(copy.deepcopy(params))))
    return tuple(refs)


def build_machine(data: Mapping[str, Any], digest: str) -> Machine:
    """The frozen `Machine` of a document that `check_document` found free of errors."""
    states: dict[str, State] = {}
    on: dict[str, dict[str, list[Transition]]] = {name: {} for name in data["states"]}
    for state, event, index, _, spec in iter_transitions(data):
        on[state].setdefault(event, []).append(
            Transition(
                source=state,
                event=event,
                index=index,
                target=spec["target"],
                guard=spec.get("guard"),
                actions=_refs(spec.get("actions")),
            )
        )
    for name, spec in data["states"].items():
        states[name] = State(
            name=name,
            final=spec.get("type") == "final",
            entry=_refs(spec.get("entry")),
            on=MappingProxyType({e: tuple(ts) for e, ts in on[name].items()}),
            description=str(spec.get("description") or ""),
        )
    applies = data["applies_to"]
    audit = data["audit"]
    return Machine(
        name=data["name"],
        description=data["description"],
        version=data["version"],
        spec_version=data["spec_version"],
        applies_to=AppliesTo(
            capabilities=tuple(applies["capabilities"]),
            tools=tuple(applies.get("tools", ())),
            agents=tuple(applies.get("agents", ())),
            environments=tuple(applies.get("environments", ())),
        ),
        initial=data["initial"],
        states=MappingProxyType(states),
        audit=AuditSpec(
            retention_days=audit["retention_days"],
            record=tuple(audit.get("record", ())),
            redact=tuple(audit.get("redact", ())),
        ),
        digest=digest,
        producers=MappingProxyType(
            {e: tuple(roles) for e, roles in data.get("producers", {}).items()}
        ),
    )
