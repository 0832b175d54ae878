"""Roster files as operators keep them: read, changed one entry at a time, written back.

A roster file is the `producers:`-only document the controller adds to its policy
(`RECOVERY_CONTROLLER_ROSTER_PATH`) and workers, tools and auditors verify records with
(`RECOVERY_ROSTER_FILE`): JSON when its name ends in `.json` (the local stack's
`keys/roster.json`), YAML otherwise. `recoveryctl keys generate --role` and `recoveryctl
roster add|remove|revoke` write it; a policy file is never rewritten (its comments
would be lost): they refuse it and print the entry to paste instead.

Changes are pure functions over `machines.Roster` (`with_producer`, `without_producer`,
`with_revoked_key`), so the file is validated as the controller will load it before it
is written, and written whole, atomically (a temporary file renamed over it).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from machines import (
    ANY,
    Grant,
    PolicyError,
    ProducerEntry,
    ProducerKey,
    Role,
    Roster,
    load_roster,
)
from ops.errors import UsageError

__all__ = [
    "SCOPE_OPTIONS",
    "entry_document",
    "grants_for",
    "new_entry",
    "read_roster_file",
    "with_producer",
    "with_revoked_key",
    "without_producer",
    "write_roster_file",
]

# The scope a grant names, per role (machines.roster): what `--capability`, `--tool`,
# `--environment` and `--agent` fill in. A role not listed takes none.
_SCOPES: Final[dict[Role, tuple[str, ...]]] = {
    Role.TOOL: ("capabilities", "tools", "environments", "agents"),
    Role.VERIFIER: ("capabilities",),
    Role.WORKER: ("capabilities",),
    Role.VALIDATOR: ("agents",),
    Role.ORCHESTRATOR: ("agents",),
    Role.CONTROLLER: ("capabilities",),
}
# Grant field -> the command-line option that fills it.
SCOPE_OPTIONS: Final = {
    "capabilities": "--capability",
    "tools": "--tool",
    "environments": "--environment",
    "agents": "--agent",
}


def grants_for(roles: Sequence[Role], scope: dict[str, Sequence[str]]) -> tuple[Grant, ...]:
    """One grant per role, each with the scope fields its role takes from `scope`
    (`capabilities`, `tools`, `environments`, `agents`). Raises `UsageError` for a tool
    grant that names no agent (the controller would refuse every opening as
    `agent-unproven`, unless call contexts prove the agent) or names any (`"*"`, which
    the controller refuses outside demo mode), and for a scope the roles do not take."""
    unused = {name for name, values in scope.items() if values} - {
        field for role in roles for field in _SCOPES.get(role, ())
    }
    if unused:
        raise UsageError(
            f"{', '.join(SCOPE_OPTIONS[n] for n in sorted(unused))} given, but role(s) "
            f"{', '.join(roles)} take none (scopes per role: docs/operations.md, Producer roster)"
        )
    if ANY in scope.get("agents", ()):
        raise UsageError(
            '--agent "*" lets the producer name any agent as the one a containment stops; '
            "the controller refuses it outside demo mode: name the agents"
        )
    return tuple(
        Grant(role=role, **{field: tuple(scope.get(field, ())) for field in _SCOPES.get(role, ())})
        for role in roles
    )


def entry_document(entry: ProducerEntry) -> dict[str, Any]:
    """`entry` as it is written in a roster (empty lists and defaults left out)."""
    document: dict[str, Any] = entry.model_dump(mode="json", exclude_defaults=True)
    document["keys"] = [k.model_dump(mode="json", exclude_defaults=True) for k in entry.keys]
    return document


def read_roster_file(path: Path) -> Roster:
    """The roster in `path`, or an empty one when the file does not exist yet. Raises
    `UsageError` for a policy file or one that does not load."""
    if not path.exists():
        return Roster()
    _refuse_policy(path)
    try:
        return load_roster(path)
    except (OSError, PolicyError) as exc:
        raise UsageError(f"roster {path} does not load: {exc}") from exc


def write_roster_file(path: Path, roster: Roster) -> None:
    """Write `roster` to `path` whole, atomically (JSON for `.json`, else YAML)."""
    _refuse_policy(path)
    document = {"producers": [entry_document(p) for p in roster.producers]}
    if path.suffix == ".json":
        text = json.dumps(document, indent=2) + "\n"
    else:
        text = yaml.safe_dump(document, sort_keys=False, default_flow_style=None)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(scratch, 0o644)  # public keys and grants: readable, as the policy is
        os.replace(scratch, path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise


def _refuse_policy(path: Path) -> None:
    if not path.is_file():
        return
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return  # load_roster names the problem
    if isinstance(data, dict) and "id" in data:
        raise UsageError(
            f"{path} is a policy file; it is never rewritten (its comments would be lost): "
            "keep producers in a roster file of their own (RECOVERY_CONTROLLER_ROSTER_PATH), "
            "or paste the entry `recoveryctl roster add --print` shows under its producers:"
        )


def with_producer(roster: Roster, entry: ProducerEntry) -> Roster:
    """`roster` with `entry` added; a producer of the same id keeps its entry and gains
    the keys (by key id) and grants it did not have."""
    found = roster.producer(entry.id)
    if found is None:
        return Roster(producers=(*roster.producers, entry))
    keys = _merged(found.keys, entry.keys, lambda k: k.key_id)
    grants = _merged(found.grants, entry.grants, lambda g: g)
    merged = found.model_copy(update={"keys": keys, "grants": grants})
    return Roster(producers=tuple(merged if p.id == entry.id else p for p in roster.producers))


def without_producer(roster: Roster, producer: str) -> Roster:
    """`roster` without `producer`; raises `UsageError` when it is not listed."""
    if roster.producer(producer) is None:
        raise UsageError(f"producer {producer} is not in the roster")
    return Roster(producers=tuple(p for p in roster.producers if p.id != producer))


def with_revoked_key(roster: Roster, producer: str, key_id: str) -> Roster:
    """`roster` with key `key_id` of `producer` marked revoked (records signed with it
    are refused as `key-revoked` from the controller's next start)."""
    found = roster.producer(producer)
    if found is None or found.key(key_id) is None:
        listed = "" if found is None else ", ".join(k.key_id for k in found.keys)
        raise UsageError(
            f"producer {producer} has no key {key_id} in the roster"
            + (f" (listed: {listed})" if listed else "")
        )
    keys = tuple(
        k.model_copy(update={"revoked": True}) if k.key_id == key_id else k for k in found.keys
    )
    changed = found.model_copy(update={"keys": keys})
    return Roster(producers=tuple(changed if p.id == producer else p for p in roster.producers))


def new_entry(producer: str, public_key: str, grants: Iterable[Grant]) -> ProducerEntry:
    """The roster entry of `producer` holding `public_key` (base64) and `grants`; raises
    `pydantic.ValidationError` for a value that is no Ed25519 public key."""
    return ProducerEntry(
        id=producer, keys=(ProducerKey(public_key=public_key),), grants=tuple(grants)
    )


def _merged(old: Sequence[Any], new: Sequence[Any], key: Any) -> tuple[Any, ...]:
    seen = {key(item) for item in old}
    return (*old, *(item for item in new if key(item) not in seen))
