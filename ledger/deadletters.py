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

`plan_dead_letters` is pure and shared by both ledgers; on PostgreSQL, `intake_reads` and
`intake_writes` lock and move the intake chains inside the batch transaction
(`ledger.postgres_commit`), whose INSERTs write the records and the outbox rows.
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
from ledger.rowsign import RowSigner

__all__ = [
    "DEAD_LETTER_KIND",
    "DeadLetter",
    "DeadLetterRow",
    "intake_chain_id",
    "intake_reads",
    "intake_writes",
    "plan_dead_letters",
]

DEAD_LETTER_KIND = "dead-letter"


def intake_chain_id(group: str, topic: str, partition: int) -> str:
    """The audit chain that records dead letters of one consumed partition."""
    return f"intake:{group}:{topic}[{partition}]"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One refused input record. `payload` is the record for the dead-letter topic (the
    caller shapes it; the ledger stores it as given), `audit` the body of its audit
    record (no raw bytes: a digest of them), `key` the outbox key the relay orders by.

    An intake chain also records what an operator did to its partition (`recoveryctl
    offsets skip`): such an entry has its own audit `kind` and `publish` False, so only
    its audit record is written, with nothing for the dead-letter topic."""

    record_id: str
    chain_id: str
    key: str
    reason_code: str
    payload: Mapping[str, Any]
    headers: Mapping[str, str]
    audit: Mapping[str, Any]
    kind: str = DEAD_LETTER_KIND
    publish: bool = True


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """One outbox row a dead letter causes (the audit record or the dead letter)."""

    record_id: str
    topic: str
    key: str
    headers: Mapping[str, str]
    payload: Mapping[str, Any]
    # The Kafka value the controller signed; None for an unsigned row.
    value: bytes | None = None
    # The audit record's place in its intake chain; None for the dead letter itself.
    audit_sequence: int | None = None


def plan_dead_letters(
    letters: Sequence[DeadLetter],
    heads: Mapping[str, ChainHead],
    audit_topic: str,
    dead_letter_topic: str,
    sign: RowSigner | None = None,
) -> tuple[dict[str, list[AuditRecord]], list[DeadLetterRow]]:
    """Chain each letter's audit record onto its intake chain's `head` and list the
    outbox rows in order: per letter, its audit record then its dead letter, each signed
    by `sign` when given. Pure."""
    bodies: dict[str, list[tuple[str, Mapping[str, Any], str]]] = {}
    for letter in letters:
        item = (letter.kind, letter.audit, dumps(letter.audit))
        bodies.setdefault(letter.chain_id, []).append(item)
    chained = {chain: chain_records(chain, heads[chain], items) for chain, items in bodies.items()}
    cursor = dict.fromkeys(chained, 0)
    rows: list[DeadLetterRow] = []
    for letter in letters:
        record = chained[letter.chain_id][cursor[letter.chain_id]]
        cursor[letter.chain_id] += 1
        audit_id = f"audit:{record.operation_id}:{record.sequence}"
        rows.append(
            _signed(
                DeadLetterRow(
                    audit_id,
                    audit_topic,
                    letter.chain_id,
                    {
                        "record_id": audit_id,
                        "operation_id": record.operation_id,
                        "kind": record.kind,
                    },
                    record.to_dict(),
                    audit_sequence=record.sequence,
                ),
                sign,
            )
        )
        if not letter.publish:
            continue
        rows.append(
            _signed(
                DeadLetterRow(
                    letter.record_id,
                    dead_letter_topic,
                    letter.key,
                    {**letter.headers, "record_id": letter.record_id, "reason": letter.reason_code},
                    letter.payload,
                ),
                sign,
            )
        )
    return chained, rows


def _signed(row: DeadLetterRow, sign: RowSigner | None) -> DeadLetterRow:
    """`row` with the controller's signature over the payload text the ledger stores."""
    if sign is None:
        return row
    signed = sign(row.topic, row.key, row.record_id, row.headers, dumps(row.payload))
    return DeadLetterRow(
        row.record_id,
        row.topic,
        row.key,
        signed.headers,
        row.payload,
        signed.value,
        row.audit_sequence,
    )


def intake_reads(
    conn: psycopg.Connection[TupleRow], letters: Sequence[DeadLetter]
) -> psycopg.Cursor[TupleRow] | None:
    """Queue, inside the caller's transaction (and pipeline), the opening and locking of
    the intake chains `letters` are audited in, in id order like operations; the cursor
    returns (chain id, sequence, head hash) rows for `plan_dead_letters`. None without
    letters."""
    if not letters:
        return None
    chains = sorted({letter.chain_id for letter in letters})
    conn.execute(
        QUERIES["open_audit_chains"],
        {"ids": chains, "heads": [genesis_hash(c) for c in chains]},
    )
    return conn.execute(QUERIES["lock_audit_chains"], {"ids": chains})


def intake_writes(
    conn: psycopg.Connection[TupleRow], chained: Mapping[str, Sequence[AuditRecord]]
) -> None:
    """Queue the move of the intake chain heads to the records `plan_dead_letters`
    chained; the records and the outbox rows go with the batch's own."""
    if not chained:
        return
    conn.execute(
        QUERIES["move_audit_chains"],
        {
            "ids": list(chained),
            "sequences": [rs[-1].sequence for rs in chained.values()],
            "heads": [rs[-1].hash for rs in chained.values()],
        },
    )
