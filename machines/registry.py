"""Load the administrator registry: the only guard and capability ids a machine may name.

The registry is operator configuration (SPEC §3 "administrator-approved capability",
CONFORMANCE L3.3), never part of a machine package: a machine names ids, the registry says
which guard implementation an id resolves to and what kind of capability an action is
(the core's invariants key on the kind, e.g. retry or stop). It is read with the same
plain-data YAML reader as machines and validated against `machines/registry.schema.json`.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from machines.errors import Code, Location, Problem, RegistryInvalid
from machines.model import CapabilityKind, CapabilitySpec, GuardSpec, Registry
from machines.yamlsafe import parse_yaml, read_bytes

DEFAULT_REGISTRY = Path(__file__).resolve().parent / "registry.yaml"
"""The registry shipped with the catalogue; operators normally supply their own."""

REGISTRY_SCHEMA = Path(__file__).resolve().parent / "registry.schema.json"
"""The JSON Schema every administrator registry is validated against."""


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(json.loads(REGISTRY_SCHEMA.read_text(encoding="utf-8")))


def _path_of(parts: Any) -> str:
    return ".".join(str(p) for p in parts)


def parse_registry(raw: bytes | str, file: str = "<registry>") -> Registry:
    """Build a `Registry` from YAML text, or raise `RegistryInvalid` listing every problem."""
    document = parse_yaml(raw, file)
    if isinstance(document, Problem):
        raise RegistryInvalid([document])
    data = document.data
    problems = [
        Problem(
            Code.REGISTRY_INVALID,
            error.message[:300],
            Location(
                file=file,
                path=_path_of(error.absolute_path),
                line=document.lines.get(_path_of(error.absolute_path)),
            ),
            "see machines/registry.schema.json",
        )
        for error in _validator().iter_errors(data)
    ]
    if problems:
        raise RegistryInvalid(problems)
    for cap_id, spec in data["capabilities"].items():
        try:
            Draft202012Validator.check_schema(spec["params_schema"])
        except SchemaError as exc:
            path = f"capabilities.{cap_id}.params_schema"
            problems.append(
                Problem(
                    Code.REGISTRY_INVALID,
                    f"params_schema of capability {cap_id!r} is not a JSON Schema: "
                    f"{exc.message[:200]}",
                    Location(file=file, path=path, line=document.lines.get(path)),
                    "write a JSON Schema (draft 2020-12) for the capability's static params",
                )
            )
    if problems:
        raise RegistryInvalid(problems)
    return _build(data)


def _build(data: dict[str, Any]) -> Registry:
    guards = {
        guard_id: GuardSpec(
            id=guard_id,
            implementation=spec["implementation"],
            description=spec.get("description", ""),
            requires_not_applied=spec.get("requires_not_applied", False),
        )
        for guard_id, spec in data["guards"].items()
    }
    capabilities = {
        cap_id: CapabilitySpec(
            id=cap_id,
            kind=CapabilityKind(spec["kind"]),
            material=spec["material"],
            params_schema=MappingProxyType(spec["params_schema"]),
            description=spec.get("description", ""),
        )
        for cap_id, spec in data["capabilities"].items()
    }
    return Registry(guards=MappingProxyType(guards), capabilities=MappingProxyType(capabilities))


def load_registry(path: str | Path = DEFAULT_REGISTRY) -> Registry:
    """Read and validate the administrator registry at `path` (default: the shipped one).

    Raises `RegistryInvalid` with every problem found; never anything else.
    """
    path = Path(path)
    raw = read_bytes(path, str(path))
    if isinstance(raw, Problem):
        raise RegistryInvalid([raw])
    return parse_registry(raw, str(path))
