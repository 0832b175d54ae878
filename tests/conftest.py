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
from tests.support.services import (
    SecuredBroker,
    ServiceLease,
    lease_kafka,
    lease_postgres,
    lease_secured_kafka,
)

# Every controller the session starts signs its output with the session's own key.
ensure_controller_key()


@pytest.fixture(scope="session")
def kafka_lease() -> Iterator[ServiceLease]:
    """The session's broker (started on first use; secured unless external)."""
    lease = lease_kafka()
    yield lease
    lease.release()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_lease: ServiceLease) -> str:
    """Bootstrap servers of the session's broker; clients connect as the environment's
    principal (the admin of the session's own broker)."""
    return kafka_lease.address


@pytest.fixture(scope="session")
def secured_kafka(kafka_lease: ServiceLease) -> Iterator[SecuredBroker]:
    """A secured broker and its principals: the session's own, or one of its own when
    the session's broker is external."""
    broker, release = lease_secured_kafka(kafka_lease)
    yield broker
    release()


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
def postgres_lease() -> Iterator[ServiceLease]:
    """The session's PostgreSQL server (started on first use)."""
    lease = lease_postgres()
    yield lease
    lease.release()


@pytest.fixture(scope="session")
def postgres_server(postgres_lease: ServiceLease) -> str:
    """Conninfo of the session server's administrative database."""
    return postgres_lease.address


@pytest.fixture(scope="session")
def database_template(postgres_server: str, postgres_lease: ServiceLease) -> Iterator[str]:
    """Name of the template database every test database is cloned from; the login
    roles get the session's passwords on the session's own server."""
    name = prepare_template(postgres_server, postgres_lease.role_passwords)
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
