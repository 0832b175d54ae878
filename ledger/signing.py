"""A detached signature of audit chain heads, for heads kept off Kafka.

The controller's key is read by `machines.load_private_key` (the one key reader). What
`recovery.audit` carries is the per-batch `chain-heads` record (`ledger.records.
heads_row`), authenticated by its record signature (`schemas.RecordSigner`, the same
key). `sign_heads` is the self-contained form, for a heads document stored or sent
elsewhere: it signs the canonical JSON of the record without its `signature`, and
`verify_heads` checks it against the controller's public key.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from ledger.audit import ChainHead
from ledger.jsonutil import dumps
from machines import ed25519_sign, ed25519_verify, key_id

__all__ = ["HEADS_KIND", "sign_heads", "verify_heads"]

HEADS_KIND = "chain-heads"


def sign_heads(key: Ed25519PrivateKey, heads: Mapping[str, ChainHead]) -> dict[str, Any]:
    """The signed chain-heads record of `heads` (operation id -> head), sorted by id."""
    record: dict[str, Any] = {
        "kind": HEADS_KIND,
        "key_id": key_id(key.public_key()),
        "heads": [
            {"operation_id": op, "sequence": h.sequence, "hash": h.hash}
            for op, h in sorted(heads.items())
        ],
    }
    signature = ed25519_sign(key, dumps(record).encode("utf-8"))
    record["signature"] = base64.b64encode(signature).decode("ascii")
    return record


def verify_heads(public: Ed25519PublicKey, record: Mapping[str, Any]) -> str | None:
    """None when `record` is a chain-heads record signed by `public`; else the reason."""
    if record.get("kind") != HEADS_KIND:
        return f"not a {HEADS_KIND} record"
    signature = record.get("signature")
    if not isinstance(signature, str):
        return "unsigned"
    if record.get("key_id") != key_id(public):
        return f"signed by key {record.get('key_id')}, not the controller key {key_id(public)}"
    body = {k: v for k, v in record.items() if k != "signature"}
    try:
        raw = base64.b64decode(signature)
    except (binascii.Error, ValueError):
        return "bad signature"
    if not ed25519_verify(public, raw, dumps(body).encode("utf-8")):
        return "bad signature"
    return None
