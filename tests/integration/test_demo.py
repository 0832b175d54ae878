"""`recoveryctl demo` end to end against the session's broker and server: every
operation of the incident reaches its expected state along the expected path, the
expected commands come out of the relay, every audit chain verifies, exit status 0, and
every record it left on the audit topic is OCSF 1.3 API Activity (pydantic-ocsf)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from ocsf.v1_3_0.events import ApiActivity

from ops.cli import main
from ops.demo_scenarios import SCENARIOS
from producers import read_topic
from schemas import TopicNames, ocsf_kind
from tests.support.kafka import TopicFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def demo_topics(topic_factory: TopicFactory, monkeypatch: pytest.MonkeyPatch) -> TopicNames:
    """Topics of this test's own, named to the CLI through RECOVERY_TOPIC_*."""
    names = TopicNames(
        events=topic_factory(3),
        commands=topic_factory(3),
        evidence=topic_factory(3),
        audit=topic_factory(3),
        dlq=topic_factory(3),
    )
    for field, value in names.model_dump().items():
        monkeypatch.setenv(f"RECOVERY_TOPIC_{field.upper()}", value)
    return names


def test_demo_plays_the_incident_and_every_operation_matches(
    kafka_bootstrap: str,
    database_url: str,
    demo_topics: TopicNames,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "demo",
            "--bootstrap",
            kafka_bootstrap,
            "--database-url",
            database_url,
            "--timeout",
            "150",
            "--json",
        ]
    )

    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 0, captured.err[-4000:]
    assert report["ok"] is True
    by_name = {op["scenario"]: op for op in report["operations"]}
    assert set(by_name) == {s.name for s in SCENARIOS}
    for scenario in SCENARIOS:
        op = by_name[scenario.name]
        assert op["state"] == scenario.final_state
        assert tuple(op["path"]) == scenario.path
        assert Counter(op["commands"]) == Counter(scenario.commands)
        assert op["audit"]["intact"] is True
        assert op["audit"]["records"] >= len(scenario.path)
    approvals = [d for op in report["operations"] for d in op["decisions"]]
    assert any(d["event"] == "HUMAN_APPROVED" for d in approvals)
    assert any(d["event"] == "HUMAN_REJECTED" for d in approvals)

    # What a SIEM reads: every record on the audit topic, the chain heads included.
    kinds: Counter[str] = Counter()
    for record in read_topic(kafka_bootstrap, demo_topics.audit, timeout=60):
        event = json.loads(record.value or b"")
        ApiActivity.model_validate(event)
        kinds[str(ocsf_kind(event))] += 1
    assert kinds["chain-heads"] > 0
    assert kinds["decision"] >= len(approvals)
    # The verification nobody answers is escalated by its timeout within the run: the
    # timer's event is in its path and its audit chain (issue #29).
    quiet = by_name["procurement-unanswered"]
    fired = [d for d in quiet["decisions"] if d["timer"]]
    assert [(d["event"], d["from"], d["to"]) for d in fired] == [
        ("VERIFICATION_UNAVAILABLE", "verifying", "escalated")
    ]
    assert "VERIFICATION_UNAVAILABLE (timer)" in quiet["audit"]["chain"]
    # The retried request's retry went out when its timer fired.
    retried = by_name["procurement-retried"]
    assert [d["event"] for d in retried["decisions"] if d["timer"]] == ["RETRY_DUE"]
