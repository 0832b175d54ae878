"""Migrations: applied to an empty database they produce exactly the expected schema,
and applying them again changes nothing."""

from __future__ import annotations

import difflib

import psycopg
import pytest

from ledger import (
    available_migrations,
    describe_schema,
    expected_schema,
    migrate_database,
)

pytestmark = pytest.mark.integration


def test_all_migrations_on_an_empty_database_give_the_expected_schema(
    empty_database: str,
) -> None:
    report = migrate_database(empty_database)
    assert report.applied == tuple(f"{m.version:04d}_{m.name}" for m in available_migrations())
    with psycopg.connect(empty_database) as conn:
        actual = describe_schema(conn)
    expected = expected_schema()
    diff = "\n".join(
        difflib.unified_diff(expected.splitlines(), actual.splitlines(), "expected", "actual")
    )
    assert actual == expected, (
        "the migrations no longer produce ledger/sql/schema.snapshot; if the change is "
        f"intended, regenerate it with `python -m ledger.schema URL`:\n{diff}"
    )


def test_migrating_twice_applies_nothing_the_second_time(empty_database: str) -> None:
    first = migrate_database(empty_database)
    second = migrate_database(empty_database)
    assert second.applied == ()
    assert second.already == first.applied
    with psycopg.connect(empty_database) as conn:
        count = conn.execute("SELECT count(*) FROM ledger_migrations").fetchone()
    assert count == (len(first.applied),)


def test_the_test_template_is_fully_migrated(database_url: str) -> None:
    assert migrate_database(database_url).applied == ()
