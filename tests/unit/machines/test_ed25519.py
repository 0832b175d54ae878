"""libsodium's Ed25519 (machines.ed25519) against OpenSSL's (cryptography): same
signatures, each verifies the other's, and every refusal stays a refusal."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given
from hypothesis import strategies as st

from machines import (
    AuthenticationError,
    AuthRefusal,
    Grant,
    ProducerEntry,
    ProducerKey,
    Role,
    Roster,
    ed25519_sign,
    ed25519_verify,
    public_key_text,
)
from schemas import (
    HEADER_KEY_ID,
    HEADER_PRODUCER,
    HEADER_SIGNATURE,
    RecordSigner,
    record_signing_message,
    verify_record,
)

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)

# RFC 8032 §7.1, TEST 2 (one-byte message 0x72).
RFC_SEED = bytes.fromhex("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb")
RFC_PUBLIC = bytes.fromhex("3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c")
RFC_SIGNATURE = bytes.fromhex(
    "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
    "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"
)


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


def test_the_rfc_8032_vector_signs_and_verifies() -> None:
    key = Ed25519PrivateKey.from_private_bytes(RFC_SEED)
    assert _raw(key.public_key()) == RFC_PUBLIC
    assert ed25519_sign(key, b"\x72") == RFC_SIGNATURE
    assert ed25519_verify(RFC_PUBLIC, RFC_SIGNATURE, b"\x72")
    assert ed25519_verify(key.public_key(), RFC_SIGNATURE, b"\x72")
    assert not ed25519_verify(RFC_PUBLIC, RFC_SIGNATURE, b"\x73")


@given(seed=st.binary(min_size=32, max_size=32), message=st.binary(max_size=2048))
def test_libsodium_and_openssl_make_the_same_signature(seed: bytes, message: bytes) -> None:
    key = Ed25519PrivateKey.from_private_bytes(seed)
    ours = ed25519_sign(key, message)
    assert ours == key.sign(message)
    key.public_key().verify(ours, message)  # OpenSSL accepts libsodium's signature
    assert ed25519_verify(_raw(key.public_key()), key.sign(message), message)


@given(
    seed=st.binary(min_size=32, max_size=32),
    message=st.binary(min_size=1, max_size=512),
    data=st.data(),
)
def test_a_flipped_bit_fails_in_both_libraries(
    seed: bytes, message: bytes, data: st.DataObject
) -> None:
    key = Ed25519PrivateKey.from_private_bytes(seed)
    public = key.public_key()
    signature = ed25519_sign(key, message)
    in_message = data.draw(st.integers(0, len(message) * 8 - 1))
    altered = bytearray(message)
    altered[in_message // 8] ^= 1 << (in_message % 8)
    in_signature = data.draw(st.integers(0, 511))
    forged = bytearray(signature)
    forged[in_signature // 8] ^= 1 << (in_signature % 8)
    for sig, msg in ((signature, bytes(altered)), (bytes(forged), message)):
        assert not ed25519_verify(public, sig, msg)
        with pytest.raises(InvalidSignature):
            public.verify(sig, msg)


def test_wrong_lengths_are_refusals_not_errors() -> None:
    key = Ed25519PrivateKey.generate()
    public = _raw(key.public_key())
    signature = ed25519_sign(key, b"m")
    assert not ed25519_verify(public, signature[:63], b"m")
    assert not ed25519_verify(public, signature + b"\x00", b"m")
    assert not ed25519_verify(public, b"", b"m")
    assert not ed25519_verify(public[:31], signature, b"m")
    assert not ed25519_verify(public + b"\x00", signature, b"m")


def test_many_keys_each_sign_with_their_own_secret() -> None:
    # More keys than the secret cache holds (it clears and refills), each dropped after
    # use: every signature must still be by its own key.
    for _ in range(200):
        key = Ed25519PrivateKey.generate()
        assert ed25519_sign(key, b"record") == key.sign(b"record")


def _roster(key: Ed25519PrivateKey) -> Roster:
    grant = Grant(role=Role.TOOL, capabilities=("*",), tools=("*",), agents=("*",))
    key_entry = ProducerKey(public_key=public_key_text(key.public_key()))
    return Roster(producers=(ProducerEntry(id="tool.t", keys=(key_entry,), grants=(grant,)),))


def _code(roster: Roster, headers: list[tuple[str, bytes | None]]) -> AuthRefusal:
    with pytest.raises(AuthenticationError) as caught:
        verify_record(roster, "recovery.events", b"op-1", b"{}", headers, at=NOW)
    return caught.value.code


@pytest.mark.parametrize(
    ("signature", "code"),
    [
        (base64.b64encode(b"\x01" * 10), AuthRefusal.SIGNATURE_INVALID),
        (base64.b64encode(b"\x01" * 65), AuthRefusal.SIGNATURE_INVALID),
        (b"", AuthRefusal.SIGNATURE_MISSING),
        (b"not base64!", AuthRefusal.SIGNATURE_MALFORMED),
    ],
)
def test_a_malformed_signature_keeps_its_refusal_code(signature: bytes, code: AuthRefusal) -> None:
    key = Ed25519PrivateKey.generate()
    headers = RecordSigner("tool.t", key).sign("recovery.events", b"op-1", b"{}", [])
    swapped = [(k, signature if k == HEADER_SIGNATURE else v) for k, v in headers]
    assert _code(_roster(key), swapped) == code


def test_a_record_signed_by_openssl_verifies_at_intake() -> None:
    # Records already on the topic were signed by cryptography; they still verify, and
    # the headers libsodium writes for the same record are the same bytes.
    key = Ed25519PrivateKey.generate()
    signer = RecordSigner("tool.t", key)
    message = record_signing_message("recovery.events", b"op-1", b"{}", [], "tool.t", signer.key_id)
    headers: list[tuple[str, bytes | None]] = [
        (HEADER_PRODUCER, b"tool.t"),
        (HEADER_KEY_ID, signer.key_id.encode("ascii")),
        (HEADER_SIGNATURE, base64.b64encode(key.sign(message))),
    ]
    entry = verify_record(_roster(key), "recovery.events", b"op-1", b"{}", headers, at=NOW)
    assert entry.id == "tool.t"
    assert signer.sign("recovery.events", b"op-1", b"{}", []) == headers
