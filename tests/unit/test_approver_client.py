"""`Context.approver_client`: how `recoveryctl review approve|reject` and `ops migrate`
publish a signed decision. A decision that cannot be published is refused with the
operation named (exit status 1), whatever stopped it: the envelope, the producer, the
broker."""

from __future__ import annotations

import argparse

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ops.context import Context
from ops.errors import Refused, exit_status
from producers import DeliveryFailed
from schemas import WireCode, WireError


@pytest.mark.parametrize(
    "failure",
    [
        WireError(WireCode.OVERSIZED, "the envelope is too large"),
        DeliveryFailed([("event-1", "Local: Message timed out")]),
    ],
)
def test_a_decision_that_cannot_be_published_is_refused_naming_the_operation(
    failure: Exception,
) -> None:
    # Nothing listens there: the producer is built, never reached.
    ctx = Context(args=argparse.Namespace(bootstrap="127.0.0.1:9", database_url=None))
    with pytest.raises(Refused, match=r"^operation op-1: could not publish: ") as refused:
        with ctx.approver_client("approver-dana", Ed25519PrivateKey.generate(), "operation op-1"):
            raise failure
    assert str(failure) in str(refused.value)
    assert exit_status(refused.value) == 1
