"""The producer roster and record signatures: each refusal has its own code."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import (
    AuthenticationError,
    AuthRefusal,
    Grant,
    ProducerEntry,
    ProducerKey,
    Role,
    Roster,
    parse_policy,
    public_key_text,
)
from schemas import HEADER_SIGNATURE, RecordSigner, verify_record

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
TOPIC = "recovery.events"


def _entry(key: Ed25519PrivateKey, **key_fields: object) -> ProducerEntry:
    return ProducerEntry(
        id="tool.payments",
        keys=(ProducerKey(public_key=public_key_text(key.public_key()), **key_fields),),
        grants=(
            Grant(
                role=Role.TOOL,
                capabilities=("payment.refund",),
                tools=("*",),
                agents=("agent-a",),
            ),
        ),
    )


def _signed(
    key: Ed25519PrivateKey, producer: str = "tool.payments"
) -> list[tuple[str, bytes | None]]:
    headers: list[tuple[str, bytes | None]] = [("content-type", b"application/json")]
    return RecordSigner(producer, key).sign(TOPIC, b"op-1", b'{"x":1}', headers)


def _refusal(roster: Roster, headers: list[tuple[str, bytes | None]], **kw: object) -> AuthRefusal:
    args: dict[str, object] = {"topic": TOPIC, "key": b"op-1", "value": b'{"x":1}'} | kw
    with pytest.raises(AuthenticationError) as caught:
        verify_record(roster, args["topic"], args["key"], args["value"], headers, at=NOW)  # type: ignore[arg-type]
    return caught.value.code


def test_a_signed_record_verifies_to_its_producer() -> None:
    key = Ed25519PrivateKey.generate()
    roster = Roster(producers=(_entry(key),))
    entry = verify_record(roster, TOPIC, b"op-1", b'{"x":1}', _signed(key), at=NOW)
    assert entry.id == "tool.payments"


def test_every_failure_has_its_code() -> None:
    key = Ed25519PrivateKey.generate()
    roster = Roster(producers=(_entry(key),))
    assert (
        _refusal(roster, [("content-type", b"application/json")]) == AuthRefusal.SIGNATURE_MISSING
    )
    assert _refusal(roster, _signed(key, "someone-else")) == AuthRefusal.PRODUCER_UNKNOWN
    other = Ed25519PrivateKey.generate()
    assert _refusal(roster, _signed(other)) == AuthRefusal.KEY_UNKNOWN
    assert _refusal(roster, _signed(key), value=b'{"x":2}') == AuthRefusal.SIGNATURE_INVALID
    assert _refusal(roster, _signed(key), key=b"op-2") == AuthRefusal.SIGNATURE_INVALID
    assert (
        _refusal(roster, _signed(key), topic="recovery.commands") == AuthRefusal.SIGNATURE_INVALID
    )
    moved = [(k, v) for k, v in _signed(key) if k != "content-type"] + [("content-type", b"x")]
    assert _refusal(roster, moved) == AuthRefusal.SIGNATURE_INVALID
    garbled = [(k, b"***" if k == HEADER_SIGNATURE else v) for k, v in _signed(key)]
    assert _refusal(roster, garbled) == AuthRefusal.SIGNATURE_MALFORMED


def test_rotation_windows_and_revocation() -> None:
    key = Ed25519PrivateKey.generate()
    for fields, code in (
        ({"revoked": True}, AuthRefusal.KEY_REVOKED),
        ({"not_before": NOW + timedelta(days=1)}, AuthRefusal.KEY_NOT_YET_VALID),
        ({"not_after": NOW}, AuthRefusal.KEY_EXPIRED),
    ):
        roster = Roster(producers=(_entry(key, **fields),))
        assert _refusal(roster, _signed(key)) == code
    valid = Roster(
        producers=(
            _entry(key, not_before=NOW - timedelta(days=1), not_after=NOW + timedelta(days=1)),
        )
    )
    assert (
        verify_record(valid, TOPIC, b"op-1", b'{"x":1}', _signed(key), at=NOW).id == "tool.payments"
    )


def test_a_key_revoked_from_a_time_still_verifies_what_it_signed_before() -> None:
    # A compromised key is revoked from when it was compromised (`not_after`): a live
    # verifier, whose clock is past that, refuses it as revoked; a verifier of history
    # judging a record at its own, earlier time still accepts it.
    key = Ed25519PrivateKey.generate()
    roster = Roster(producers=(_entry(key, revoked=True, not_after=NOW),))
    assert _refusal(roster, _signed(key)) == AuthRefusal.KEY_REVOKED
    before = NOW - timedelta(seconds=1)
    assert verify_record(roster, TOPIC, b"op-1", b'{"x":1}', _signed(key), at=before).id
    for_good = Roster(producers=(_entry(key, revoked=True),))
    with pytest.raises(AuthenticationError) as caught:
        verify_record(for_good, TOPIC, b"op-1", b'{"x":1}', _signed(key), at=before)
    assert caught.value.code == AuthRefusal.KEY_REVOKED


def test_grants_permit_only_what_they_list() -> None:
    entry = _entry(Ed25519PrivateKey.generate())
    assert entry.permits(Role.TOOL, capability="payment.refund", agent="agent-a", tool="t")
    assert not entry.permits(Role.TOOL, capability="email.send", agent="agent-a")
    assert not entry.permits(Role.TOOL, capability="payment.refund", agent="agent-b")
    assert not entry.permits(Role.TOOL, capability="payment.refund", environment="prod")
    assert not entry.permits(Role.VERIFIER, capability="payment.refund")
    assert entry.permits(Role.TOOL, capability="payment.refund", tool=None)


def test_policy_holds_the_roster_and_refuses_duplicates() -> None:
    key = public_key_text(Ed25519PrivateKey.generate().public_key())
    producer = {"id": "p", "keys": [{"public_key": key}], "grants": [{"role": "tool"}]}
    policy = parse_policy({"id": "x", "producers": [producer]})
    assert policy.roster.producer("p") is not None
    # Rotating or revoking keys must not change what decisions are bound to.
    assert parse_policy({"id": "x"}).digest == policy.digest
    with pytest.raises(ValueError, match="listed twice"):
        parse_policy({"id": "x", "producers": [producer, producer]})
    with pytest.raises(ValueError, match="32"):
        parse_policy({"id": "x", "producers": [{**producer, "keys": [{"public_key": "AAAA"}]}]})


def test_a_producer_key_derived_from_a_public_name_is_found() -> None:
    from machines import insecure_test_key, public_name_keys

    derived = public_key_text(insecure_test_key("tool.payments").public_key())
    real = public_key_text(Ed25519PrivateKey.generate().public_key())
    producers = [
        {"id": "tool.payments", "keys": [{"public_key": derived}], "grants": [{"role": "tool"}]},
        {"id": "tool.mail", "keys": [{"public_key": real}], "grants": [{"role": "tool"}]},
    ]
    found = public_name_keys(parse_policy({"id": "x", "producers": producers}))
    assert [k.holder for k in found] == ["producers[tool.payments]"]
