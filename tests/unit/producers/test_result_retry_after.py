"""A worker's failure result may ask the controller to wait before the next retry: the
client puts `retry_after_seconds` into the result's payload, the one key the decision
core reads from a payload (docs/wire-protocol.md, section 5), and refuses a value the
core would ignore."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from machines import Lineage
from machines.timers import retry_after_seconds
from producers import ProducersError, RecoveryClient
from schemas import CapabilityCommand


def _client() -> RecoveryClient:
    # Building an event needs the producer's id only; nothing is published here.
    client = RecoveryClient.__new__(RecoveryClient)
    client.producer = "worker-1"
    return client


def _retry() -> CapabilityCommand:
    return CapabilityCommand(
        command_id="op-1:3:0",
        capability="payment.create-refund",
        kind="retry",
        material=True,
        params={},
        origin="transition",
        operation_id="op-1",
        correlation_id="corr-1",
        causation_event_id="timer:op-1:2:retry",
        machine_name="payment-refund",
        machine_version="1.0.0",
        machine_digest="sha256:" + "ab" * 32,
        sequence=3,
        lineage=Lineage(agent="agent-1", task="task-1", initiating_principal="alice"),
        issued_at=datetime(2026, 6, 1, 12, 0, tzinfo=UTC),
        idempotency_key="rf-1",
    )


def test_a_failure_with_retry_after_carries_it_where_the_core_reads_it() -> None:
    event = _client().action_result(_retry(), False, retry_after_seconds=120)
    assert (event.event_type, event.event_id) == ("RETRY_FAILED", "result:op-1:3:0")
    assert event.payload == {"retry_after_seconds": 120}
    assert retry_after_seconds(event.payload) == 120


def test_a_result_without_retry_after_has_no_payload() -> None:
    assert _client().action_result(_retry(), False).payload is None


@pytest.mark.parametrize("bad", [-1, 1.5, True, "60"])
def test_a_retry_after_the_core_would_ignore_is_refused(bad: object) -> None:
    with pytest.raises(ProducersError, match="retry_after_seconds"):
        _client().action_result(_retry(), False, retry_after_seconds=bad)  # type: ignore[arg-type]
