"""`ledger.driver` is the one place psycopg's errors become the ledger's: which ledger
error each driver failure is, and that the driver error stays attached as the cause."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

from ledger.driver import driver_errors, translate
from ledger.errors import (
    LedgerError,
    LedgerUnavailable,
    MigrationError,
    RetryableConflict,
    UnknownOperation,
)


@pytest.mark.parametrize(
    ("driver", "expected"),
    [
        (pg_errors.SerializationFailure("could not serialize"), RetryableConflict),
        (pg_errors.DeadlockDetected("deadlock detected"), RetryableConflict),
        (psycopg.OperationalError("server closed the connection"), LedgerUnavailable),
        (PoolTimeout("couldn't get a connection"), LedgerUnavailable),
        (pg_errors.UniqueViolation("duplicate key, no constraint named"), LedgerError),
        (psycopg.ProgrammingError("syntax error"), LedgerError),
    ],
)
def test_each_driver_failure_becomes_its_ledger_error(
    driver: psycopg.Error, expected: type[LedgerError]
) -> None:
    error = translate("commit batch of 3 events for group g", driver)
    assert type(error) is expected
    assert str(error).startswith("commit batch of 3 events for group g: ")


def test_a_step_that_means_one_thing_names_its_class_for_every_failure() -> None:
    error = translate(
        "migration 0003_x failed",
        pg_errors.SerializationFailure("could not serialize"),
        lost="nothing of it was applied",
        every=MigrationError,
    )
    assert type(error) is MigrationError
    assert str(error) == "migration 0003_x failed: could not serialize; nothing of it was applied"


def test_driver_errors_raise_from_the_driver_error_and_pass_ledger_errors_unchanged() -> None:
    lost = psycopg.OperationalError("connection refused")
    with pytest.raises(LedgerUnavailable, match="database d: start it") as raised:
        with driver_errors("database d", lost="start it"):
            raise lost
    assert raised.value.__cause__ is lost
    mine = UnknownOperation("operation op-1 is not in the ledger")
    with pytest.raises(UnknownOperation) as passed, driver_errors("operation op-1"):
        raise mine
    assert passed.value is mine
