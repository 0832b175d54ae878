"""Hash-chained audit records (SPEC §10), one chain per operation.

Each record carries the hash of the record before it (`prev_hash`) and its own `hash`,
a SHA-256 over the canonical JSON of everything else in it. The first record of an
operation chains from a genesis hash derived from the operation id, so a chain cannot be
moved to another operation. The operation row keeps the chain head (last sequence and
hash), so deleting the newest records is detected as well as altering or deleting one
in the middle. `verify_chain` recomputes a chain and reports the first break.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ledger.jsonutil import dumps

__all__ = [
    "AuditRecord",
    "ChainBreak",
    "ChainHead",
    "chain_records",
    "genesis_hash",
    "genesis_head",
    "record_hash",
    "verify_chain",
]


@dataclass(frozen=True, slots=True)
class ChainHead:
    """The newest record of an operation's chain: its sequence (0: none yet) and hash."""

    sequence: int
    hash: str


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audit record as stored and published. `record` is the plain JSON body."""

    operation_id: str
    sequence: int
    kind: str
    prev_hash: str
    hash: str
    record: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The record as published on the audit topic: body plus its chain links."""
        return {
            "operation_id": self.operation_id,
            "sequence": self.sequence,
            "kind": self.kind,
            "prev_hash": self.prev_hash,
            "hash": self.hash,
            "record": dict(self.record),
        }


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """The first place an operation's chain does not verify, and what was expected."""

    operation_id: str
    sequence: int
    reason: str
    expected: str
    found: str

    def describe(self) -> str:
        """One line for an operator: which record, what is wrong, what to do."""
        return (
            f"operation {self.operation_id}: audit record {self.sequence} {self.reason}: "
            f"expected {self.expected}, found {self.found}; the chain was altered or a "
            "record removed: restore the ledger from backup and investigate"
        )


def _sha256(value: Any) -> str:
    return "sha256:" + hashlib.sha256(dumps(value).encode("utf-8")).hexdigest()


def genesis_hash(operation_id: str) -> str:
    """The `prev_hash` of an operation's first record."""
    return _sha256({"genesis": operation_id})


def genesis_head(operation_id: str) -> ChainHead:
    """The head of an operation that has no audit record yet."""
    return ChainHead(0, genesis_hash(operation_id))


def record_hash(
    operation_id: str, sequence: int, kind: str, prev_hash: str, record: Mapping[str, Any]
) -> str:
    """The hash of one record: over its operation, sequence, kind, link and body."""
    return _sha256(
        {
            "operation_id": operation_id,
            "sequence": sequence,
            "kind": kind,
            "prev_hash": prev_hash,
            "record": record,
        }
    )


def chain_records(
    operation_id: str, head: ChainHead, bodies: Iterable[tuple[str, Mapping[str, Any]]]
) -> list[AuditRecord]:
    """Chain `(kind, body)` pairs onto `head`, in order. Pure: the caller persists the
    records and the new head in the same transaction that read `head` under lock."""
    out: list[AuditRecord] = []
    sequence, prev = head.sequence, head.hash
    for kind, body in bodies:
        sequence += 1
        digest = record_hash(operation_id, sequence, kind, prev, body)
        out.append(AuditRecord(operation_id, sequence, kind, prev, digest, body))
        prev = digest
    return out


def verify_chain(
    operation_id: str, records: Sequence[AuditRecord], head: ChainHead | None
) -> ChainBreak | None:
    """Recompute the chain of `operation_id` from genesis; return the first break, or
    None when intact. `records` must be in sequence order; `head` is what the operation
    row says the newest record is (None when the operation row itself is missing)."""
    prev = genesis_hash(operation_id)
    expected_sequence = 1
    for rec in records:
        if rec.sequence != expected_sequence:
            return ChainBreak(
                operation_id,
                expected_sequence,
                "is missing",
                f"sequence {expected_sequence}",
                f"sequence {rec.sequence}",
            )
        if rec.prev_hash != prev:
            return ChainBreak(operation_id, rec.sequence, "has a broken link", prev, rec.prev_hash)
        digest = record_hash(operation_id, rec.sequence, rec.kind, rec.prev_hash, rec.record)
        if digest != rec.hash:
            return ChainBreak(operation_id, rec.sequence, "was altered", digest, rec.hash)
        prev = rec.hash
        expected_sequence += 1
    return _check_head(operation_id, expected_sequence - 1, prev, head)


def _check_head(
    operation_id: str, last: int, last_hash: str, head: ChainHead | None
) -> ChainBreak | None:
    if head is None:
        return ChainBreak(operation_id, last, "has no operation row", "an operation row", "none")
    if head.sequence != last:
        return ChainBreak(
            operation_id,
            last + 1,
            "is missing at the end of the chain",
            f"head sequence {head.sequence}",
            f"last stored sequence {last}",
        )
    if head.hash != last_hash:
        return ChainBreak(operation_id, last, "does not match the chain head", head.hash, last_hash)
    return None
