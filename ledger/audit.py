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
from dataclasses import dataclass, field
from typing import Any

from ledger.jsonutil import dumps, dumps_str

__all__ = [
    "AUDIT_FORMAT",
    "AuditRecord",
    "AuditSubject",
    "ChainBreak",
    "ChainHead",
    "DecisionRowFacts",
    "base_body",
    "chain_records",
    "genesis_hash",
    "genesis_head",
    "operation_commitment",
    "record_hash",
    "text_digest",
    "verify_chain",
    "verify_subject",
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
    # The canonical JSON of `record` when the chain was built, kept so that storing and
    # publishing the record does not encode it again.
    record_json: str = field(default="", compare=False, repr=False)

    def body_json(self) -> str:
        """The canonical JSON text of `record`."""
        return self.record_json or dumps(self.record)

    def published_json(self) -> str:
        """`to_dict()` as canonical JSON text, without encoding the body twice."""
        return (
            f'{{"hash":{dumps_str(self.hash)},"kind":{dumps_str(self.kind)},'
            f'"operation_id":{dumps_str(self.operation_id)},'
            f'"prev_hash":{dumps_str(self.prev_hash)},'
            f'"record":{self.body_json()},"sequence":{self.sequence}}}'
        )

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


def genesis_hash(operation_id: str) -> str:
    """The `prev_hash` of an operation's first record: SHA-256 over the canonical JSON
    of `{"genesis": operation_id}`, written out (one key: nothing to sort)."""
    text = f'{{"genesis":{dumps_str(operation_id)}}}'
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def genesis_head(operation_id: str) -> ChainHead:
    """The head of an operation that has no audit record yet."""
    return ChainHead(0, genesis_hash(operation_id))


def record_hash(
    operation_id: str, sequence: int, kind: str, prev_hash: str, record_json: str
) -> str:
    """The hash of one record: SHA-256 over the canonical JSON object of its kind,
    operation, link, body (`record_json`, the canonical JSON of the body) and sequence.
    The strings are encoded by `dumps_str`, which is `dumps` for a string."""
    text = (
        f'{{"kind":{dumps_str(kind)},"operation_id":{dumps_str(operation_id)},'
        f'"prev_hash":{dumps_str(prev_hash)},"record":{record_json},"sequence":{sequence}}}'
    )
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def chain_records(
    operation_id: str,
    head: ChainHead,
    bodies: Iterable[tuple[str, Mapping[str, Any], str]],
) -> list[AuditRecord]:
    """Chain `(kind, body, body_json)` triples onto `head`, in order (`body_json` is
    `dumps(body)`, passed in so it is encoded once). Pure: the caller persists the
    records and the new head in the same transaction that read `head` under lock."""
    out: list[AuditRecord] = []
    sequence, prev = head.sequence, head.hash
    for kind, body, body_json in bodies:
        sequence += 1
        digest = record_hash(operation_id, sequence, kind, prev, body_json)
        out.append(AuditRecord(operation_id, sequence, kind, prev, digest, body, body_json))
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
    if records and _starts_after_purge(records[0]):
        # Retention purged the records before this tombstone (ledger.retention); what it
        # removed is proven against the signed copy on the audit topic, not here.
        prev = str(records[0].record["purged_head"])
        expected_sequence = records[0].sequence
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
        digest = record_hash(operation_id, rec.sequence, rec.kind, rec.prev_hash, dumps(rec.record))
        if digest != rec.hash:
            return ChainBreak(operation_id, rec.sequence, "was altered", digest, rec.hash)
        prev = rec.hash
        expected_sequence += 1
    return _check_head(operation_id, expected_sequence - 1, prev, head)


def _starts_after_purge(first: AuditRecord) -> bool:
    body = first.record
    return (
        first.kind == "tombstone"
        and isinstance(body.get("purged_through"), int)
        and body["purged_through"] == first.sequence - 1
        and isinstance(body.get("purged_head"), str)
    )


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


# --- audit/2: the chain commits to what decides (issue 15) -----------------------------

AUDIT_FORMAT = "audit/2"
# The keys audit/2 adds to a record body; the rest is the body audit/1 had (for a
# decision: the decision record exactly as the `decisions` row stores it).
COMMITMENT_KEYS = ("format", "decision_digest", "operation")
COUNTERS = ("version", "epoch", "retry_attempts", "recovery_attempts", "budget_spent")


def text_digest(text: str) -> str:
    """`sha256:` and the hex SHA-256 of `text` (UTF-8)."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def operation_commitment(state: str, counters: Mapping[str, int], view: Any) -> dict[str, Any]:
    """What an audit/2 record commits to about its operation row after the batch: the
    state, the counters (`COUNTERS`) and the digest of the folded view's canonical JSON."""
    out: dict[str, Any] = {"state": state, "view_digest": text_digest(dumps(view))}
    out.update({name: int(counters[name]) for name in COUNTERS})
    return out


def base_body(record: Mapping[str, Any]) -> dict[str, Any]:
    """An audit/2 body without the commitment keys (for a decision: the decision record)."""
    return {k: v for k, v in record.items() if k not in COMMITMENT_KEYS}


@dataclass(frozen=True, slots=True)
class DecisionRowFacts:
    """A stored decision row as `audit verify` reads it back."""

    sequence: int
    outcome: str
    state_before: str
    state_after: str
    decision: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class AuditSubject:
    """The rows an operation's audit/2 chain commits to: its decisions and its operation
    row (state, counters from the columns, the stored folded view)."""

    decisions: tuple[DecisionRowFacts, ...]
    state: str | None  # None: no operation row
    counters: Mapping[str, int]
    view: Any


def verify_subject(
    operation_id: str, records: Sequence[AuditRecord], subject: AuditSubject
) -> ChainBreak | None:
    """Check the decision rows and the operation row against an intact audit/2 chain;
    the first disagreement, or None. Records of format audit/1 commit to nothing
    beyond themselves and are skipped; an operation whose newest record is audit/1 has
    its row unchecked (it was written before audit/2)."""
    decided = {
        int(r.record["sequence"]): r
        for r in records
        if r.kind == "decision" and r.record.get("format") == AUDIT_FORMAT
    }
    for row in subject.decisions:
        rec = decided.get(row.sequence)
        if rec is None:
            continue
        found = _decision_break(operation_id, rec, row)
        if found is not None:
            return found
    newest = next((r for r in reversed(records) if "operation" in r.record), None)
    if newest is None or subject.state is None:
        return None
    return _operation_break(operation_id, newest, subject)


def _decision_break(
    operation_id: str, rec: AuditRecord, row: DecisionRowFacts
) -> ChainBreak | None:
    digest = text_digest(dumps(row.decision))
    if digest != rec.record.get("decision_digest"):
        return ChainBreak(
            operation_id,
            rec.sequence,
            f"does not match decision row {row.sequence} (its record)",
            str(rec.record.get("decision_digest")),
            digest,
        )
    for column in ("outcome", "state_before", "state_after"):
        if getattr(row, column) != row.decision.get(column):
            return ChainBreak(
                operation_id,
                rec.sequence,
                f"does not match decision row {row.sequence} (column {column})",
                str(row.decision.get(column)),
                str(getattr(row, column)),
            )
    return None


def _operation_break(
    operation_id: str, rec: AuditRecord, subject: AuditSubject
) -> ChainBreak | None:
    committed = rec.record["operation"]
    assert subject.state is not None
    found = operation_commitment(subject.state, subject.counters, subject.view)
    for name in ("state", *COUNTERS, "view_digest"):
        if committed.get(name) != found[name]:
            return ChainBreak(
                operation_id,
                rec.sequence,
                f"does not match the operation row ({name})",
                str(committed.get(name)),
                str(found[name]),
            )
    return None
