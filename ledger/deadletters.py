"""Dead letters: input the controller refused, recorded in the batch transaction.

A record that cannot become a decided event (undecodable bytes, a schema violation, an
unknown or unpinned machine, a forged signature, a replayed nonce...) must still leave
two durable traces, written in the same transaction as the stored offset that skips it
(otherwise a crash between the two would either lose the refusal or replay it twice):

- an outbox row for `recovery.dlq` carrying the original bytes, headers, coordinates and
  the reason (its id is deterministic, so a replayed batch cannot add a second one);
- an audit record, hash-chained like every other. A refused record may not belong to any
  operation (its bytes may not even decode), so dead letters are chained per consumed
  partition, in an *intake chain* (`intake:<group>:<topic>[<partition>]`) whose head
  lives in `audit_chains` (migration 0002). Only the partition's current owner writes to
  it, and the epoch check of the batch transaction makes that so.

`plan_dead_letters` is pure and shared by both ledgers; `write_dead_letters` executes it
on PostgreSQL inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from ledger.audit import AuditRecord, ChainHead, chain_records, genesis_hash
from ledger.jsonutil import dumps
from ledger.queries import QUERIES

__all__ = [
    "DEAD_LETTER_KIND",
    "DeadLetter",
    "intake_chain_id",
    "plan_dead_letters",
    "write_dead_letters",
]

DEAD_LETTER_KIND = "dead-letter"


def intake_chain_id(group: str, topic: str, partition: int) -> str:
    """The audit chain that records dead letters of one consumed partition."""
    return f"intake:{group}:{topic}[{partition}]"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One refused input record. `payload` is the record for the dead-letter topic (the
    caller shapes it; the ledger stores it as given), `audit` the body of its audit
    record (no raw bytes: a digest of them), `key` the outbox key the relay orders by."""

    record_id: str
    chain_id: str
    key: str
    reason_code: str
    payload: Mapping[str, Any]
    headers: Mapping[str, str]
    audit: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """One outbox row a dead letter causes (the audit record or the dead letter)."""

    record_id: str
    topic: str
    key: str
    headers: Mapping[str, str]
    payload: Mapping[str, Any]


def plan_dead_letters(
    letters: Sequence[DeadLetter],
    heads: Mapping[str, ChainHead],
    audit_topic: str,
    dead_letter_topic: str,
) -> tuple[dict[str, list[AuditRecord]], list[DeadLetterRow]]:
    """Chain each letter's audit record onto its intake chain's `head` and list the
    outbox rows in order: per letter, its audit record then its dead letter. Pure."""
    bodies: dict[str, list[tuple[str, Mapping[str, Any], str]]] = {}
    for letter in letters:
        item = (DEAD_LETTER_KIND, letter.audit, dumps(letter.audit))
        bodies.setdefault(letter.chain_id, []).append(item)
    chained = {chain: chain_records(chain, heads[chain], items) for chain, items in bodies.items()}
    cursor = dict.fromkeys(chained, 0)
    rows: list[DeadLetterRow] = []
    for letter in letters:
        record = chained[letter.chain_id][cursor[letter.chain_id]]
        cursor[letter.chain_id] += 1
        audit_id = f"audit:{record.operation_id}:{record.sequence}"
        rows.append(
            DeadLetterRow(
                audit_id,
                audit_topic,
                letter.chain_id,
                {"record_id": audit_id, "operation_id": record.operation_id, "kind": record.kind},
                record.to_dict(),
            )
        )
        rows.append(
            DeadLetterRow(
                letter.record_id,
                dead_letter_topic,
                letter.key,
                {**letter.headers, "record_id": letter.record_id, "reason": letter.reason_code},
                letter.payload,
            )
        )
    return chained, rows


def write_dead_letters(
    cur: psycopg.Cursor[TupleRow],
    letters: Sequence[DeadLetter],
    audit_topic: str,
    dead_letter_topic: str,
) -> tuple[int, int]:
    """Write `letters` inside the caller's transaction: open and lock their intake chains
    (in id order, like operations), append the chained audit records and the outbox rows,
    and move the chain heads. Returns (audit records, outbox rows) written."""
    if not letters:
        return 0, 0
    chains = sorted({letter.chain_id for letter in letters})
    cur.execute(
        QUERIES["open_audit_chains"],
        {"ids": chains, "heads": [genesis_hash(c) for c in chains]},
    )
    found = cur.execute(QUERIES["lock_audit_chains"], {"ids": chains}).fetchall()
    heads = {str(c): ChainHead(int(s), str(h)) for c, s, h in found}
    chained, rows = plan_dead_letters(letters, heads, audit_topic, dead_letter_topic)
    records = [r for rs in chained.values() for r in rs]
    with cur.copy(QUERIES["copy_audit_records"]) as copy:
        for r in records:
            copy.write_row((r.operation_id, r.sequence, r.kind, r.prev_hash, r.hash, r.body_json()))
    with cur.copy(QUERIES["copy_outbox"]) as copy:
        for o in rows:
            # The outbox payload column holds the bytes to publish (bytea).
            payload = dumps(o.payload).encode("utf-8")
            copy.write_row((o.record_id, o.topic, o.key, dumps(o.headers), payload, None))
    cur.execute(
        QUERIES["move_audit_chains"],
        {
            "ids": list(chained),
            "sequences": [rs[-1].sequence for rs in chained.values()],
            "heads": [rs[-1].hash for rs in chained.values()],
        },
    )
    return len(records), len(rows)
