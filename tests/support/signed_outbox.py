"""Drive a ledger with batches the controller signs, and check what the relay would
publish from its outbox against the controller's key (shared by the in-memory unit test
and the PostgreSQL integration test, so both ledgers are held to the same bytes)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumer import RawRecord, Refusal, dead_letter
from ledger import Ledger, OutboxRecord
from machines import Grant, Lineage, ProducerEntry, ProducerKey, Role, Roster, public_key_text
from producers.encoding import EncodedRecord, RecordEncoder
from schemas import (
    CONTENT_TYPE,
    DEFAULT_TOPICS,
    HEADER_RECORD_ID,
    HEADER_SCHEMA,
    OutboxSigner,
    RecordSigner,
)
from tests.unit.ledger.ledger_support import GROUP, TOPIC, decide_batch, event, sequence

SIGNED_AT = datetime(2026, 11, 30, 12, 30, tzinfo=UTC)
CONTROLLER_ID = "recovery-controller"

Headers = list[tuple[str, bytes | None]]


def controller_roster(key: Ed25519PrivateKey, producer: str = CONTROLLER_ID) -> Roster:
    """A roster naming `key` as the controller's."""
    return Roster(
        producers=(
            ProducerEntry(
                id=producer,
                keys=(ProducerKey(public_key=public_key_text(key.public_key())),),
                grants=(Grant(role=Role.CONTROLLER, capabilities=("*",)),),
            ),
        )
    )


def signer_for(key: Ed25519PrivateKey) -> OutboxSigner:
    """The controller's row signer with a fixed signing time (the ledgers compare equal)."""
    return OutboxSigner(RecordSigner(CONTROLLER_ID, key), DEFAULT_TOPICS, clock=lambda: SIGNED_AT)


def drive_signed(ledger: Ledger, sign: OutboxSigner) -> None:
    """Commands on an opened and on a continued operation, audit records, and a dead
    letter with its intake audit record, all signed."""
    epoch = ledger.claim(GROUP, TOPIC, [0], "controller-a")[0].epoch
    first = replace(decide_batch(ledger, sequence("op-1")[:1], epoch=epoch), sign=sign)
    garbage = RawRecord(TOPIC, 0, 1, b"op-x", b"\x00garbage", (), 1_700_000_000_000)
    refusal = Refusal("undecodable", "not an envelope")
    letter = dead_letter(GROUP, "controller-a", garbage, refusal, SIGNED_AT)
    ledger.commit(replace(first, dead_letters=(letter,), positions=_moved(first, 2)))
    # op-1 continues (a command row for an operation opened in an earlier batch).
    rest = sequence("op-1")[1:]
    later = decide_batch(ledger, rest, epoch=epoch, first_offset=2)
    ledger.commit(replace(later, sign=sign))


def _moved(batch: object, next_offset: int) -> tuple[object, ...]:
    (position,) = batch.positions  # type: ignore[attr-defined]
    return (replace(position, next_offset=next_offset),)


def no_lookup(operation_id: str) -> Lineage:
    raise AssertionError(f"a signed command row carries its own lineage ({operation_id})")


def published(ledger: Ledger) -> list[tuple[OutboxRecord, EncodedRecord, Headers]]:
    """Every unpublished outbox row as the relay would encode and send it."""
    encoder = RecordEncoder(DEFAULT_TOPICS, no_lookup)
    with ledger.lease_outbox(1000) as lease:
        rows = list(lease.records)
    out = []
    for row in rows:
        encoded = encoder.encode(row)
        headers: Headers = [
            (CONTENT_TYPE, encoded.content_type.encode()),
            (HEADER_RECORD_ID, encoded.record_id.encode()),
        ]
        if encoded.fingerprint is not None:
            headers.append((HEADER_SCHEMA, encoded.fingerprint.encode()))
        headers.extend((k, v.encode()) for k, v in encoded.headers.items())
        out.append((row, encoded, headers))
    return out


__all__ = [
    "CONTROLLER_ID",
    "SIGNED_AT",
    "controller_roster",
    "drive_signed",
    "event",
    "published",
    "signer_for",
]
