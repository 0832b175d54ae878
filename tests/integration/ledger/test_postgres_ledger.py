"""The abstract ledger suite against PostgreSQL, tampering with the real tables."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from ledger import Ledger, PostgresLedger
from tests.unit.ledger.contract import LedgerContract
from tests.unit.ledger.lineage_contract import LineageContract
from tests.unit.ledger.timer_contract import TimerContract

pytestmark = pytest.mark.integration

# The append-only trigger (migration 0010) refuses these edits; a superuser can skip
# triggers, and that rewrite is what audit verification must still catch.
BYPASS_TRIGGERS = "SET session_replication_role = replica"


class TestPostgresLedger(LedgerContract, LineageContract, TimerContract):
    @pytest.fixture
    def ledger(self, database_url: str) -> Iterator[PostgresLedger]:
        self.url = database_url
        ledger = PostgresLedger(database_url, max_size=3)
        yield ledger
        ledger.close()

    def tamper_audit(self, ledger: Ledger, operation_id: str, sequence: int) -> None:
        with psycopg.connect(self.url) as conn:
            conn.execute(BYPASS_TRIGGERS)
            changed = conn.execute(
                # The record column is json (migration 0008): edit it as jsonb.
                "UPDATE audit_records SET record = jsonb_set(record::jsonb, '{state_after}', "
                "'\"done\"')::json WHERE operation_id = %s AND sequence = %s",
                (operation_id, sequence),
            ).rowcount
        assert changed == 1

    def delete_audit(self, ledger: Ledger, operation_id: str, sequence: int) -> None:
        with psycopg.connect(self.url) as conn:
            conn.execute(BYPASS_TRIGGERS)
            deleted = conn.execute(
                "DELETE FROM audit_records WHERE operation_id = %s AND sequence = %s",
                (operation_id, sequence),
            ).rowcount
        assert deleted == 1
