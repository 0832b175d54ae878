"""Ed25519 key files and key ids, shared by every signer and verifier of the project.

A private key file holds PEM (PKCS#8, unencrypted) or the base64 of the raw 32-byte
seed; it is written with mode 0600 and never stored in the database. A public key is
written as the base64 of its 32 raw bytes, and named by its key id: `ed25519:` and the
first 16 hex digits of the SHA-256 of the raw bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from functools import lru_cache
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "KeyFileError",
    "key_id",
    "key_id_of_text",
    "load_private_key",
    "public_key_bytes",
    "public_key_from_text",
    "public_key_text",
    "raw_public_key",
    "write_private_key",
]


class KeyFileError(ValueError):
    """A key file is missing, unreadable or not an Ed25519 key; the message names it."""


def raw_public_key(public: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of `public` (what libsodium and key ids are computed over)."""
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    """`ed25519:` and the first 16 hex digits of the SHA-256 of the raw public key."""
    return "ed25519:" + hashlib.sha256(raw_public_key(public)).hexdigest()[:16]


def public_key_text(public: Ed25519PublicKey) -> str:
    """The public key as the base64 of its 32 raw bytes (the form rosters store)."""
    return base64.b64encode(raw_public_key(public)).decode("ascii")


@lru_cache(maxsize=4096)
def public_key_from_text(text: str) -> Ed25519PublicKey:
    """The public key whose base64 raw form is `text`; raises `KeyFileError` otherwise.
    Cached: rosters are small and immutable, and decoding costs more than a lookup."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyFileError(f"public key {text!r} is not base64") from exc
    if len(raw) != 32:
        raise KeyFileError(f"public key {text!r} decodes to {len(raw)} bytes, not 32")
    return Ed25519PublicKey.from_public_bytes(raw)


@lru_cache(maxsize=4096)
def public_key_bytes(text: str) -> bytes:
    """The 32 raw bytes of the base64 public key `text` (what `machines.ed25519.verify`
    takes); raises `KeyFileError` as `public_key_from_text` does. Cached likewise."""
    return raw_public_key(public_key_from_text(text))


def key_id_of_text(text: str) -> str:
    """The key id of the base64 raw public key `text`."""
    return key_id(public_key_from_text(text))


def load_private_key(path: str | Path, *, setting: str = "") -> Ed25519PrivateKey:
    """The Ed25519 private key in `path`: PEM (PKCS#8) or the base64 of its raw seed.
    `setting` names the variable or option that gave the path, for the error message."""
    hint = f" (from {setting})" if setting else ""
    try:
        data = Path(path).read_bytes()
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError as exc:
        raise KeyFileError(
            f"key file {path}{hint} cannot be read ({exc.strerror}); create one with "
            "`recoveryctl keys generate --out FILE`"
        ) from exc
    if mode & 0o077:
        # Anyone who can read the file can sign as its holder: refuse to use it.
        raise KeyFileError(
            f"key file {path}{hint} is readable by {_who(mode)} (mode {mode:04o}); anyone "
            f"on this host who can read it can sign as its holder: `chmod 600 {path}` (and "
            "replace the key if others may have read it)"
        )
    if data.lstrip().startswith(b"-----BEGIN"):
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise KeyFileError(f"key file {path}{hint} is not an unencrypted PEM key") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"key file {path}{hint} holds a key that is not Ed25519")
        return key
    try:
        seed = base64.b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyFileError(f"key file {path}{hint} is neither PEM nor base64") from exc
    if len(seed) != 32:
        raise KeyFileError(
            f"key file {path}{hint} decodes to {len(seed)} bytes; an Ed25519 seed is 32"
        )
    return Ed25519PrivateKey.from_private_bytes(seed)


def _who(mode: int) -> str:
    """`group`, `others` or `group and others`, for a mode with bits in 0o077."""
    who = [name for name, bits in (("group", 0o070), ("others", 0o007)) if mode & bits]
    return " and ".join(who)


def write_private_key(path: str | Path, key: Ed25519PrivateKey) -> None:
    """Write `key` to `path` as PEM (PKCS#8), created with mode 0600; refuses to
    overwrite an existing file (`FileExistsError`)."""
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
