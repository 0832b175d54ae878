"""`recoveryctl audit verify --against-topic`: the database against its signed copy.

The controller signs every record it publishes on `recovery.audit` (`docs/relay.md`):
each audit record (OCSF, its chain link under `unmapped.recovery.chain`), one
`chain-heads` record per batch (every chain the batch extended, with its newest sequence
and hash) and a `tombstone` per purged chain. The database's head lives in the database,
so a superuser can rewrite records *and* head consistently; the topic's copy is
append-only and signed with a key the database never holds. This module reads the topic
and compares:

- a record on the topic that is unsigned, or signed by anyone but a roster controller
  key (a forgery chaining onto the real head, say) is reported (`unsigned-record`,
  `forged-record`) and otherwise ignored;
- a published record whose hash differs from the database's record of that chain and
  sequence (`rewritten`), or a signed head the database's chain no longer has
  (`head-mismatch`): a consistent rewrite;
- a published record or signed head the database no longer has, not covered by a signed
  tombstone (`deleted`); covered, it is `purged` (counted, not a finding);
- a database record missing from the topic while a later record of its chain was
  published (`missing-from-topic`). Records after a chain's newest published one are
  counted as not yet published: the relay may not have got to them.

`compare_with_topic` is pure over the records read and the ledger's chains.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from ledger import Ledger
from machines import AuthenticationError, AuthRefusal, Role, Roster
from producers import TopicRecord
from schemas import verify_record

__all__ = ["TopicFinding", "TopicReport", "compare_with_topic"]

HEADS: Final = "chain-heads"
TOMBSTONE: Final = "tombstone"


@dataclass(frozen=True, slots=True)
class TopicFinding:
    """One disagreement between the topic and the database."""

    code: str
    chain: str | None
    sequence: int | None
    detail: str

    def describe(self) -> str:
        where = "" if self.chain is None else f" {self.chain}#{self.sequence}"
        return f"{self.code}{where}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "chain": self.chain,
            "sequence": self.sequence,
            "detail": self.detail,
        }


@dataclass(slots=True)
class TopicReport:
    """What the comparison read and found."""

    records_read: int = 0
    audit_records: int = 0
    heads_records: int = 0
    heads_checked: int = 0
    tombstones: int = 0
    purged: int = 0
    unpublished: int = 0
    chains: int = 0
    findings: list[TopicFinding] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "records_read": self.records_read,
            "audit_records": self.audit_records,
            "heads_records": self.heads_records,
            "heads_checked": self.heads_checked,
            "tombstones": self.tombstones,
            "purged_records": self.purged,
            "not_yet_published": self.unpublished,
            "chains_checked": self.chains,
            "findings": [f.to_json() for f in self.findings],
        }


@dataclass(slots=True)
class _Topic:
    published: dict[tuple[str, int], str] = field(default_factory=dict)
    heads: list[tuple[str, int, str, str]] = field(default_factory=list)
    # chain -> (purged through sequence, hash of that record)
    tombstones: dict[str, tuple[int, str]] = field(default_factory=dict)


def compare_with_topic(
    ledger: Ledger,
    records: Iterable[TopicRecord],
    roster: Roster,
    *,
    at: datetime | None = None,
) -> TopicReport:
    """Compare the ledger's audit chains with the audit topic's `records` (see the module
    docstring); `roster` holds the controller keys a record must be signed with."""
    report = TopicReport()
    topic = _read(records, roster, at or datetime.now(UTC), report)
    stored: dict[tuple[str, int], str] = {}
    newest: dict[str, int] = {}
    for chain in ledger.audit_operation_ids():
        report.chains += 1
        for rec in ledger.audit_chain(chain)[0]:
            stored[(chain, rec.sequence)] = rec.hash
    for (chain, seq), _ in topic.published.items():
        newest[chain] = max(newest.get(chain, 0), seq)
    _published_against_stored(topic, stored, report)
    _heads_against_stored(topic, stored, report)
    for (chain, seq), _ in sorted(stored.items()):
        if (chain, seq) in topic.published or _purged(topic, chain, seq):
            continue
        if seq < newest.get(chain, 0):
            report.findings.append(
                TopicFinding(
                    "missing-from-topic",
                    chain,
                    seq,
                    "the database holds this record but the topic never got it, though a "
                    "later record of the chain was published",
                )
            )
        else:
            report.unpublished += 1
    return report


def _read(
    records: Iterable[TopicRecord], roster: Roster, at: datetime, report: TopicReport
) -> _Topic:
    topic = _Topic()
    for rec in records:
        report.records_read += 1
        where = f"{rec.topic}[{rec.partition}]@{rec.offset}"
        try:
            entry = verify_record(roster, rec.topic, rec.key, rec.value, rec.headers, at=at)
        except AuthenticationError as exc:
            code = (
                "unsigned-record" if exc.code == AuthRefusal.SIGNATURE_MISSING else "forged-record"
            )
            report.findings.append(
                TopicFinding(code, None, None, f"{where}: {exc.code}: {exc.reason}")
            )
            continue
        if Role.CONTROLLER not in entry.roles():
            report.findings.append(
                TopicFinding(
                    "forged-record", None, None, f"{where}: producer {entry.id} is no controller"
                )
            )
            continue
        try:
            _note(topic, json.loads(rec.value or b"{}"), report)
        except (ValueError, KeyError, TypeError) as exc:
            report.findings.append(
                TopicFinding("unreadable-record", None, None, f"{where}: signed but {exc!r}")
            )
    return topic


def _note(topic: _Topic, value: Mapping[str, Any], report: TopicReport) -> None:
    kind = value.get("kind")
    if kind == HEADS:
        report.heads_records += 1
        for head in value.get("heads") or ():
            topic.heads.append(
                (str(head["operation_id"]), int(head["sequence"]), str(head["hash"]), "")
            )
        return
    if kind == TOMBSTONE:
        report.tombstones += 1
        chain = str(value["operation_id"])
        through = int(value["purged_through"])
        if through >= topic.tombstones.get(chain, (0, ""))[0]:
            topic.tombstones[chain] = (through, str(value["purged_head"]))
        # The tombstone is a record of the chain too (stored in the database).
        topic.published[(chain, int(value["sequence"]))] = str(value["hash"])
        return
    link = value["unmapped"]["recovery"]["chain"]
    report.audit_records += 1
    topic.published[(str(link["operation_id"]), int(link["sequence"]))] = str(link["hash"])


def _purged(topic: _Topic, chain: str, seq: int) -> bool:
    stone = topic.tombstones.get(chain)
    return stone is not None and seq <= stone[0]


def _published_against_stored(
    topic: _Topic, stored: Mapping[tuple[str, int], str], report: TopicReport
) -> None:
    for (chain, seq), digest in sorted(topic.published.items()):
        found = stored.get((chain, seq))
        if found == digest:
            continue
        if found is None:
            if _purged(topic, chain, seq):
                report.purged += 1
                continue
            report.findings.append(
                TopicFinding(
                    "deleted",
                    chain,
                    seq,
                    f"published and signed as {digest}, gone from the database with no "
                    "signed tombstone (not a retention purge)",
                )
            )
            continue
        report.findings.append(
            TopicFinding(
                "rewritten",
                chain,
                seq,
                f"published and signed as {digest}, the database now holds {found}",
            )
        )


def _heads_against_stored(
    topic: _Topic, stored: Mapping[tuple[str, int], str], report: TopicReport
) -> None:
    for chain, seq, digest, _ in topic.heads:
        report.heads_checked += 1
        found = stored.get((chain, seq))
        if found == digest:
            continue
        if found is None and _purged(topic, chain, seq):
            continue
        if (chain, seq) in topic.published and topic.published[(chain, seq)] == digest:
            continue  # already reported against its published record
        report.findings.append(
            TopicFinding(
                "head-mismatch",
                chain,
                seq,
                f"a signed chain-heads record names {digest}; the database "
                + ("has no such record" if found is None else f"holds {found}"),
            )
        )
