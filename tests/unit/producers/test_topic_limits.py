"""The relay's check of the topics' message limits fails as `ProducersError` when no
broker answers, which the relay retries with backoff; a bare `TimeoutError` from the
admin client's future used to escape and end the relay (found by the 100,000-event
crash run: a relay started while the broker was being restarted exited)."""

from __future__ import annotations

import pytest

from ops.ports import free_ports
from producers import ProducersError, check_message_limits
from schemas import KafkaSecurity


def test_a_broker_that_does_not_answer_is_a_producers_error() -> None:
    (port,) = free_ports(1)  # nothing listens there
    with pytest.raises(ProducersError, match="did not answer within 1s"):
        check_message_limits(
            f"127.0.0.1:{port}", ["recovery.events"], security=KafkaSecurity(), timeout=1.0
        )
