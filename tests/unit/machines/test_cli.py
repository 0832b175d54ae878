"""`recoveryctl validate` and `recoveryctl machines lock|sign|verify|keygen`, run through the
real argument parser: exit codes 0/1/2, human and JSON output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from machines import CATALOGUE
from ops.cli import main

INVALID = Path(__file__).parent / "invalid"


def test_validate_catalogue_exits_zero_and_prints_each_digest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["validate", str(CATALOGUE / "procurement-request"), str(CATALOGUE / "email-send")])
        == 0
    )
    out = capsys.readouterr().out
    assert out.count(": valid ") == 2
    assert "procurement-request@1.0.0 sha256:" in out


def test_validate_invalid_machine_exits_one_and_lists_code_location_and_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = INVALID / "48-guard-unknown.yaml"
    assert main(["validate", str(CATALOGUE / "email-send"), str(path)]) == 1
    out = capsys.readouterr().out
    assert "INVALID (1 error)" in out
    assert "guard-unknown" in out
    assert "states.escalated.on.HUMAN_APPROVED[0].guard" in out
    assert "hint:" in out


def test_validate_json_prints_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    path = INVALID / "48-guard-unknown.yaml"
    assert main(["validate", "--json", str(CATALOGUE / "payment-refund"), str(path)]) == 1
    results = json.loads(capsys.readouterr().out)
    assert [set(r) for r in results] == [
        {"path", "valid", "name", "version", "digest", "errors", "warnings"}
    ] * 2
    good, bad = results
    assert good["valid"] is True
    assert good["digest"].startswith("sha256:")
    assert bad["valid"] is False
    assert bad["digest"] is None
    (error,) = bad["errors"]
    assert {"code", "message", "location"} <= set(error)
    assert error["code"] == "guard-unknown"
    assert error["location"]["state"] == "escalated"
    assert error["location"]["event"] == "HUMAN_APPROVED"
    assert error["location"]["transition"] == 0
    assert error["location"]["field"] == "guard"


def test_validate_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    assert main(["validate", str(tmp_path / "absent")]) == 2


def test_validate_with_broken_registry_is_a_usage_error(tmp_path: Path) -> None:
    registry = tmp_path / "registry.yaml"
    registry.write_text("registry_version: 1\n")
    assert main(["validate", "--registry", str(registry), str(CATALOGUE / "email-send")]) == 2


def test_validate_without_paths_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as caught:
        main(["validate"])
    assert caught.value.code == 2


def test_keygen_lock_sign_verify_round_trip_then_tampering_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = tmp_path / "payment-refund"
    shutil.copytree(CATALOGUE / "payment-refund", package)
    (package / "RECOVERY.sig").unlink()
    key, lock, trust = tmp_path / "key.pem", tmp_path / "machines.lock", tmp_path / "trust.yaml"

    assert main(["machines", "keygen", "--out", str(key), "--json"]) == 0
    public = json.loads(capsys.readouterr().out)["public_key"]
    assert key.stat().st_mode & 0o077 == 0
    trust.write_text(f"publishers:\n  acme:\n    keys: ['{public}']\n")

    assert main(["machines", "lock", str(package), "--lock", str(lock), "--publisher", "acme"]) == 0
    assert main(["machines", "sign", str(package), "--key", str(key), "--publisher", "acme"]) == 0
    verify = ["machines", "verify", str(package), "--lock", str(lock), "--trust", str(trust)]
    capsys.readouterr()
    assert main(verify) == 0
    assert "verified sha256:" in capsys.readouterr().out

    text = (package / "RECOVERY.yaml").read_text()
    (package / "RECOVERY.yaml").write_text(
        text.replace("retention_days: 2555", "retention_days: 9")
    )
    assert main([*verify, "--json"]) == 1
    (result,) = json.loads(capsys.readouterr().out)
    assert [e["code"] for e in result["errors"]] == ["pin-digest-mismatch"]


def test_lock_refuses_invalid_machine_and_writes_nothing(tmp_path: Path) -> None:
    lock = tmp_path / "machines.lock"
    path = INVALID / "48-guard-unknown.yaml"
    assert main(["machines", "lock", str(path), "--lock", str(lock), "--publisher", "acme"]) == 1
    assert not lock.exists()


def test_keygen_refuses_to_overwrite_an_existing_key(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("precious")
    assert main(["machines", "keygen", "--out", str(key)]) == 2
    assert key.read_text() == "precious"
