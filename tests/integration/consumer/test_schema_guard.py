"""A controller refuses to start on a ledger database that lacks migrations."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from consumer.errors import ControllerError
from consumer.service import run_controller
from consumer.settings import ControllerSettings
from ledger.migrations import available_migrations, migrate_database

pytestmark = pytest.mark.integration

# The shipped template: an explicit policy, as the controller requires.
POLICY = Path(__file__).resolve().parents[3] / "ops" / "policy.production.yaml"


def test_controller_refuses_a_ledger_without_its_migrations_and_names_them(
    empty_database: str,
) -> None:
    settings = ControllerSettings(
        bootstrap="127.0.0.1:9", database_url=empty_database, policy_path=POLICY, demo_mode=True
    )

    with pytest.raises(ControllerError, match=r"lacks migrations 0001_ledger.*db migrate"):
        run_controller(settings, threading.Event())


def test_controller_refuses_a_ledger_missing_only_the_newest_migration(
    empty_database: str,
) -> None:
    migrate_database(empty_database)
    newest = available_migrations()[-1]
    # As a ledger of the previous release records it: every migration but the newest.
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute("DELETE FROM ledger_migrations WHERE version = %s", (newest.version,))
    settings = ControllerSettings(
        bootstrap="127.0.0.1:9", database_url=empty_database, policy_path=POLICY, demo_mode=True
    )

    label = f"{newest.version:04d}_{newest.name}"
    with pytest.raises(ControllerError, match=rf"lacks migrations {label};"):
        run_controller(settings, threading.Event())
