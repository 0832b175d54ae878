"""Shared fixtures: the session's Kafka broker and PostgreSQL server, per-test topics and
per-test databases.

Services start lazily: a session whose tests use none of these fixtures starts nothing.
Set RECOVERY_KAFKA_BOOTSTRAP / RECOVERY_DATABASE_URL to run against existing services.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.db import (
    clone_database,
    create_empty_database,
    drop_database,
    prepare_template,
    with_database,
)
from tests.support.kafka import TopicFactory
from tests.support.keys import ensure_controller_key
from tests.support.services import lease_kafka, lease_postgres

# Every controller the session starts signs its output with the session's own key.
ensure_controller_key()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of the session's broker (started on first use)."""
    lease = lease_kafka()
    yield lease.address
    lease.release()


@pytest.fixture
def topic_factory(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[TopicFactory]:
    """Creates topics with names unique to this test; deletes them afterwards."""
    factory = TopicFactory(kafka_bootstrap, request.node.name)
    yield factory
    factory.delete_all()


@pytest.fixture
def topic(topic_factory: TopicFactory) -> str:
    """One fresh single-partition topic for this test."""
    return topic_factory()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """Conninfo of the session server's administrative database (started on first use)."""
    lease = lease_postgres()
    yield lease.address
    lease.release()


@pytest.fixture(scope="session")
def database_template(postgres_server: str) -> Iterator[str]:
    """Name of the template database every test database is cloned from."""
    name = prepare_template(postgres_server)
    yield name
    drop_database(postgres_server, name)


@pytest.fixture
def database_url(
    postgres_server: str, database_template: str, request: pytest.FixtureRequest
) -> Iterator[str]:
    """URL of a database of this test's own, cloned from the template; dropped after."""
    name = clone_database(postgres_server, database_template, request.node.name)
    yield with_database(postgres_server, name)
    drop_database(postgres_server, name)


@pytest.fixture
def empty_database(postgres_server: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of an empty database of this test's own, no migration applied; dropped after."""
    name = create_empty_database(postgres_server, request.node.name)
    yield with_database(postgres_server, name)
    drop_database(postgres_server, name)
