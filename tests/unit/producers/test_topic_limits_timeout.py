"""A broker that does not answer the relay's topic-limit check in time is an outage the
relay waits out (a `ProducersError`, retried with backoff), never an exception that
ends the relay: the crash run's relay exited on one while the broker was busy."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from producers import ProducersError
from producers import topics as topics_module


class _SilentAdmin:
    def __init__(self, _config: dict[str, Any]) -> None:
        pass

    def describe_configs(self, resources: list[Any], **_kw: Any) -> dict[Any, Future[Any]]:
        # Futures nobody completes: `result(timeout=...)` raises TimeoutError.
        return {resource: Future() for resource in resources}


def test_a_check_the_broker_does_not_answer_in_time_is_a_producers_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(topics_module, "AdminClient", _SilentAdmin)
    with pytest.raises(ProducersError, match=r"no answer within 0\.05s"):
        topics_module.check_message_limits("127.0.0.1:1", ["recovery.events"], timeout=0.05)
