"""PostgreSQL stores the controller's signatures with the rows, and what its relay lease
reads back (audit rows joined from their records, commands with the lineage the commit
read under the lock) encodes to exactly the bytes the controller signed: the same rows,
headers and signatures as the in-memory ledger writes."""

from __future__ import annotations

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import MemoryLedger, PostgresLedger
from schemas import DEFAULT_TOPICS, verify_record
from tests.support.signed_outbox import (
    CONTROLLER_ID,
    SIGNED_AT,
    controller_roster,
    drive_signed,
    published,
    signer_for,
)

pytestmark = pytest.mark.integration


def test_postgres_rows_verify_and_match_the_memory_ledgers(database_url: str) -> None:
    key = Ed25519PrivateKey.generate()
    memory, postgres = MemoryLedger(), PostgresLedger(database_url)
    try:
        drive_signed(memory, signer_for(key))
        drive_signed(postgres, signer_for(key))
        expected, actual = published(memory), published(postgres)
    finally:
        postgres.close()
    assert [(e.record_id, e.value, h) for _, e, h in actual] == [
        (e.record_id, e.value, h) for _, e, h in expected
    ]
    roster = controller_roster(key)
    topics = set()
    for _, encoded, headers in actual:
        entry = verify_record(
            roster, encoded.topic, encoded.key.encode(), encoded.value, headers, at=SIGNED_AT
        )
        assert entry.id == CONTROLLER_ID
        topics.add(encoded.topic)
    assert {DEFAULT_TOPICS.commands, DEFAULT_TOPICS.audit, DEFAULT_TOPICS.dlq} <= topics


def test_rows_without_their_signed_value_publish_the_same_records(database_url: str) -> None:
    # A row written before migration 0012 has no `value`: the relay encodes its payload
    # (an audit row's joined record), which must give the bytes the controller signed.
    key = Ed25519PrivateKey.generate()
    postgres = PostgresLedger(database_url)
    try:
        drive_signed(postgres, signer_for(key))
        stored = published(postgres)
        with psycopg.connect(database_url) as conn:
            conn.execute("UPDATE outbox SET value = NULL WHERE published_at IS NULL")
        encoded = published(postgres)
    finally:
        postgres.close()
    assert all(row.value is not None for row, _, _ in stored)
    assert all(row.value is None for row, _, _ in encoded)
    assert [(e.record_id, e.topic, e.value, h) for _, e, h in encoded] == [
        (e.record_id, e.topic, e.value, h) for _, e, h in stored
    ]


def test_a_signed_row_is_leased_and_marked_without_its_payload_or_audit_record(
    database_url: str,
) -> None:
    # The lease publishes a row's signed value as it is: neither its payload nor an
    # audit row's record is read (or parsed), and the mark by primary key marks exactly
    # the rows the lease acknowledged.
    key = Ed25519PrivateKey.generate()
    postgres = PostgresLedger(database_url)
    try:
        drive_signed(postgres, signer_for(key))
        expected = published(postgres)
        with psycopg.connect(database_url) as conn:
            conn.execute(
                "UPDATE outbox SET payload = convert_to('not json', 'UTF8') "
                "WHERE published_at IS NULL AND payload IS NOT NULL"
            )
            # An audit row whose record would not build: the lease must not look it up.
            conn.execute(
                "UPDATE outbox SET audit_sequence = audit_sequence + 1000 "
                "WHERE published_at IS NULL AND audit_sequence IS NOT NULL"
            )
        with postgres.lease_outbox(1000, payloads=False) as lease:
            records = list(lease.records)
            first, rest = records[0], records[1:]
            lease.mark_published([first.record_id])
        with postgres.lease_outbox(1000, payloads=False) as lease:
            left = [r.record_id for r in lease.records]
    finally:
        postgres.close()
    assert [(r.record_id, r.value) for r in records] == [
        (row.record_id, row.value) for row, _, _ in expected
    ]
    assert all(r.payload == {} for r in records)
    assert left == [r.record_id for r in rest]
