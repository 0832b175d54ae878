"""The services a test session runs against: external ones named by environment
variables, or local ones started once per session and stopped at its end.

A service that cannot be reached or started fails the run with the reason and the log
tail (`pytest.fail`); nothing is ever skipped because a service is missing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ops.errors import StackError
from ops.kafka import start_kafka, wait_for_kafka
from ops.paths import ensure_dir, stack_dir
from ops.postgres import start_postgres, wait_for_postgres
from schemas import ENV_DATABASE_URL, ENV_KAFKA_BOOTSTRAP

__all__ = ["ServiceLease", "lease_kafka", "lease_postgres", "service_root"]


@dataclass(frozen=True)
class ServiceLease:
    """A service for the session: its address and how to give it back."""

    address: str
    external: bool
    release: Callable[[], None]


def service_root(prefix: str) -> Path:
    """A fresh folder for a test's own service instance, under the stack folder so that
    the unprivileged PostgreSQL user can traverse it (pytest's tmp_path is mode 0700)."""
    parent = ensure_dir(stack_dir() / "tests")
    root = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=parent))
    root.chmod(0o755)
    return root


def lease_kafka() -> ServiceLease:
    """The broker named by RECOVERY_KAFKA_BOOTSTRAP, or a local one started now."""
    external = os.environ.get(ENV_KAFKA_BOOTSTRAP)
    if external:
        try:
            wait_for_kafka(external, timeout=20.0)
        except StackError as exc:
            pytest.fail(f"{ENV_KAFKA_BOOTSTRAP}={external} is not usable: {exc}", pytrace=False)
        return ServiceLease(external, True, lambda: None)
    root = service_root("kafka")
    try:
        broker = start_kafka(root / "kafka")
    except StackError as exc:
        pytest.fail(f"local Kafka broker for this test run did not start: {exc}", pytrace=False)

    def release() -> None:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)

    return ServiceLease(broker.bootstrap, False, release)


def lease_postgres() -> ServiceLease:
    """The server named by RECOVERY_DATABASE_URL (a role that may create databases), or
    a local one started now; the address is a conninfo for its administrative database."""
    external = os.environ.get(ENV_DATABASE_URL)
    if external:
        try:
            wait_for_postgres(external, timeout=20.0)
        except StackError as exc:
            pytest.fail(f"{ENV_DATABASE_URL}={external} is not usable: {exc}", pytrace=False)
        return ServiceLease(external, True, lambda: None)
    root = service_root("postgres")
    try:
        server = start_postgres(root / "postgres")
    except StackError as exc:
        pytest.fail(f"local PostgreSQL for this test run did not start: {exc}", pytrace=False)

    def release() -> None:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)

    return ServiceLease(server.url, False, release)
