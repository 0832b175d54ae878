"""The producer roster: who may write which records, proven by Ed25519 keys (SPEC §1,
§7.7, §12: the controller decides only on authenticated identities).

Each producer has an id, one or more public keys with validity windows (rotation) and
revocation, and grants: a role and the scope it holds the role for. The roster lives in
the operator's policy under `producers:` (or in a file of its own with the same key, for
workers that verify commands). A record's signature names its producer and key id;
`Roster.authenticate` proves both or refuses with one `AuthRefusal` code, and
`ProducerEntry.permits` says whether the producer holds a role for a scope. A list in a
grant names what it permits; `"*"` permits anything; an omitted list permits nothing,
so a grant is never wider than it says.

Roles (their scope fields):

- `tool`: reports operations it performs: `capabilities`, `tools`, `environments`, and
  the `agents` it reports for;
- `verifier`: answers verification commands for `capabilities`;
- `worker`: executes commands and reports their results for `capabilities`;
- `validator`: validates checkpoints of `agents`;
- `orchestrator`: reports lineage and ancestors' states for `agents`;
- `classifier`: proposes events (never authority, SPEC §11);
- `approver`: publishes signed human decisions (each decision is verified on its own
  signature against the policy's approvers);
- `controller`: signs what the controller emits (commands, cascade events, audit).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from machines import ed25519
from machines.keys import KeyFileError, key_id_of_text, public_key_bytes, public_key_from_text

__all__ = [
    "ANY",
    "AuthRefusal",
    "AuthenticationError",
    "Grant",
    "ProducerEntry",
    "ProducerKey",
    "Role",
    "Roster",
]

ANY: Final = "*"
_ID = r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}$"


class Role(StrEnum):
    """What a producer may write; see the module docstring for each role's scope."""

    TOOL = "tool"
    VERIFIER = "verifier"
    WORKER = "worker"
    VALIDATOR = "validator"
    ORCHESTRATOR = "orchestrator"
    CLASSIFIER = "classifier"
    APPROVER = "approver"
    CONTROLLER = "controller"


class AuthRefusal(StrEnum):
    """Why a record's producer is not authenticated or not permitted; each is a
    dead-letter reason code of its own."""

    SIGNATURE_MISSING = "signature-missing"
    SIGNATURE_MALFORMED = "signature-malformed"
    PRODUCER_UNKNOWN = "producer-unknown"
    KEY_UNKNOWN = "key-unknown"
    KEY_REVOKED = "key-revoked"
    KEY_NOT_YET_VALID = "key-not-yet-valid"
    KEY_EXPIRED = "key-expired"
    SIGNATURE_INVALID = "signature-invalid"
    ROLE_NOT_PERMITTED = "role-not-permitted"
    IDENTITY_MISMATCH = "identity-mismatch"
    # The opener proves neither the affected agent (no tool grant naming it, no call
    # context) nor, with a context, a valid one (`machines.call_context`).
    AGENT_UNPROVEN = "agent-unproven"
    CALL_CONTEXT_INVALID = "call-context-invalid"


class AuthenticationError(Exception):
    """A record that is not proven to come from a roster producer allowed to write it."""

    def __init__(self, code: AuthRefusal, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class ProducerKey(BaseModel):
    """One public key of a producer, valid in `[not_before, not_after)` unless revoked:
    for good without a `not_after`, from it with one (the time it was compromised)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    public_key: str = Field(description="raw 32-byte Ed25519 public key, base64")
    not_before: datetime | None = None
    not_after: datetime | None = None
    revoked: bool = False

    @field_validator("public_key")
    @classmethod
    def _is_ed25519(cls, value: str) -> str:
        try:
            public_key_from_text(value)
        except KeyFileError as exc:
            raise ValueError(str(exc)) from exc
        return value

    @field_validator("not_before", "not_after")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("validity times must carry a timezone (use Z for UTC)")
        return value

    @property
    def key_id(self) -> str:
        """`ed25519:` and 16 hex digits of the SHA-256 of the raw key."""
        return key_id_of_text(self.public_key)


class Grant(BaseModel):
    """A role held for a scope. Omitted lists permit nothing; `"*"` permits anything."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role
    capabilities: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    environments: tuple[str, ...] = ()
    agents: tuple[str, ...] = ()

    def permits(self, **scope: str | None) -> bool:
        """Whether every given scope value (keywords `capability`, `tool`, `environment`,
        `agent`) is in its list, or the list holds `"*"`. A scope value not given is not
        checked; one given as None is admitted only by `"*"`."""
        for name, value in scope.items():
            allowed: tuple[str, ...] = getattr(self, _SCOPE_FIELDS[name])
            if ANY not in allowed and (value is None or value not in allowed):
                return False
        return True


_SCOPE_FIELDS: Final = {
    "capability": "capabilities",
    "tool": "tools",
    "environment": "environments",
    "agent": "agents",
}


class ProducerEntry(BaseModel):
    """A producer: its id, its keys and the roles it holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=_ID)
    keys: tuple[ProducerKey, ...] = Field(min_length=1)
    grants: tuple[Grant, ...] = ()

    def roles(self) -> frozenset[Role]:
        """Every role the producer holds, for any scope."""
        return frozenset(g.role for g in self.grants)

    def permits(self, role: Role, **scope: str | None) -> bool:
        """Whether the producer holds `role` for `scope` (keyword arguments of
        `Grant.permits`: capability, tool, environment, agent)."""
        return any(g.role == role and g.permits(**scope) for g in self.grants)

    def key(self, key_id: str) -> ProducerKey | None:
        """The listed key named `key_id`, if any."""
        for entry in self.keys:
            if entry.key_id == key_id:
                return entry
        return None


class Roster(BaseModel):
    """Every producer whose records the controller (or a worker) accepts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    producers: tuple[ProducerEntry, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> Roster:
        ids = [p.id for p in self.producers]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"producer ids listed twice: {', '.join(dupes)}")
        return self

    def producer(self, producer_id: str) -> ProducerEntry | None:
        """The roster entry for `producer_id`, if any."""
        return _index(self).get(producer_id)

    def with_role(self, role: Role) -> Iterable[ProducerEntry]:
        """Every producer holding `role` for some scope."""
        return (p for p in self.producers if role in p.roles())

    def valid_key(
        self, producer_id: str, key_id: str, *, at: datetime
    ) -> tuple[ProducerEntry, ProducerKey]:
        """The producer `producer_id` and its key `key_id`, when the roster lists both
        and the key is neither revoked nor outside its validity at `at`; raises
        `AuthenticationError` with the first check that fails (what `authenticate`
        checks before the signature, and what a client checks before it signs)."""
        entry = self.producer(producer_id)
        if entry is None:
            raise AuthenticationError(
                AuthRefusal.PRODUCER_UNKNOWN,
                f"producer {producer_id!r} is not in the roster; add it to the policy's "
                "`producers` with its public key and grants",
            )
        key = entry.key(key_id)
        if key is None:
            listed = ", ".join(k.key_id for k in entry.keys)
            raise AuthenticationError(
                AuthRefusal.KEY_UNKNOWN,
                f"producer {producer_id} has no key {key_id} (listed: {listed})",
            )
        # A revoked key with a `not_after` is revoked from then (when it was compromised):
        # what it signed before stays verifiable for a verifier of history, which judges
        # a record at its own time (`ops.audit_topic`); a live verifier's clock is past it.
        if key.revoked and (key.not_after is None or at >= key.not_after):
            raise AuthenticationError(
                AuthRefusal.KEY_REVOKED, f"key {key_id} of producer {producer_id} is revoked"
            )
        if key.not_before is not None and at < key.not_before:
            raise AuthenticationError(
                AuthRefusal.KEY_NOT_YET_VALID,
                f"key {key_id} of producer {producer_id} is valid from "
                f"{key.not_before.isoformat()}, not at {at.isoformat()}",
            )
        if key.not_after is not None and at >= key.not_after:
            raise AuthenticationError(
                AuthRefusal.KEY_EXPIRED,
                f"key {key_id} of producer {producer_id} expired at {key.not_after.isoformat()}",
            )
        return entry, key

    def authenticate(
        self,
        producer_id: str | None,
        key_id: str | None,
        message: bytes,
        signature: str | None,
        *,
        at: datetime,
    ) -> ProducerEntry:
        """The producer whose key `key_id` signed `message` (base64 `signature`), valid
        at `at`; raises `AuthenticationError` with the first check that fails."""
        if not producer_id or not key_id or not signature:
            missing = [
                name
                for name, value in (
                    ("producer", producer_id),
                    ("key id", key_id),
                    ("signature", signature),
                )
                if not value
            ]
            raise AuthenticationError(
                AuthRefusal.SIGNATURE_MISSING,
                f"unsigned: no {', '.join(missing)}; every record must be signed by a "
                "roster producer (the client library signs with its producer key)",
            )
        entry, key = self.valid_key(producer_id, key_id, at=at)
        try:
            raw = base64.b64decode(signature, validate=True)
        except (binascii.Error, ValueError):
            raise AuthenticationError(
                AuthRefusal.SIGNATURE_MALFORMED,
                f"signature of producer {producer_id} is not base64",
            ) from None
        if not ed25519.verify(public_key_bytes(key.public_key), raw, message):
            raise AuthenticationError(
                AuthRefusal.SIGNATURE_INVALID,
                f"signature by key {key_id} of producer {producer_id} does not verify: the "
                "record was altered or not signed by that key",
            )
        return entry


_INDEXES: dict[int, tuple[Roster, dict[str, ProducerEntry]]] = {}


def _index(roster: Roster) -> dict[str, ProducerEntry]:
    # Rosters are immutable and few; index each once, by identity.
    cached = _INDEXES.get(id(roster))
    if cached is not None and cached[0] is roster:
        return cached[1]
    index = {p.id: p for p in roster.producers}
    if len(_INDEXES) > 64:
        _INDEXES.clear()
    _INDEXES[id(roster)] = (roster, index)
    return index
