"""The services a test session runs against: external ones named by environment
variables, or local ones started once per session and stopped at its end.

The session's own broker is the secured one (TLS, SASL/SCRAM, ACLs): while it runs,
the environment names its admin principal's client file (RECOVERY_KAFKA_CONFIG_FILE,
every other RECOVERY_KAFKA_* security variable cleared), so every client a test builds
through `schemas.kafka_config`, and every process it starts, connects as admin. An
external broker (RECOVERY_KAFKA_BOOTSTRAP) is used with the security variables the
caller set for it. `lease_secured_kafka` gives the tests of the broker's own defences
a secured broker whatever the session's is, with each principal's settings.
`lease_kafka_cluster` starts a secured three-node cluster of the test's own
(`ops.kafka_cluster`) for the fault tests that kill a broker, the environment naming
its admin while it is leased.

A service that cannot be reached or started fails the run with the reason and the log
tail (`pytest.fail`); nothing is ever skipped because a service is missing.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest

from ledger import LOGIN_ROLES
from ops.errors import StackError
from ops.kafka import KafkaBroker, start_kafka, wait_for_kafka
from ops.kafka_cluster import CLUSTER_NODES, KafkaCluster, start_kafka_cluster
from ops.kafka_security import BrokerSecurity
from ops.paths import TRAVERSABLE, private_dir, stack_dir
from ops.postgres import start_postgres, wait_for_postgres
from ops.postgres_ha import HaPostgres, start_postgres_ha
from schemas import (
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    ENV_KAFKA_CONFIG_FILE,
    ENV_KAFKA_SASL_MECHANISM,
    ENV_KAFKA_SASL_PASSWORD,
    ENV_KAFKA_SASL_PASSWORD_FILE,
    ENV_KAFKA_SASL_USERNAME,
    ENV_KAFKA_SECURITY_PROTOCOL,
    ENV_KAFKA_SSL_CA_LOCATION,
)

__all__ = [
    "SECURITY_VARIABLES",
    "LeasedCluster",
    "SecuredBroker",
    "ServiceLease",
    "lease_kafka",
    "lease_kafka_cluster",
    "lease_postgres",
    "lease_secured_kafka",
    "name_admin",
    "own_kafka",
    "own_postgres_ha",
    "service_root",
]

# The Kafka client security settings: a client file or its parts.
SECURITY_VARIABLES: Final = (
    ENV_KAFKA_CONFIG_FILE,
    ENV_KAFKA_SECURITY_PROTOCOL,
    ENV_KAFKA_SASL_MECHANISM,
    ENV_KAFKA_SASL_USERNAME,
    ENV_KAFKA_SASL_PASSWORD,
    ENV_KAFKA_SASL_PASSWORD_FILE,
    ENV_KAFKA_SSL_CA_LOCATION,
)


def name_admin(security: BrokerSecurity) -> Callable[[], None]:
    """Make the environment name `security`'s admin client file (every other Kafka
    security variable cleared), so every client this process and its children build
    connects as admin; returns what gives the environment back."""
    saved = {name: os.environ.pop(name) for name in SECURITY_VARIABLES if name in os.environ}
    os.environ[ENV_KAFKA_CONFIG_FILE] = str(security.client_file("admin"))

    def restore() -> None:
        os.environ.pop(ENV_KAFKA_CONFIG_FILE, None)
        os.environ.update(saved)

    return restore


@dataclass(frozen=True)
class ServiceLease:
    """A service for the session: its address and how to give it back."""

    address: str
    external: bool
    release: Callable[[], None]
    # The session's own secured broker (None for an external one).
    broker: KafkaBroker | None = None
    # The login roles' passwords on the session's own server (role -> password), which
    # its URLs' password file holds; empty for an external server (its roles keep theirs).
    role_passwords: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SecuredBroker:
    """A secured broker: where it listens and each principal's client settings."""

    bootstrap: str
    security: BrokerSecurity


def service_root(prefix: str) -> Path:
    """A fresh folder for a test's own service instance, under the stack folder so that
    the unprivileged PostgreSQL user can traverse it (pytest's tmp_path is mode 0700)."""
    parent = private_dir(stack_dir() / "tests", TRAVERSABLE)
    root = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=parent))
    root.chmod(TRAVERSABLE)
    return root


def lease_kafka() -> ServiceLease:
    """The broker named by RECOVERY_KAFKA_BOOTSTRAP (with the caller's security
    variables), or a secured local one started now, the environment naming its admin
    principal until the lease is released (module docstring)."""
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
    assert broker.security is not None
    restore = name_admin(broker.security)

    def release() -> None:
        restore()
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)

    return ServiceLease(broker.bootstrap, False, release, broker)


@contextmanager
def own_kafka(prefix: str) -> Iterator[KafkaBroker]:
    """A secured broker of the caller's own, started now from this checkout's
    `ops/kafka/server.properties`, for tests that need its group settings (the short
    sessions of fast failover) whatever the session's broker is. While it runs the
    environment names its admin's client file (every other security variable cleared),
    as for the session's own broker; stopped and removed at the end."""
    root = service_root(prefix)
    try:
        broker = start_kafka(root / "kafka")
    except StackError as exc:
        pytest.fail(f"Kafka broker {prefix} did not start: {exc}", pytrace=False)
    assert broker.security is not None
    restore = name_admin(broker.security)
    try:
        yield broker
    finally:
        restore()
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)


class LeasedCluster:
    """A cluster of the test's own: kill a node, restart it; `cluster` is the current
    handle (a restart replaces it). While leased, the environment names the cluster's
    admin (RECOVERY_KAFKA_CONFIG_FILE), so every client and child process the test
    builds connects as admin; `release` restores it, stops every node, removes the
    folder."""

    def __init__(self, cluster: KafkaCluster, restore: Callable[[], None], root: Path) -> None:
        self.cluster = cluster
        self._restore = restore
        self._root = root

    @property
    def bootstrap(self) -> str:
        """Every node's address, comma-separated."""
        return self.cluster.bootstrap

    def kill(self, node_id: int) -> None:
        """SIGKILL node `node_id` (1-based)."""
        self.cluster.kill(node_id)

    def restart(self, node_id: int, timeout: float = 60.0) -> None:
        """Start the killed node again on its folder, id and ports; return once the
        metadata lists every node."""
        self.cluster = self.cluster.restart(node_id, timeout)

    def release(self) -> None:
        """Give the environment back, kill the nodes and remove their folder. The folder
        goes, so nothing needs flushing; and a node's controlled shutdown can wait for a
        quorum the other nodes are leaving (a teardown's SIGTERM once went unanswered for
        the 30 s `KafkaBroker.stop` allows, failing a test that had passed)."""
        self._restore()
        try:
            for node_id in range(1, len(self.cluster.nodes) + 1):
                self.cluster.kill(node_id)
        finally:
            shutil.rmtree(self._root, ignore_errors=True)


def lease_kafka_cluster(nodes: int = CLUSTER_NODES) -> LeasedCluster:
    """A secured cluster of `nodes` nodes started now for one test (module docstring);
    `pytest.fail` with the failing node's log tail when it does not start."""
    root = service_root("kafka-cluster")
    try:
        cluster = start_kafka_cluster(root / "cluster", nodes=nodes)
    except StackError as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"local {nodes}-node Kafka cluster did not start: {exc}", pytrace=False)
    assert cluster.security is not None
    return LeasedCluster(cluster, name_admin(cluster.security), root)


def lease_secured_kafka(session: ServiceLease) -> tuple[SecuredBroker, Callable[[], None]]:
    """A secured broker for the tests of its defences: the session's own when it is one,
    else (an external session broker) one started for them now; and how to release it."""
    if session.broker is not None and session.broker.security is not None:
        return SecuredBroker(session.broker.bootstrap, session.broker.security), lambda: None
    root = service_root("kafka-secured")
    try:
        broker = start_kafka(root / "kafka")
    except StackError as exc:
        pytest.fail(f"secured Kafka broker for the ACL tests did not start: {exc}", pytrace=False)
    assert broker.security is not None

    def release() -> None:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)

    return SecuredBroker(broker.bootstrap, broker.security), release


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
    # Nothing is trusted on the local server: the login roles get passwords of their own,
    # which the password file its URLs name holds (ops/postgres.py).
    passwords = {role: secrets.token_urlsafe(18) for role in LOGIN_ROLES.values()}
    server.remember(passwords)

    def release() -> None:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)

    return ServiceLease(server.url, False, release, role_passwords=passwords)


@contextmanager
def own_postgres_ha(prefix: str) -> Iterator[HaPostgres]:
    """A PostgreSQL failover pair and its monitor of the caller's own (`ops.postgres_ha`:
    pg_auto_failover, a synchronous standby), for the tests that lose the ledger's
    primary; stopped and removed at the end. `pytest.fail` with the logs' tails when it
    does not start."""
    root = service_root(prefix)
    try:
        cluster = start_postgres_ha(root / "postgres")
    except StackError as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"local PostgreSQL failover pair did not start: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
