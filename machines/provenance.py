"""Pinning and provenance of machines: the lock file and Ed25519 publisher signatures.

SPEC §8.1 step 1 and §12, CONFORMANCE L3.1: the controller loads only a machine whose
`name@version` is pinned in the operator's lock file to the machine's canonical digest and
a publisher, and whose publisher signature verifies under a key the operator trusts.

- Lock file (`machines.lock`, JSON): `{"lock_version": 1, "machines": {"name@version":
  {"name", "version", "digest", "publisher", "path"}}, "current": {"name": "version"}}`;
  `path` is relative to the lock. A lock may pin several versions of a machine (a
  rollout); `current` then names the version new operations open on (`machines.Pins`).
- Signature (`RECOVERY.sig` beside RECOVERY.yaml, JSON): `{"signature_version": 1, "name",
  "version", "digest", "publisher", "key_id", "signature"}`; `signature` is base64 Ed25519
  over `signed_message(...)`, the canonical JSON of the pinned fields plus a context
  string, so a signature can never be replayed for another machine, version or purpose.
- Trusted publishers (operator configuration, YAML): `{"publishers": {"<id>": {"keys":
  ["<base64 raw 32-byte Ed25519 public key>", ...]}}}`.

Each check failing raises `ProvenanceError` with exactly one coded problem naming it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from machines import ed25519
from machines.digest import DIGEST_PATTERN, canonical_json
from machines.errors import Code, Location, Problem, ProvenanceError
from machines.keys import key_id, public_key_text
from machines.loader import load_machine
from machines.model import Machine, MachineProvenance, Registry
from machines.pins import Pins
from machines.yamlsafe import parse_yaml, read_bytes

SIGNATURE_FILE = "RECOVERY.sig"
SIGNATURE_CONTEXT = "agent-recovery/0.2 machine signature v1"
_ID = r"^[a-z0-9][a-z0-9._-]*$"


class LockEntry(BaseModel):
    """One pinned machine: `name@version` → digest and publisher."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    version: str = Field(min_length=1, max_length=64)
    digest: str = Field(pattern=DIGEST_PATTERN.pattern)
    publisher: str = Field(pattern=_ID)
    path: str = ""


class LockFile(BaseModel):
    """The operator's lock file: the only machines the controller will load. `current`
    names, for a machine pinned at several versions, the one new operations open on
    (a machine pinned once needs no entry)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    lock_version: int = Field(1, ge=1, le=1)
    machines: dict[str, LockEntry] = Field(default_factory=dict)
    current: dict[str, str] = Field(default_factory=dict)

    def entry(self, name: str, version: str) -> LockEntry | None:
        """The pin of `name@version`, if any."""
        return self.machines.get(f"{name}@{version}")

    def versions(self, name: str) -> list[str]:
        """Every pinned version of `name`, in lock order."""
        return [e.version for e in self.machines.values() if e.name == name]

    def current_version(self, name: str) -> str | None:
        """The version of `name` new operations open on: the marked one, else the only
        pinned one; None when it is not pinned or several are and none is marked."""
        marked = self.current.get(name)
        if marked is not None:
            return marked
        found = self.versions(name)
        return found[0] if len(found) == 1 else None

    def problem(self) -> str | None:
        """What makes this lock unusable beyond its shape, or None: a key that does not
        match its entry, a current version that is not pinned, or a machine pinned at
        several versions without a current one."""
        for key, entry in self.machines.items():
            if key != f"{entry.name}@{entry.version}":
                return f"lock key {key!r} does not match its entry {entry.name}@{entry.version}"
        for name, version in self.current.items():
            if self.entry(name, version) is None:
                return f"current version {name}@{version} is not pinned"
        names = {e.name for e in self.machines.values()}
        for name in sorted(names):
            if self.current_version(name) is None:
                return (
                    f"machine {name} is pinned at versions {', '.join(self.versions(name))} "
                    "and none is marked current"
                )
        return None


class SignatureFile(BaseModel):
    """A publisher's detached signature over a machine's pinned identity."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    signature_version: int = Field(1, ge=1, le=1)
    name: str
    version: str
    digest: str = Field(pattern=DIGEST_PATTERN.pattern)
    publisher: str = Field(pattern=_ID)
    key_id: str
    signature: str


class TrustedPublishers(BaseModel):
    """Operator configuration: publisher id → base64 raw Ed25519 public keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    class Publisher(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        keys: list[str] = Field(min_length=1)

    publishers: dict[str, Publisher]


def _fail(code: Code, message: str, file: str, hint: str) -> ProvenanceError:
    return ProvenanceError([Problem(code, message, Location(file=file), hint)])


def signed_message(name: str, version: str, digest: str, publisher: str) -> bytes:
    """The exact bytes a publisher signs for `name@version` with `digest`."""
    return canonical_json(
        {
            "context": SIGNATURE_CONTEXT,
            "digest": digest,
            "name": name,
            "publisher": publisher,
            "version": version,
        }
    )


def sign_machine(machine: Machine, publisher: str, private_key: Ed25519PrivateKey) -> SignatureFile:
    """A signature by `publisher` over the machine's name, version and digest."""
    message = signed_message(machine.name, machine.version, machine.digest, publisher)
    return SignatureFile(
        signature_version=1,
        name=machine.name,
        version=machine.version,
        digest=machine.digest,
        publisher=publisher,
        key_id=key_id(private_key.public_key()),
        signature=base64.b64encode(ed25519.sign(private_key, message)).decode("ascii"),
    )


def dump_model(model: BaseModel) -> str:
    """Deterministic JSON text of a lock or signature file (sorted keys, trailing newline).
    A lock without a `current` entry is written without the key, as before rollouts."""
    data = model.model_dump()
    if isinstance(model, LockFile) and not model.current:
        del data["current"]
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _read_json(path: Path, code: Code, what: str) -> Any:
    raw = read_bytes(path, str(path))
    if isinstance(raw, Problem):
        raise ProvenanceError([Problem(code, raw.message, raw.location, f"provide the {what}")])
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _fail(
            code, f"{what} is not JSON: {exc}", str(path), f"regenerate the {what}"
        ) from exc


def load_lock(path: str | Path) -> LockFile:
    """Read a lock file; raises `ProvenanceError` (LOCK_INVALID) when it is not well-formed."""
    path = Path(path)
    data = _read_json(path, Code.LOCK_INVALID, "lock file")
    try:
        lock = LockFile.model_validate(data)
    except ValidationError as exc:
        raise _fail(
            Code.LOCK_INVALID,
            f"lock file is malformed: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}",
            str(path),
            "regenerate it with `recoveryctl machines lock`",
        ) from exc
    problem = lock.problem()
    if problem is not None:
        raise _fail(
            Code.LOCK_INVALID,
            problem,
            str(path),
            "regenerate it with `recoveryctl machines lock`, and mark the version new "
            "operations open on with `recoveryctl machines promote NAME@VERSION`",
        )
    return lock


def load_trusted_publishers(path: str | Path) -> TrustedPublishers:
    """Read the operator's trusted publisher keys (YAML); TRUST_CONFIG_INVALID on error."""
    path = Path(path)
    raw = read_bytes(path, str(path))
    document = raw if isinstance(raw, Problem) else parse_yaml(raw, str(path))
    if isinstance(document, Problem):
        raise ProvenanceError(
            [Problem(Code.TRUST_CONFIG_INVALID, document.message, document.location)]
        )
    try:
        trust = TrustedPublishers.model_validate(document.data)
        for publisher in trust.publishers.values():
            for text in publisher.keys:
                _public_key(text)
    except (ValidationError, ValueError) as exc:
        raise _fail(
            Code.TRUST_CONFIG_INVALID,
            f"trusted publishers configuration is malformed: {str(exc).splitlines()[0]}",
            str(path),
            "list base64 raw Ed25519 public keys per publisher (docs/machine-format.md)",
        ) from exc
    return trust


def _public_key(text: str) -> Ed25519PublicKey:
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"public key {text[:16]!r}... is not base64") from exc
    if len(raw) != 32:
        raise ValueError(f"public key {text[:16]!r}... is not 32 bytes")
    return Ed25519PublicKey.from_public_bytes(raw)


def signature_path(package: str | Path) -> Path:
    """Where the signature of a package (folder or RECOVERY.yaml) lives."""
    package = Path(package)
    folder = package if package.is_dir() else package.parent
    return folder / SIGNATURE_FILE


def check_pin(machine: Machine, lock: LockFile, lock_file: str = "<lock>") -> str:
    """Return the pinned publisher of `machine`, or raise PIN_MISSING / PIN_DIGEST_MISMATCH."""
    ref = f"{machine.name}@{machine.version}"
    entry = lock.entry(machine.name, machine.version)
    if entry is None:
        raise _fail(
            Code.PIN_MISSING,
            f"machine {ref} is not pinned in the lock file",
            lock_file,
            "review the machine, then pin it with `recoveryctl machines lock`",
        )
    if entry.digest != machine.digest:
        raise _fail(
            Code.PIN_DIGEST_MISMATCH,
            f"machine {ref} has digest {machine.digest} but the lock pins {entry.digest}",
            lock_file,
            "the machine changed since it was reviewed: review it and re-lock, or restore "
            "the pinned content",
        )
    return entry.publisher


def check_signature(
    machine: Machine, publisher: str, signature_file: Path, trust: TrustedPublishers
) -> MachineProvenance:
    """Verify the publisher signature of a pinned machine; raise the exact failing check.
    Returns the provenance that verified: the publisher, the id of the trusted key the
    signature verified under (not the id the file claims) and the signature's digest."""
    file = str(signature_file)
    ref = f"{machine.name}@{machine.version}"
    if not signature_file.is_file():
        raise _fail(
            Code.SIGNATURE_MISSING,
            f"machine {ref} has no signature ({SIGNATURE_FILE})",
            file,
            "ask the publisher to sign it with `recoveryctl machines sign`",
        )
    try:
        data = _read_json(signature_file, Code.SIGNATURE_MALFORMED, "signature")
        signature = SignatureFile.model_validate(data)
        raw = base64.b64decode(signature.signature, validate=True)
    except (ValidationError, binascii.Error) as exc:
        raise _fail(
            Code.SIGNATURE_MALFORMED,
            f"signature of {ref} is malformed: {str(exc).splitlines()[0]}",
            file,
            "re-sign with `recoveryctl machines sign`",
        ) from exc
    if signature.publisher != publisher:
        raise _fail(
            Code.PUBLISHER_MISMATCH,
            f"machine {ref} is pinned to publisher {publisher!r} but signed by "
            f"{signature.publisher!r}",
            file,
            "re-lock with the right publisher, or obtain the pinned publisher's signature",
        )
    covered = (signature.name, signature.version, signature.digest)
    if covered != (machine.name, machine.version, machine.digest):
        raise _fail(
            Code.SIGNATURE_INVALID,
            f"signature covers {signature.name}@{signature.version} {signature.digest}, not "
            f"{ref} {machine.digest}",
            file,
            "the machine changed after it was signed: have the publisher sign this content",
        )
    trusted = trust.publishers.get(publisher)
    if trusted is None:
        raise _fail(
            Code.PUBLISHER_UNTRUSTED,
            f"publisher {publisher!r} of {ref} is not in the trusted publishers configuration",
            file,
            "add the publisher's public key to the operator's trusted publishers, after review",
        )
    message = signed_message(machine.name, machine.version, machine.digest, publisher)
    for text in trusted.keys:
        public = _public_key(text)
        if not ed25519.verify(public, raw, message):
            continue
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        return MachineProvenance(publisher, key_id(public), digest)
    raise _fail(
        Code.SIGNATURE_INVALID,
        f"signature of {ref} by {publisher!r} (key {signature.key_id}) does not verify under "
        "any trusted key of that publisher",
        file,
        "the signature or the trusted key is wrong; do not load this machine",
    )


def load_pinned_machine(
    path: str | Path, registry: Registry, lock_path: str | Path, trust: TrustedPublishers
) -> Machine:
    """Load a machine only if it validates, is pinned by digest and is signed by a trusted
    publisher (SPEC §8.1). Raises `MachineInvalid` or `ProvenanceError`, naming the check.
    The machine returned carries the `MachineProvenance` that verified, which the ledger
    records when an operation is opened under it (SPEC §10)."""
    machine = load_machine(path, registry)
    lock = load_lock(lock_path)
    publisher = check_pin(machine, lock, str(lock_path))
    provenance = check_signature(machine, publisher, signature_path(path), trust)
    return replace(machine, provenance=provenance)


def load_locked_machines(
    lock_path: str | Path, registry: Registry, trust: TrustedPublishers
) -> Pins:
    """Every machine the lock file pins, by `name@version`, each loaded through
    `load_pinned_machine` from its `path` (relative to the lock file), with the version
    of each name new operations open on (`machines.Pins`). This is what a controller
    loads at start-up; the first refusal raises and names its check."""
    lock_path = Path(lock_path)
    lock = load_lock(lock_path)
    loaded: dict[str, Machine] = {}
    for ref, entry in lock.machines.items():
        package = Path(entry.path)
        if not package.is_absolute():
            package = lock_path.parent / package
        machine = load_pinned_machine(package, registry, lock_path, trust)
        if f"{machine.name}@{machine.version}" != ref:
            raise _fail(
                Code.PIN_MISSING,
                f"lock entry {ref} points to {package}, which holds "
                f"{machine.name}@{machine.version}",
                str(lock_path),
                "fix the entry's path or re-lock the machine",
            )
        loaded[ref] = machine
    return Pins(loaded, lock.current)


def lock_entry(machine: Machine, publisher: str, package: Path, lock_dir: Path) -> LockEntry:
    """The lock entry pinning `machine` (validated) to its digest and `publisher`."""
    folder = package if package.is_dir() else package.parent
    try:
        relative = folder.resolve().relative_to(lock_dir.resolve()).as_posix()
    except ValueError:
        relative = folder.resolve().as_posix()
    return LockEntry(
        name=machine.name,
        version=machine.version,
        digest=machine.digest,
        publisher=publisher,
        path=relative,
    )


__all__ = [
    "SIGNATURE_FILE",
    "LockEntry",
    "LockFile",
    "SignatureFile",
    "TrustedPublishers",
    "check_pin",
    "check_signature",
    "dump_model",
    "key_id",
    "load_lock",
    "load_locked_machines",
    "load_pinned_machine",
    "load_trusted_publishers",
    "lock_entry",
    "public_key_text",
    "sign_machine",
    "signature_path",
    "signed_message",
]
