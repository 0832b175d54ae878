"""Helpers of the relay tests: outbox rows written the way the ledger writes them (one
transaction per batch, so the NOTIFY trigger fires as in production), and a reader of
everything a topic holds."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

from schemas import HEADER_RECORD_ID, TopicNames, header_value, kafka_config

__all__ = ["Row", "Seen", "audit_row", "command_row", "insert_rows", "published_ids", "read_all"]


@dataclass(frozen=True, slots=True)
class Row:
    """One outbox row to insert."""

    record_id: str
    topic: str
    key: str
    headers: dict[str, str]
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Seen:
    """One record read back from a topic."""

    topic: str
    partition: int
    offset: int
    key: str
    record_id: str | None
    headers: dict[str, str]
    value: bytes


def command_row(topics: TopicNames, operation_id: str, sequence: int) -> Row:
    """A command row shaped like `ledger.records._command_rows`, lineage included."""
    command_id = f"cmd-{operation_id}-{sequence}"
    payload = {
        "command_id": command_id,
        "capability": "procurement.verify-request",
        "kind": "verify",
        "material": False,
        "params": {"attempt": sequence},
        "origin": "transition",
        "operation_id": operation_id,
        "sequence": sequence,
        "correlation_id": f"corr-{operation_id}",
        "machine": {"name": "procurement-request", "version": "1.0.0", "digest": "sha256:00"},
        "caused_by_event": f"evt-{operation_id}-{sequence}",
        "decided_at": datetime(2026, 11, 30, 3, 0, tzinfo=UTC).isoformat(),
        "lineage": {"agent": "agent-1", "task": "task-1", "initiating_principal": "alice"},
    }
    headers = {"record_id": command_id, "operation_id": operation_id, "capability": "x"}
    return Row(command_id, topics.commands, operation_id, headers, payload)


def audit_row(topics: TopicNames, operation_id: str, sequence: int) -> Row:
    """An audit row shaped like `ledger.records.finish_outbox` (a chained decision)."""
    record_id = f"audit:{operation_id}:{sequence}"
    payload = {
        "operation_id": operation_id,
        "sequence": sequence,
        "kind": "decision",
        "prev_hash": f"h{sequence - 1}",
        "hash": f"h{sequence}",
        "record": {
            "decided_at": datetime(2026, 11, 30, 3, 0, tzinfo=UTC).isoformat(),
            "outcome": "transitioned",
            "state_before": "a",
            "state_after": "b",
        },
    }
    headers = {"record_id": record_id, "operation_id": operation_id, "kind": "decision"}
    return Row(record_id, topics.audit, operation_id, headers, payload)


def insert_rows(database_url: str, rows: Sequence[Row]) -> None:
    """Insert `rows` in one transaction, in order (their outbox ids follow that order)."""
    with psycopg.connect(database_url) as conn, conn.cursor() as cur:
        with cur.copy("COPY outbox (record_id, topic, key, headers, payload) FROM STDIN") as copy:
            for r in rows:
                copy.write_row(
                    (r.record_id, r.topic, r.key, json.dumps(r.headers), json.dumps(r.payload))
                )


def published_ids(database_url: str) -> tuple[set[str], set[str]]:
    """(published, unpublished) record ids of the outbox."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT record_id, published_at IS NOT NULL FROM outbox").fetchall()
    return {r[0] for r in rows if r[1]}, {r[0] for r in rows if not r[1]}


def read_all(
    bootstrap: str, topics: Sequence[str], expected: int, timeout: float = 60
) -> list[Seen]:
    """Every record of `topics` from the beginning, in partition order, once at least
    `expected` arrived and nothing more came for a second (or at `timeout`)."""
    consumer = Consumer(
        {
            **kafka_config(bootstrap),
            "group.id": f"relay-test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        metadata = consumer.list_topics(timeout=10)
        consumer.assign(
            [TopicPartition(t, p, 0) for t in topics for p in metadata.topics[t].partitions]
        )
        seen: list[Seen] = []
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.consume(500, 0.2)
            now = time.monotonic()
            if batch:
                quiet_since = now
            for m in batch:
                if m.error() is not None:
                    continue
                pairs: list[tuple[str, bytes | None]] = [
                    (str(k), v.encode() if isinstance(v, str) else v)
                    for k, v in list(m.headers() or [])
                ]
                seen.append(
                    Seen(
                        topic=str(m.topic()),
                        partition=int(m.partition() or 0),
                        offset=int(m.offset() or 0),
                        key=(m.key() or b"").decode(),
                        record_id=header_value(pairs, HEADER_RECORD_ID),
                        headers={k: (v or b"").decode() for k, v in pairs},
                        value=m.value() or b"",
                    )
                )
            if len(seen) >= expected and now - quiet_since > 1.0:
                break
        return seen
    finally:
        consumer.close()
