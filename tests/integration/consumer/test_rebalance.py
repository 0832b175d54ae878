"""Two members of one group: partitions move when a member joins and when it leaves,
and every event is still decided exactly once."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.integration.consumer.harness import (
    Tool,
    open_ledger,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.support.kafka import TopicFactory

OPERATIONS = 40


def test_a_member_joining_and_leaving_mid_stream_loses_and_repeats_no_decision(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=4)
    policy = write_policy(tmp_path, Ed25519PrivateKey.generate())
    group = f"g-{uuid.uuid4().hex}"
    ledger = open_ledger(database_url)
    done = threading.Event()

    def produce() -> None:
        # Two events per operation, published while membership changes.
        tool = Tool(kafka_bootstrap, topic)
        try:
            for round_ in ("TOOL_TIMEOUT", "TOOL_FAILED"):
                for n in range(OPERATIONS):
                    tool.event("procurement-request", f"op-{n}", round_)
                    if n % 10 == 0:
                        tool.flush()
                        done.wait(0.1)
        finally:
            tool.close()

    first = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    second = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    producer = threading.Thread(target=produce)
    try:
        with running(first, ledger) as a:
            a.wait_owned(4)
            producer.start()
            with running(second, ledger) as b:
                wait_for(lambda: len(b.controller.owned) >= 1, 30, "the second member's share")
                wait_for(lambda: len(a.controller.owned) <= 3, 30, "the first member's release")
                b.halt()
            wait_for(lambda: len(a.controller.owned) == 4, 30, "the partitions back at a")
            producer.join(timeout=60)
            wait_for(
                lambda: all(len(ledger.decisions(f"op-{n}")) == 2 for n in range(OPERATIONS)),
                60,
                "every event decided",
            )
        for n in range(OPERATIONS):
            decisions = ledger.decisions(f"op-{n}")
            assert [d["sequence"] for d in decisions] == [1, 2]
            assert [d["event"]["type"] for d in decisions] == ["TOOL_TIMEOUT", "TOOL_FAILED"]
        assert sum(ledger.offsets(group, topic).values()) == 2 * OPERATIONS
    finally:
        done.set()
        ledger.close()
