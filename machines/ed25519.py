"""Ed25519 signing and verification for every signer and verifier of the project.

libsodium (through PyNaCl) does the arithmetic: on the benchmark machine it signs in
about 22 µs and verifies in 57 µs where OpenSSL (through `cryptography`) takes 38-46
and 113-122, and the controller verifies every consumed record and signs every outbox
row (docs/PERFORMANCE.md). Ed25519 is deterministic (RFC 8032), so the signatures are
byte-identical to the ones `cryptography` makes and either library verifies the other's.
Keys stay `cryptography` objects, read, written and named by `machines.keys`; this
module only turns them into the bytes libsodium wants, once per key.

libsodium's verification is the stricter of the two: it also refuses signatures under
small-order (weak) public keys, which no honest key is. A refusal is `False` here, for
a wrong-length signature or key as for a signature that does not match, as
`cryptography` raised `InvalidSignature` for all of them.
"""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from nacl.bindings import crypto_sign, crypto_sign_open, crypto_sign_seed_keypair
from nacl.exceptions import BadSignatureError

from machines.keys import raw_public_key

__all__ = ["SIGNATURE_BYTES", "sign", "verify"]

SIGNATURE_BYTES = 64
_PUBLIC_BYTES = 32

# id(key) -> (key, libsodium's 64-byte secret key). Holding the key keeps its id from
# being reused while the entry lives; signers are few (one per process and producer).
_SECRETS: dict[int, tuple[Ed25519PrivateKey, bytes]] = {}


def _secret(private_key: Ed25519PrivateKey) -> bytes:
    found = _SECRETS.get(id(private_key))
    if found is not None and found[0] is private_key:
        return found[1]
    seed = private_key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    _public, secret = crypto_sign_seed_keypair(seed)
    if len(_SECRETS) >= 64:
        _SECRETS.clear()
    _SECRETS[id(private_key)] = (private_key, secret)
    return secret


def sign(private_key: Ed25519PrivateKey, message: bytes) -> bytes:
    """The 64-byte Ed25519 signature of `message` by `private_key` (RFC 8032; the same
    bytes `private_key.sign(message)` returns)."""
    return crypto_sign(message, _secret(private_key))[:SIGNATURE_BYTES]


def verify(public_key: Ed25519PublicKey | bytes, signature: bytes, message: bytes) -> bool:
    """Whether `signature` is a valid Ed25519 signature of `message` under
    `public_key` (an object or its 32 raw bytes). False, never an exception, for a
    signature or key of the wrong length."""
    if isinstance(public_key, Ed25519PublicKey):
        public_key = raw_public_key(public_key)
    if len(signature) != SIGNATURE_BYTES or len(public_key) != _PUBLIC_BYTES:
        return False
    try:
        crypto_sign_open(signature + message, public_key)
    except BadSignatureError:
        return False
    return True
