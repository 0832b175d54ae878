"""Record signatures: every record on the project's topics is signed by its producer.

A signed record carries three headers: `recovery-producer` (the producer id in the
roster), `recovery-key-id` (which of its keys) and `recovery-signature` (base64 Ed25519).
The signature covers, in canonical JSON with a domain tag, the topic, the Kafka key,
the SHA-256 of the value, the headers a consumer acts on (`SIGNED_HEADERS`: content
type, schema, record id, command id) and the producer and key id themselves. So a
record cannot be moved to another topic or operation, re-keyed, altered, or have its
dedupe ids changed without the signature failing; trace headers stay outside, because
tracing rewrites them.

`RecordSigner.sign` returns the headers with the signature added; `verify_record`
proves them against a `machines.Roster` and returns the producer's roster entry, or
raises `machines.AuthenticationError` with a reason code.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import ProducerEntry, Roster, canonical_json, key_id
from schemas.headers import (
    CONTENT_TYPE,
    HEADER_COMMAND_ID,
    HEADER_RECORD_ID,
    HEADER_SCHEMA,
    header_value,
)

__all__ = [
    "HEADER_KEY_ID",
    "HEADER_PRODUCER",
    "HEADER_SIGNATURE",
    "RECORD_SIGNATURE_DOMAIN",
    "SIGNED_HEADERS",
    "RecordSigner",
    "record_signing_message",
    "verify_record",
]

HEADER_PRODUCER: Final = "recovery-producer"
HEADER_KEY_ID: Final = "recovery-key-id"
HEADER_SIGNATURE: Final = "recovery-signature"
RECORD_SIGNATURE_DOMAIN: Final = "agent-recovery/record/v1"
SIGNED_HEADERS: Final = (CONTENT_TYPE, HEADER_SCHEMA, HEADER_RECORD_ID, HEADER_COMMAND_ID)
_SIGNATURE_HEADERS: Final = frozenset({HEADER_PRODUCER, HEADER_KEY_ID, HEADER_SIGNATURE})

Header = tuple[str, bytes | None]


def record_signing_message(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
    producer: str,
    key_id: str,
) -> bytes:
    """The exact bytes a producer signs for one record."""
    return canonical_json(
        {
            "domain": RECORD_SIGNATURE_DOMAIN,
            "topic": topic,
            "key": None if key is None else base64.b64encode(key).decode("ascii"),
            "value_sha256": None if value is None else hashlib.sha256(value).hexdigest(),
            "headers": {name: header_value(headers, name) for name in SIGNED_HEADERS},
            "producer": producer,
            "key_id": key_id,
        }
    )


@dataclass(frozen=True, slots=True)
class RecordSigner:
    """A producer's identity and private key: signs the records it publishes."""

    producer: str
    private_key: Ed25519PrivateKey = field(repr=False)
    key_id: str = ""

    def __post_init__(self) -> None:
        if not self.key_id:
            object.__setattr__(self, "key_id", key_id(self.private_key.public_key()))

    def sign(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Sequence[Header]
    ) -> list[Header]:
        """`headers` without any earlier signature headers, plus this producer's."""
        kept = [(k, v) for k, v in headers if k not in _SIGNATURE_HEADERS]
        message = record_signing_message(topic, key, value, kept, self.producer, self.key_id)
        signature = base64.b64encode(self.private_key.sign(message))
        kept.append((HEADER_PRODUCER, self.producer.encode("utf-8")))
        kept.append((HEADER_KEY_ID, self.key_id.encode("ascii")))
        kept.append((HEADER_SIGNATURE, signature))
        return kept


def verify_record(
    roster: Roster,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
    *,
    at: datetime,
) -> ProducerEntry:
    """The roster entry of the producer that signed this record with a key valid at
    `at`; raises `machines.AuthenticationError` naming what failed."""
    producer = header_value(headers, HEADER_PRODUCER)
    key_name = header_value(headers, HEADER_KEY_ID)
    signature = header_value(headers, HEADER_SIGNATURE)
    message = b""
    if producer and key_name:
        unsigned = [(k, v) for k, v in headers if k not in _SIGNATURE_HEADERS]
        message = record_signing_message(topic, key, value, unsigned, producer, key_name)
    return roster.authenticate(producer, key_name, message, signature, at=at)
