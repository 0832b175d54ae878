"""Signing and verifying chain-heads records (issue 15)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.audit import ChainHead
from ledger.signing import sign_heads, verify_heads
from machines import KeyFileError, key_id
from machines import load_private_key as load_signing_key

HEADS = {"op-2": ChainHead(4, "sha256:" + "b" * 64), "op-1": ChainHead(3, "sha256:" + "a" * 64)}


def _seed_file(tmp_path: Path, key: Ed25519PrivateKey) -> Path:
    raw = key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    path = tmp_path / "key.b64"
    path.write_text(base64.b64encode(raw).decode() + "\n")
    path.chmod(0o600)  # a key file readable by others is refused
    return path


def test_a_signed_record_verifies_and_lists_heads_in_id_order(tmp_path: Path) -> None:
    key = load_signing_key(_seed_file(tmp_path, Ed25519PrivateKey.generate()))
    record = sign_heads(key, HEADS)
    assert [h["operation_id"] for h in record["heads"]] == ["op-1", "op-2"]
    assert record["key_id"] == key_id(key.public_key())
    assert verify_heads(key.public_key(), record) is None


def test_pem_and_base64_files_load_the_same_key(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "key.pem"
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    pem.chmod(0o600)
    assert key_id(load_signing_key(pem).public_key()) == key_id(
        load_signing_key(_seed_file(tmp_path, key)).public_key()
    )


def test_an_altered_head_an_unsigned_record_and_another_key_are_refused() -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    record = sign_heads(key, HEADS)
    altered = {**record, "heads": [{**record["heads"][0], "sequence": 2}, record["heads"][1]]}
    assert verify_heads(key.public_key(), altered) == "bad signature"
    unsigned = {k: v for k, v in record.items() if k != "signature"}
    assert verify_heads(key.public_key(), unsigned) == "unsigned"
    forged = sign_heads(other, HEADS)
    reason = verify_heads(key.public_key(), forged)
    assert reason is not None
    assert "not the controller key" in reason


def test_a_missing_or_malformed_key_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot be read"):
        load_signing_key(tmp_path / "absent")
    bad = tmp_path / "bad"
    bad.write_text("c2hvcnQ=\n")
    bad.chmod(0o600)
    with pytest.raises(KeyFileError, match="decodes to 5 bytes"):
        load_signing_key(bad)


def test_recoveryctl_audit_key_prints_the_key_id_and_public_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ops.cli import main

    key = Ed25519PrivateKey.generate()
    path = _seed_file(tmp_path, key)
    assert main(["audit", "key", "--key-file", str(path)]) == 0
    assert capsys.readouterr().out.split()[0] == key_id(key.public_key())
    assert main(["audit", "key", "--key-file", str(tmp_path / "absent")]) == 2
    assert "absent" in capsys.readouterr().err
