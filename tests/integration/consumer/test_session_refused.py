"""A session timeout the broker refuses stops the controller with what to change.

A broker refuses a join whose session timeout lies outside its
`group.min.session.timeout.ms`..`group.max.session.timeout.ms`; librdkafka would retry
the join for ever and the member would never own a partition. Fast failover asks for a
short session (docs/controller.md, "Failover"), which a stock broker (6 s minimum)
refuses, so the controller fails closed instead, naming the setting and the broker's.
The test asks for more than any broker's maximum (30 min by default), refused whatever
the session's broker is.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumer.errors import ControllerError
from tests.integration.consumer.harness import (
    open_ledger,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.support.kafka import TopicFactory

pytestmark = pytest.mark.integration

_REFUSED_MS = 1_900_000


def test_a_session_timeout_the_broker_refuses_stops_the_controller_naming_it(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(1)
    settings = settings_for(
        kafka_bootstrap,
        database_url,
        topic,
        write_policy(tmp_path, Ed25519PrivateKey.generate()),
        f"g-{uuid.uuid4().hex[:8]}",
    ).model_copy(update={"session_timeout_ms": _REFUSED_MS, "max_poll_interval_ms": _REFUSED_MS})
    ledger = open_ledger(database_url)
    try:
        with running(settings, ledger) as member:
            wait_for(lambda: not member.thread.is_alive(), 30, "the controller to stop")
            assert len(member.errors) == 1, member.errors
            (error,) = member.errors
            member.errors.clear()  # expected; halt() would raise it again
    finally:
        ledger.close()
    assert isinstance(error, ControllerError)
    assert f"refuses session_timeout_ms={_REFUSED_MS}" in str(error)
    assert "group.min.session.timeout.ms" in str(error)
    assert "RECOVERY_CONTROLLER_SESSION_TIMEOUT_MS" in str(error)
    assert member.controller.owned == {}
