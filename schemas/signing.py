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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import ProducerEntry, Roster, canonical_json, ed25519_sign, key_id, load_private_key
from schemas.headers import (
    CONTENT_TYPE,
    HEADER_COMMAND_ID,
    HEADER_RECORD_ID,
    HEADER_SCHEMA,
    header_value,
)
from schemas.settings import (
    ENV_PRODUCER_ID,
    ENV_PRODUCER_KEY_FILE,
    ConfigurationError,
    IdentitySettings,
)

__all__ = [
    "HEADER_KEY_ID",
    "HEADER_PRODUCER",
    "HEADER_SIGNATURE",
    "RECORD_SIGNATURE_DOMAIN",
    "SIGNED_HEADERS",
    "RecordSigner",
    "SignerSettingMissing",
    "record_signing_message",
    "signer_from_env",
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
        signature = base64.b64encode(ed25519_sign(self.private_key, message))
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


class SignerSettingMissing(ConfigurationError):
    """`RECOVERY_PRODUCER_ID` or `RECOVERY_PRODUCER_KEY_FILE` is not set; the message
    says which and how to make a key."""


def signer_from_env(environ: Mapping[str, str] | None = None) -> RecordSigner:
    """The producer's signer from `RECOVERY_PRODUCER_ID` and `RECOVERY_PRODUCER_KEY_FILE`
    (`IdentitySettings`; a PEM or base64-seed Ed25519 key file). Raises
    `SignerSettingMissing` when either is unset and `machines.KeyFileError` when the file
    is unusable."""
    identity = IdentitySettings.load(environ)
    producer, path = identity.producer_id, identity.producer_key_file
    missing = [n for n, v in ((ENV_PRODUCER_ID, producer), (ENV_PRODUCER_KEY_FILE, path)) if not v]
    if producer is None or path is None:
        raise SignerSettingMissing(
            f"{' and '.join(missing)} not set: every record must be signed by its producer; "
            f"set {ENV_PRODUCER_ID} to the producer's roster id and {ENV_PRODUCER_KEY_FILE} to "
            "its Ed25519 key file (`recoveryctl keys generate --out FILE`), or pass a "
            "RecordSigner"
        )
    return RecordSigner(producer, load_private_key(path, setting=ENV_PRODUCER_KEY_FILE))
