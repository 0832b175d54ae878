"""The relay's check of the topics' message limits fails as `ProducersError` when no
broker answers, which the relay retries with backoff; a bare `TimeoutError` from the
admin client's future used to escape and end the relay (found by the 100,000-event
crash run: a relay started while the broker was being restarted exited)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from ops.ports import free_ports
from producers import ProducersError, check_message_limits
from schemas import KafkaSecurity


def test_a_broker_that_does_not_answer_is_a_producers_error() -> None:
    (port,) = free_ports(1)  # nothing listens there
    with pytest.raises(ProducersError, match="did not answer within 1s"):
        check_message_limits(
            f"127.0.0.1:{port}", ["recovery.events"], security=KafkaSecurity(), timeout=1.0
        )


def test_a_request_that_timed_out_says_the_broker_did_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Whichever runs out first, the request's own timeout or the wait for its future,
    # the relay is told the broker did not answer, not that a permission is missing.
    def timed_out(self: AdminClient, resources: list[Any], **_: Any) -> dict[Any, Any]:
        future: Future[Any] = Future()
        future.set_exception(
            KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed while waiting for controller"))
        )
        return {resource: future for resource in resources}

    monkeypatch.setattr(AdminClient, "describe_configs", timed_out)
    (port,) = free_ports(1)
    with pytest.raises(ProducersError, match="did not answer within 1s") as raised:
        check_message_limits(
            f"127.0.0.1:{port}", ["recovery.events"], security=KafkaSecurity(), timeout=1.0
        )
    assert "DescribeConfigs" not in str(raised.value)
