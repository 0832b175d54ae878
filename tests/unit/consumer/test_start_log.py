"""The controller's start-up log names the database without its password."""

from __future__ import annotations

import pytest

from consumer.service import redact_url


@pytest.mark.parametrize(
    ("url", "logged"),
    [
        ("postgresql://rc:s3cret@db:5432/ledger", "postgresql://rc:***@db:5432/ledger"),
        ("postgresql://rc@db/ledger", "postgresql://rc@db/ledger"),
        ("postgresql://db/ledger?sslmode=require", "postgresql://db/ledger?sslmode=require"),
    ],
)
def test_the_database_url_is_logged_without_its_password(url: str, logged: str) -> None:
    assert redact_url(url) == logged
    assert "s3cret" not in redact_url(url)
