"""Second versions of catalogue machines, for rollout and migration tests.

The catalogue is signed by a publisher whose private key is not in the repository, so a
test that pins two versions of a machine copies the packages it needs, edits them,
signs them with a publisher key of its own and writes a lock and a trust file naming
that key: `signed_lock`. `versioned` builds such a version in memory, for unit tests
that never look at signatures.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import CATALOGUE, DEFAULT_REGISTRY, Machine, Problem, load_registry
from machines.loader import validate_text
from machines.provenance import LockFile, dump_model, lock_entry, public_key_text, sign_machine
from machines.yamlsafe import parse_yaml

PUBLISHER = "rollout-tests"

Edit = Callable[[dict[str, Any]], None]


def review_renamed(data: dict[str, Any]) -> None:
    """An `Edit` of email-send: version 2 calls `unresolved` `awaiting-review` (a
    migration maps one to the other), and adds a `triage` state, entered on
    TOOL_FAILED, whose entry escalates (which no state of version 1 ran)."""
    states = data["states"]
    states["awaiting-review"] = states.pop("unresolved")
    for state in states.values():
        for routes in (state.get("on") or {}).values():
            for route in routes if isinstance(routes, list) else [routes]:
                if route.get("target") == "unresolved":
                    route["target"] = "awaiting-review"
    states["triage"] = {
        "description": "Escalated on entry.",
        "entry": [{"capability": "human.escalate", "params": {"queue": "q", "severity": "low"}}],
        "on": dict(states["awaiting-review"]["on"]),
    }
    states["failure-reported"]["on"]["TOOL_FAILED"]["target"] = "triage"


def machine_document(name: str, version: str, edit: Edit | None = None) -> dict[str, Any]:
    """The catalogue machine `name` as data, at `version`, changed by `edit`."""
    raw = (CATALOGUE / name / "RECOVERY.yaml").read_bytes()
    document = parse_yaml(raw, name)
    assert not isinstance(document, Problem), document
    data: dict[str, Any] = json.loads(json.dumps(document.data))
    data["version"] = version
    if edit is not None:
        edit(data)
    return data


def machine_text(name: str, version: str, edit: Edit | None = None) -> str:
    """`machine_document` as RECOVERY.yaml text (JSON, which is YAML; PyYAML would read
    a state's `on:` as a boolean)."""
    return json.dumps(machine_document(name, version, edit), indent=2) + "\n"


def versioned(name: str, version: str, edit: Edit | None = None) -> Machine:
    """The catalogue machine `name` at `version` (changed by `edit`), validated."""
    text = machine_text(name, version, edit)
    report = validate_text(text, load_registry(DEFAULT_REGISTRY), f"{name}@{version}")
    assert report.machine is not None, [p.as_dict() for p in report.errors]
    return report.machine


@dataclass(frozen=True)
class SignedLock:
    """A lock and trust file pinning test-signed packages, and the key that signed them."""

    lock: Path
    trust: Path
    key: Ed25519PrivateKey
    folder: Path

    def write(self, versions: Sequence[tuple[str, str]], current: Mapping[str, str]) -> None:
        """Rewrite the lock to pin exactly `versions` ((name, version) pairs already
        packaged under `folder`), with `current`."""
        registry = load_registry(DEFAULT_REGISTRY)
        entries = {}
        for name, version in versions:
            package = self.folder / f"{name}-{version}"
            report = validate_text((package / "RECOVERY.yaml").read_bytes(), registry)
            assert report.machine is not None
            entries[f"{name}@{version}"] = lock_entry(
                report.machine, PUBLISHER, package, self.lock.parent
            )
        lock = LockFile(lock_version=1, machines=entries, current=dict(current))
        tmp = self.lock.with_name(self.lock.name + ".tmp")
        tmp.write_text(dump_model(lock), encoding="utf-8")
        tmp.replace(self.lock)


def package(
    folder: Path, key: Ed25519PrivateKey, name: str, version: str, edit: Edit | None
) -> Path:
    """Write the package `name-version` under `folder`, signed with `key`."""
    target = folder / f"{name}-{version}"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(CATALOGUE / name, target)
    (target / "RECOVERY.sig").unlink(missing_ok=True)
    text = machine_text(name, version, edit)
    (target / "RECOVERY.yaml").write_text(text, encoding="utf-8")
    registry = load_registry(DEFAULT_REGISTRY)
    report = validate_text(text, registry, str(target / "RECOVERY.yaml"))
    assert report.machine is not None, [p.as_dict() for p in report.errors]
    signature = sign_machine(report.machine, PUBLISHER, key)
    (target / "RECOVERY.sig").write_text(dump_model(signature), encoding="utf-8")
    return target


def signed_lock(
    folder: Path,
    versions: Sequence[tuple[str, str, Edit | None]],
    current: Mapping[str, str] | None = None,
) -> SignedLock:
    """Package, sign and pin each (name, version, edit) under `folder`; the lock marks
    `current` (default: the first version of each name)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    for name, version, edit in versions:
        package(folder, key, name, version, edit)
    trust = folder / "trusted-publishers.yaml"
    trust.write_text(
        yaml.safe_dump({"publishers": {PUBLISHER: {"keys": [public_key_text(key.public_key())]}}}),
        encoding="utf-8",
    )
    signed = SignedLock(folder / "machines.lock", trust, key, folder)
    first: dict[str, str] = {}
    for name, version, _ in versions:
        first.setdefault(name, version)
    signed.write([(n, v) for n, v, _ in versions], current if current is not None else first)
    return signed
