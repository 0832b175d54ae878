"""`recoveryctl topics create` without a known broker says how to name one."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.cli import main
from producers import ProvisionError, provision
from schemas import TopicNames


def test_topics_create_without_any_broker_exits_2_and_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RECOVERY_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("RECOVERY_STACK_DIR", str(tmp_path))  # no stack state there
    assert main(["topics", "create"]) == 2
    err = capsys.readouterr().err
    assert "--bootstrap" in err
    assert "recoveryctl stack up" in err


def test_topic_names_come_from_the_environment_and_are_validated() -> None:
    names = TopicNames.from_env({"RECOVERY_TOPIC_DLQ": "team-a.dlq", "RECOVERY_TOPIC_AUDIT": ""})
    assert names.dlq == "team-a.dlq"
    assert names.audit == "recovery.audit"
    with pytest.raises(ValueError, match="events"):
        TopicNames.from_env({"RECOVERY_TOPIC_EVENTS": "bad name!"})


def test_provisioning_refuses_zero_partitions_before_contacting_a_broker() -> None:
    with pytest.raises(ProvisionError, match="partitions"):
        provision("127.0.0.1:1", partitions=0)
