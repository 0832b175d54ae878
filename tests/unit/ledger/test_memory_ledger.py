"""The abstract ledger suite against the in-memory ledger."""

from __future__ import annotations

import pytest

from ledger import Ledger, MemoryLedger
from tests.unit.ledger.contract import LedgerContract
from tests.unit.ledger.lineage_contract import LineageContract
from tests.unit.ledger.timer_contract import TimerContract


class TestMemoryLedger(LedgerContract, LineageContract, TimerContract):
    @pytest.fixture
    def ledger(self) -> MemoryLedger:
        return MemoryLedger()

    def tamper_audit(self, ledger: Ledger, operation_id: str, sequence: int) -> None:
        assert isinstance(ledger, MemoryLedger)
        records, _ = ledger.audit_chain(operation_id)
        body = dict(records[sequence - 1].record)
        body["state_after"] = "done"
        ledger.tamper_audit(operation_id, sequence, body)

    def delete_audit(self, ledger: Ledger, operation_id: str, sequence: int) -> None:
        assert isinstance(ledger, MemoryLedger)
        ledger.delete_audit(operation_id, sequence)
