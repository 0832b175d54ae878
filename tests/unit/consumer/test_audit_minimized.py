"""The controller's batch pipeline (intake, decision, rows, commit, over the in-memory
ledger the parity tests hold equal to PostgreSQL) keeps no redacted payload value, for
every catalogue machine, and its first audit record of an operation names the signed
machine that decided and the controller (SPEC §10, issue #16 class 9)."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from consumer.batch import CONTROLLER_VERSION
from consumer.intake import RawRecord
from ledger import MemoryLedger
from machines import Event, Machine
from tests.unit.consumer.support import CONTROLLER, FOUND, decide, encoded, event, pinned

SECRET = "SECRET-MARKER-51"


def _commit(ledger: MemoryLedger, raws: list[RawRecord], now: Event, refused: int = 0) -> list[str]:
    planned = decide(ledger, raws, now=now.event_time + timedelta(minutes=1), lineage=True)
    assert len(planned.refused) == refused, planned.refused
    ledger.commit(planned.batch)
    return [r.code for _, r in planned.refused]


def _exposed(text: str) -> str:
    """`text` and every base64 run in it decoded (dead letters hold bytes as base64)."""
    decoded = []
    for run in re.findall(r"[A-Za-z0-9+/]{16,}={0,2}", text):
        try:
            decoded.append(base64.b64decode(run + "=" * (-len(run) % 4)).decode("latin-1"))
        except binascii.Error:
            continue
    return "\n".join([text, *decoded])


def _secrets(machine: Machine, **rest: Any) -> dict[str, Any]:
    planted: dict[str, Any] = {p.split(".", 1)[1]: f"{SECRET} {p}" for p in machine.audit.redact}
    return {**rest, **planted}


def _machines() -> list[Machine]:
    return sorted({m.name: m for m in pinned()[0].values()}.values(), key=lambda m: m.name)


@pytest.mark.parametrize("machine", _machines(), ids=lambda m: m.name)
def test_no_redacted_value_is_stored_and_the_opening_record_names_the_signed_machine(
    machine: Machine,
) -> None:
    ledger = MemoryLedger()
    agent = machine.applies_to.agents[0] if machine.applies_to.agents else "agent-1"
    kw = {"machine": machine.name, "version": machine.version, "agent": agent}
    timeout = event("TOOL_TIMEOUT", payload=_secrets(machine, request="req-1"), **kw)
    found = event("VERIFICATION_FOUND", evidence=FOUND, payload=_secrets(machine), **kw)
    # The first event's id reused with another payload: a conflict, dead-lettered.
    reused = replace(timeout, payload=_secrets(machine, request="req-2"), payload_digest="")
    _commit(ledger, [encoded(timeout, 0), encoded(found, 1)], timeout)
    _commit(ledger, [encoded(reused, 2)], timeout)
    # Refused once its machine is known: dead-lettered, never with the consumed bytes.
    foreign = event("TOOL_FAILED", correlation_id="corr-other", payload=_secrets(machine), **kw)
    unscoped = event("TOOL_TIMEOUT", "op-2", scope=None, payload=_secrets(machine), **kw)
    codes = _commit(ledger, [encoded(foreign, 3), encoded(unscoped, 4, partition=0)], timeout, 2)
    assert sorted(codes) == ["correlation-mismatch", "scope-missing"]

    stored = _exposed(repr(ledger._s))
    assert SECRET not in stored
    assert "event-id-conflict" in stored  # the conflict was recorded, without the secret

    chain, _ = ledger.audit_chain("op-1")
    opened = chain[0].record
    assert chain[0].kind == "operation-opened"
    assert machine.provenance is not None
    assert opened["machine"] == {
        "name": machine.name,
        "version": machine.version,
        "digest": machine.digest,
        "provenance": machine.provenance.to_dict(),
    }
    assert opened["controller"] == {"id": CONTROLLER, "version": CONTROLLER_VERSION}
    decisions = [r.record for r in chain if r.kind == "decision"]
    # The timeout, the verification and the foreign event's refusal (recorded, too).
    assert [d["outcome"] for d in decisions][2] == "refused"
    assert len(decisions) == 3
    assert all(d["controller"] == opened["controller"] for d in decisions)
    # What each decision's audit record keeps of the payload is what audit.record says.
    first = decisions[0]["payload"]
    if "downstream_references" in machine.audit.record:
        assert first["request"] == "req-1"
        assert all(first[p.split(".", 1)[1]] == {"redacted": True} for p in machine.audit.redact)
    else:
        assert first["omitted"] is True
    second = decisions[1]["payload"]
    assert ("omitted" in second) is ("evidence_payloads" not in machine.audit.record)
