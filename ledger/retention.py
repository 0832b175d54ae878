"""Retention that is not tampering: purge an operation's history, leave a signed tombstone.

`purge_operation` runs, in one transaction, `purge_operation_history` (migration 0010:
the one way past the append-only trigger) and then appends a `tombstone` audit record
to the operation's chain, continuing its head: its body names the sequence and hash the
purge ended at (`purged_through`, `purged_head`), how many rows went, when and why. An
outbox row publishes it on the audit topic as a `tombstone` record, signed by the
controller's key (`RowSigner`), so that:

- `audit verify` accepts a chain that starts at a tombstone (`ledger.audit.verify_chain`);
- `audit verify --against-topic` counts the published records the tombstone covers as
  purged, and reports any other record gone from the database as deleted: only the
  controller's key can sign a tombstone, and the database never holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import psycopg
from psycopg.rows import TupleRow

from ledger.audit import AuditRecord, ChainHead, chain_records
from ledger.jsonutil import column_json, dumps
from ledger.queries import QUERIES
from ledger.rowsign import RowSigner
from schemas import TopicNames

__all__ = ["TOMBSTONE_FORMAT", "TOMBSTONE_KIND", "PurgeCandidate", "PurgeResult", "purge_operation"]

TOMBSTONE_KIND: Final = "tombstone"
TOMBSTONE_FORMAT: Final = "tombstone/1"

Conn = psycopg.Connection[TupleRow]


@dataclass(frozen=True, slots=True)
class PurgeCandidate:
    """An operation retention may purge: untouched since `updated_at`."""

    operation_id: str
    machine_name: str
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class PurgeResult:
    """What one purge removed and the tombstone it left."""

    operation_id: str
    rows_removed: int
    purged_through: int
    tombstone_sequence: int
    tombstone_hash: str


def tombstone_payload(
    record: AuditRecord, head: ChainHead, body: Mapping[str, Any]
) -> dict[str, Any]:
    """The outbox payload that publishes tombstone `record` (chained after `head`, the
    purged chain's last record) on the audit topic, where it becomes an OCSF event."""
    return {
        "kind": TOMBSTONE_KIND,
        "operation_id": record.operation_id,
        "sequence": record.sequence,
        "hash": record.hash,
        "prev_hash": record.prev_hash,
        "purged_through": head.sequence,
        "purged_head": head.hash,
        "record": dict(body),
    }


def purge_candidates(conn: Conn, before: datetime) -> list[PurgeCandidate]:
    """Operations untouched since `before` with history beyond a tombstone."""
    rows = conn.execute(QUERIES["purge_candidates"], {"before": before}).fetchall()
    return [PurgeCandidate(str(op), str(machine), at) for op, machine, at in rows]


def purge_operation(
    conn: Conn,
    operation_id: str,
    *,
    reason: str,
    now: datetime,
    topics: TopicNames,
    sign: RowSigner | None,
) -> PurgeResult:
    """Purge `operation_id`'s history and leave its tombstone, in one transaction.
    Raises `LookupError` for an unknown operation; the database refuses one with
    unpublished outbox rows (`purge-unpublished-outbox`)."""
    with conn.transaction():
        row = conn.execute(QUERIES["purge_lock_head"], {"id": operation_id}).fetchone()
        if row is None:
            raise LookupError(f"operation {operation_id} has no operation row: nothing to purge")
        head = ChainHead(int(row[0]), str(row[1]))
        removed_row = conn.execute(QUERIES["purge_history"], {"id": operation_id}).fetchone()
        removed = int(removed_row[0]) if removed_row is not None else 0
        body: dict[str, Any] = {
            "format": TOMBSTONE_FORMAT,
            "purged_through": head.sequence,
            "purged_head": head.hash,
            "rows_removed": removed,
            "purged_at": now.isoformat(),
            "reason": reason,
        }
        [record] = chain_records(operation_id, head, [(TOMBSTONE_KIND, body, dumps(body))])
        conn.execute(
            QUERIES["insert_tombstone"],
            {
                "id": operation_id,
                "sequence": record.sequence,
                "prev_hash": record.prev_hash,
                "hash": record.hash,
                "record": record.body_json(),
            },
        )
        conn.execute(
            QUERIES["move_purged_head"],
            {"id": operation_id, "sequence": record.sequence, "hash": record.hash},
        )
        payload = tombstone_payload(record, head, body)
        rid = f"tombstone:{operation_id}:{record.sequence}"
        headers: dict[str, str] = {
            "record_id": rid,
            "operation_id": operation_id,
            "kind": "tombstone",
        }
        payload_json = dumps(payload)
        value = None
        if sign is not None:
            signed = sign(topics.audit, operation_id, rid, headers, payload_json)
            headers, value = signed.headers, signed.value
        conn.execute(
            QUERIES["insert_tombstone_outbox"],
            {
                "record_id": rid,
                "topic": topics.audit,
                "key": operation_id,
                "headers": column_json(headers),
                "payload": payload_json,
                "value": value,
            },
        )
    return PurgeResult(operation_id, removed, head.sequence, record.sequence, record.hash)
