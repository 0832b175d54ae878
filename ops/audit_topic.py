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
  `forged-record`) and otherwise ignored. Each key is judged at the time the record
  was signed (an audit record's own OCSF `time`; a chain-heads record's, the newest
  record it names), never later than now, so a controller key rotated out (`not_after`)
  or revoked from the time of a compromise still proves what it signed before; a
  record backdated by someone holding such a key is not the ledger's record, which the
  comparisons below report;
- a published record whose hash differs from the database's record of that chain and
  sequence (`rewritten`), or a signed head the database's chain no longer has
  (`head-mismatch`): a consistent rewrite;
- a published record or signed head the database no longer has, not covered by a signed
  tombstone (`deleted`); covered, it is `purged` (counted, not a finding);
- a database record missing from the topic while a later record of its chain was
  published (`missing-from-topic`). Records after a chain's newest published one are
  counted as not yet published: the relay may not have got to them.

`compare_with_topic` is pure over the records read and the ledger's chains. With
`publish_lag`, a record after its chain's newest published one that the ledger wrote
longer ago than that is reported (`not-published`): the relay publishes within seconds,
so an old unpublished tail is a relay held back or a row nobody signed, not a pending one.

`verify_authors` needs no topic: every audit record in the database must have the outbox
row the controller wrote for it, signed with a roster controller key (as of when it was
written) over exactly that record's chain link (`unsigned-record`, `forged-record`,
`unsigned-audit-row` when there is no signed row at all). So a row inserted, chained
and made head with the controller's database credentials alone, without its key, is
found from the database (`recoveryctl audit verify`), before any SIEM compares.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from ledger import AuditOutboxRow, AuditRecord, Ledger
from machines import AuthenticationError, AuthRefusal, Lineage, Role, Roster
from producers import RecordEncoder, TopicRecord, UnpublishableRow
from schemas import TopicNames, ocsf_kind, verify_record

__all__ = ["TopicFinding", "TopicReport", "compare_with_topic", "verify_authors"]

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


def verify_authors(
    ledger: Ledger, roster: Roster, topics: TopicNames, operation_id: str | None = None
) -> list[TopicFinding]:
    """Every audit record's signed outbox row (of one operation, or all), checked (module
    docstring): one finding per record the controller's key does not prove. Purged
    records have no row and are not looked for (their chain's tombstone is)."""
    findings: list[TopicFinding] = []
    rows = {(r.chain, r.sequence): r for r in ledger.audit_outbox(operation_id)}
    encoder = RecordEncoder(topics, _no_lineage)
    chains = (operation_id,) if operation_id is not None else ledger.audit_operation_ids()
    for chain in chains:
        for rec in ledger.audit_chain(chain)[0]:
            problem = _author_problem(rec, rows.get((chain, rec.sequence)), roster, encoder)
            if problem is not None:
                findings.append(TopicFinding(problem[0], chain, rec.sequence, problem[1]))
    return findings


def _no_lineage(operation_id: str) -> Lineage:
    raise LookupError(f"an audit row needs no lineage ({operation_id})")


def _author_problem(
    record: AuditRecord, row: AuditOutboxRow | None, roster: Roster, encoder: RecordEncoder
) -> tuple[str, str] | None:
    if row is None or row.record.value is None:
        return (
            "unsigned-audit-row",
            "no outbox row signed by the controller publishes this record: it was not "
            "written by the controller",
        )
    try:
        encoded = encoder.encode(row.record)
        entry = verify_record(
            roster,
            encoded.topic,
            encoded.key.encode(),
            encoded.value,
            encoded.kafka_headers(),
            at=row.created_at,
        )
        signed = _chain_link(json.loads(encoded.value))
    except AuthenticationError as exc:
        code = "unsigned-record" if exc.code == AuthRefusal.SIGNATURE_MISSING else "forged-record"
        return code, f"{exc.code}: {exc.reason}"
    except (UnpublishableRow, ValueError, KeyError, TypeError) as exc:
        return "forged-record", f"its outbox row does not read as an audit record: {exc}"
    if Role.CONTROLLER not in entry.roles():
        return "forged-record", f"signed by producer {entry.id}, which is no controller"
    if signed != (record.operation_id, record.sequence, record.hash):
        return "forged-record", f"the controller signed {signed}, not this record"
    return None


def compare_with_topic(
    ledger: Ledger,
    records: Iterable[TopicRecord],
    roster: Roster,
    *,
    at: datetime | None = None,
    publish_lag: timedelta | None = None,
) -> TopicReport:
    """Compare the ledger's audit chains with the audit topic's `records` (see the module
    docstring); `roster` holds the controller keys a record must be signed with."""
    report = TopicReport()
    now = at or datetime.now(UTC)
    topic = _read(records, roster, now, report)
    written = (
        {(r.chain, r.sequence): r.created_at for r in ledger.audit_outbox()}
        if publish_lag is not None
        else {}
    )
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
            continue
        when = written.get((chain, seq))
        if publish_lag is not None and (when is None or now - when > publish_lag):
            age = "no outbox row" if when is None else f"written {now - when} ago"
            report.findings.append(
                TopicFinding(
                    "not-published",
                    chain,
                    seq,
                    f"not on the topic ({age}), longer than the relay's bound of "
                    f"{publish_lag}: the relay is held back, or the row is nobody's",
                )
            )
            continue
        report.unpublished += 1
    return report


def _parsed(value: bytes | None) -> Mapping[str, Any]:
    try:
        data = json.loads(value or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _own_time(data: Mapping[str, Any]) -> datetime | None:
    """The time an audit record says it was made (OCSF `time`, milliseconds)."""
    millis = data.get("time")
    if not isinstance(millis, int) or isinstance(millis, bool):
        return None
    try:
        return datetime.fromtimestamp(millis / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _record_times(records: Sequence[TopicRecord]) -> dict[tuple[str, int], datetime]:
    """The time of every audit record on the topic, by its chain link."""
    times: dict[tuple[str, int], datetime] = {}
    for rec in records:
        data = _parsed(rec.value)
        when = _own_time(data)
        try:
            chain, seq, _ = _chain_link(data)
        except (KeyError, TypeError, ValueError):
            continue
        if when is not None:
            times[(chain, seq)] = when
    return times


def _signed_time(
    data: Mapping[str, Any], times: Mapping[tuple[str, int], datetime]
) -> datetime | None:
    """When a topic record was signed, as it says: an audit record's own time; a
    chain-heads record's, the newest of the records it names (it is signed in their
    batch); None when neither is known."""
    when = _own_time(data)
    if when is not None:
        return when
    heads = data.get("heads")
    if not isinstance(heads, list):
        return None
    found = [
        times[key]
        for h in heads
        if isinstance(h, dict)
        and (key := (str(h.get("operation_id")), _int(h.get("sequence")))) in times
    ]
    return max(found) if found else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) else -1


def _read(
    records: Iterable[TopicRecord], roster: Roster, at: datetime, report: TopicReport
) -> _Topic:
    topic = _Topic()
    read = list(records)
    times = _record_times(read)
    for rec in read:
        report.records_read += 1
        where = f"{rec.topic}[{rec.partition}]@{rec.offset}"
        try:
            # Judged at the time it says it was signed, so that a rotated controller key
            # (`not_after`) still verifies what it signed before: a record backdated by a
            # holder of a retired key is not the ledger's, and the comparison below
            # reports it.
            signed_at = _signed_time(_parsed(rec.value), times) or at
            entry = verify_record(
                roster, rec.topic, rec.key, rec.value, rec.headers, at=min(signed_at, at)
            )
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
    kind = ocsf_kind(value)
    if kind == HEADS:
        report.heads_records += 1
        for head in _recovery(value).get("heads") or ():
            topic.heads.append(
                (str(head["operation_id"]), int(head["sequence"]), str(head["hash"]), "")
            )
        return
    chain, sequence, digest = _chain_link(value)
    if kind == TOMBSTONE:
        report.tombstones += 1
        body = _recovery(value).get("record") or value
        through = int(body["purged_through"])
        if through >= topic.tombstones.get(chain, (0, ""))[0]:
            topic.tombstones[chain] = (through, str(body["purged_head"]))
    else:
        report.audit_records += 1
    # A tombstone is a record of the chain too (stored in the database).
    topic.published[(chain, sequence)] = digest


def _recovery(value: Mapping[str, Any]) -> Mapping[str, Any]:
    """`unmapped.recovery` of an OCSF record; the record itself in the plain JSON form an
    older controller published chain heads and tombstones in (the same field names)."""
    if "unmapped" not in value:
        return value
    found: Mapping[str, Any] = value["unmapped"]["recovery"]
    return found


def _chain_link(value: Mapping[str, Any]) -> tuple[str, int, str]:
    """The (chain, sequence, hash) a published audit record or tombstone stands for."""
    link = _recovery(value).get("chain") or value  # an older plain tombstone: top level
    return str(link["operation_id"]), int(link["sequence"]), str(link["hash"])


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
