"""Ed25519 signing of audit chain heads (issue 15: keyed and anchored outside the DB).

The controller's signing key lives in a file (PEM, PKCS#8, or the raw 32-byte seed in
base64), named by `RECOVERY_CONTROLLER_SIGNING_KEY_FILE`, never in the database. A
"chain-heads" record names, for each operation a batch touched, its newest audit
sequence and hash; `sign_heads` signs the canonical JSON of the record without its
`signature`, and `verify_heads` checks it against the controller's public key. Not yet
wired into the commit path or `audit verify --against-topic`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from ledger.audit import ChainHead
from ledger.jsonutil import dumps

__all__ = [
    "HEADS_KIND",
    "SigningKeyError",
    "key_id",
    "load_signing_key",
    "public_key_text",
    "sign_heads",
    "verify_heads",
]

HEADS_KIND = "chain-heads"


class SigningKeyError(ValueError):
    """The signing key file is missing or not an Ed25519 key; the message names it."""


def load_signing_key(path: str | Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in `path`: PEM (PKCS#8) or the base64 of its raw seed."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SigningKeyError(
            f"signing key file {path} cannot be read ({exc.strerror}): set "
            "RECOVERY_CONTROLLER_SIGNING_KEY_FILE to the controller's Ed25519 key file"
        ) from exc
    if data.lstrip().startswith(b"-----BEGIN"):
        key = serialization.load_pem_private_key(data, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise SigningKeyError(f"signing key file {path} holds a key that is not Ed25519")
        return key
    try:
        seed = base64.b64decode(data.strip(), validate=True)
    except binascii.Error as exc:
        raise SigningKeyError(f"signing key file {path} is neither PEM nor base64") from exc
    if len(seed) != 32:
        raise SigningKeyError(
            f"signing key file {path} decodes to {len(seed)} bytes; an Ed25519 seed is 32"
        )
    return Ed25519PrivateKey.from_private_bytes(seed)


def _raw_public(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    """`ed25519:` and the first 16 hex digits of the SHA-256 of the raw public key."""
    return "ed25519:" + hashlib.sha256(_raw_public(public)).hexdigest()[:16]


def public_key_text(public: Ed25519PublicKey) -> str:
    """The public key as base64 of its 32 raw bytes (what `audit verify` is given)."""
    return base64.b64encode(_raw_public(public)).decode("ascii")


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
    signature = key.sign(dumps(record).encode("utf-8"))
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
        public.verify(base64.b64decode(signature), dumps(body).encode("utf-8"))
    except (InvalidSignature, binascii.Error, ValueError):
        return "bad signature"
    return None
