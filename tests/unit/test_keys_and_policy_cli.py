"""`recoveryctl keys` and `recoveryctl policy` (no services): key files made private and
read back, a policy shown, digested and validated as the controller reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from machines import Policy, load_policy
from ops.cli import main
from ops.commands.review import load_private_key


def test_keys_generate_writes_a_private_key_and_show_reads_it_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "alice.pem"
    assert main(["keys", "generate", "--out", str(path), "--id", "alice", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert path.stat().st_mode & 0o777 == 0o600
    assert made["roster_entry"] == {
        "id": "alice",
        "public_key": made["public_key"],
        "roles": ["recovery-approver"],
    }
    assert made["key_id"].startswith("ed25519:")
    assert main(["keys", "show", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["public_key"], shown["key_id"], shown["mode"]) == (
        made["public_key"],
        made["key_id"],
        "0600",
    )
    assert load_private_key(path) is not None
    # Never overwrites a key.
    assert main(["keys", "generate", "--out", str(path)]) == 2
    assert "cannot create" in capsys.readouterr().err


def test_keys_show_warns_about_a_readable_file_and_refuses_garbage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "k.pem"
    assert main(["keys", "generate", "--out", str(path)]) == 0
    capsys.readouterr()
    path.chmod(0o644)
    assert main(["keys", "show", str(path)]) == 0
    captured = capsys.readouterr()
    assert "public key" in captured.out
    assert "readable by others" in captured.err
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    assert main(["keys", "show", str(junk)]) == 2
    assert f"key file {junk} is neither PEM nor base64" in capsys.readouterr().err


def test_policy_digest_show_and_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("id: ops-test\nmax_retry_attempts: 2\ntrusted_verifiers: [v-1]\n")
    assert main(["policy", "digest", str(path)]) == 0
    assert capsys.readouterr().out.strip() == load_policy(path).digest
    assert main(["policy", "show", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["policy"]["max_retry_attempts"] == 2
    assert shown["digest"] == load_policy(path).digest
    assert main(["policy", "show", str(path)]) == 0
    assert "max_retry_attempts              2" in capsys.readouterr().out
    assert main(["policy", "validate", str(path)]) == 0
    assert "valid policy ops-test" in capsys.readouterr().out


def test_policy_defaults_to_the_built_in_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RECOVERY_CONTROLLER_POLICY_PATH", raising=False)
    assert main(["policy", "digest"]) == 0
    assert capsys.readouterr().out.strip() == Policy(id="default").digest


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("id: loose\nallow_self_approval: true\n", "would loosen a SPEC §7 invariant"),
        ("id: bad\nforbidden_capabilities: [no.such]\n", "unregistered capabilities no.such"),
    ],
)
def test_policy_validate_names_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    assert main(["policy", "validate", str(path)]) == 1
    assert message in capsys.readouterr().err
