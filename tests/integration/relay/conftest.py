"""Fixtures of the relay tests: per-test recovery topics and a ledger on the test's own
database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledger import PostgresLedger
from schemas import TopicNames
from tests.support.kafka import TopicFactory


@pytest.fixture
def relay_topics(topic_factory: TopicFactory) -> TopicNames:
    """Fresh topics for every stream, 3 partitions each (so keys spread out)."""
    return TopicNames(
        events=topic_factory(3),
        commands=topic_factory(3),
        evidence=topic_factory(3),
        audit=topic_factory(3),
        dlq=topic_factory(3),
    )


@pytest.fixture
def ledger(database_url: str) -> Iterator[PostgresLedger]:
    """The PostgreSQL ledger of this test's database."""
    ledger = PostgresLedger(database_url, max_size=4)
    yield ledger
    ledger.close()
