"""Every outbox row the controller writes is signed when the commit builds it, and the
relay's encoding of it verifies against the controller's key (the in-memory ledger; the
PostgreSQL twin is tests/integration/ledger/test_signed_outbox.py)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import MemoryLedger
from machines import AuthenticationError, AuthRefusal
from schemas import DEFAULT_TOPICS, verify_record
from tests.support.signed_outbox import (
    CONTROLLER_ID,
    SIGNED_AT,
    controller_roster,
    drive_signed,
    published,
    signer_for,
)


def test_every_row_the_relay_publishes_verifies_as_the_controllers() -> None:
    key = Ed25519PrivateKey.generate()
    ledger = MemoryLedger()
    drive_signed(ledger, signer_for(key))
    records = published(ledger)
    topics = {encoded.topic for _, encoded, _ in records}
    assert {DEFAULT_TOPICS.commands, DEFAULT_TOPICS.audit, DEFAULT_TOPICS.dlq} <= topics
    roster = controller_roster(key)
    for _, encoded, headers in records:
        entry = verify_record(
            roster, encoded.topic, encoded.key.encode(), encoded.value, headers, at=SIGNED_AT
        )
        assert entry.id == CONTROLLER_ID


def test_a_byte_changed_by_the_relay_or_another_key_fails_verification() -> None:
    key = Ed25519PrivateKey.generate()
    ledger = MemoryLedger()
    drive_signed(ledger, signer_for(key))
    _, encoded, headers = next(r for r in published(ledger) if r[1].topic.endswith("commands"))
    roster = controller_roster(key)
    tampered = encoded.value[:-1] + bytes([encoded.value[-1] ^ 1])
    with pytest.raises(AuthenticationError) as caught:
        verify_record(roster, encoded.topic, encoded.key.encode(), tampered, headers, at=SIGNED_AT)
    assert caught.value.code == AuthRefusal.SIGNATURE_INVALID
    other = controller_roster(Ed25519PrivateKey.generate())
    with pytest.raises(AuthenticationError) as caught:
        verify_record(
            other, encoded.topic, encoded.key.encode(), encoded.value, headers, at=SIGNED_AT
        )
    assert caught.value.code == AuthRefusal.KEY_UNKNOWN


def test_an_unsigned_batch_writes_unsigned_rows() -> None:
    ledger = MemoryLedger()
    drive_signed(ledger, None)  # type: ignore[arg-type]
    for row, _, _ in published(ledger):
        assert "signature" not in row.headers
