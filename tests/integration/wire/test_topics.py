"""Topic provisioning against the real broker is idempotent, through the API and the CLI."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from ops.cli import main
from producers import provision
from schemas import TopicNames, kafka_config

pytestmark = pytest.mark.integration


@pytest.fixture
def names(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TopicNames]:
    """Topic names unique to this test, also set in the environment the CLI reads."""
    prefix = f"t-prov-{uuid.uuid4().hex[:8]}"
    for stream in ("events", "commands", "evidence", "audit", "dlq"):
        monkeypatch.setenv(f"RECOVERY_TOPIC_{stream.upper()}", f"{prefix}.{stream}")
    topics = TopicNames.from_env()
    yield topics
    admin = AdminClient(kafka_config(kafka_bootstrap))
    existing = set(admin.list_topics(timeout=10).topics)
    doomed = [t for t in topics.all() if t in existing]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=30).values():
            future.result(timeout=30)


def test_provisioning_twice_creates_the_topics_once_and_keeps_their_partitions(
    kafka_bootstrap: str, names: TopicNames
) -> None:
    first = provision(kafka_bootstrap, partitions=3, names=names)
    second = provision(kafka_bootstrap, partitions=5, names=names)

    assert [(r.name, r.created, r.partitions) for r in first] == [(n, True, 3) for n in names.all()]
    assert [(r.name, r.created, r.partitions) for r in second] == [
        (n, False, 3) for n in names.all()
    ]


def test_recoveryctl_topics_create_reports_created_then_existing(
    kafka_bootstrap: str, names: TopicNames, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["topics", "create", "--partitions", "2", "--bootstrap", kafka_bootstrap, "--json"]
    assert main(args) == 0
    created = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)

    assert [t["name"] for t in created] == list(names.all())
    assert all(t["created"] and t["partitions"] == 2 for t in created)
    assert not any(t["created"] for t in again)


def test_topic_names_default_to_the_recovery_streams() -> None:
    assert TopicNames.from_env({}).all() == (
        "recovery.events",
        "recovery.commands",
        "recovery.evidence",
        "recovery.audit",
        "recovery.dlq",
    )
