"""`recoveryctl keys`, `recoveryctl roster` and `recoveryctl policy` (no services): key
files made private and read back (and refused when others may read them), roster entries
written with their grants, a policy shown, digested and validated as the controller reads
it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from machines import KeyFileError, Policy, Role, load_policy, load_roster
from ops.cli import main
from ops.commands.review import load_private_key
from ops.keys import stack_roster
from ops.roster_file import new_entry, read_roster_file, with_producer, write_roster_file


@pytest.fixture(autouse=True)
def _no_local_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Never the developer's running stack (its roster is the default one).
    monkeypatch.setenv("RECOVERY_STACK_DIR", str(tmp_path / "no-stack"))
    monkeypatch.delenv("RECOVERY_CONTROLLER_ROSTER_PATH", raising=False)


_TOOL = [
    "--id", "smtp-tool", "--role", "tool", "--capability", "email.send",
    "--tool", "smtp-relay", "--environment", "production", "--agent", "mail-agent",
]  # fmt: skip


def test_keys_generate_writes_a_private_key_and_its_roster_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, roster = tmp_path / "smtp-tool.pem", tmp_path / "roster.json"
    argv = ["keys", "generate", "--out", str(path), "--roster", str(roster), *_TOOL, "--json"]
    assert main(argv) == 0
    made = json.loads(capsys.readouterr().out)
    assert path.stat().st_mode & 0o777 == 0o600
    grant = {
        "role": "tool",
        "capabilities": ["email.send"],
        "tools": ["smtp-relay"],
        "environments": ["production"],
        "agents": ["mail-agent"],
    }
    assert made["roster_entry"] == {
        "id": "smtp-tool",
        "keys": [{"public_key": made["public_key"]}],
        "grants": [grant],
    }
    assert made["approvers_entry"] is None  # not an approver: no approvers: entry
    assert made["key_id"].startswith("ed25519:")
    listed = load_roster(roster).producer("smtp-tool")
    assert listed is not None
    assert listed.permits(Role.TOOL, capability="email.send", agent="mail-agent")
    assert main(["keys", "show", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["public_key"], shown["key_id"], shown["mode"]) == (
        made["public_key"],
        made["key_id"],
        "0600",
    )
    assert load_private_key(path) is not None
    # Never overwrites a key; --if-missing keeps and uses it, and lists it once.
    assert main(["keys", "generate", "--out", str(path), *_TOOL]) == 2
    assert "it exists, and a key is never overwritten" in capsys.readouterr().err
    again = ["keys", "generate", "--out", str(path), "--roster", str(roster), *_TOOL]
    assert main([*again, "--if-missing", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["key_id"] == made["key_id"]
    assert len(load_roster(roster).producers) == 1


def test_keys_generate_for_an_approver_prints_both_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "alice.pem"
    argv = ["keys", "generate", "--out", str(path), "--id", "alice", "--role", "approver"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "roster entry (producers:):" in out
    assert "policy entry (approvers:" in out
    assert "roles: [recovery-approver]" in out
    assert "added to roster" not in out  # no roster file named, none on a stack


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--role", "tool", "--agent", "*"], "lets the producer name any agent"),
        (["--role", "worker", "--agent", "a"], "--agent given, but role(s) worker take none"),
        (["--role", "tool"], None),
    ],
)
def test_keys_generate_refuses_a_grant_the_controller_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], said: str | None
) -> None:
    path = tmp_path / "t.pem"
    code = main(["keys", "generate", "--out", str(path), "--id", "t", *extra])
    if said is None:
        assert code == 0
        return
    assert code == 2
    assert said in capsys.readouterr().err
    assert not path.exists()  # checked before any key is made


def test_a_key_file_others_can_read_is_refused_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "k.pem"
    assert main(["keys", "generate", "--out", str(path), "--id", "k", "--role", "tool"]) == 0
    capsys.readouterr()
    path.chmod(0o640)
    assert main(["keys", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert "is readable by group (mode 0640)" in err
    assert f"chmod 600 {path}" in err
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match="readable by group and others"):
        load_private_key(path)
    path.chmod(0o600)
    assert load_private_key(path) is not None
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    junk.chmod(0o600)
    assert main(["keys", "show", str(junk)]) == 2
    assert f"key file {junk} is neither PEM nor base64" in capsys.readouterr().err


def test_roster_add_show_revoke_remove_edit_a_roster_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roster = tmp_path / "roster.yaml"
    key = tmp_path / "w.pem"
    assert main(["keys", "generate", "--out", str(key), "--id", "w", "--role", "worker"]) == 0
    capsys.readouterr()
    base = ["--roster", str(roster)]
    add = ["roster", "add", *base, "--id", "w", "--key-file", str(key)]
    assert main([*add, "--role", "worker", "--capability", "payment.refund"]) == 0
    # The same producer again: the grant it lacks is added, its key not twice.
    assert main([*add, "--role", "verifier", "--capability", "payment.verify-refund"]) == 0
    entry = load_roster(roster).producer("w")
    assert entry is not None
    assert len(entry.keys) == 1
    assert entry.roles() == {Role.WORKER, Role.VERIFIER}
    capsys.readouterr()
    assert main(["roster", "show", *base]) == 0
    shown = capsys.readouterr().out
    assert "worker capabilities=payment.refund; verifier" in shown
    key_id = entry.keys[0].key_id
    assert main(["roster", "revoke", *base, "--id", "w", "--key-id", key_id]) == 0
    revoked = load_roster(roster).producer("w")
    assert revoked is not None
    assert revoked.keys[0].revoked
    assert main(["roster", "show", *base]) == 0
    assert f"{key_id} (not usable)" in capsys.readouterr().out
    assert main(["roster", "remove", *base, "--id", "w"]) == 0
    assert load_roster(roster).producers == ()
    assert main(["roster", "remove", *base, "--id", "w"]) == 2
    assert "producer w is not in the roster" in capsys.readouterr().err


def test_roster_commands_never_rewrite_a_policy_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("# kept as written\nid: ops\nproducers: []\n")
    argv = ["roster", "add", "--roster", str(policy), "--id", "t", "--role", "tool"]
    assert main([*argv, "--public-key", "A" * 43 + "="]) == 2
    assert "is a policy file; it is never rewritten" in capsys.readouterr().err
    assert policy.read_text().startswith("# kept as written")
    assert main([*argv, "--public-key", "A" * 43 + "=", "--print"]) == 0
    assert "- id: t" in capsys.readouterr().out


def test_the_stack_roster_keeps_the_producers_added_to_it(tmp_path: Path) -> None:
    path = stack_roster(tmp_path)
    entry = new_entry("t", "A" * 43 + "=", ())
    write_roster_file(path, with_producer(read_roster_file(path), entry))
    again = stack_roster(tmp_path)  # `stack up` again
    assert [p.id for p in load_roster(again).producers] == ["recovery-controller", "t"]


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
