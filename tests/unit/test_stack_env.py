"""One ready set of variables per role of the local stack (`ops.stack_env`): each role
its own principal, database role, keys and roster, and none of another role's (issue
#31: the guides exported the admin's database URL and client file for everyone)."""

from __future__ import annotations

import shlex
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ops.demo import DEMO_TOPICS
from ops.stack import KafkaState, PostgresState, StackState
from ops.stack_env import ROLES, role_environment, shell_lines, write_role_files

_URL = "postgresql://{user}@127.0.0.1:5432/recovery?passfile=/s/postgres/pgpass"


def _state(home: Path) -> StackState:
    clients = {c: f"{home}/kafka/clients/{c}.properties" for c in ("admin", "tool", "worker",
               "controller", "relay", "siem", "bench")}  # fmt: skip
    roles = {c: _URL.format(user=f"recovery_{c}") for c in ("controller", "relay", "reader",
             "auditor", "owner")}  # fmt: skip
    return StackState(
        kafka=KafkaState(bootstrap="127.0.0.1:9092", external=False, client_files=clients),
        postgres=PostgresState(url=_URL.format(user="postgres"), external=False, role_urls=roles),
        stack_dir=str(home),
        started_at=datetime(2026, 12, 1, tzinfo=UTC),
        startup_seconds=1.0,
    )


def test_each_role_gets_its_own_principal_and_database_role(tmp_path: Path) -> None:
    state = _state(tmp_path)
    controller = role_environment(state, "controller")
    assert controller["RECOVERY_KAFKA_CONFIG_FILE"].endswith("/controller.properties")  # type: ignore[union-attr]
    assert controller["RECOVERY_DATABASE_URL"] == _URL.format(user="recovery_controller")
    assert controller["RECOVERY_CONTROLLER_SIGNING_KEY_FILE"] == f"{tmp_path}/keys/controller.key"
    # Who decides again (review, replay --verify) trusts whom the controller trusts.
    for deciding in ("controller", "approver", "reader"):
        roster = role_environment(state, deciding)["RECOVERY_CONTROLLER_ROSTER_PATH"]
        assert roster == f"{tmp_path}/keys/roster.json", deciding
    assert role_environment(state, "tool")["RECOVERY_CONTROLLER_ROSTER_PATH"] is None
    tool = role_environment(state, "tool", "smtp-tool")
    assert tool["RECOVERY_KAFKA_CONFIG_FILE"].endswith("/tool.properties")  # type: ignore[union-attr]
    assert tool["RECOVERY_DATABASE_URL"] is None  # a tool needs no database: unset
    assert tool["RECOVERY_PRODUCER_KEY_FILE"] == f"{tmp_path}/keys/smtp-tool.pem"
    assert tool["RECOVERY_ROSTER_FILE"] == f"{tmp_path}/keys/roster.json"
    # No role but admin gets the superuser's URL or the admin's client file.
    for role in ROLES:
        env = role_environment(state, role)
        if role != "admin":
            assert env["RECOVERY_DATABASE_URL"] != state.postgres.url, role
            assert not str(env["RECOVERY_KAFKA_CONFIG_FILE"]).endswith("/admin.properties"), role


def test_the_demo_role_reads_the_demos_sandbox(tmp_path: Path) -> None:
    demo = role_environment(_state(tmp_path), "demo")
    assert "/recovery_demo?" in str(demo["RECOVERY_DATABASE_URL"])
    assert "recovery_reader@" in str(demo["RECOVERY_DATABASE_URL"])
    assert demo["RECOVERY_TOPIC_EVENTS"] == DEMO_TOPICS.events
    assert demo["RECOVERY_TOPIC_DLQ"] == DEMO_TOPICS.dlq
    # ... and every other role unsets them again.
    assert role_environment(_state(tmp_path), "tool")["RECOVERY_TOPIC_EVENTS"] is None


def test_a_producer_is_for_roles_that_sign(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="signs nothing"):
        role_environment(_state(tmp_path), "reader", "someone")


def test_the_lines_set_and_unset_in_a_real_shell(tmp_path: Path) -> None:
    state = _state(tmp_path)
    env = role_environment(state, "worker", "w 1")
    script = (
        "\n".join(shell_lines(env))
        + '\nprintf "%s|%s" "$RECOVERY_PRODUCER_ID" "${RECOVERY_DATABASE_URL-unset}"'
    )
    done = subprocess.run(
        ["bash", "-c", script],
        env={"RECOVERY_DATABASE_URL": "postgresql://postgres@x/recovery"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout == "w 1|unset"
    folder = write_role_files(state)
    assert {p.name for p in folder.iterdir()} == {f"{r}.env" for r in ROLES}
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in folder.iterdir())
    assert shlex.quote(state.postgres.role_urls["reader"]) in (folder / "reader.env").read_text()
