"""Layer 3 of machine validation: JSON Schema errors as coded, located problems.

`jsonschema` reports what failed in schema terms (a `oneOf` with two branches, a
`required` list); an author needs one finding per defect, in document terms, with a hint.
`schema_problems` picks the `oneOf` branch the author meant, splits `required` and
`additionalProperties` errors per field, maps each to a `Code`, and attaches a hint for
the field. `machines.validation.check_document` runs it between the reserved-feature and
the structure layers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from machines.errors import Code

__all__ = [
    "RECOVERY_MACHINE_SCHEMA",
    "covered",
    "dotted_path",
    "machine_schema_validator",
    "schema_problems",
]

RECOVERY_MACHINE_SCHEMA = Path(__file__).resolve().parent / "recovery-machine.schema.json"
"""The JSON Schema of RECOVERY.yaml (SPEC §5), shipped with the machine format."""


@cache
def machine_schema_validator() -> Draft202012Validator:
    """The validator of machines/recovery-machine.schema.json (loaded once)."""
    schema = json.loads(RECOVERY_MACHINE_SCHEMA.read_text(encoding="utf-8"))
    return Draft202012Validator(schema)


def dotted_path(parts: Iterator[Any] | Any) -> str:
    """The dotted document path (`states.x.on.E[0].guard`) of a jsonschema path."""
    path = ""
    for part in parts:
        path = f"{path}[{part}]" if isinstance(part, int) else (f"{path}.{part}" if path else part)
    return str(path)


_SCHEMA_CODES = {
    "required": Code.SCHEMA_REQUIRED,
    "additionalProperties": Code.SCHEMA_UNKNOWN_FIELD,
    "type": Code.SCHEMA_TYPE,
    "pattern": Code.SCHEMA_PATTERN,
    "enum": Code.SCHEMA_ENUM,
    "const": Code.SCHEMA_ENUM,
}


def _branch_errors(context: list[ValidationError]) -> list[ValidationError]:
    """The errors of the oneOf branch the author meant: the first whose type fits.

    A branch that fails on the type of the instance itself (a mapping given where the
    other branch takes a list) is not what the author meant, so its errors are noise.
    """
    branches: dict[Any, list[ValidationError]] = {}
    for inner in context:
        branches.setdefault(inner.relative_schema_path[0], []).append(inner)
    for errors in branches.values():
        if not any(e.validator == "type" and not e.relative_path for e in errors):
            return errors
    return [best_match(context)]


def _schema_findings(error: ValidationError) -> Iterator[tuple[Code, str, str]]:
    """(code, path, message) for one jsonschema error, descending into oneOf branches."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        for inner in _branch_errors(error.context):
            yield from _schema_findings(inner)
        return
    path = dotted_path(error.absolute_path)
    code = _SCHEMA_CODES.get(str(error.validator), Code.SCHEMA_VIOLATION)
    instance = error.instance
    required = error.validator_value
    if error.validator == "required" and isinstance(instance, dict) and isinstance(required, list):
        missing = [f for f in required if f not in instance]
        for name in missing:
            yield (
                code,
                dotted_path([*error.absolute_path, name]),
                f"required field {name!r} missing",
            )
        return
    schema = error.schema
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = schema.get("properties", {}) if isinstance(schema, Mapping) else {}
        for key in error.instance:
            if key not in allowed:
                yield (
                    code,
                    dotted_path([*error.absolute_path, key]),
                    f"unknown field {key!r}; allowed: {', '.join(sorted(allowed))}",
                )
        return
    if "propertyNames" in error.absolute_schema_path:
        yield (
            code,
            dotted_path([*error.absolute_path, str(error.instance)]),
            f"name {error.message}",
        )
        return
    yield code, path, error.message[:300]


_FIELD_HINTS = {
    "guard": "a transition has at most one guard: one registered guard id such as "
    "'evidence.not-applied'",
    "target": "name one state of this machine",
    "actions": "list registered capability ids, or {capability: <id>, params: {...}}",
    "entry": "list registered capability ids, or {capability: <id>, params: {...}}",
    "type": "a state's type is 'atomic' (the default) or 'final'",
    "version": "use a semantic version such as 1.0.0 (quoted if YAML would read a number)",
    "name": "use lowercase words joined by hyphens, e.g. procurement-request",
    "retention_days": "give a whole number of days between 1 and 3650",
    "capabilities": "list at least one governed tool capability id",
}


def _schema_hint(path: str) -> str:
    """A hint for a schema problem, specific to the field when one is known."""
    field = re.split(r"[.\[]", path)[-1] if path else ""
    if re.fullmatch(r"states\.[^.]+\.on\.[^.\[]+", path):
        return (
            "events are uppercase identifiers (TOOL_TIMEOUT) mapping to one transition or "
            "an ordered list of transitions"
        )
    if re.fullmatch(r"states\.[^.\[]+", path):
        return (
            "a state is a mapping with optional type, description, entry and on; its name is "
            "lowercase words joined by '-' or '_'"
        )
    hint = _FIELD_HINTS.get(field.rstrip("]"))
    return hint or "see machines/recovery-machine.schema.json and docs/machine-format.md"


def covered(path: str, reported: set[str]) -> bool:
    """Whether `path` is at, under or above a path already in `reported`: one defect is
    reported once, at the first layer that finds it."""
    return any(
        path == r or path.startswith((f"{r}.", f"{r}[")) or r.startswith((f"{path}.", f"{path}["))
        for r in reported
    )


def schema_problems(data: Any, reported: set[str]) -> Iterator[tuple[Code, str, str, str]]:
    """(code, path, message, hint) for every JSON Schema error of `data`, in path order,
    leaving out a path covered by `reported` (the paths earlier layers already reported)
    or by an earlier schema finding."""
    reported = set(reported)
    validator = machine_schema_validator()
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    for error in errors:
        for code, path, message in _schema_findings(error):
            if covered(path, reported):
                continue
            reported.add(path)
            yield code, path, message, _schema_hint(path)
