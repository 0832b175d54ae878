"""A controller refuses to start on a ledger database that lacks migrations."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from consumer.errors import ControllerError
from consumer.service import run_controller
from consumer.settings import ControllerSettings
from ledger import create_database, drop_database, with_database
from ledger.migrations import available_migrations, migrate_database

pytestmark = pytest.mark.integration


@pytest.fixture
def unmigrated_database(postgres_server: str) -> Iterator[str]:
    name = f"guard_{uuid.uuid4().hex[:10]}"
    create_database(postgres_server, name)
    yield with_database(postgres_server, name)
    drop_database(postgres_server, name)


def test_controller_refuses_a_ledger_without_its_migrations_and_names_them(
    unmigrated_database: str,
) -> None:
    settings = ControllerSettings(bootstrap="127.0.0.1:9", database_url=unmigrated_database)

    with pytest.raises(ControllerError, match=r"lacks migrations 0001_ledger.*db migrate"):
        run_controller(settings, threading.Event())


def test_controller_refuses_a_ledger_missing_only_the_newest_migration(
    unmigrated_database: str,
) -> None:
    migrate_database(unmigrated_database)
    newest = available_migrations()[-1]
    # As a ledger of the previous release records it: every migration but the newest.
    with psycopg.connect(unmigrated_database, autocommit=True) as conn:
        conn.execute("DELETE FROM ledger_migrations WHERE version = %s", (newest.version,))
    settings = ControllerSettings(bootstrap="127.0.0.1:9", database_url=unmigrated_database)

    label = f"{newest.version:04d}_{newest.name}"
    with pytest.raises(ControllerError, match=rf"lacks migrations {label};"):
        run_controller(settings, threading.Event())
